"""Hugging Face ``generate``: greedy decode tok/s row-major vs with the RVV policy, one process, one model.

``python -m sglang_rvv.bench.hf_generate MODEL_DIR --json OUT [--repetitions N] [--seed S]``

The checkpoint is loaded once with transformers (BF16, CPU); a seeded prompt of
``INPUT_LEN`` (64) token ids is generated greedily, exactly ``OUTPUT_LEN`` new tokens,
first row-major, then after ``install_rvv_policy`` and ``warm_up`` on the same
model object (a 1B model is 2.5 GB: loading it twice would double the peak RSS
and the run time). Each mode is timed after one untimed generate, so neither
compiles nor first-call allocations are measured. Per repetition a prefill-only
generate (one new token) and the full generate are timed; their difference is
the ``OUTPUT_LEN - 1`` decode steps. The raw times and the generated ids are
kept, and :func:`summarize` derives the rates (the report and the suite share it).

Nothing at module level imports torch, so the report can import :func:`summarize`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .client import OUTPUT_LEN
from .results import write_json

MODES = ("off", "on")
REPETITIONS = 3


def _generate(model, prompt, new_tokens: int):
    import torch

    ids = torch.tensor([prompt])
    # min_new_tokens: an EOS pick must not shorten the output (random weights pick anything).
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False)[0, len(prompt):].tolist()


def _timed(model, prompt, new_tokens: int) -> tuple[float, list[int]]:
    began = time.perf_counter()
    output = _generate(model, prompt, new_tokens)
    return time.perf_counter() - began, output


def measure_mode(model, prompt: list[int], repetitions: int) -> dict:
    """Raw timings of one mode: ``repetitions`` × (prefill-only, full) generates after one untimed one."""
    import torch

    with torch.no_grad():  # as SGLang runs; the compiled routes' Dynamo guards include grad mode
        _generate(model, prompt, OUTPUT_LEN)
        prefill_s, full_s, outputs = [], [], []
        for _ in range(repetitions):
            prefill_s.append(_timed(model, prompt, 1)[0])
            seconds, output = _timed(model, prompt, OUTPUT_LEN)
            full_s.append(seconds)
            outputs.append(output)
    if any(output != outputs[0] for output in outputs):
        raise RuntimeError(f"greedy generate is not deterministic across repetitions: {outputs}")
    return {"prefill_s": prefill_s, "full_s": full_s, "output_ids": outputs[0]}


def load_model(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval()


def measure(model_dir: Path, repetitions: int = REPETITIONS, seed: int = 0,
            report_path: Path | None = None) -> dict:
    """Both modes on one model: off first, then the policy installed and warmed up; the result payload."""
    from .. import RvvPolicyConfig, install_rvv_policy
    from ..policy import policy_of
    from ..warmup import warm_up
    from .serving import prompt_ids

    prompt = prompt_ids(model_dir, 1, seed)[0]
    model = load_model(model_dir)
    modes = {"off": measure_mode(model, prompt, repetitions)}
    began = time.perf_counter()
    installed = install_rvv_policy(model, RvvPolicyConfig())
    if installed.adapter is None:  # "on" would silently measure row-major again
        raise RuntimeError(f"{model_dir}: the policy does not apply ({installed.reason})")
    warmup = warm_up(policy_of(model))
    install_s = time.perf_counter() - began
    if report_path is not None:  # what the SGLang plugin writes: the policy report with the warm-up's
        write_json(report_path, {**asdict(installed), "warmup": asdict(warmup)})
    modes["on"] = measure_mode(model, prompt, repetitions)
    return {"input_len": len(prompt), "output_len": OUTPUT_LEN, "repetitions": repetitions, "prompt_ids": prompt,
            "install_and_warmup_s": install_s, "packed_bytes": installed.packed_bytes,
            "outputs_equal": modes["off"]["output_ids"] == modes["on"]["output_ids"], "modes": modes}


def summarize(result: dict) -> dict:
    """mode -> median prefill and decode tok/s over the repetitions; ``on/off`` ratios; outputs equal."""
    out: dict = {}
    for mode, raw in result["modes"].items():
        prefill = [result["input_len"] / s for s in raw["prefill_s"]]
        # The full generate is the prefill plus output_len - 1 decode steps.
        decode = [(result["output_len"] - 1) / (full - pre) for pre, full in zip(raw["prefill_s"], raw["full_s"],
                                                                                   strict=True) if full > pre]
        out[mode] = {"prefill_tok_s": statistics.median(prefill) if prefill else None,
                     "decode_tok_s": statistics.median(decode) if decode else None, "n": len(raw["full_s"])}
    for key in ("prefill_tok_s", "decode_tok_s"):
        on, off = (out.get(mode, {}).get(key) for mode in ("on", "off"))
        out.setdefault("ratio", {})[key] = on / off if on is not None and off else None
    modes = result["modes"]
    out["outputs_equal"] = all(m in modes for m in MODES) and modes["off"]["output_ids"] == modes["on"]["output_ids"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.bench.hf_generate", description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="checkpoint directory")
    parser.add_argument("--json", type=Path, required=True, help="write the result payload here")
    parser.add_argument("--repetitions", type=int, default=REPETITIONS)
    parser.add_argument("--seed", type=int, default=0, help="of the prompt's random token ids")
    parser.add_argument("--report-path", type=Path, help="write the policy report (with the warm-up's) here")
    args = parser.parse_args(argv)
    result = measure(args.model, args.repetitions, args.seed, args.report_path)
    write_json(args.json, result)
    print(json.dumps(summarize(result)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
