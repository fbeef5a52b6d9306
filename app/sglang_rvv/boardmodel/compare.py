"""``python -m sglang_rvv.boardmodel.compare`` (``make peer-compare``): llama.cpp and the appliance
counted by one instrument and priced by one board model, side by side, into ``peer-compare.json``
in a run directory whose path is the last line on stdout (progress on stderr).

    [--shapes ...] [--formats ...] [--paths vec_dot repack] [--threads 4 8] [--layouts ...] [--served ...]
    [--jobs N] [--run-dir DIR]

Each engine's model is counted once (one guest thread, under the counting qemu) and priced at each
thread count with the same constants (``model.CONSTANTS``). A published anchor (``model.PEER_ANCHORS``)
is set beside the row it can be compared with, with the prediction's error; an anchor without
such a row is named on stderr and in the JSON, never matched to another row.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..bench.results import default_run_dir, utc_stamp
from ..jsonfile import write_json
from ..layout import WEIGHT_DTYPES
from . import model, peer, peer_build, peer_models, rootfs, run, served, tool

RESULT = "peer-compare.json"
SCHEMA = 1
LABEL = "modelled from emulated instruction counts, not measured on a board"
# The peer compare's models and llama.cpp formats: Qwen3-0.6B and Qwen2.5-0.5B at 4 and 8 bits
# (IME's published models), TinyLlama at Q4_K_M (the plain-RVV calibration anchor).
PEER_FORMATS = {"qwen3-0.6b": ("Q4_0", "Q8_0"), "tinyllama-1.1b": ("Q4_K_M",), "qwen2.5-0.5b": ("Q4_0", "Q8_0")}
PATHS = ("vec_dot", "repack")
PRICED_PREFILL = 128  # the product's prefill target is a 128-token prompt, whatever length was counted
OUR_LAYOUTS = ("bf16", "int8", "int4", "int4_a8")
# The product's targets, judged here (modelled): ours over llama.cpp's plain-RVV Q4_0 of the same
# model at the same threads.
TARGETS = ({"what": "decode", "ours": "int4", "peer_format": "Q4_0", "at_least": 1.2},
           {"what": "prefill128", "ours": "int4", "peer_format": "Q4_0", "at_least": 1.0})


def log(text: str) -> None:
    print(f"peer-compare: {text}", file=sys.stderr, flush=True)


def priced_row(result: dict, engine: str, path: str, fmt: str, threads: int, weight_bytes: int) -> dict:
    decode = result["phases"][run.PER_TOKEN]["components"]
    prefill = result["phases"][run.PREFILL]["components"]
    tokens = result["workload"]["prefill_len"]
    d = model.predict(decode, weight_bytes, threads)
    p = model.predict_prefill(prefill, weight_bytes, result["shape"], tokens, PRICED_PREFILL, threads)
    outside = sum(v["insns"] for name, v in decode.items() if name != "kernel")
    return {"engine": engine, "path": path, "model": result["workload"]["name"], "format": fmt, "threads": threads,
            "decode_instructions": sum(v["insns"] for v in decode.values()),
            "decode_kernel_instructions": decode["kernel"]["insns"], "decode_outside_kernel_instructions": outside,
            f"prefill{tokens}_instructions": sum(v["insns"] for v in prefill.values()),
            f"prefill{tokens}_kernel_instructions": prefill["kernel"]["insns"],
            "bytes_per_token": weight_bytes, "modelled_decode_tok_s": d["tok_per_s"], "decode_bound": d["bound"],
            "modelled_prefill_tok_s": p["tok_per_s"], "prefill_bound": p["bound"], "prefill_tokens": tokens,
            "modelled_prefill_tokens": PRICED_PREFILL,
            "published_tok_s": None, "error": None, "_counted": result}


def served_row(row: dict) -> dict:
    """A served token's priced row (served.priced_rows) in the compare's shape: decode only (a
    served prefill is not counted)."""
    return {"engine": "sglang-rvv", "path": "served", "model": row["shape"], "format": row["layout"],
            "threads": row["threads"],
            "decode_instructions": row["kernel_per_token"] + row["outside_kernels_per_token"],
            "decode_kernel_instructions": row["kernel_per_token"],
            "decode_outside_kernel_instructions": row["outside_kernels_per_token"], "lm_head": row["lm_head"],
            "bytes_per_token": row["bytes_per_token"], "modelled_decode_tok_s": row["modelled_tok_s"],
            "decode_bound": row["bound"], "modelled_prefill_tok_s": None, "prefill_bound": None, "prefill_tokens": None,
            "published_tok_s": None, "error": None, "_counted": None}


def held_to_anchors(rows: list[dict]) -> list[dict]:
    """Each published anchor with the row it is compared with: a calibration anchor's error, or a
    bound's ratio; ``comparable: null`` and a line on stderr where no counted row matches."""
    out = []
    for anchor in model.PEER_ANCHORS:
        entry = {**anchor}
        match = next((r for r in rows if r["engine"] == "llama.cpp" and r["path"] == anchor["compare_path"]
                      and r["model"] == anchor["model"] and r["format"] == anchor["format"]
                      and r["threads"] == anchor["threads"]), None)
        if match is None:
            entry["comparable"] = None
            log(f"anchor {anchor['what']}: no comparable count (needs llama.cpp {anchor['compare_path']} "
                f"{anchor['model']} {anchor['format']} at {anchor['threads']} threads)")
            out.append(entry)
            continue
        counted = match["_counted"]
        prefill = model.predict_prefill(counted["phases"][run.PREFILL]["components"], match["bytes_per_token"],
                                        counted["shape"], match["prefill_tokens"], anchor["prefill_tokens"],
                                        match["threads"])["tok_per_s"]
        modelled = {"decode": match["modelled_decode_tok_s"], "prefill": prefill}
        published = {"decode": anchor["decode_tok_s"], "prefill": anchor["prefill_tok_s"],
                     "prefill_test": f"pp{anchor['prefill_tokens']}"}
        error = {k: modelled[k] / published[k] - 1 for k in ("decode", "prefill")}
        entry.update(comparable=f"{match['engine']} {match['path']} {match['model']} {match['format']} "
                                f"{match['threads']} threads", modelled_tok_s=modelled, error=error)
        if anchor["use"] == "calibration":
            match.update(published_tok_s=published, error=error, modelled_anchor_prefill_tok_s=prefill)
        out.append(entry)
    return out


def ratios(rows: list[dict]) -> list[dict]:
    """The product's targets: ours over llama.cpp's plain RVV, per model, path and thread count."""
    out = []
    for target in TARGETS:
        key = "modelled_decode_tok_s" if target["what"] == "decode" else "modelled_prefill_tok_s"
        for ours in (r for r in rows if r["engine"] == "sglang-rvv" and r["format"] == target["ours"]
                     and r[key] is not None):
            for theirs in (r for r in rows if r["engine"] == "llama.cpp" and r["model"] == ours["model"]
                           and r["format"] == target["peer_format"] and r["threads"] == ours["threads"]):
                value = ours[key] / theirs[key]
                out.append({"what": target["what"], "model": ours["model"], "threads": ours["threads"],
                            "ours": f"{ours['path']} {ours['format']}", "peer": f"llama.cpp {theirs['path']} "
                            f"{theirs['format']}", "ratio": value, "target": target["at_least"],
                            "met": value >= target["at_least"]})
    return out


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.boardmodel.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(PEER_FORMATS),
                        help="shapes of images/lock.toml [tools.count.shapes] (default: %(default)s)")
    parser.add_argument("--formats", nargs="+", help="llama-quantize types for every shape (default: per shape, "
                        + "; ".join(f"{k}: {' '.join(v)}" for k, v in PEER_FORMATS.items()) + ")")
    parser.add_argument("--paths", nargs="+", default=list(PATHS),
                        help="llama.cpp's weight paths, vec_dot and repack (default: both; none: the appliance only)")
    model.add_threads_option(parser)
    parser.add_argument("--layouts", nargs="+", default=list(OUR_LAYOUTS),
                        help="the appliance's layouts, through the policy's forward (none: llama.cpp only)")
    parser.add_argument("--served", nargs="+", default=[], choices=WEIGHT_DTYPES,
                        help="the appliance's layouts through SGLang's serving loop too (make served-count; "
                             "decode only, one server at a time, 20-40 min each; default: none)")
    parser.add_argument("--prefill", type=int, default=128, help="the counted prefill's length (default 128)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="counts at a time (default: the cores)")
    parser.add_argument("--image", help=f"the riscv64 runtime image (default {rootfs.image_name()})")
    parser.add_argument("--run-dir", type=Path, help="write into this run directory (default: results/<host>/<UTC>)")
    args = parser.parse_args(argv)
    if args.layouts == ["none"]:
        args.layouts = []
    if args.paths == ["none"]:
        args.paths = []
    if any(path not in PATHS for path in args.paths):
        parser.error(f"--paths: choose from {', '.join(PATHS)} or none")
    bad = [layout for layout in args.layouts if layout not in WEIGHT_DTYPES]
    if bad:
        parser.error(f"unknown layout {bad[0]!r}: choose from {', '.join(WEIGHT_DTYPES)} or none")
    if args.prefill < 1:
        parser.error("--prefill: the prefill is priced from its own count; give at least 1 token")
    return args


def count_all(args) -> tuple[list[dict], dict]:
    """Every count the arguments ask for, ``args.jobs`` at a time (each one qemu process on one
    guest thread: counts do not depend on what runs beside them), each priced at every thread count."""
    for name in args.shapes:
        run.shape(name)  # an unknown shape fails before anything is counted
    counter = tool.build()
    scratch = run.scratch_dir()
    inputs, jobs = {"qemu_cpu": counter.qemu_cpu}, []
    if args.paths:
        host = peer_build.require("host")
        build = peer_build.require("rvv")
        known = peer_models.quantize_types(host.path)
        formats = {name: tuple(args.formats or PEER_FORMATS.get(name, ("Q4_0",))) for name in args.shapes}
        for fmt in {f for fs in formats.values() for f in fs}:
            if fmt not in known:
                raise tool.ToolError(f"unknown format {fmt!r}: llama-quantize knows {', '.join(sorted(known))}")
        inputs["peer_build"] = build.manifest
        for name in args.shapes:
            for fmt in formats[name]:
                peer_models.model_file(name, run.shape(name), fmt, log=log)  # made once, before the counts
                for path in args.paths:
                    work = peer.PeerWork(name, fmt, repack=path == "repack", prefill_len=args.prefill)
                    jobs.append(("llama.cpp", path, fmt, work,
                                 lambda work=work: peer.count(counter, build, work, scratch / "peer", log=log)))
    if args.layouts or args.served:
        root = rootfs.prepare(args.image)
        inputs["rootfs"] = rootfs.check(root)
    if args.layouts:
        for name in args.shapes:
            for layout in args.layouts:
                work = run.Workload(name, policy=True, weight_dtype=layout, prefill_len=args.prefill)
                jobs.append(("sglang-rvv", "policy forward", layout, work,
                             lambda work=work: run.count(counter, root, work, scratch)))
    if args.served:
        served_args = served.parse(["--shapes", *args.shapes, "--layouts", *args.served,
                                    "--threads", *map(str, args.threads)])
        jobs.append(("sglang-rvv", "served", None, None,  # one job: one server at a time
                     lambda: [served_row(row) for row in served.count_all(served_args, counter, root)[0]]))

    def counted(job):
        engine, path, fmt, work, count = job
        if work is None:  # the served counts: their own progress, their rows priced
            return count()
        log(f"counting {engine} {work.label}")
        result = count()
        weight = (result["bytes_per_token"] if engine == "llama.cpp" else
                  model.streamed_bytes(result["shape"], result["packed_source_bytes"], result["packed_bytes"]))
        log(f"counted {engine} {work.label} ({result['emulated_seconds']:.0f} s under qemu)")
        return [priced_row(result, engine, path, fmt, t, weight) for t in args.threads]

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = [row for priced in pool.map(counted, jobs) for row in priced]
    return rows, inputs


def main(argv=None) -> int:
    args = parse(argv)
    run_dir = args.run_dir or default_run_dir()
    try:
        rows, inputs = count_all(args)
    except tool.ToolError as error:
        print(f"peer-compare: error: {error}", file=sys.stderr)
        return 2
    anchors = held_to_anchors(rows)
    for row in rows:
        row.pop("_counted")
    write_json(run_dir / RESULT, {
        "schema": SCHEMA, "kind": "peer_compare", "written_utc": utc_stamp(), "label": LABEL,
        "inputs": inputs, "constants": model.constants_json(), "peers": rows, "anchors": anchors,
        "ratios": ratios(rows)})
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
