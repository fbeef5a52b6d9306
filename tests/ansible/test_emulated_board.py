"""provision.yml against an emulated board: a riscv64 Debian container under qemu-user,
reached through the containers.podman connection. It must pass (RVV and memory allowed as
emulated, and reported so), change nothing on a second run, and then pass the host checks;
switching the governor and zram off removes what board_tuning set up for them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_support import REPO, flat, host_checks_pass, inventory, playbook, recap
from image_support import pyc_check

BOARD = "emulated-board"


@pytest.fixture(scope="module")
def board_container():
    """A long-running riscv64 container from the project's riscv64 base image (Debian forky)."""
    if os.geteuid() != 0 or shutil.which("podman") is None:
        pytest.fail("the emulated board needs root and rootful podman: run images/scripts/podman-setup.sh")
    # A cold forky rootfs: 7 min here, downloads included (its .pyc compiled natively: images/base/pyc.sh).
    subprocess.run(["make", "image-base", "ARCH=riscv64"], cwd=REPO, check=True, timeout=3600)
    image = subprocess.run([REPO / "images/scripts/image-name.sh", "base", "riscv64"], check=True,
                           capture_output=True, text=True).stdout.strip()
    name = f"sglang-rvv-board-{os.getpid()}"
    # --init: a crash of PID 1 under qemu would hang; host network: apt reaches the mirror.
    subprocess.run(["podman", "run", "-d", "--init", "--network", "host", "--name", name, image,
                    "sleep", "infinity"], check=True, capture_output=True)
    yield name
    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True)


def test_every_debian_python_source_of_the_base_has_its_pyc(board_container):
    # The base build compiles them natively, not by Debian's py3compile under qemu (images/base/pyc.sh).
    python = ["podman", "exec", "-i", board_container, "python3", "-"]
    sources, bad = pyc_check(python, "/usr/lib/python3/dist-packages")
    assert sources > 10000 and not bad, (sources, bad[:20])  # torch alone has 2349
    diverted = subprocess.run(["podman", "exec", board_container, "dpkg-divert", "--list", "*py3compile*"],
                              capture_output=True, text=True, check=True).stdout
    assert diverted == "", diverted  # Debian's py3compile is back, for what the board installs later


@pytest.fixture(scope="module")
def board_inventory(board_container, tmp_path_factory):
    variables = {
        "ansible_connection": "containers.podman.podman",
        "ansible_host": board_container,
        "ansible_python_interpreter": "/usr/bin/python3",
        "ansible_become": False,  # root in the container already; it has no sudo
        "board_allow_emulated": True,
        # No systemd in the container: podman there needs cgroupfs and the file events logger.
        "board_podman_cgroup_manager": "cgroupfs",
        "board_podman_events_logger": "file",
        # The container's disk is the test host's, which this suite fills with images (CI had
        # 37 GiB left here). Nothing is built on this board, so the 40 GiB a board needs for
        # its own builds does not apply; the check itself still runs.
        "board_preflight_min_disk_gib": 5,
        # No images are built under qemu: only the board checks apply.
        "sglang_rvv_infra_checks": ["board"],
    }
    return inventory(tmp_path_factory.mktemp("emulated") / "inventory.yml", {BOARD: variables})


@pytest.fixture(scope="module")
def provisioned(board_inventory):
    first = playbook(board_inventory, "provision.yml")
    second = playbook(board_inventory, "provision.yml") if first.returncode == 0 else None
    return first, second


def test_provision_passes_and_reports_the_emulation(provisioned):
    first, _ = provisioned
    assert first.returncode == 0, first.stdout[-4000:]
    out = flat(first.stdout)
    assert f"board_preflight: {BOARD} ok: riscv64" in out
    assert "RVV NO (emulated target, allowed by board_allow_emulated)" in out
    assert "board_podman: podman 5." in out and "compose command: podman compose," in out
    assert f"board_tuning: the kernel of {BOARD} exposes no cpufreq governor" in out
    assert recap(first.stdout)[BOARD]["changed"] > 0


def test_a_second_provision_changes_nothing(provisioned):
    first, second = provisioned
    assert second is not None, "the first run failed"
    assert second.returncode == 0, second.stdout[-4000:]
    assert recap(second.stdout)[BOARD]["changed"] == 0, second.stdout[-4000:]


def test_a_board_short_of_disk_is_refused_before_anything_is_installed(board_inventory):
    result = playbook(board_inventory, "provision.yml", "-e", "board_preflight_min_disk_gib=100000")
    assert result.returncode != 0
    out = flat(result.stdout)
    assert "below board_preflight_min_disk_gib=100000: free space or grow the filesystem" in out
    assert "board_podman" not in out


def test_host_checks_pass_with_hardware_checks_reported_as_emulated(provisioned, board_inventory):
    assert provisioned[0].returncode == 0, "provisioning failed"
    # architecture, podman, thread count and two provisioned directories; the service checks skip.
    out = flat(host_checks_pass(board_inventory, 5))
    for what in ("RVV", "16 GB memory", "cpufreq governor"):
        assert f"{what}" in out
    assert f"needs a real Banana Pi BPI-F3: {BOARD} is emulated" in out
    assert "sglang_rvv_infra_checks" in out


def test_the_quadlet_units_generate_services_with_the_compose_settings(provisioned, board_inventory):
    """The service and gateway roles' quadlet units, through podman 5's own generator on the board image."""
    assert provisioned[0].returncode == 0, "provisioning failed"
    result = playbook(board_inventory, str(Path(__file__).parent / "playbooks" / "quadlet-dryrun.yml"))
    assert result.returncode == 0, result.stdout[-4000:]
    out = flat(result.stdout)
    parts = re.split(r"---([\w.-]+\.service)---", out)  # -dryrun prints ---NAME.service--- before each
    units = dict(zip(parts[1::2], parts[2::2], strict=True))
    service, gateway = units["sglang-rvv.service"], units["sglang-rvv-gateway.service"]
    assert "ExecStart=/usr/bin/podman run --name sglang-rvv " in service
    for option in ("--read-only", "--user 10001:10001", "--cap-drop all", "--security-opt=no-new-privileges",
                   "--publish 127.0.0.1:30000:30000", "--health-cmd /usr/local/lib/sglang-rvv/healthcheck.py",
                   "--env-file /etc/sglang-rvv/runtime.env", "--init", "--memory=8g"):
        assert option in service, option
    # compose/gateway.yaml's settings, with the boards' URLs and the role's defaults (quadlet writes the
    # health command's space as \x20, which systemd turns back into a space)
    assert "ExecStart=/usr/bin/podman run --name sglang-rvv-gateway " in gateway
    for option in ("--read-only", "--user 10001:10001", "--cap-drop all", "--security-opt=no-new-privileges",
                   "--network host", r'--health-cmd "/usr/local/lib/sglang-rvv/gateway.py\x20health"', "--init",
                   "--memory=1g", "--env SGLANG_RVV_GATEWAY_HOST=127.0.0.1", "--env SGLANG_RVV_GATEWAY_PORT=30000",
                   "--env SGLANG_RVV_GATEWAY_POLICY=cache_aware", "--env SGLANG_RVV_GATEWAY_METRICS_PORT=29000",
                   "--env SGLANG_RVV_GATEWAY_WORKERS=http://10.0.0.21:30000,http://10.0.0.22:30000"):
        assert option in gateway, option
    for unit in (service, gateway):
        assert "Restart=on-failure" in unit and "WantedBy=multi-user.target" in unit


def _on_board(board_container, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "exec", board_container, "sh", "-c", command], capture_output=True, text=True)


def test_switching_the_governor_and_zram_off_removes_what_tuning_set_up(provisioned, board_inventory, board_container):
    """The board has no systemd or cpufreq, so board_tuning never set either up here: leave what
    it leaves (the governor's boot unit, and zramswap's configuration marked as its own), then
    switch both off. The files go (the units' stop and disable need systemd, and skip), a second
    run changes nothing, and a zram configuration board_tuning did not write stays."""
    assert provisioned[0].returncode == 0, "provisioning failed"
    unit, zram = "/etc/systemd/system/sglang-rvv-cpufreq.service", "/etc/default/zramswap"
    left = _on_board(board_container, f"mkdir -p {unit.rsplit('/', 1)[0]} && printf '[Unit]\\n' > {unit}"
                                      f" && printf '# Ansible managed (board_tuning)\\nALGO=zstd\\n' > {zram}")
    assert left.returncode == 0, left.stderr
    off = ("-e", '{"board_tuning_governor": "", "board_tuning_zram_enabled": false}')
    # board_tuning alone (playbooks/tuning.yml), as provision.yml applies it: a whole provision.yml
    # under qemu takes minutes, and its own second run is checked above.
    tuning = str(Path(__file__).parent / "playbooks" / "tuning.yml")
    first = playbook(board_inventory, tuning, *off)
    assert first.returncode == 0, first.stdout[-4000:]
    assert "governor left alone; zram off" in flat(first.stdout)
    assert recap(first.stdout)[BOARD]["changed"] > 0
    for path in (unit, zram):
        assert _on_board(board_container, f"test -e {path}").returncode == 1, f"{path} is still there"
    second = playbook(board_inventory, tuning, *off)
    assert second.returncode == 0, second.stdout[-4000:]
    assert "governor left alone; zram off" in flat(second.stdout)
    assert recap(second.stdout)[BOARD]["changed"] == 0, second.stdout[-4000:]
    # Not board_tuning's: left alone.
    assert _on_board(board_container, f"printf 'ALGO=lz4\\n' > {zram}").returncode == 0
    third = playbook(board_inventory, tuning, *off)
    assert third.returncode == 0 and recap(third.stdout)[BOARD]["changed"] == 0, third.stdout[-4000:]
    assert _on_board(board_container, f"cat {zram}").stdout == "ALGO=lz4\n"
