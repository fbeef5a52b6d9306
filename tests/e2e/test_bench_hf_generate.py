"""The suite's Hugging Face generate step on the tiny Llama, measured: row-major and bf16 packed
with equal outputs, then int8 and int4 on the same model, each beside bf16 packed."""

from __future__ import annotations

import json

from sglang_rvv.bench import hf_generate, results, suite
from sglang_rvv.bench.progress import Progress
from sglang_rvv.bench.report import summaries
from sglang_rvv.checkpoint import write_tiny_checkpoint


def test_generate_step_off_and_on_on_the_tiny_llama(tmp_path):
    model_dir = tmp_path / "llama"
    write_tiny_checkpoint(model_dir, "llama", seed=0)
    run_dir = tmp_path / "run"
    results.write_meta(run_dir, {"provenance": {}})

    # The suite's own step: its process, the result file and the policy report it points to.
    suite.run_hf_generate(model_dir, run_dir, {}, repetitions=1, seed=0, progress=Progress(),
                          weight_dtypes=("bf16", "int8", "int4"))

    run = results.load_run(run_dir)
    record = run.of("hf_generate")["generate"]
    assert record["input_len"] == 64 and record["output_len"] == 8 and len(record["prompt_ids"]) == 64
    assert list(record["modes"]) == ["off", "on", "on-int8", "on-int4"]
    for mode in record["modes"]:
        raw = record["modes"][mode]
        assert len(raw["output_ids"]) == 8
        assert all(full > prefill > 0 for prefill, full in zip(raw["prefill_s"], raw["full_s"], strict=True))
    assert record["outputs_equal"] is True and record["modes"]["on"]["first_difference"] is None
    summary = summaries.hf_generate(run)
    assert summary["outputs_equal"] is True
    for mode in hf_generate.MODES:
        assert summary[mode]["prefill_tok_s"] > 0 and summary[mode]["decode_tok_s"] > 0 and summary[mode]["n"] == 1
    assert summary["ratio"]["decode_tok_s"] > 0
    # Each quantized layout really packed (fewer bytes than bf16: int4 fewest), fell back nowhere,
    # and is rated against bf16 packed.
    installs = record["layouts"]
    assert installs["bf16"]["packed_bytes"] > installs["int8"]["packed_bytes"] > installs["int4"]["packed_bytes"] > 0
    for name in ("int8", "int4"):
        v = summary["layouts"][name]
        assert v["fell_back"] == {} and v["ids"] == 8 and 0 <= v["leading_ids_equal"] <= 8
        # Where it parted from row-major, with row-major's logit gap there (greedy: never negative).
        assert (v["first_difference"] is None) == (v["leading_ids_equal"] == 8)
        if v["first_difference"] is not None:
            assert v["first_difference"]["step"] == v["leading_ids_equal"] and v["first_difference"]["logit_gap"] >= 0
        assert v["vs_bf16"] == v["decode_tok_s"] / summary["on"]["decode_tok_s"] > 0
    print(json.dumps({name: v["vs_bf16"] for name, v in summary["layouts"].items()}))
    policy = run.policy_report(record)
    assert policy["packed_bytes"] == record["packed_bytes"] > 0 and policy["warmup"]["keys"]
    print(json.dumps(summary["ratio"]))  # the measured ratios, for the log (-s)
