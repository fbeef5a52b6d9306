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
GATED = run.Workload("tiny", policy=True, weight_dtype="bf16", prompt_len=4, decode_steps=2)


def measure(counter: tool.Tool, root, work: run.Workload, scratch) -> dict:
    result = run.count(counter, root, work, scratch)
    step = result["phases"]["decode2"]["components"]
    kernel = step["kernel"]
    return {"insns": {name: step[name]["insns"] for name in COMPONENT_NAMES},
            "kernel_loads_per_weight_byte": kernel["vec_loads"] / result["packed_bytes"],
            "kernel_load_bytes_per_weight_byte": kernel["vec_load_bytes"] / result["packed_bytes"],
            "emulated_seconds": result["emulated_seconds"]}


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
        "step at M=1 after a 4-token prefill, 1 thread, VLEN 256",
        "qemu_cpu": counter.qemu_cpu, "plugin_source_sha256": tool.sha256(tool.SOURCE),
        "insns": measured["insns"], "kernel_loads_per_weight_byte": loads})
    print(args.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
