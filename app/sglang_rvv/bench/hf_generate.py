"""Hugging Face ``generate``: greedy decode tok/s row-major vs with the RVV policy, one process, one model.

``python -m sglang_rvv.bench.hf_generate MODEL_DIR --json OUT [--repetitions N] [--seed S]
[--weight-dtypes bf16,int8,int4]``

The checkpoint is loaded once with transformers (BF16, CPU); a seeded prompt of
``INPUT_LEN`` (64) token ids is generated greedily, exactly ``OUTPUT_LEN`` new tokens,
first row-major, then after ``install_rvv_policy`` and ``warm_up`` on the same
model object (a 1B model is 2.5 GB: loading it twice would double the peak RSS
and the run time). Each mode is timed after one untimed generate, so neither
compiles nor first-call allocations are measured. Per repetition one generate is
timed, with a streamer marking when its first new token came: up to there is the
prefill, the rest the ``OUTPUT_LEN - 1`` decode steps. (Two separate generates,
prefill-only and full, differed by less than their noise on a tiny model on a
loaded host, and their difference went negative.) The raw times and the
generated ids are kept, and :func:`summarize` derives the rates (the report and
the suite share it).

With ``--weight-dtypes`` the policy is installed again on the same model for each further
layout (mode ``on-int8``, ``on-int4``: the same BF16 weights quantized at install, the bf16
buffers freed), warmed up and measured in turn, so every layout's decode rate sits beside
bf16 packed and row-major in one process, under the same machine load.

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

MODES = ("off", "on")  # row-major and bf16 packed: every run has them
REPETITIONS = 3


def layout_mode(weight_dtype: str) -> str:
    """The mode a layout is measured as: ``on`` for bf16 (the flag's default), ``on-DTYPE`` else."""
    return "on" if weight_dtype == "bf16" else f"on-{weight_dtype}"


class _Marks:
    """A ``generate`` streamer that keeps when each ``put`` came: the prompt's, then one per new token."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def put(self, _ids) -> None:
        self.at.append(time.perf_counter())

    def end(self) -> None:
        pass


def _generate(model, prompt, streamer: _Marks | None = None, logits: bool = False):
    """The new ids; with ``logits``, also each step's logits (FP32, one row per new id)."""
    import torch

    ids = torch.tensor([prompt])
    # min_new_tokens: an EOS pick must not shorten the output (random weights pick anything).
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUT_LEN,
                         min_new_tokens=OUTPUT_LEN, do_sample=False, streamer=streamer,
                         output_logits=logits, return_dict_in_generate=logits)
    if not logits:
        return out[0, len(prompt):].tolist()
    return out.sequences[0, len(prompt):].tolist(), [step[0].float() for step in out.logits]


def first_difference(reference_ids: list[int], reference_logits: list, ids: list[int]) -> dict | None:
    """Where ``ids`` first part from the row-major ``reference_ids`` (None: nowhere), with the row-major
    logit gap between the two picks there and the smoke's near-tie tolerance (``TIE_TOLERANCE`` of the
    step's largest logit magnitude). Past that step the prefixes differ, so nothing later is judged."""
    from ..smoke.comparison import TIE_TOLERANCE

    step = next((i for i, (a, b) in enumerate(zip(ids, reference_ids, strict=True)) if a != b), None)
    if step is None:
        return None
    row = reference_logits[step]
    gap = float(row[reference_ids[step]] - row[ids[step]])
    tolerance = TIE_TOLERANCE * float(row.abs().max())
    return {"step": step, "logit_gap": gap, "near_tie_tolerance": tolerance, "near_tie": gap <= tolerance}


def measure_mode(model, prompt: list[int], repetitions: int) -> tuple[dict, list]:
    """Raw timings of one mode: ``repetitions`` timed generates after one untimed one; per generate
    the seconds to its first new token (``prefill_s``) and to its last (``full_s``). Also the
    untimed generate's logits per step (kept out of the record: 8 vocabulary-wide rows)."""
    import torch

    with torch.no_grad():  # as SGLang runs; the compiled routes' Dynamo guards include grad mode
        first, logits = _generate(model, prompt, logits=True)
        prefill_s, full_s, outputs = [], [], [first]
        for _ in range(repetitions):
            marks = _Marks()
            began = time.perf_counter()
            outputs.append(_generate(model, prompt, marks))
            full_s.append(time.perf_counter() - began)
            prefill_s.append(marks.at[1] - began)  # at[0] is the prompt's put, before any forward
    if any(output != outputs[0] for output in outputs):
        raise RuntimeError(f"greedy generate is not deterministic across repetitions: {outputs}")
    return {"prefill_s": prefill_s, "full_s": full_s, "output_ids": outputs[0]}, logits


def load_model(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval()


def _install(model, model_dir: Path, weight_dtype: str):
    """The policy installed (again) with ``weight_dtype`` and warmed up: (report, warm-up, seconds)."""
    from .. import RvvPolicyConfig, install_rvv_policy
    from ..policy import policy_of
    from ..warmup import warm_up

    began = time.perf_counter()
    installed = install_rvv_policy(model, RvvPolicyConfig(weight_dtype=weight_dtype))
    if installed.adapter is None:  # "on" would silently measure row-major again
        raise RuntimeError(f"{model_dir}: the policy does not apply ({installed.reason})")
    return installed, warm_up(policy_of(model)), time.perf_counter() - began


def measure(model_dir: Path, repetitions: int = REPETITIONS, seed: int = 0,
            report_path: Path | None = None, weight_dtypes: tuple[str, ...] = ("bf16",)) -> dict:
    """Every mode on one model: off first, then the policy installed and warmed up with each layout
    of ``weight_dtypes`` in turn (bf16 first); the result payload."""
    from ..layout import WEIGHT_DTYPES
    from .serving import prompt_ids

    if not weight_dtypes or weight_dtypes[0] != "bf16" or not set(weight_dtypes) <= set(WEIGHT_DTYPES) \
            or len(set(weight_dtypes)) != len(weight_dtypes):
        raise ValueError(f"weight_dtypes={','.join(weight_dtypes)}: give bf16 first, then any of "
                         f"{', '.join(WEIGHT_DTYPES[1:])} once each")
    prompt = prompt_ids(model_dir, 1, seed)[0]
    model = load_model(model_dir)
    off, reference_logits = measure_mode(model, prompt, repetitions)
    modes = {"off": off}
    installs, gated = {}, None
    for weight_dtype in weight_dtypes:
        installed, warmup, seconds = _install(model, model_dir, weight_dtype)
        if weight_dtype == "bf16" and report_path is not None:
            # What the SGLang plugin writes: the policy report with the warm-up's.
            write_json(report_path, {**asdict(installed), "warmup": asdict(warmup)})
        # What a layout skipped beyond bf16's skips (the shape gate's) fell back to a wider
        # layout: the report names it beside the rate. bf16 (first) falls back nowhere.
        gated = installed.skipped if gated is None else gated
        installs[weight_dtype] = {"packed_bytes": installed.packed_bytes, "install_and_warmup_s": seconds,
                                  "fell_back": {name: why for name, why in installed.skipped.items()
                                                if name not in gated}}
        record, _ = measure_mode(model, prompt, repetitions)
        record["first_difference"] = first_difference(modes["off"]["output_ids"], reference_logits,
                                                      record["output_ids"])
        modes[layout_mode(weight_dtype)] = record
    return {"input_len": len(prompt), "output_len": OUTPUT_LEN, "repetitions": repetitions, "prompt_ids": prompt,
            "install_and_warmup_s": installs["bf16"]["install_and_warmup_s"],
            "packed_bytes": installs["bf16"]["packed_bytes"], "layouts": installs,
            "outputs_equal": modes["off"]["output_ids"] == modes["on"]["output_ids"], "modes": modes}


def summarize(result: dict) -> dict:
    """mode -> median prefill and decode tok/s over the repetitions; ``on/off`` ratios; outputs equal."""
    out: dict = {}
    for mode, raw in result["modes"].items():
        prefill = [result["input_len"] / s for s in raw["prefill_s"]]
        # The full generate is the prefill plus output_len - 1 decode steps.
        decode = [(result["output_len"] - 1) / (full - pre)
                  for pre, full in zip(raw["prefill_s"], raw["full_s"], strict=True)]
        out[mode] = {"prefill_tok_s": statistics.median(prefill) if prefill else None,
                     "decode_tok_s": statistics.median(decode) if decode else None, "n": len(raw["full_s"])}
    for key in ("prefill_tok_s", "decode_tok_s"):
        on, off = (out.get(mode, {}).get(key) for mode in ("on", "off"))
        out.setdefault("ratio", {})[key] = on / off if on is not None and off else None
    modes = result["modes"]
    out["outputs_equal"] = all(m in modes for m in MODES) and modes["off"]["output_ids"] == modes["on"]["output_ids"]
    # Where bf16 packed first parted from row-major, and whether at a near tie (runs before the
    # field was recorded have None).
    out["first_difference"] = modes.get("on", {}).get("first_difference")
    # The quantized layouts beside bf16 packed and row-major; their greedy ids need not equal
    # row-major's, so how many leading ids do is shown, not judged here.
    out["layouts"] = {}
    for weight_dtype, install in result.get("layouts", {}).items():
        mode = layout_mode(weight_dtype)
        if weight_dtype == "bf16" or mode not in out:
            continue
        decode = out[mode]["decode_tok_s"]
        ids, reference = modes[mode]["output_ids"], modes["off"]["output_ids"]
        same = next((i for i, (a, b) in enumerate(zip(ids, reference, strict=True)) if a != b), len(ids))
        out["layouts"][weight_dtype] = {
            "decode_tok_s": decode, "packed_bytes": install["packed_bytes"],
            "vs_bf16": decode / out["on"]["decode_tok_s"] if decode and out["on"]["decode_tok_s"] else None,
            "vs_off": decode / out["off"]["decode_tok_s"] if decode and out["off"]["decode_tok_s"] else None,
            "leading_ids_equal": same, "ids": len(ids), "fell_back": install["fell_back"],
            "first_difference": modes[mode].get("first_difference")}
    return out


def agreement(ids_equal: bool, difference: dict | None) -> tuple[bool, str]:
    """Whether a mode's greedy ids count as row-major's (equal, or parted first at a near tie), and
    the words for it. A run recorded before ``first_difference`` was has only ``ids_equal``."""
    if ids_equal:
        return True, "equal"
    if difference is None:
        return False, "DIFFER"
    where = (f"at step {difference['step']} (row-major logit gap {difference['logit_gap']:.4f} "
             f"{'≤' if difference['near_tie'] else '>'} near-tie tolerance {difference['near_tie_tolerance']:.4f})")
    return (True, f"equal up to a near tie {where}") if difference["near_tie"] else (False, f"DIFFER {where}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.bench.hf_generate", description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="checkpoint directory")
    parser.add_argument("--json", type=Path, required=True, help="write the result payload here")
    parser.add_argument("--repetitions", type=int, default=REPETITIONS)
    parser.add_argument("--seed", type=int, default=0, help="of the prompt's random token ids")
    parser.add_argument("--report-path", type=Path, help="write the policy report (with the warm-up's) here")
    parser.add_argument("--weight-dtypes", default="bf16",
                        help="comma-separated layouts measured after row-major, bf16 first (default: bf16)")
    args = parser.parse_args(argv)
    try:
        weight_dtypes = tuple(args.weight_dtypes.split(","))
        result = measure(args.model, args.repetitions, args.seed, args.report_path, weight_dtypes)
    except ValueError as error:
        parser.error(str(error))
    write_json(args.json, result)
    print(json.dumps(summarize(result)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
