"""Image tests: real podman builds through the make targets, real containers, real compose.

Everything here needs root and rootful podman (``images/scripts/podman-setup.sh``, run by
``.ci/run``). Builds are shared by the whole session and skipped by the scripts when up
to date, so a second run is quick.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from image_support import HOST_ARCH, lock_get, run


@pytest.fixture(scope="session")
def podman() -> str:
    # Not hardware, so not a skip: .ci/run sets podman up, and a machine without it must say so.
    if os.geteuid() != 0 or shutil.which("podman") is None:
        pytest.fail("the image tests need root and rootful podman: run images/scripts/podman-setup.sh as root")
    return "podman"


@pytest.fixture(scope="session")
def build_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("build-logs")


@pytest.fixture(scope="session")
def amd64_images(podman, build_logs) -> dict[str, str]:
    """base -> runtime -> model image -> warm image, for the host arch, through `make image`, of the
    generated tiny-llama (named: the default model is a real one, slower to build and to serve)."""
    run(["make", "image", f"ARCH={HOST_ARCH}", "MODEL=tiny-llama", "CACHE=warm"], timeout=3600,
        log=build_logs / "make-image.log")
    version, model = lock_get("app.version"), "tiny-llama"
    return {
        "runtime": f"localhost/sglang-rvv-runtime:{version}-{HOST_ARCH}",
        "model": f"localhost/sglang-rvv:{version}-{model}-{HOST_ARCH}",
        "warm": f"localhost/sglang-rvv:{version}-{model}-warm-{HOST_ARCH}",
    }


@pytest.fixture(scope="session")
def default_model_image(podman, build_logs) -> str:
    """`make image` with no MODEL: the default model's image (base and runtime shared with the other tests)."""
    began = time.monotonic()
    run(["make", "image", f"ARCH={HOST_ARCH}"], timeout=3600, log=build_logs / "make-image-default.log")
    print(f"make image (default model, conversion included): {time.monotonic() - began:.0f} s")
    return f"localhost/sglang-rvv:{lock_get('app.version')}-{lock_get('models.default')}-{HOST_ARCH}"


@pytest.fixture(scope="session")
def default_checkpoint(default_model_image, tmp_path_factory) -> Path:
    """The default model's checkpoint as its image holds it (/models/model), copied out for
    transformers on this host."""
    out = tmp_path_factory.mktemp("default-checkpoint")
    container = subprocess.run(["podman", "create", default_model_image], check=True, capture_output=True,
                               text=True).stdout.strip()
    try:
        subprocess.run(["podman", "cp", f"{container}:/models/model", str(out)], check=True, timeout=300)
    finally:
        subprocess.run(["podman", "rm", container], check=True, capture_output=True)
    return out / "model"
