"""The board preflight role, run for real: this x86 host (connection local) must be refused
with the one message that names the fact and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ANSIBLE_DIR = Path(__file__).resolve().parents[2] / "ansible"


def _provision(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "bpi_f3:\n  hosts:\n    this-host:\n      ansible_connection: local\n"
        f"      ansible_python_interpreter: {sys.executable}\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [Path(sys.executable).with_name("ansible-playbook"), "-i", inventory, "provision.yml", *extra],
        cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=300)


def test_preflight_refuses_a_non_riscv64_target_naming_the_fact_and_the_fix(tmp_path):
    result = _provision(tmp_path)
    assert result.returncode == 2, result.stdout[-3000:]
    out = " ".join(result.stdout.split())
    assert f"board_preflight: this-host is {os.uname().machine}, not riscv64." in out
    assert "point the inventory's bpi_f3 group at the board" in out
    assert "failed=1" in out


def test_emulation_does_not_excuse_the_wrong_architecture(tmp_path):
    result = _provision(tmp_path, "-e", "board_allow_emulated=true")
    assert result.returncode == 2
    assert "not riscv64" in " ".join(result.stdout.split())
