"""ansible-lint (production profile) and yamllint are clean on the playbooks, roles and compose file."""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib

import yaml
from ansible_support import ANSIBLE_DIR, BIN, ENV, REPO


def test_ansible_lint_production_profile_is_clean():
    result = subprocess.run([BIN / "ansible-lint", "--profile", "production"], cwd=ANSIBLE_DIR, env=ENV,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in result.stderr


def test_yamllint_is_clean():
    result = subprocess.run([BIN / "yamllint", "--strict", "ansible", "compose", ".yamllint"], cwd=REPO, env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_roles_arch_names_are_the_locks():
    """A role maps Ansible's architecture fact to the lock's arch names in Jinja, where the lock
    cannot be read; each such map must be images/lock.toml's arch.*.machine, inverted."""
    lock = tomllib.loads((REPO / "images" / "lock.toml").read_text())
    expected = {pins["machine"]: arch for arch, pins in lock["arch"].items()}
    maps = {}
    for path in sorted(ANSIBLE_DIR.glob("roles/*/vars/main.yml")):
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            found = re.fullmatch(r"\{\{ (\{.*\})\[ansible_facts\.architecture\] \}\}", str(value))
            if found:
                maps[f"{path.parent.parent.name}: {name}"] = ast.literal_eval(found.group(1))
    assert len(maps) == 3, maps  # the build, reproduce and service roles
    for where, mapping in maps.items():
        assert mapping == expected, where
