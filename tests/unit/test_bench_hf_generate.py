"""The suite's Hugging Face generate step on the tiny Llama: both modes measured, outputs equal."""

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
    suite.run_hf_generate(model_dir, run_dir, {}, repetitions=1, seed=0, progress=Progress())

    run = results.load_run(run_dir)
    record = run.of("hf_generate")["generate"]
    assert record["input_len"] == 64 and record["output_len"] == 8 and len(record["prompt_ids"]) == 64
    for mode in hf_generate.MODES:
        raw = record["modes"][mode]
        assert len(raw["output_ids"]) == 8
        assert all(full > prefill > 0 for prefill, full in zip(raw["prefill_s"], raw["full_s"], strict=True))
    assert record["outputs_equal"] is True
    summary = summaries.hf_generate(run)
    assert summary["outputs_equal"] is True
    for mode in hf_generate.MODES:
        assert summary[mode]["prefill_tok_s"] > 0 and summary[mode]["decode_tok_s"] > 0 and summary[mode]["n"] == 1
    assert summary["ratio"]["decode_tok_s"] > 0
    policy = run.policy_report(record)
    assert policy["packed_bytes"] == record["packed_bytes"] > 0 and policy["warmup"]["keys"]
    print(json.dumps(summary["ratio"]))  # the measured ratios, for the log (-s)
