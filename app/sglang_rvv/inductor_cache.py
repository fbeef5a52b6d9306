"""A prewarmed Inductor cache and the manifest that says what it is valid for.

A compiled artifact is only as good as the stack that built it. The manifest
records that stack (torch version and commit, app version, machine and ATen
CPU capability, the C++ compiler Inductor calls, the model's config, the packed
weight layout: weight dtype, group size, lm_head dtype) next to the shape keys
the warm-up compiled. :func:`check` compares it with the
running stack. Any difference, or a manifest that cannot be read, rejects the
cache: the server starts artifact-cold with a warning that names the field.
A cache is never trusted on faith and never stops a start.

Only the config matters of the model: artifacts depend on shapes, which the
config fixes, never on weight values. The layout decides which ops were
compiled, so a cache warmed for another layout is rejected like one built by
another stack.

The warm-up's measured route table (:data:`ROUTE_TABLE`) lives in the same
directory, so it ships and seeds with the artifacts. It carries its own stack
and is checked the same way, each time it is read (:mod:`sglang_rvv.route_table`).

The cache is built by :mod:`sglang_rvv.cache_build`, which starts a whole server.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "sglang_rvv_cache_manifest.json"
SCHEMA = 2  # 2: the layout fields
# The RvvPolicyConfig fields that choose the packed layout; the manifest records each.
LAYOUT_FIELDS = ("weight_dtype", "group_size", "lm_head_dtype")
ROUTE_TABLE = "sglang_rvv_route_table.json"
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


def app_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang-rvv")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def torch_stack() -> dict:
    """The software and ISA both compiled artifacts and timings depend on."""
    import torch

    return {
        "torch_version": torch.__version__,
        "torch_git": torch.version.git_version,
        "app_version": app_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def layout_of(config) -> dict:
    """The layout fields of an RvvPolicyConfig, as the manifest records them."""
    return {name: getattr(config, name) for name in LAYOUT_FIELDS}


def running_stack(model_dir: str | os.PathLike, layout: dict) -> dict:
    """What a cache must have been built with to be used here (``layout``: :func:`layout_of`)."""
    config = Path(model_dir) / "config.json"
    return {
        "schema": SCHEMA,
        **torch_stack(),
        "compiler": _compiler_version(),
        "model_config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        **layout,
    }


def read_object(path: Path) -> dict:
    """The JSON object in ``path``; raises OSError or ValueError."""
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def differences(recorded: dict, running: dict) -> list[str]:
    return [
        f"{key}: cache {recorded.get(key)!r}, running {value!r}"
        for key, value in running.items() if recorded.get(key) != value
    ]


@dataclass(frozen=True)
class CacheState:
    warm: bool
    reason: str  # one line, for the startup log

    def __str__(self) -> str:
        return f"artifact-{'warm' if self.warm else 'cold'} ({self.reason})"


def check(cache_dir: str | os.PathLike, model_dir: str | os.PathLike, layout: dict) -> CacheState:
    """Whether the prewarmed cache in ``cache_dir`` was built for this stack, model and layout."""
    path = Path(cache_dir) / MANIFEST
    if not path.exists():
        return CacheState(False, f"no prewarmed cache: {path} is absent")
    try:
        manifest = read_object(path)
    except (OSError, ValueError) as error:
        return CacheState(False, f"prewarmed cache rejected: {path} is unreadable ({error})")
    differ = differences(manifest, running_stack(model_dir, layout))
    if differ:
        return CacheState(False, "prewarmed cache rejected, " + "; ".join(differ))
    keys = manifest.get("shape_keys") or []
    return CacheState(True, f"prewarmed cache of {len(keys)} shape keys matches this stack")


def seed(warm_dir: str | os.PathLike, cache_dir: str | os.PathLike) -> int:
    """Copy the prewarmed artifacts into the writable cache directory; returns the files copied.

    The route table comes along. A table already in ``cache_dir`` is kept, like
    any file there: it was measured by an earlier start, and the warm-up
    re-measures it anyway if it does not match the running stack.
    """
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
