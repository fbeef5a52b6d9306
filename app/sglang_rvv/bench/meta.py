"""Where a benchmark number comes from: source, image, lock, model, machine and stack.

:func:`provenance` is collected once per run and copied into every result, so
a result file read alone still says what produced it. Nothing here imports
torch or SGLang (versions come from package metadata), so it is cheap and safe
to call from the suite's parent process.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..entrypoint import IMAGE_LOCK
from ..host import cpu_model, usable_cpus
from ..inductor_cache import app_version
from ..launch.client import get_json

REPO = Path(__file__).resolve().parents[3]
# The pins a result depends on: the Python stack and the images (the image's own copy when run inside one).
LOCK_FILES = (REPO / "requirements" / "lock.txt", REPO / "images" / "lock.toml", IMAGE_LOCK)
IMAGE_ID_ENV = "SGLANG_RVV_IMAGE_ID"
# The model image's lock entry for its checkpoint (images/scripts/build-model.sh writes it).
MODEL_JSON = "model.json"


def source() -> dict:
    """The git commit and dirty flag of this checkout, or the app version when it is not one."""
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=30, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True,
                                text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "app_version": app_version()}
    return {"commit": commit, "dirty": bool(status.strip()), "app_version": app_version()}


def lock_hashes() -> dict[str, str]:
    """sha256 of each lock file present, keyed by its path."""
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in LOCK_FILES if path.is_file()}


def model_info(model_dir: Path, shape: str | None) -> dict:
    """The model's path and revision: the config's ``_name_or_path``, else a ``model.json`` beside it."""
    model_dir = Path(model_dir).resolve()
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    info = {
        "path": str(model_dir),
        "architectures": config.get("architectures"),
        "config_sha256": hashlib.sha256(config_path.read_bytes()).hexdigest(),
        "name_or_path": config.get("_name_or_path"),
        "revision": None,
        "generated_shape": shape,  # random weights with this real model's shapes
    }
    for candidate in (model_dir / MODEL_JSON, model_dir.parent / MODEL_JSON, IMAGE_LOCK.with_name(MODEL_JSON)):
        if candidate.is_file():
            pinned = json.loads(candidate.read_text())
            info["name_or_path"] = info["name_or_path"] or pinned.get("repo") or pinned.get("name")
            info["revision"] = pinned.get("revision") or (f"seed {pinned['seed']}" if "seed" in pinned else None)
            info["model_json"] = str(candidate)
            break
    if shape and info["revision"] is None:
        info["revision"] = "seed 0"  # one_batch.shaped_model always writes seed 0
    return info


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _here() -> dict:
    """This host's part of a provenance: where the measuring process runs, from what."""
    return {
        "host": platform.node(),
        "source": source(),
        "image_id": os.environ.get(IMAGE_ID_ENV) or None,
        "lock_sha256": lock_hashes(),
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "omp_num_threads": int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS") else None,
        "python": platform.python_version(),
        "app_version": app_version(),
    }


def provenance(model_dir: Path, shape: str | None) -> dict:
    """Everything a result is recorded with (the cache state is per measurement, not here)."""
    return {**_here(), "model": model_info(model_dir, shape), "torch": _package_version("torch"),
            "sglang": _package_version("sglang")}


def fleet_provenance(workers: list[str]) -> dict:
    """A fleet run's: this client host's facts, and what the first worker says it serves and runs
    (``/model_info``, ``/server_info``); the servers' machines are the workers', not this one."""
    info = get_json(workers[0] + "/model_info")
    server = get_json(workers[0] + "/server_info")
    model = {"path": info.get("model_path"), "served_model_name": info.get("served_model_name"),
             "name_or_path": info.get("served_model_name"), "revision": None, "generated_shape": None}
    return {**_here(), "model": model, "torch": None, "sglang": server.get("version"), "workers": workers}
