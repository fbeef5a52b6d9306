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

The warm-up's measured route table (:data:`ROUTE_TABLE`) lives in the same
directory, so it ships and seeds with the artifacts. It carries its own stack
(the CPU model, op provider and thread count on top of torch and the ISA) and
is checked the same way, each time it is read: a table measured elsewhere is
ignored and measured again, never trusted.

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

from .host import cpu_model
from .jsonfile import write_json

MANIFEST = "sglang_rvv_cache_manifest.json"
SCHEMA = 1
ROUTE_TABLE = "sglang_rvv_route_table.json"
ROUTE_TABLE_SCHEMA = 1
ROUTE_TABLE_FIELDS = ("projection", "bucket", "out_features", "in_features", "packed_us", "row_major_us", "route")
ROUTE_CHOICES = ("packed", "row_major")
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


def _torch_stack() -> dict:
    """The software and ISA both compiled artifacts and timings depend on."""
    import torch

    return {
        "torch_version": torch.__version__,
        "torch_git": torch.version.git_version,
        "app_version": app_version(),
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def running_stack(model_dir: str | os.PathLike) -> dict:
    """What a cache must have been built with to be used here."""
    config = Path(model_dir) / "config.json"
    return {
        "schema": SCHEMA,
        **_torch_stack(),
        "compiler": _compiler_version(),
        "model_config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
    }


def route_table_stack() -> dict:
    """What a route table must have been measured on to be used here."""
    import torch

    from .ops import PROVIDER_NAME

    return {
        "schema": ROUTE_TABLE_SCHEMA,
        **_torch_stack(),
        "cpu_model": cpu_model(),
        "provider": PROVIDER_NAME,
        "threads": torch.get_num_threads(),
    }


def _read_object(path: Path) -> dict:
    """The JSON object in ``path``; raises OSError or ValueError."""
    value = json.loads(path.read_text())
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _differences(recorded: dict, running: dict) -> list[str]:
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


def check(cache_dir: str | os.PathLike, model_dir: str | os.PathLike) -> CacheState:
    """Whether the prewarmed cache in ``cache_dir`` was built for this stack and model."""
    path = Path(cache_dir) / MANIFEST
    if not path.exists():
        return CacheState(False, f"no prewarmed cache: {path} is absent")
    try:
        manifest = _read_object(path)
    except (OSError, ValueError) as error:
        return CacheState(False, f"prewarmed cache rejected: {path} is unreadable ({error})")
    differ = _differences(manifest, running_stack(model_dir))
    if differ:
        return CacheState(False, "prewarmed cache rejected, " + "; ".join(differ))
    keys = manifest.get("shape_keys") or []
    return CacheState(True, f"prewarmed cache of {len(keys)} shape keys matches this stack")


def _check_entries(entries) -> None:
    if not isinstance(entries, list):
        raise ValueError("'entries' is not a list")
    for entry in entries:
        if not isinstance(entry, dict) or not set(ROUTE_TABLE_FIELDS) <= entry.keys():
            raise ValueError(f"an entry lacks one of {ROUTE_TABLE_FIELDS}: {entry!r}")
        if entry["route"] not in ROUTE_CHOICES:
            raise ValueError(f"an entry's route is {entry['route']!r}, not one of {ROUTE_CHOICES}")


def read_route_table(cache_dir: str | os.PathLike) -> tuple[list[dict], str | None]:
    """The entries of ``cache_dir``'s route table, and why they were rejected (``None`` if not).

    An absent table is no entries and no rejection; an unreadable one, or one
    measured on another stack, is no entries and the reason.
    """
    path = Path(cache_dir) / ROUTE_TABLE
    if not path.exists():
        return [], None
    try:
        table = _read_object(path)
        _check_entries(table.get("entries"))
    except (OSError, ValueError) as error:
        return [], f"{path} is unreadable ({error})"
    differ = _differences(table, route_table_stack())
    if differ:
        return [], f"{path} was measured on another stack: " + "; ".join(differ)
    return table["entries"], None


def write_route_table(cache_dir: str | os.PathLike, entries: list[dict]) -> Path:
    path = Path(cache_dir) / ROUTE_TABLE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {**route_table_stack(), "entries": entries}, sort_keys=True)
    return path


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
