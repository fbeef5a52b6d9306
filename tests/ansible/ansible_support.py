"""Run the project's playbooks and testinfra checks for real, the way `make provision` does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
       "PATH": f"{BIN}:{os.environ['PATH']}"}


def inventory(path: Path, hosts: dict[str, dict], gateway: dict[str, dict] | None = None) -> Path:
    """An inventory with ``hosts`` (name -> variables) in the bpi_f3 group, and ``gateway``'s in
    the gateway group."""
    groups = {"bpi_f3": {"hosts": hosts}, **({"gateway": {"hosts": gateway}} if gateway else {})}
    path.write_text(yaml.safe_dump(groups))
    return path


def playbook(inventory_path: Path, name: str, *extra: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    """One ansible-playbook run; never raises on failure (refusals are tested too)."""
    began = time.monotonic()
    result = subprocess.run([BIN / "ansible-playbook", "-i", inventory_path, name, *extra], cwd=ANSIBLE_DIR,
                            env=ENV, capture_output=True, text=True, timeout=timeout)
    print(f"$ ansible-playbook {name} {' '.join(extra)}: exit {result.returncode} "
          f"in {time.monotonic() - began:.0f} s\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    return result


def succeeded(runs: dict[str, subprocess.CompletedProcess], name: str) -> subprocess.CompletedProcess:
    """runs[name], asserted to have run (runs stop at the first failed playbook) and passed."""
    assert name in runs, f"an earlier playbook failed: {list(runs)}"
    assert runs[name].returncode == 0, runs[name].stdout[-4000:]
    return runs[name]


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP as {host: {ok: n, changed: n, failed: n, ...}}."""
    return {host: {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", counts)}
            for host, counts in re.findall(r"^(\S+)\s+: (ok=.*)$", output, re.M)}


def flat(output: str) -> str:
    """Output with whitespace runs folded: Ansible wraps long messages."""
    return " ".join(output.split())


def host_checks(inventory_path: Path, timeout: float = 1800, group: str = "bpi_f3") -> subprocess.CompletedProcess:
    """tests/infra against every host of the inventory's group, through testinfra's Ansible backend."""
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/infra", f"--hosts=ansible://{group}",
         f"--ansible-inventory={inventory_path}", "-rs", "-p", "no:cacheprovider", "-q"],
        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)
    print(f"$ pytest tests/infra: exit {result.returncode} in {time.monotonic() - began:.0f} s")
    print(result.stdout[-4000:])
    return result


def host_checks_pass(inventory_path: Path, passed: int, group: str = "bpi_f3") -> str:
    """host_checks, asserted to pass with exactly PASSED checks run; their output."""
    result = host_checks(inventory_path, group=group)
    assert result.returncode == 0, result.stdout[-4000:]
    assert f"{passed} passed" in result.stdout
    return result.stdout
