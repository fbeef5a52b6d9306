"""``python -m sglang_rvv.boardmodel.counters [--shapes ...] [--layouts ...] [--lock LOCK] --run-dir DIR``:
the board model's workloads measured natively on the machine this runs on (a riscv64 board, in the
model image): the same guest, shapes, seeds, phases and one thread as the counts under qemu, each
mark reading this process's counters (perf_event_open: user-space instructions and cycles, as
``perf stat`` counts them) and the clock. Writes ``board-counters.json`` into the run directory and
prints the directory on stdout; beside a ``board-model.json`` of the same workloads, the report
sets the two side by side, which is what calibrates the model's IPCs.

Where the counters cannot be read (no PMU, ``kernel.perf_event_paranoid``, a container's seccomp
profile, qemu-user), the file says why and keeps the clock's seconds per phase, the command says
so on stderr and still exits 0. A workload that fails is an error (exit 2), as under qemu.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import asdict
from pathlib import Path

from ..bench.results import default_run_dir, utc_stamp
from ..host import cpu_isa
from ..jsonfile import write_json
from ..layout import WEIGHT_DTYPES
from . import perfcounters, run
from .tool import LOCK, ToolError

RESULT = "board-counters.json"
SCHEMA = 1
LABEL = "measured on this machine with perf_event_open, one thread, user space"


def phase_values(first: dict, last: dict) -> dict:
    """One phase's counts: each counter's and the clock's difference between its two marks."""
    out = {key: last[key] - first[key] for key in last if not key.endswith("_multiplexed")}
    out.update({key: True for key in (*first, *last) if key.endswith("_multiplexed")})
    return out


def measure(work: run.Workload, events: list[str], scratch: Path, pinned: dict) -> dict:
    """Run ``work``'s guest natively with ``events`` read at its marks; its phases' values."""
    result = scratch / f"{work.label}.json"
    argument = run.spec(work, result, pinned, counters=events)
    proc = subprocess.run([sys.executable, str(run.GUEST), json.dumps(argument)], env=run.environment(),
                          capture_output=True, text=True)
    out = run.outcome(work, proc, result)
    readings = out["readings"]
    marks = readings["marks"]
    phases = {name: phase_values(marks[first], marks[last]) for name, (first, last) in run.phase_marks(work).items()}
    return {"workload": asdict(work), "label": work.label, "shape": argument["shape"], "tokens": out["tokens"],
            "provider": (out["report"] or {}).get("provider"), "error": readings.get("error"),
            "phases": phases, "per_token": phases[run.PER_TOKEN]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.boardmodel.counters", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(run.BENCH_SHAPES),
                        help="tiny, or shapes of the lock's [tools.count.shapes] (default: make bench's)")
    parser.add_argument("--layouts", nargs="*", default=list(WEIGHT_DTYPES), choices=WEIGHT_DTYPES,
                        help="the policy's layouts after the policy off (none: the policy off only)")
    run.add_lm_head_option(parser)
    parser.add_argument("--events", default=",".join(perfcounters.HARDWARE),
                        help=f"comma-separated, of {', '.join(perfcounters.EVENTS)} (default %(default)s)")
    parser.add_argument("--lock", type=Path, default=LOCK,
                        help="the images/lock.toml that pins the shapes (the model image has none: mount "
                             "the shipped source's)")
    parser.add_argument("--run-dir", type=Path, help="write into this run directory (default: "
                                                      "results/<host>/<UTC timestamp>)")
    args = parser.parse_args(argv)
    events = [e for e in args.events.split(",") if e]
    unknown = [e for e in events if e not in perfcounters.EVENTS]
    if unknown or not events:
        parser.error(f"--events {args.events}: choose from {', '.join(perfcounters.EVENTS)}")
    run_dir = args.run_dir or default_run_dir()
    results, skipped = [], {}
    try:
        if not args.lock.is_file():
            raise ToolError(f"--lock {args.lock}: no such file; pass the project's images/lock.toml")
        pinned = tomllib.loads(args.lock.read_text())["tools"]["count"].get("shapes", {})
        for name in args.shapes:
            run.shape(name, pinned)
        with tempfile.TemporaryDirectory(prefix="sglang-rvv-counters-") as scratch:
            for work in run.workloads(args.shapes, args.layouts, args.lm_head):
                print(f"counters: measuring {work.label}", file=sys.stderr, flush=True)
                try:
                    results.append(measure(work, events, Path(scratch), pinned))
                except run.LayoutMissing as missing:
                    skipped[work.label] = str(missing)
                    print(f"counters: skipped {missing}", file=sys.stderr)
    except ToolError as error:
        print(f"counters: error: {error}", file=sys.stderr)
        return 2
    unavailable = next((r["error"] for r in results if r["error"]), None)
    if unavailable:
        print(f"counters: no counts, the clock only: {unavailable}", file=sys.stderr)
    write_json(run_dir / RESULT, {
        "schema": SCHEMA, "kind": "board_counters", "written_utc": utc_stamp(), "label": LABEL,
        "host": platform.node(), "machine": platform.machine(), "isa": cpu_isa(), "events": events,
        "unavailable": unavailable, "per_token_phase": run.PER_TOKEN, "workloads": results, "skipped": skipped})
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
