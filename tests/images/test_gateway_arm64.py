"""The arm64 gateway: an arm64 controller or server runs the fleet's gateway.

`build-base.sh arm64` and `build-gateway.sh arm64` build it here as on an arm64 host: pip fetches
the lock's aarch64 wheels (lock ``arch.arm64.wheel_platforms``, requirements/lock.txt's second
hashes), and the image's binaries run under qemu-aarch64 (binfmt_misc, set up by
images/scripts/podman-setup.sh). The arm64 gateway must then route to an amd64 appliance
exactly as the amd64 gateway does. The lock pins no arm64 appliance, and the appliance images
say so. Timings under qemu say nothing about an arm64 host.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from image_support import REPO, SCRIPTS, Container, build_emulated, completion, free_port, gateway_workers, lock_get

BUILD_TIMEOUT = 1800  # a cold arm64 base (mmdebstrap under qemu) takes minutes
GATEWAY_HEALTH = "/usr/local/lib/sglang-rvv/gateway.py health"


@pytest.fixture(scope="module")
def arm64_gateway(podman, build_logs) -> str:
    """The arm64 base and gateway images, built (or found up to date) by the scripts."""
    build_emulated("arm64", ("build-base.sh", "build-gateway.sh"), build_logs, timeout=BUILD_TIMEOUT)
    return f"localhost/sglang-rvv-gateway:{lock_get('app.version')}-arm64"


@pytest.mark.parametrize("script", ["build-runtime.sh", "build-model.sh", "build-cache.sh"])
def test_the_appliance_images_refuse_arm64_naming_what_the_lock_pins(script):
    result = subprocess.run([SCRIPTS / script, "arm64"], capture_output=True, text=True, timeout=60)
    image = script.removeprefix("build-").removesuffix(".sh")
    assert result.returncode == 1, result.stderr
    assert (f"arch.arm64 builds the base and gateway images only, not {image}: it pins no appliance "
            "(no torch, no Inductor cache key); appliances are amd64, riscv64") in result.stderr


def test_the_arm64_gateway_holds_the_locked_smg_for_aarch64(arm64_gateway):
    inspect = json.loads(subprocess.run(["podman", "image", "inspect", arm64_gateway], capture_output=True,
                                        text=True, check=True).stdout)[0]
    labels = inspect["Config"]["Labels"]
    assert (inspect["Architecture"], labels["io.sglang-rvv.arch"]) == ("arm64", "arm64")
    pinned = next(line.split()[0] for line in (REPO / "requirements/lock.txt").read_text().splitlines()
                  if line.startswith("smg=="))
    assert labels["io.sglang-rvv.gateway"] == pinned
    probe = "import importlib.metadata as m, platform; print(platform.machine(), m.version('smg'))"
    out = subprocess.run(["podman", "run", "--rm", "--init", "--network=none", "--entrypoint", "python3",
                          arm64_gateway, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    machine, version = out.stdout.split()
    assert (machine, f"smg=={version}") == ("aarch64", pinned)


def test_the_arm64_gateway_routes_to_an_amd64_appliance(arm64_gateway, amd64_images):
    appliance = Container(amd64_images["warm"])
    gateway = None
    try:
        appliance.wait_healthy()
        port, metrics = free_port(), free_port()
        worker = f"http://127.0.0.1:{appliance.port}"
        gateway = subprocess.run(
            ["podman", "run", "-d", "--init", "--network=host", "--read-only", "--health-cmd", GATEWAY_HEALTH,
             "-e", f"SGLANG_RVV_GATEWAY_WORKERS={worker}", "-e", f"SGLANG_RVV_GATEWAY_PORT={port}",
             "-e", f"SGLANG_RVV_GATEWAY_METRICS_PORT={metrics}", arm64_gateway],
            capture_output=True, text=True, check=True).stdout.strip()
        began = time.monotonic()
        while subprocess.run(["podman", "healthcheck", "run", gateway], capture_output=True).returncode != 0:
            state = subprocess.run(["podman", "inspect", "--format", "{{.State.Status}}", gateway],
                                   capture_output=True, text=True).stdout.strip()
            if state != "running" or time.monotonic() - began > 300:
                logs = subprocess.run(["podman", "logs", gateway], capture_output=True, text=True)
                pytest.fail(f"arm64 gateway {state}, not healthy after {time.monotonic() - began:.0f} s:\n"
                            f"{(logs.stdout + logs.stderr)[-3000:]}", pytrace=False)
            time.sleep(2)
        print(f"arm64 gateway healthy after {time.monotonic() - began:.0f} s (qemu-aarch64)")
        assert gateway_workers(port) == {worker: True}
        for prompt in ("Hello, how are you", "Once upon a time there"):
            through, direct = (completion(server, prompt, model="tiny-llama") for server in (port, appliance.port))
            assert through["choices"][0]["text"] == direct["choices"][0]["text"], prompt
            assert through["usage"]["completion_tokens"] == 8
    finally:
        if gateway:
            subprocess.run(["podman", "rm", "-f", "-t", "5", gateway], capture_output=True)
        appliance.remove()
