"""The ``python -m`` commands that the Makefile, the image scripts and the README invoke exist
under those names (``--help`` only: what they do is tested with their modules)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module, invoked_by", [
    ("sglang_rvv.launch", "make serve"),
    ("sglang_rvv.cache_build", "images/scripts/build-cache.sh"),
    ("sglang_rvv.smoke", "ansible's sglang_rvv_service role and the README"),
    ("sglang_rvv.boardmodel.compare", "make peer-compare"),
])
def test_python_m_command_answers_help(module, invoked_by):
    proc = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{invoked_by} runs `python -m {module}`:\n{proc.stderr}"
    assert proc.stdout.startswith(f"usage: python -m {module}"), proc.stdout
