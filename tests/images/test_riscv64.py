"""riscv64 under qemu-user: base and runtime images from the scripts, the policy smoke inside.

Without a patched wheelhouse the riscv64 runtime is Debian's python3-torch 2.6 plus
the app (no SGLang), so what runs there is ``python -m sglang_rvv.smoke``: pack,
install, forward and compare with row-major on a tiny Llama generated on the host,
with the RVV 1.0 / VLEN 256 CPU model of the board. Needs root (rootful podman)
and qemu-riscv64 in binfmt_misc (images/scripts/podman-setup.sh).
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest
from image_support import REPO, lock_get, run

SCRIPTS = REPO / "images" / "scripts"
BINFMT_ENTRY = Path("/proc/sys/fs/binfmt_misc/qemu-riscv64")
QEMU_CPU = "rv64,v=true,vlen=256,vext_spec=v1.0"
BUILD_TIMEOUT = 3600  # a cold base build (mmdebstrap under qemu) takes minutes
SMOKE_TIMEOUT = 900


def _emulation_missing() -> str | None:
    if platform.machine() == "riscv64":
        return None
    try:
        enabled = BINFMT_ENTRY.read_text().startswith("enabled")
    except OSError:
        enabled = False
    if not enabled:
        return (f"no riscv64 CPU and no emulation: {BINFMT_ENTRY} is not enabled (qemu-user-static binfmt; "
                "run images/scripts/podman-setup.sh as root)")
    return None


def _run(command: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return proc, time.monotonic() - start


@pytest.fixture(scope="module")
def riscv64_runtime_image(podman, build_logs) -> str:
    """The riscv64 runtime image, built (or found up to date) by the scripts."""
    reason = _emulation_missing()
    if reason:
        pytest.skip(reason)
    for script in ("build-base.sh", "build-runtime.sh"):
        run([str(SCRIPTS / script), "riscv64"], timeout=BUILD_TIMEOUT, log=build_logs / f"riscv64-{script}.log")
    return f"localhost/sglang-rvv-runtime:{lock_get('app.version')}-riscv64"


@pytest.fixture(scope="module")
def riscv64_tiny_llama(tmp_path_factory) -> Path:
    """The lock's default tiny Llama, generated on the host with this venv."""
    out = tmp_path_factory.mktemp("riscv64") / "tiny-llama"
    subprocess.run([sys.executable, "-m", "sglang_rvv.checkpoint", str(out), "--arch", "llama", "--seed", "0"],
                   check=True, capture_output=True, timeout=600)
    return out


def test_runtime_image_is_labelled_debian_torch(riscv64_runtime_image):
    inspect = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .Labels}} {{.Architecture}}", riscv64_runtime_image],
        check=True, capture_output=True, text=True,
    ).stdout
    labels_json, architecture = inspect.rsplit(" ", 1)
    labels = json.loads(labels_json)
    assert architecture.strip() == "riscv64"
    assert labels["io.sglang-rvv.arch"] == "riscv64"
    assert labels["io.sglang-rvv.torch-source"] == "debian"
    assert labels["io.sglang-rvv.torch"] == f"debian:{lock_get('arch.riscv64.torch.version')}"
    assert labels["io.sglang-rvv.serving"] == "unavailable"
    assert labels["io.sglang-rvv.sglang"] == "none"


def test_runtime_build_is_kept_when_up_to_date(riscv64_runtime_image):
    proc, _ = _run([str(SCRIPTS / "build-runtime.sh"), "riscv64"], BUILD_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert f"{riscv64_runtime_image} is up to date" in proc.stderr


def test_policy_smoke_under_qemu(riscv64_runtime_image, riscv64_tiny_llama):
    proc, seconds = _run([
        "podman", "run", "--rm", "--init", "--network=none", "--no-healthcheck",
        "-e", f"QEMU_CPU={QEMU_CPU}",
        "-v", f"{riscv64_tiny_llama}:/models/model:ro",
        riscv64_runtime_image, "python", "-m", "sglang_rvv.smoke", "/models/model",
    ], SMOKE_TIMEOUT)
    print(f"smoke under qemu: {seconds:.0f} s\n{proc.stdout}")
    assert proc.returncode == 0, f"smoke failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    report = proc.stdout
    assert report.startswith("sglang_rvv smoke: PASSED"), report
    torch_prefix = lock_get("arch.riscv64.torch.version")
    assert "machine riscv64," in report and f"torch {torch_prefix}." in report, report
    assert "packed_eager" in report and "buckets 1, 4, 8, 16" in report, report


def test_the_entrypoint_says_why_this_image_cannot_serve(riscv64_runtime_image):
    proc, _ = _run(["podman", "run", "--rm", "--init", "--network=none", "--no-healthcheck",
                    riscv64_runtime_image], SMOKE_TIMEOUT)
    assert proc.returncode == 64, proc.stderr
    # podman's own notice on a foreign-arch image is not the entrypoint's output
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("WARNING: image platform")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("sglang-rvv entrypoint: error: SGLang is not installed in this image; torch 2.6 "
                               "comes from Debian's python3-torch"), lines[0]
    assert "python -m sglang_rvv.smoke" in lines[0]
