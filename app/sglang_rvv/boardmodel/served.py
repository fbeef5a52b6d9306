"""``python -m sglang_rvv.boardmodel.served`` (``make served-count``): the served token, counted and
priced. SGLang's real server of each shape (seeded random BF16 weights, written once per shape)
serves flag on in each layout under the counting qemu (:mod:`.serving`); each row prices its
per-token count with the board model and goes into ``served-count.json`` in a run directory whose
path is the last line on stdout (progress on stderr).

    [--shapes qwen3-0.6b] [--layouts int4] [--lm-head LAYOUT] [--candidates K] [--threads 4 8] [--tokens 3,7]
    [--run-dir DIR]

A served token is the scheduler's (it runs the model's forward, batch building and sampling; the
HTTP server and the detokenizer run beside it on cores of their own): the kernel library's count
as counted, and everything else at the by-thread estimate (``serving._threads``), its components
in the proportions the process's count gives them. The bytes a token streams are the packed
buffers the server's own report names, the rest of the weights at BF16.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..bench.results import default_run_dir, utc_stamp
from ..checkpoint import write_tiny_checkpoint
from ..jsonfile import write_json
from ..layout import WEIGHT_DTYPES
from . import model, rootfs, run, serving, tool

RESULT = "served-count.json"
SCHEMA = 1
LABEL = "modelled from emulated instruction counts, not measured on a board"
PORT = 31991


def log(text: str) -> None:
    print(f"served-count: {text}", file=sys.stderr, flush=True)


def checkpoint(name: str) -> Path:
    """The shape's served checkpoint: seeded random BF16 weights (the policy-forward counts' own
    draw) and the tiny tokenizer, written once and kept beside the counter's cache."""
    shape = run.shape(name)
    out = tool.CACHE / "served-models" / name
    if not (out / "config.json").is_file():
        log(f"writing {name}'s checkpoint (seeded random BF16 weights) to {out}")
        write_tiny_checkpoint(out, shape["arch"], seed=0, **{k: v for k, v in shape.items() if k != "arch"})
    return out


def token_components(scheduler: dict) -> dict[str, dict]:
    """The scheduler's per-token components: the kernel as counted, the rest scaled so that its
    instructions sum to the by-thread estimate outside the kernel."""
    raw = scheduler["per_token_raw"]
    outside = scheduler.get("thread_estimate")
    if outside is None:
        raise tool.ToolError("the scheduler's count has no thread rows: the plugin ran without threads=1")
    outside -= raw["kernel"]["insns"]
    counted = sum(v["insns"] for name, v in raw.items() if name != "kernel")
    scale = max(0.0, outside) / counted if counted else 0.0
    return {name: dict(v) if name == "kernel" else {k: x * scale for k, x in v.items()}
            for name, v in raw.items()}


def streamed_bytes(report: dict) -> int:
    """A served token's weight bytes: the report's packed buffers, when they hold every projection
    and lm_head (what a row-major weight would add is not in the server's report)."""
    if report.get("skipped") or "lm_head" not in report.get("packed", ()):
        raise tool.ToolError(f"the served model left projections row-major ({report.get('skipped') or 'lm_head'}): "
                             "its bytes a token are not all in the report; choose a layout that packs them")
    return report["packed_bytes"]


def priced_rows(name: str, layout: str, counted: dict, report: dict, threads) -> list[dict]:
    """One row per thread count; ``exact_candidates``: the logits rescored from BF16 (0: none)."""
    components = token_components(counted["processes"]["scheduler"])
    weight = streamed_bytes(report)
    outside = sum(v["insns"] for k, v in components.items() if k != "kernel")
    exact = report["config"].get("lm_head_exact_candidates", 0)
    rows = []
    for t in threads:
        p = model.predict(components, weight, t)
        rows.append({"shape": name, "layout": layout, "lm_head": report["layouts"].get("lm_head"),
                     "speculative": None, "exact_candidates": exact, "threads": t,
                     "outside_kernels_per_token": outside,
                     "kernel_per_token": components["kernel"]["insns"], "bytes_per_token": weight,
                     "modelled_tok_s": p["tok_per_s"], "bound": p["bound"],
                     "seconds_outside_kernels": sum(v for k, v in p["component_seconds"].items() if k != "kernel")})
    return rows


def count(counter: tool.Tool, root: Path, name: str, layout: str, lm_head: str | None, scratch: Path,
          tokens: tuple[int, int], candidates: int = 0) -> tuple[dict, dict]:
    """One served count: (the serving count, the server's policy report)."""
    # Beside the scratch, not in it: every JSON file there is a process of the server's.
    report_path = scratch.with_name(f"{scratch.name}-report.json")
    scratch.mkdir(parents=True, exist_ok=True)
    report_path.unlink(missing_ok=True)
    extra = ["--cpu-rvv-weight-dtype", layout, "--cpu-rvv-report-path", str(report_path),
             *(["--cpu-rvv-lm-head-dtype", lm_head] if lm_head else []),
             *(["--cpu-rvv-lm-head-candidates", str(candidates)] if candidates else [])]
    counted = serving.count_serving(counter, root, checkpoint(name), scratch, PORT, *tokens,
                                    extra_args=extra, log=log)
    if not report_path.is_file():
        raise tool.ToolError(f"{name} {layout}: the counted server wrote no policy report")
    return counted, json.loads(report_path.read_text())


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.boardmodel.served", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["qwen3-0.6b"],
                        help="shapes of images/lock.toml [tools.count.shapes] (default: %(default)s)")
    parser.add_argument("--layouts", nargs="+", default=["int4"], choices=WEIGHT_DTYPES)
    run.add_lm_head_option(parser)
    parser.add_argument("--candidates", type=int, default=0,
                        help="a quantized lm_head's exact greedy picks: rescore its top K from the BF16 rows "
                             "(--cpu-rvv-lm-head-candidates; default 0, off)")
    model.add_threads_option(parser)
    parser.add_argument("--tokens", default="3,7", help="the two request lengths (default %(default)s)")
    parser.add_argument("--image", help=f"the riscv64 runtime image (default {rootfs.image_name()})")
    parser.add_argument("--run-dir", type=Path, help="write into this run directory (default: results/<host>/<UTC>)")
    args = parser.parse_args(argv)
    try:
        args.tokens = tuple(int(v) for v in args.tokens.split(","))
    except ValueError:
        parser.error(f"--tokens {args.tokens!r}: give two request lengths, SHORT,LONG")
    if len(args.tokens) != 2 or not 0 < args.tokens[0] < args.tokens[1]:
        parser.error(f"--tokens {args.tokens!r}: give two request lengths, the second longer")
    if args.candidates < 0:
        parser.error("--candidates: give 0 (off) or the number of logits to rescore")
    return args


def count_all(args, counter: tool.Tool | None = None, root: Path | None = None) -> tuple[list[dict], list[dict]]:
    """Every (shape, layout) the arguments ask for, one server at a time (a board-sized server
    holds gigabytes): the priced rows, and each count as counted."""
    for name in args.shapes:
        run.shape(name)  # an unknown shape fails before anything is counted
    counter = counter or tool.build()
    root = root or rootfs.prepare(args.image)
    rows, counts = [], []
    for name in args.shapes:
        for layout in args.layouts:
            log(f"counting the served {name} {layout}")
            counted, report = count(counter, root, name, layout, args.lm_head, run.scratch_dir() / "served",
                                    args.tokens, args.candidates)
            log(f"counted the served {name} {layout} ({counted['emulated_seconds']:.0f} s under qemu)")
            rows.extend(priced_rows(name, layout, counted, report, args.threads))
            counts.append({"shape": name, "layout": layout, "report": report, "counted": counted})
    return rows, counts


def main(argv=None) -> int:
    args = parse(argv)
    run_dir = args.run_dir or default_run_dir()
    try:
        counter = tool.build()
        root = rootfs.prepare(args.image)
        found = rootfs.check(root)
        rows, counts = count_all(args, counter, root)
    except tool.ToolError as error:
        print(f"served-count: error: {error}", file=sys.stderr)
        return 2
    write_json(run_dir / RESULT, {
        "schema": SCHEMA, "kind": "served_count", "written_utc": utc_stamp(), "label": LABEL,
        "inputs": {"qemu_cpu": counter.qemu_cpu, "rootfs": found}, "constants": model.constants_json(),
        "rows": rows, "counts": counts})
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
