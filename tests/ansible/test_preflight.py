"""The board preflight role, run for real: this x86 host (connection local) must be refused
with the one message that names the fact and the fix."""

from __future__ import annotations

import os
import sys

from ansible_support import flat, inventory, playbook


def _provision(tmp_path, *extra: str):
    hosts = {"this-host": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
    return playbook(inventory(tmp_path / "inventory.yml", hosts), "provision.yml", *extra, timeout=300)


def test_preflight_refuses_a_non_riscv64_target_naming_the_fact_and_the_fix(tmp_path):
    result = _provision(tmp_path)
    assert result.returncode == 2, result.stdout[-3000:]
    out = flat(result.stdout)
    assert f"board_preflight: this-host is {os.uname().machine}, not riscv64." in out
    assert "point the inventory's bpi_f3 group at the board" in out
    assert "failed=1" in out


def test_emulation_does_not_excuse_the_wrong_architecture(tmp_path):
    result = _provision(tmp_path, "-e", "board_allow_emulated=true")
    assert result.returncode == 2
    assert "not riscv64" in flat(result.stdout)
