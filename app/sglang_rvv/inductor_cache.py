"""A prewarmed Inductor cache and the manifest that says what it is valid for.

A compiled artifact is only as good as the stack that built it. The manifest
records that stack (torch version and commit, app version, machine and ATen
CPU capability, the C++ compiler Inductor calls, the model's config) next to
the shape keys the warm-up compiled. :func:`check` compares it with the
running stack. Any difference, or a manifest that cannot be read, rejects the
cache: the server starts artifact-cold with a warning that names the field.
A cache is never trusted on faith and never stops a start.

Only the config matters of the model: artifacts depend on shapes, which the
config fixes, never on weight values.

::

    python -m sglang_rvv.inductor_cache warm MODEL_DIR CACHE_DIR   # compile every key, write the manifest
    python -m sglang_rvv.inductor_cache check CACHE_DIR MODEL_DIR  # exit 0 when the cache is usable
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "sglang_rvv_cache_manifest.json"
SCHEMA = 1
# Set by the container entrypoint to artifact-warm/-cold; the plugin copies it into the policy report.
STATE_ENV = "SGLANG_RVV_CACHE_STATE"
# Manifest fields that describe the cache but do not decide whether it is usable.
_INFORMATIONAL = ("shape_keys", "warmup", "model_dir", "created")


def _compiler_version() -> str:
    from torch._inductor import config

    compiler = config.cpp.cxx[-1] or "g++"
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{compiler}: unavailable ({type(error).__name__})"
    return out.stdout.splitlines()[0].strip() if out.stdout else compiler


def _app_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang-rvv")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def running_stack(model_dir: str | os.PathLike) -> dict:
    """What a cache must have been built with to be used here."""
    import torch

    config = Path(model_dir) / "config.json"
    return {
        "schema": SCHEMA,
        "torch_version": torch.__version__,
        "torch_git": torch.version.git_version,
        "app_version": _app_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "compiler": _compiler_version(),
        "model_config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
    }


@dataclass(frozen=True)
class CacheState:
    warm: bool
    reason: str  # one line, for the startup log

    def __str__(self) -> str:
        return f"artifact-{'warm' if self.warm else 'cold'} ({self.reason})"


def check(cache_dir: str | os.PathLike, model_dir: str | os.PathLike) -> CacheState:
    """Whether the prewarmed cache in ``cache_dir`` was built for this stack and model."""
    path = Path(cache_dir) / MANIFEST
    if not path.exists():
        return CacheState(False, f"no prewarmed cache: {path} is absent")
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        return CacheState(False, f"prewarmed cache rejected: {path} is unreadable ({error})")
    want = running_stack(model_dir)
    differ = [
        f"{key}: cache {manifest.get(key)!r}, running {value!r}"
        for key, value in want.items() if manifest.get(key) != value
    ]
    if differ:
        return CacheState(False, "prewarmed cache rejected, " + "; ".join(differ))
    keys = manifest.get("shape_keys") or []
    return CacheState(True, f"prewarmed cache of {len(keys)} shape keys matches this stack")


def seed(warm_dir: str | os.PathLike, cache_dir: str | os.PathLike) -> int:
    """Copy the prewarmed artifacts into the writable cache directory; returns the files copied."""
    warm_dir, cache_dir = Path(warm_dir), Path(cache_dir)
    copied = 0
    for source in warm_dir.rglob("*"):
        target = cache_dir / source.relative_to(warm_dir)
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.seed-{os.getpid()}")
            shutil.copy2(source, tmp)
            tmp.replace(target)  # a reader never sees half an artifact
            copied += 1
    return copied


def warm(model_dir: str | os.PathLike, cache_dir: str | os.PathLike, *, timeout: float) -> dict:
    """Start a server with ``--cpu-rvv-warmup`` on an empty ``cache_dir``, stop it, write the manifest."""
    from .server import SGLangServer

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
        extra_args=["--enable-cpu-rvv-inductor", "--cpu-rvv-warmup", "--cpu-rvv-report-path", str(report_path)],
    )
    with server:
        pass
    report = json.loads(report_path.read_text())
    report_path.unlink()
    warmup = report.get("warmup")
    if not warmup or not warmup.get("keys"):
        raise RuntimeError(f"the server compiled no shape keys (policy report: {report.get('reason') or report})")
    manifest = {
        **running_stack(model_dir),
        "shape_keys": warmup["keys"],
        "warmup": {k: warmup[k] for k in ("compiled", "cache_hits", "seconds")},
        "model_dir": str(model_dir),
        "created": int(time.time()),
    }
    tmp = cache_dir / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(cache_dir / MANIFEST)
    print(f"warm cache ready in {time.monotonic() - began:.0f} s: {len(warmup['keys'])} shape keys, "
          f"{warmup['compiled']} compiled, {warmup['cache_hits']} already cached", file=sys.stderr)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.inductor_cache", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    warm_cmd = commands.add_parser("warm", help="compile every shape key of MODEL_DIR into CACHE_DIR")
    warm_cmd.add_argument("model_dir")
    warm_cmd.add_argument("cache_dir")
    warm_cmd.add_argument("--timeout", type=float, default=3600.0, help="seconds for the warm-up server start")
    check_cmd = commands.add_parser("check", help="exit 0 when CACHE_DIR's manifest matches this stack")
    check_cmd.add_argument("cache_dir")
    check_cmd.add_argument("model_dir")
    args = parser.parse_args(argv)
    if args.command == "warm":
        warm(args.model_dir, args.cache_dir, timeout=args.timeout)
        return 0
    state = check(args.cache_dir, args.model_dir)
    print(state)
    return 0 if state.warm else 1


if __name__ == "__main__":
    sys.exit(main())
