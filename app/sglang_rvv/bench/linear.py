"""Linear microbenchmark: row-major F.linear vs the packed route vs the full policy call.

Weights rotate through several copies whose total exceeds the last-level
cache, so every call streams its weight from memory as in real decode. At
M=1 the achieved weight bandwidth is printed next to this machine's measured
read and copy bandwidth (the physical limit for decode). The policy is warmed
up as a server with ``--cpu-rvv-warmup`` is, so its column follows a route
table measured in this run, and its last column names the route it took.
Every cell is the fastest of ROUNDS interleaved rounds per variant. F.linear
is timed twice in each round, first and after the policy call: how far apart
one op's two timings land is this run's noise floor for the cell's ratios.
Each cell's GB/s is the weight's bytes over the time per call: decode streams
every weight once per token, so this is what bounds tok/s.

``--threads 4,8`` measures every cell at each thread count, each in a fresh
process of its own pinned to as many CPUs (:mod:`.threads`). The result
records the provider (and why it was chosen), the native kernel library's ISA
and VLEN, and the ``isa`` line of /proc/cpuinfo.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .. import bodies, host, routing
from ..adapters import Adapter, install_routed_linear
from ..config import RvvPolicyConfig
from ..kernels import rvv
from ..ops import PROVIDER_NAME, PROVIDER_REASON, packed_bf16_linear
from ..packed_state import BUFFER
from ..policy import RvvPolicy
from ..warmup import warm_up
from . import threads
from .results import m1_gbs, thread_counts, weight_gbs

# Llama-3.2-1B as SGLang sees it (fused qkv and gate_up): (N, K).
LLAMA_3_2_1B = {
    "qkv_proj": (3072, 2048),
    "o_proj": (2048, 2048),
    "gate_up_proj": (16384, 2048),
    "down_proj": (2048, 8192),
    "lm_head": (128256, 2048),
}
DEFAULT_ROWS = (1, 2, 3, 4, 8, 9, 16, 64, 128)
ROUNDS = 5
GB = 1e9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--projections", default=",".join(LLAMA_3_2_1B),
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)), help="M values")
    parser.add_argument("--min-time", type=float, default=0.3,
                        help=f"seconds timed per cell and variant, over {ROUNDS} interleaved rounds")
    parser.add_argument("--threads", type=thread_counts,
                        help="comma-separated thread counts, each measured in a process of its own "
                             f"(default: torch's current count, {torch.get_num_threads()} here)")
    parser.add_argument("--json", type=Path, help="also write the results here")


def _llc_bytes() -> int:
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024**2}.get(text[-1], 1)
        best = max(best, int(text.rstrip("KM")) * scale)
    return best or 32 * 1024**2


def _time(fn, operands, min_time: float, warm: bool = True) -> float:
    """Seconds per call, cycling through ``operands`` (one weight copy per call)."""
    if warm:
        for op in operands[:2]:
            fn(op)
    calls, start = 0, time.perf_counter()
    while True:
        for op in operands:
            fn(op)
        calls += len(operands)
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls


def memory_bandwidth(nbytes: int = 1 << 30) -> dict[str, float]:
    """Read and copy bandwidth over ``nbytes``, each the best of ROUNDS rounds (as the cells are).

    Read is the faster of two reductions (sum, max) that do almost no arithmetic per byte,
    so the figure is the memory's limit rather than one reduction's. It is measured before
    and after the projections (see :func:`run`): on a shared VM it moved from 30 to 57 GB/s
    between runs, and a low reading would flatter the M=1 fraction.
    """
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    read = min(_time(fn, [src], 0.2) for _ in range(ROUNDS) for fn in (torch.sum, torch.amax))
    copy = min(_time(lambda t: dst.copy_(t), [src], 0.2) for _ in range(ROUNDS))
    return {"read_gbs": nbytes / read / GB, "copy_gbs": 2 * nbytes / copy / GB}


def kernel_facts() -> dict:
    """What the kernels ran on: the provider and why it was chosen, the native library's ISA and VLEN,
    and the ``isa`` line of /proc/cpuinfo (riscv64 only; on x86 the provenance's cpu_model says it).

    ``kernel_isa`` is the library's own ``kernel_isa()`` ("rvv vlen=256", or "generic" for its scalar
    twins) wherever it loads, whichever provider won; ``None``, like ``vlen``, where it does not.
    """
    rvv.status()  # loads the library where it can run (cached), so its ISA is known even when it lost
    native = torch.ops.sglang_rvv_native
    kernel_isa = native.kernel_isa() if hasattr(native, "kernel_isa") else None
    vlen = re.search(r"\bvlen=(\d+)", kernel_isa or "")
    return {"provider": PROVIDER_NAME, "provider_reason": PROVIDER_REASON, "kernel_isa": kernel_isa,
            "vlen": int(vlen.group(1)) if vlen else None, "isa": host.cpu_isa()}


def _bench_policy(modules: list[torch.nn.Module]) -> RvvPolicy:
    """A policy over standalone projections: the same routing and state as in a model."""
    root = torch.nn.Module()
    root.copies = torch.nn.ModuleList(modules)
    root.config = SimpleNamespace(tie_word_embeddings=False)
    kinds = {k: k for k in routing.PROJECTIONS}
    adapter = Adapter("bench", kinds, lambda m: True, install_routed_linear, lambda m: False)
    policy = RvvPolicy(root, adapter, RvvPolicyConfig(memory_budget_mib=2**40))
    policy.reconcile()
    policy.root = root  # keep the container alive: the policy holds it weakly
    # A benchmark measures: its route table is never one left in the cache by an earlier
    # (possibly busy) run.
    with tempfile.TemporaryDirectory(prefix="sglang-rvv-bench-routes-") as table_dir:
        print(warm_up(policy, table_dir=table_dir).summary(), file=sys.stderr, flush=True)
    return policy


def _measure(kind: str, n: int, k: int, rows: int, linears, min_time: float) -> dict:
    """Each variant's fastest of ROUNDS interleaved rounds of ``min_time / ROUNDS``: a burst of
    other work then has to hit the same variant in every round to skew a ratio (the route
    table is measured the same way)."""
    weights = [lin.weight for lin in linears]
    packed = [lin._buffers[BUFFER] for lin in linears]
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    key = bodies.RegionalShapeKey(torch.bfloat16, "cpu", kind, rows, n, k, bodies.Mode.EXPLICIT_PACKED)
    compiled = bodies.COMPILED.get(key)
    variants = {
        "linear_us": (lambda w: F.linear(x, w), weights),
        "compiled_us": (lambda p: compiled(x, p, n), packed),
        "eager_us": (lambda p: packed_bf16_linear(x, p, n), packed),
        "policy_us": (lambda lin: lin(x), linears),
        "linear_again_us": (lambda w: F.linear(x, w), weights),
    }
    if rows == 1:
        # The same weight copies read by a reduction with next to no arithmetic, in the same
        # rounds: decode's limit at the moment the cell ran (the VM's bandwidth drifts).
        variants["read_us"] = (lambda w: w.view(torch.float32).amax(), weights)
    best = dict.fromkeys(variants, math.inf)
    with torch.inference_mode():
        for round_ in range(ROUNDS):
            for name, (fn, operands) in variants.items():
                seconds = _time(fn, operands, min_time / ROUNDS, warm=round_ == 0)
                best[name] = min(best[name], seconds * 1e6)
    return dict(projection=kind, n=n, k=k, rows=rows, **best)


def _print_m1_by_threads(runs: list[dict]) -> None:
    m1 = [(r["threads"], m1_gbs(r["results"])) for r in runs]
    if all(gbs["compiled"] is not None for _, gbs in m1):
        for name, label in (("compiled", "packed compiled"), ("linear", "F.linear")):
            print(f"# M=1 {label} GB/s by threads: " + ", ".join(f"{t}: {gbs[name]:.2f}" for t, gbs in m1),
                  flush=True)


def run(args: argparse.Namespace) -> int:
    unknown = set(args.projections.split(",")) - set(LLAMA_3_2_1B)
    if unknown:
        sys.exit(f"unknown projection(s) {sorted(unknown)}; choose from {list(LLAMA_3_2_1B)}")
    counts = args.threads or [torch.get_num_threads()]
    facts = kernel_facts()
    argv = ["--projections", args.projections, "--rows", args.rows, "--min-time", str(args.min_time)]
    runs = threads.runs("linear", argv, counts, lambda: _run_here(args, facts))
    if len(counts) > 1:  # each child printed its own table as it went
        _print_m1_by_threads(runs)
    if args.json:
        args.json.write_text(json.dumps({**facts, "runs": runs}, indent=1))
    return 0


def _run_here(args: argparse.Namespace, facts: dict) -> dict:
    """Every cell at torch's current thread count, in this process."""
    projections = args.projections.split(",")
    rows_list = [int(r) for r in args.rows.split(",")]
    llc = _llc_bytes()
    torch.manual_seed(0)
    print(f"# torch {torch.__version__}, provider {PROVIDER_NAME}, threads {torch.get_num_threads()}, "
          f"LLC {llc / 2**20:.0f} MiB", flush=True)
    print(f"# provider reason: {facts['provider_reason']}; native kernels: {facts['kernel_isa'] or 'not loaded'}, "
          f"VLEN {facts['vlen'] or 'n/a'}; /proc/cpuinfo isa: {facts['isa'] or 'n/a'}", flush=True)
    before = memory_bandwidth()
    print(f"# memory bandwidth: read {before['read_gbs']:.1f} GB/s, copy {before['copy_gbs']:.1f} GB/s "
          "(measured again at the end; the higher one counts)", flush=True)

    results = []
    header = ("| projection | N x K | M | F.linear us | packed compiled us | packed eager us | policy us "
              "| linear/compiled | linear/policy | linear/again | GB/s linear | GB/s compiled | policy route |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for kind in projections:
        n, k = LLAMA_3_2_1B[kind]
        weight_bytes = n * k * 2
        copies = max(2, math.ceil(4 * llc / weight_bytes))
        print(f"# {kind}: {copies} weight copies ({copies * weight_bytes / 2**20:.0f} MiB), packing...",
              file=sys.stderr, flush=True)
        linears = []
        for _ in range(copies):
            lin = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
            torch.nn.init.normal_(lin.weight, std=0.02)
            lin.requires_grad_(False)
            linears.append(lin)
        modules = []
        for lin in linears:
            holder = torch.nn.Module()
            setattr(holder, kind, lin)
            modules.append(holder)
        policy = _bench_policy(modules)
        for rows in rows_list:
            row = _measure(kind, n, k, rows, linears, args.min_time)
            routes = sorted({r for (_, r, _), c in policy.counters.items() if c})
            policy.counters.clear()
            row.update(policy_routes=routes, linear_gbs=weight_gbs(row, "linear"),
                       compiled_gbs=weight_gbs(row, "compiled"))
            results.append(row)
            cells = [kind, f"{n}x{k}", rows] + [f"{row[c]:.0f}" for c in
                                                  ("linear_us", "compiled_us", "eager_us", "policy_us")]
            cells += [f"{row['linear_us'] / row[c]:.2f}" for c in ("compiled_us", "policy_us", "linear_again_us")]
            cells += [f"{row[c]:.1f}" for c in ("linear_gbs", "compiled_gbs")]
            cells.append(", ".join(routes))
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)
        del policy, linears, modules
    after = memory_bandwidth()
    bw = {key: max(before[key], after[key]) for key in before}
    print(f"# memory bandwidth at the end: read {after['read_gbs']:.1f} GB/s, copy {after['copy_gbs']:.1f} GB/s; "
          f"counted: read {bw['read_gbs']:.1f}, copy {bw['copy_gbs']:.1f}", flush=True)
    gbs = m1_gbs(results)
    if gbs["read"]:
        projections = sum(r["rows"] == 1 for r in results)
        for name in ("linear", "compiled"):
            print(f"# M=1 across {projections} projections, {name}: {gbs[name]:.1f} GB/s = "
                  f"{gbs[name] / gbs['read']:.0%} of the {gbs['read']:.1f} GB/s read in the same rounds "
                  f"({gbs[name] / bw['read_gbs']:.0%} of the best 1 GiB read)")
    return {**threads.this_run(), "bandwidth": bw, "bandwidth_before": before,
            "bandwidth_after": after, "results": results}
