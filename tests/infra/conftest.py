"""Host checks for a provisioned board, run through the project's Ansible inventory:

    pytest tests/infra --hosts='ansible://bpi_f3' --ansible-inventory=INVENTORY

Which checks apply to a host comes from its inventory variables:
``sglang_rvv_infra_checks`` (default ``[board, service]``, or ``[gateway]`` for a host of the
gateway group; the emulated board has no images, so it runs ``[board]``) and
``board_allow_emulated`` (hardware checks skip, naming the board they need). Without
``--hosts`` the plain ``make test`` run leaves this directory out (tests/conftest.py);
tests/ansible drives it against real targets.
"""

from __future__ import annotations

import json
import shlex

import pytest

BOARD = "a real Banana Pi BPI-F3"


class Target:
    """One inventory host with the variables the checks need."""

    def __init__(self, host):
        self.host = host
        self.vars = host.ansible.get_variables()

    @property
    def emulated(self) -> bool:
        return str(self.vars.get("board_allow_emulated", False)).lower() in ("true", "1", "yes")

    def require(self, check: str) -> None:
        default = ["gateway"] if "gateway" in self.vars.get("group_names", []) else ["board", "service"]
        wanted = self.vars.get("sglang_rvv_infra_checks", default)
        if check not in wanted:
            pytest.skip(f"{self.vars['inventory_hostname']} runs only {wanted} checks (sglang_rvv_infra_checks)")

    def require_hardware(self, what: str) -> None:
        if self.emulated:
            pytest.skip(f"{what} needs {BOARD}: {self.vars['inventory_hostname']} is emulated "
                        "(qemu-user, board_allow_emulated=true)")

    def src(self) -> str:
        return f"{self.vars.get('sglang_rvv_src_dir', '/opt/sglang-rvv/src')}/current"

    def run_ok(self, command: str) -> str:
        result = self.host.run(command)
        assert result.rc == 0, f"{command}: exit {result.rc}: {result.stderr.strip()[-500:]}"
        return result.stdout

    def local_fact(self, name: str) -> dict:
        return json.loads(self.host.file(f"/etc/ansible/facts.d/{name}.fact").content_string)

    def image(self) -> str:
        kind = "cache" if self.vars.get("sglang_rvv_cache", "warm") == "warm" else "model"
        model = self.vars.get("sglang_rvv_model", "")
        env = ""
        if self.vars.get("sglang_rvv_model_dir"):  # the target's copy names the image (group_vars/all.yml)
            store = self.vars.get("sglang_rvv_model_store_dir", "/opt/sglang-rvv/models")
            copy = f"{store}/{self.vars['sglang_rvv_model_dir'].rstrip('/').rsplit('/', 1)[-1]}"
            model, env = "", f"SGLANG_RVV_CHECKPOINT_DIR={shlex.quote(copy)} "
        command = f"cd {shlex.quote(self.src())} && {env}images/scripts/image-name.sh {kind} {self.arch()} {model}"
        return self.run_ok(command).strip()

    def arch(self) -> str:
        """The served image's arch: sglang_rvv_arch (an emulated one runs under qemu-user), else the
        target machine's, as the lock names it."""
        return self.vars.get("sglang_rvv_arch") or self.lock("arch-of", self.host.system_info.arch)

    def lock(self, *args: str) -> str:
        """images/scripts/lock.py in the deployed tree."""
        return self.run_ok(f"cd {shlex.quote(self.src())} && python3 images/scripts/lock.py "
                           f"{' '.join(map(shlex.quote, args))}").strip()


@pytest.fixture(scope="module")
def target(host) -> Target:
    return Target(host)
