"""``python -m sglang_rvv.boardmodel [--shapes ...] [--layouts ...] [--serving MODEL_DIR] [--run-dir DIR]``:
count decode steps of each shape with the policy off and on (each layout), price them with the
board model, write ``board-model.json`` into the run directory and print the directory on stdout
(progress on stderr), like ``python -m sglang_rvv.bench suite``. With ``--serving``, SGLang's real
server of that checkpoint is counted too, every process of it (:mod:`.serving`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..bench.results import default_run_dir, utc_stamp
from ..jsonfile import write_json
from ..layout import WEIGHT_DTYPES
from . import model, rootfs, run, serving, tool

RESULT = "board-model.json"
SCHEMA = 1


def priced(result: dict) -> dict:
    step = result["phases"][run.PER_TOKEN]["components"]
    weight = model.streamed_bytes(result["shape"], result["packed_source_bytes"], result["packed_bytes"])
    return {**result, "per_token": step, "weight_bytes": weight,
            "kernel_loads_per_weight_byte": (step["kernel"]["vec_loads"] / result["packed_bytes"]
                                             if result["packed_bytes"] else None),
            "kernel_load_bytes_per_weight_byte": (step["kernel"]["vec_load_bytes"] / result["packed_bytes"]
                                                  if result["packed_bytes"] else None),
            "prediction": model.predict(step, weight)}


def priced_serving(result: dict) -> dict:
    """Each process's per-token instructions outside the kernel library, and their modelled serial
    seconds on one core (the board model's IPCs). On the board the three processes run on cores
    of their own, so the scheduler's (the model's forward, batch building, sampling) is the one
    on a token's path; the others overlap it."""
    for values in result["processes"].values():
        seconds = model.predict(values["per_token"], 0)["component_seconds"]
        values["outside_kernel_insns"] = sum(v["insns"] for name, v in values["per_token"].items() if name != "kernel")
        values["outside_kernel_insns_raw"] = sum(v["insns"] for name, v in values["per_token_raw"].items()
                                                 if name != "kernel")
        values["rest_seconds"] = sum(v for name, v in seconds.items() if name != "kernel")
        if "thread_estimate" in values:
            # The kernel runs on the main thread (one thread counted); the rest of the estimate is
            # the token's serial work, at the IPC every non-kernel component has.
            outside = values["thread_estimate"] - values["per_token_raw"]["kernel"]["insns"]
            values["thread_outside_kernel_insns"] = outside
            values["thread_rest_seconds"] = outside / model.c("ipc_interpreter") / model.c("freq_hz")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.boardmodel", description=__doc__)
    parser.add_argument("--shapes", nargs="*", default=list(run.BENCH_SHAPES),
                        help="the shapes whose decode steps are counted (none: --serving alone)")
    parser.add_argument("--layouts", nargs="+", default=list(WEIGHT_DTYPES), choices=WEIGHT_DTYPES)
    run.add_lm_head_option(parser)
    parser.add_argument("--run-dir", type=Path, help="write into this run directory (default: "
                                                      "results/<host>/<UTC timestamp>)")
    parser.add_argument("--image", help=f"the riscv64 runtime image (default {rootfs.image_name()})")
    parser.add_argument("--serving", type=Path, metavar="MODEL_DIR",
                        help="also count SGLang's serving loop per token, serving this checkpoint (flag on, eager "
                             "packed route): a request of --serving-tokens SHORT,LONG new tokens each")
    parser.add_argument("--serving-tokens", default="4,12", help="the two request lengths (default %(default)s)")
    parser.add_argument("--serving-port", type=int, default=31990,
                        help="the counted server's port (default %(default)s)")
    args = parser.parse_args(argv)
    run_dir = args.run_dir or default_run_dir()
    try:
        for name in args.shapes:
            run.shape(name)
        counter = tool.build()
        root = rootfs.prepare(args.image)
        found = rootfs.check(root)
        scratch = run.scratch_dir()
        tool.check_loads_plugin(counter, scratch, root / "usr/bin/true", root)
        results, skipped = [], {}
        for work in run.workloads(args.shapes, args.layouts, args.lm_head):
            print(f"boardmodel: counting {work.label}", file=sys.stderr, flush=True)
            try:
                results.append(priced(run.count(counter, root, work, scratch)))
            except run.LayoutMissing as missing:  # a layout that has not landed in the image yet
                skipped[work.label] = str(missing)
                print(f"boardmodel: skipped {missing}", file=sys.stderr)
        served = None
        if args.serving:
            short, long = (int(v) for v in args.serving_tokens.split(","))
            print(f"boardmodel: counting SGLang serving {args.serving} ({short} and {long} new tokens)",
                  file=sys.stderr, flush=True)
            served = priced_serving(serving.count_serving(
                counter, root, args.serving.resolve(), scratch / "serving", args.serving_port, short, long,
                log=lambda text: print(f"boardmodel: {text}", file=sys.stderr, flush=True)))
            served["model"] = str(args.serving)
    except tool.ToolError as error:
        print(f"boardmodel: error: {error}", file=sys.stderr)
        return 2
    write_json(run_dir / RESULT, {
        "schema": SCHEMA, "kind": "board_model", "written_utc": utc_stamp(),
        "label": "modelled from emulated instruction counts, not measured on a board",
        "tool": {"qemu": str(counter.qemu), "qemu_version": counter.qemu_version,
                 "qemu_cpu": counter.qemu_cpu, "plugin_source_sha256": tool.sha256(tool.SOURCE)},
        "rootfs": found, "constants": model.constants_json(), "anchors": list(model.ANCHORS),
        "per_token_phase": run.PER_TOKEN, "workloads": results, "skipped": skipped, "serving": served})
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
