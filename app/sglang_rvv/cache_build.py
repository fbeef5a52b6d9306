"""Build the prewarmed Inductor cache that :mod:`sglang_rvv.inductor_cache` checks and seeds.

Building starts a whole SGLang server with ``--cpu-rvv-warmup`` on an empty cache
directory, so it lives apart from the runtime check that every container start runs.

::

    python -m sglang_rvv.cache_build warm MODEL_DIR CACHE_DIR   # compile every key, write the manifest
    python -m sglang_rvv.cache_build check CACHE_DIR MODEL_DIR  # exit 0 when the cache is usable

Both take the packed layout from the container's variables (``SGLANG_RVV_WEIGHT_DTYPE``,
``SGLANG_RVV_GROUP_SIZE``, ``SGLANG_RVV_LM_HEAD_DTYPE``; unset: bf16), as the entrypoint does,
so a cache is warmed for, and checked against, the layout the server will serve.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .entrypoint import Refusal, policy_config
from .inductor_cache import MANIFEST, ROUTE_TABLE, check, layout_of, running_stack
from .jsonfile import write_json
from .launch.process import SGLangServer
from .route_table import Choice
from .srt.flags import layout_flags


def warm(model_dir: str | os.PathLike, cache_dir: str | os.PathLike, config, *, timeout: float) -> dict:
    """Start a server with ``--cpu-rvv-warmup`` on an empty ``cache_dir``, stop it, write the manifest."""
    cache_dir = Path(cache_dir).resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    report_path = cache_dir.parent / f".{cache_dir.name}.warmup-report.json"
    report_path.unlink(missing_ok=True)
    print(f"warming {cache_dir} for {model_dir}: starting SGLang with --cpu-rvv-warmup "
          "(every shape key is compiled; minutes on a slow CPU)", file=sys.stderr, flush=True)
    began = time.monotonic()
    server = SGLangServer(
        model_dir, startup_timeout=timeout, log_path="-",
        env={"TORCHINDUCTOR_CACHE_DIR": str(cache_dir)},
        extra_args=["--enable-cpu-rvv-inductor", *layout_flags(config), "--cpu-rvv-warmup",
                    "--cpu-rvv-report-path", str(report_path)],
    )
    with server:
        pass
    report = json.loads(report_path.read_text())
    report_path.unlink()
    warmup = report.get("warmup")
    uncompiled = (warmup or {}).get("packed_not_compiled")
    if not warmup or (report.get("packed") and not warmup.get("keys") and not uncompiled):
        raise RuntimeError(f"the server compiled no shape keys (policy report: {report.get('reason') or report})")
    if not warmup["keys"]:
        if uncompiled:  # the rvv provider: its packed calls need no compile
            print(f"nothing to compile: {len(report.get('packed', []))} projections packed, whose calls are not "
                  f"compiled ({uncompiled})", file=sys.stderr)
        else:  # a model whose every projection the provider's shape gate leaves to F.linear
            print(f"nothing to compile: {len(report.get('skipped', {}))} projections row-major on provider "
                  f"{report.get('provider')} ({sorted(set(report.get('skipped', {}).values()))[:3]})",
                  file=sys.stderr)
    # The server's warm-up wrote the route table into its Inductor cache dir, this one.
    routes = warmup.get("route_table") or []
    if routes and not (cache_dir / ROUTE_TABLE).exists():
        raise RuntimeError(f"the server measured {len(routes)} routes but wrote no {cache_dir / ROUTE_TABLE}")
    manifest = {
        **running_stack(model_dir, layout_of(config)),
        "shape_keys": warmup["keys"],
        "warmup": {k: warmup[k] for k in ("compiled", "cache_hits", "seconds")},
        "model_dir": str(model_dir),
        "created": int(time.time()),
    }
    write_json(cache_dir / MANIFEST, manifest, sort_keys=True)
    row_major = sum(entry["route"] == Choice.ROW_MAJOR for entry in routes)
    eager = sum(entry["route"] == Choice.EAGER for entry in routes)
    print(f"warm cache ready in {time.monotonic() - began:.0f} s: {len(warmup['keys'])} shape keys, "
          f"{warmup['compiled']} compiled, {warmup['cache_hits']} already cached; route table: "
          f"{row_major} of {len(routes)} buckets row-major, {eager} eager", file=sys.stderr)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.cache_build", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    warm_cmd = commands.add_parser("warm", help="compile every shape key of MODEL_DIR into CACHE_DIR")
    warm_cmd.add_argument("model_dir")
    warm_cmd.add_argument("cache_dir")
    warm_cmd.add_argument("--timeout", type=float, default=3600.0, help="seconds for the warm-up server start")
    check_cmd = commands.add_parser("check", help="exit 0 when CACHE_DIR's manifest matches this stack")
    check_cmd.add_argument("cache_dir")
    check_cmd.add_argument("model_dir")
    args = parser.parse_args(argv)
    try:
        config = policy_config(os.environ)
    except Refusal as refusal:
        parser.error(str(refusal))
    if args.command == "warm":
        warm(args.model_dir, args.cache_dir, config, timeout=args.timeout)
        return 0
    state = check(args.cache_dir, args.model_dir, layout_of(config))
    print(state)
    return 0 if state.warm else 1


if __name__ == "__main__":
    sys.exit(main())
