"""ansible-lint (production profile) and yamllint are clean on the playbooks, roles and compose file."""

from __future__ import annotations

import subprocess

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
