#!/usr/bin/env python3
"""Print what an image contains, as JSON: the evidence that two builds made the same thing.

Runs inside an image (standard library only, any python3):

    podman run --rm --no-healthcheck --entrypoint python3 -v ./images/scripts/content-manifest.py:/tmp/cm.py:ro IMAGE /tmp/cm.py

- debian_packages: every installed package and version (dpkg);
- python_dists: every distribution on sys.path with its version and the sha256 of its RECORD
  (which lists the sha256 of each installed file, so equal RECORDs mean equal wheels);
- model: the sha256 of every file under /models/model, when there is one.
Timestamps, image IDs and layer digests are deliberately not here (images/README.md says why).
"""

import hashlib
import importlib.metadata as md
import json
import subprocess
from pathlib import Path

MODEL_DIR = Path("/models/model")


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def debian_packages() -> dict[str, str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}:${Architecture}=${Version}\\n"],
                         check=True, capture_output=True, text=True).stdout
    return dict(sorted(line.split("=", 1) for line in out.splitlines() if line))


def python_dists() -> dict[str, dict]:
    dists = {}
    for dist in md.distributions():
        record = dist.read_text("RECORD")
        dists[dist.metadata["Name"].lower()] = {
            "version": dist.version,
            "record_sha256": hashlib.sha256(record.encode()).hexdigest() if record else None,
        }
    return dict(sorted(dists.items()))


def model_files() -> dict[str, str]:
    if not MODEL_DIR.is_dir():
        return {}
    return {str(p.relative_to(MODEL_DIR)): sha256(p) for p in sorted(MODEL_DIR.rglob("*")) if p.is_file()}


print(json.dumps({"debian_packages": debian_packages(), "python_dists": python_dists(), "model": model_files()},
                 indent=1, sort_keys=True))
