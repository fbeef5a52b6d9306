"""Linear microbenchmark per weight layout: bf16, int8 and int4 packed side by side, in one run.

For each projection (Llama-3.2-1B's shapes, as :mod:`.linear`) and each layout, the
projection's weight copies (more than the last-level cache, so every call streams
from memory) get the policy with that ``weight_dtype`` and every bucket on the packed
route (no measured route table: this compares kernels); each cell's key compiles in
its untimed first calls, so only the measured rows compile.
Per cell and in the same interleaved rounds (the fastest of :data:`.linear.ROUNDS`):
row-major ``F.linear`` on the BF16 weight, the policy's call (the compiled packed
route), the eager packed call on the same buffers (:func:`bodies.eager_call`, what the
measured route table serves where it is faster), and at M=1 a plain read of the packed
tensors (the bandwidth decode could reach at that moment). GB/s and the ratios take the
faster of the two packed calls, as the route table would.

Bytes streamed per call are the real packed bytes of one copy, scales included
(``RvvPolicy.packed_bytes()`` over the copies), so GB/s compares layouts honestly: an
int4 cell streams about a quarter of bf16's bytes. Each cell gives its time, its GB/s,
its speed-up over the bf16 packed cell and over F.linear, and at M=1 the fraction of
the same-rounds read bandwidth.

A layout this build cannot pack (the policy falls back, or does not know the dtype)
is a row ``not available: REASON``, never a crash: the run still compares the others.

``--threads 4,8`` measures at each thread count in a fresh process pinned to as many CPUs
(:mod:`.threads`): on the K1, one cluster of four cores, then all eight.

``python -m sglang_rvv.bench layouts [--weight-dtypes bf16,int8,int4] [--projections ...]
[--rows 1,4] [--min-time S] [--threads 4,8] [--json OUT]``

Nothing at module level imports torch, so the report can import :func:`format_table`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from . import threads
from .results import thread_counts

DEFAULT_ROWS = (1, 4)


def _dtypes(text: str) -> list[str]:
    from ..layout import WEIGHT_DTYPES

    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in WEIGHT_DTYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose a comma-separated subset of {','.join(WEIGHT_DTYPES)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..layout import WEIGHT_DTYPES
    from .linear import ROUNDS

    parser.add_argument("--weight-dtypes", type=_dtypes, default=list(WEIGHT_DTYPES),
                        help=f"layouts to compare (default {','.join(WEIGHT_DTYPES)}); bf16 is the ratios' base")
    parser.add_argument("--projections", default="qkv_proj,o_proj,gate_up_proj,down_proj,lm_head",
                        help="comma-separated subset of %(default)s (Llama-3.2-1B's shapes)")
    parser.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)), help="M values (default %(default)s)")
    parser.add_argument("--min-time", type=float, default=0.3,
                        help=f"seconds timed per cell and variant, over {ROUNDS} interleaved rounds")
    parser.add_argument("--threads", type=thread_counts,
                        help="comma-separated thread counts, each measured in a fresh process pinned to as many "
                             "CPUs (bench/threads.py; default: torch's current count, in this process)")
    parser.add_argument("--json", type=Path, help="also write the results here")


def _policy(linears: list, kind: str, weight_dtype: str):
    """The policy over standalone copies of one projection, packed as ``weight_dtype``; and why
    that layout is not available, or None."""
    import torch

    from .. import routing
    from ..adapters import Adapter, install_routed_linear
    from ..config import RvvPolicyConfig
    from ..policy import RvvPolicy

    root = torch.nn.Module()
    holders = []
    for lin in linears:
        holder = torch.nn.Module()
        setattr(holder, kind, lin)
        holders.append(holder)
    root.copies = torch.nn.ModuleList(holders)
    root.config = SimpleNamespace(tie_word_embeddings=False)
    adapter = Adapter("bench", {k: k for k in routing.PROJECTIONS}, lambda m: True, install_routed_linear,
                      lambda m: False)
    try:
        config = RvvPolicyConfig(memory_budget_mib=2**40, measure_routes=False, weight_dtype=weight_dtype)
        policy = RvvPolicy(root, adapter, config)
        report = policy.reconcile()
    except (TypeError, ValueError) as error:  # a config or policy that does not know the layout
        return None, f"{type(error).__name__}: {error}"
    policy.root = root  # the policy holds its model weakly
    layouts = set((asdict(report).get("layouts") or {}).values())
    if weight_dtype != "bf16" and layouts != {weight_dtype}:
        why = sorted(set(report.skipped.values()) | set((asdict(report).get("layout_fallbacks") or {}).values()))
        return policy, (f"packed as {sorted(layouts) or 'bf16 (no layouts reported)'}"
                        f"{'; ' + '; '.join(why) if why else ''}")
    if len(report.packed) != len(linears):
        return policy, f"packed {len(report.packed)} of {len(linears)} copies: {sorted(set(report.skipped.values()))}"
    return policy, None


def _cell(rows: int, linears, policy, layout_name: str, bytes_per_call: int, min_time: float) -> dict:
    import torch
    import torch.nn.functional as F

    from ..bodies import eager_call
    from ..srt.metrics import packed_tensors
    from .linear import ROUNDS, _time

    n, k = linears[0].out_features, linears[0].in_features
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    tensors = [packed_tensors(lin) for lin in linears]
    eager, tail = eager_call(layout_name, n, k)
    variants = {
        "linear_us": (lambda w: F.linear(x, w), [lin.weight for lin in linears]),
        "packed_us": (lambda lin: lin(x), linears),
        "eager_us": (lambda ts: eager(x, *ts, *tail), tensors),
    }
    if rows == 1:
        # A reduction over the packed tensors themselves, in the same rounds: decode's limit now.
        # (As float32 words, the widest cheap reduction; every packed tensor's last dim is 32 elements.)
        variants["read_us"] = (lambda ts: [t.view(torch.float32).amax() for t in ts], tensors)
    best = dict.fromkeys(variants, math.inf)
    with torch.inference_mode():
        for round_ in range(ROUNDS):  # round 0's untimed first calls compile the cell's key
            for name, (fn, operands) in variants.items():
                best[name] = min(best[name], _time(fn, operands, min_time / ROUNDS, warm=round_ == 0) * 1e6)
    routes = sorted({r for (_, r, _), c in policy.counters.items() if c})
    policy.counters.clear()
    return dict(rows=rows, bytes_per_call=bytes_per_call, routes=routes, **best)


def measure(weight_dtypes: list[str], projections: list[str], rows_list: list[int], min_time: float) -> list[dict]:
    """One row per (projection, layout, M); unavailable layouts have ``not_available`` instead of times."""
    import torch

    from .linear import LLAMA_3_2_1B, _llc_bytes

    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}", file=sys.stderr, flush=True)
    llc = _llc_bytes()
    torch.manual_seed(0)
    results = []
    for kind in projections:
        n, k = LLAMA_3_2_1B[kind]
        copies = max(2, math.ceil(4 * llc / (n * k * 2)))
        linears = []
        for _ in range(copies):
            lin = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
            torch.nn.init.normal_(lin.weight, std=0.02)
            linears.append(lin.requires_grad_(False))
        for weight_dtype in weight_dtypes:
            head = dict(projection=kind, n=n, k=k, weight_dtype=weight_dtype)
            policy, missing = _policy(linears, kind, weight_dtype)
            if missing is not None:
                results += [dict(head, rows=rows, not_available=missing) for rows in rows_list]
            else:
                per_call = policy.packed_bytes() // copies
                results += [dict(head, **_cell(rows, linears, policy, weight_dtype, per_call, min_time))
                            for rows in rows_list]
            if policy is not None:
                policy.invalidate(repack=False)  # free this layout's buffers before the next one packs
            del policy
    return with_ratios(results)


def packed_call_us(r: dict) -> float:
    """A cell's packed time: the faster of the compiled and the eager call (a cell of a run
    before the eager call was timed: the compiled one)."""
    return min(r["packed_us"], r.get("eager_us", math.inf))


def with_ratios(results: list[dict]) -> list[dict]:
    """Add GB/s (bytes streamed per call over the faster packed call's time) and the ratios to the
    same cell's bf16 packed time and F.linear time, and at M=1 the fraction of the same-rounds
    read bandwidth."""
    bf16 = {(r["projection"], r["rows"]): r for r in results if r["weight_dtype"] == "bf16" and "packed_us" in r}
    for r in results:
        if "packed_us" not in r:
            continue
        packed = packed_call_us(r)
        r["packed_gbs"] = r["bytes_per_call"] / packed / 1e3
        r["vs_linear"] = r["linear_us"] / packed
        base = bf16.get((r["projection"], r["rows"]))
        r["vs_bf16_packed"] = packed_call_us(base) / packed if base else None
        if "read_us" in r:
            r["read_gbs"] = r["bytes_per_call"] / r["read_us"] / 1e3
            r["of_read"] = r["packed_gbs"] / r["read_gbs"]
    return results


def format_table(results: list[dict]) -> str:
    lines = ["| projection | N x K | layout | M | MiB/call | packed us (compiled) | packed us (eager) | F.linear us "
             "| GB/s | vs bf16 packed | vs F.linear | of read (M=1) | route |", "|" + "---|" * 13]
    for r in results:
        cells = [r["projection"], f"{r['n']}x{r['k']}", r["weight_dtype"], r["rows"]]
        if "not_available" in r:
            cells += [f"not available: {r['not_available']}"] + [""] * 8
        else:
            ratio = r["vs_bf16_packed"]
            eager = f"{r['eager_us']:.0f}" if "eager_us" in r else "n/a"
            cells += [f"{r['bytes_per_call'] / 2**20:.2f}", f"{r['packed_us']:.0f}", eager, f"{r['linear_us']:.0f}",
                      f"{r['packed_gbs']:.1f}", "n/a" if ratio is None else f"{ratio:.2f}", f"{r['vs_linear']:.2f}",
                      f"{r['of_read']:.0%}" if "of_read" in r else "", ", ".join(r["routes"])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    from .linear import LLAMA_3_2_1B, kernel_facts

    projections = args.projections.split(",")
    unknown = set(projections) - set(LLAMA_3_2_1B)
    if unknown:
        sys.exit(f"unknown projection(s) {sorted(unknown)}; choose from {list(LLAMA_3_2_1B)}")
    def here() -> dict:
        rows_list = [int(r) for r in args.rows.split(",")]
        results = measure(args.weight_dtypes, projections, rows_list, args.min_time)
        print(format_table(results), flush=True)
        return {**threads.this_run(), "results": results}

    argv = ["--weight-dtypes", ",".join(args.weight_dtypes), "--projections", args.projections,
            "--rows", args.rows, "--min-time", str(args.min_time)]
    runs = threads.runs("layouts", argv, args.threads or [torch.get_num_threads()], here)
    if args.json:
        args.json.write_text(json.dumps({**kernel_facts(), "runs": runs}, indent=1))
    return 0
