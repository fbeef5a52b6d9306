"""The gate's checked-in baseline: instructions per decode token per component of the tiny model
(policy on, BF16, VLEN 256), and the M=1 kernel's vector loads per packed weight byte per layout.

``python -m sglang_rvv.boardmodel.baseline [--layouts ...] [PATH]`` counts the gated workload and
rewrites PATH (default tests/images/data/board-model-baseline.json) with ``reason`` reset to a
placeholder the gate refuses: updating the baseline is a deliberate edit that states, in that
field, the reviewed reason the counts changed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..jsonfile import write_json
from ..layout import WEIGHT_DTYPES
from . import rootfs, run, tool
from .counts import COMPONENT_NAMES

PATH = tool.REPO / "tests" / "images" / "data" / "board-model-baseline.json"
PLACEHOLDER = "UNREVIEWED: replace with the reviewed reason these counts changed"
# Per component: an increase above max(RELATIVE x baseline, ABSOLUTE) fails. The interpreter
# varies by about 1 % of its count run to run (shared/board.md); the rest repeat exactly.
RELATIVE = 0.02
ABSOLUTE = 20_000
LOADS_RELATIVE = 0.001  # vector loads per weight byte: the kernel reads each packed byte once
# A projection call's instructions outside the kernel library: an increase above
# max(RELATIVE x baseline, CALL_ABSOLUTE) fails.
CALL_ABSOLUTE = 500
CALLS = 64
GATED = run.Workload("tiny", policy=True, weight_dtype="bf16", prompt_len=4, decode_steps=2, calls=CALLS)


def measure(counter: tool.Tool, root, work: run.Workload, scratch) -> dict:
    result = run.count(counter, root, work, scratch)
    step = result["phases"]["decode2"]["components"]
    kernel = step["kernel"]
    return {"insns": {name: step[name]["insns"] for name in COMPONENT_NAMES},
            "kernel_loads_per_weight_byte": kernel["vec_loads"] / result["packed_bytes"],
            "kernel_load_bytes_per_weight_byte": kernel["vec_load_bytes"] / result["packed_bytes"],
            "per_call": per_call(result, work.calls) if work.calls else None,
            "emulated_seconds": result["emulated_seconds"]}


def per_call(result: dict, calls: int) -> dict:
    """Instructions per projection call (M=1, eager packed route) outside the kernel library, per
    component, through the module (``projection``), through its bare native op (``op``: torch's
    dispatcher and the op's entry) and through that op call compiled with torch.compile's eager
    backend (``compiled``: Dynamo's guards and frame as well); ``kernel`` is the library's own, the
    same in all three."""
    out = {}
    for name, phase in (("projection", "projection_calls"), ("op", "op_calls"), ("compiled", "compiled_calls")):
        components = result["phases"][phase]["components"]
        out[name] = {c: round(components[c]["insns"] / calls) for c in COMPONENT_NAMES if c != "kernel"}
    out["kernel"] = round(result["phases"]["projection_calls"]["components"]["kernel"]["insns"] / calls)
    return out


def outside_kernel(calls: dict, route: str) -> int:
    return sum(calls[route].values())


def compare_insns(baseline: dict, measured: dict) -> list[str]:
    """One line per component whose instructions per token grew past the tolerance."""
    out = []
    for name in COMPONENT_NAMES:
        base, now = baseline["insns"][name], measured["insns"][name]
        allowed = max(RELATIVE * base, ABSOLUTE)
        if now - base > allowed:
            out.append(f"{name}: {now:,} instructions per decode token, baseline {base:,} "
                       f"(+{now - base:,}, +{(now - base) / max(base, 1):.1%}; tolerance "
                       f"{allowed:,.0f})")
    return out


def compare_call(baseline: dict, measured: dict) -> str | None:
    """Why a projection call's instructions outside the kernel library grew past the tolerance, or None."""
    if "per_call" not in baseline:
        return "the baseline has no per_call counts: run `python -m sglang_rvv.boardmodel.baseline` and state why"
    base, now = (outside_kernel(counts, "projection") for counts in (baseline["per_call"], measured["per_call"]))
    allowed = max(RELATIVE * base, CALL_ABSOLUTE)
    if now - base > allowed:
        return (f"a projection call: {now:,} instructions outside the kernel library, baseline {base:,} "
                f"(+{now - base:,}; tolerance {allowed:,.0f}); per component now "
                f"{measured['per_call']['projection']}, baseline {baseline['per_call']['projection']}")
    return None


def compare_loads(baseline: dict, layout: str, per_byte: float) -> str | None:
    base = baseline["kernel_loads_per_weight_byte"].get(layout)
    if base is None:
        return (f"layout {layout} has no baseline: run `python -m sglang_rvv.boardmodel.baseline` "
                "and state the reason")
    if per_byte - base > LOADS_RELATIVE * base:
        return (f"layout {layout}: {per_byte:.6f} vector loads per weight byte, baseline "
                f"{base:.6f} (+{(per_byte - base) / base:.2%})")
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.boardmodel.baseline",
                                     description=__doc__)
    parser.add_argument("path", nargs="?", type=Path, default=PATH)
    parser.add_argument("--layouts", nargs="+", default=list(WEIGHT_DTYPES), choices=WEIGHT_DTYPES)
    args = parser.parse_args(argv)
    try:
        counter = tool.build()
        root = rootfs.prepare()
        rootfs.check(root)
        scratch = run.scratch_dir()
        tool.check_loads_plugin(counter, scratch, root / "usr/bin/true", root)
        measured = measure(counter, root, GATED, scratch)
        loads = {"bf16": measured["kernel_loads_per_weight_byte"]}
        for layout in args.layouts:
            if layout == "bf16":
                continue
            try:
                work = run.Workload("tiny", policy=True, weight_dtype=layout, decode_steps=2)
                loads[layout] = measure(counter, root, work, scratch)["kernel_loads_per_weight_byte"]
            except run.LayoutMissing as missing:
                print(f"baseline: skipped {missing}", file=sys.stderr)
    except tool.ToolError as error:
        print(f"baseline: error: {error}", file=sys.stderr)
        return 2
    write_json(args.path, {
        "reason": PLACEHOLDER, "workload": "tiny model (sglang_rvv.tiny), policy on, second decode "
        f"step at M=1 after a 4-token prefill, 1 thread, VLEN 256; then {CALLS} calls of its first "
        f"o_proj at M=1 through the module, {CALLS} of its native op, and {CALLS} of that op call compiled "
        "(torch.compile, eager backend)",
        "qemu_cpu": counter.qemu_cpu, "plugin_source_sha256": tool.sha256(tool.SOURCE),
        "insns": measured["insns"], "per_call": measured["per_call"], "kernel_loads_per_weight_byte": loads})
    print(args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
