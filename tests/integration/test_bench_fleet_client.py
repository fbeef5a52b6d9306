"""The fleet client runs in the gateway image, which has Python and smg but none of this
project's dependencies (make reproduce mounts the source there): its imports must stay in the
standard library."""

from __future__ import annotations

import subprocess
import sys

from image_support import REPO


def test_the_fleet_client_imports_with_the_standard_library_only():
    # -S: no site-packages, so any third-party import (torch, psutil, ...) fails here.
    result = subprocess.run([sys.executable, "-S", "-m", "sglang_rvv.bench.fleet", "--help"], capture_output=True,
                            text=True, timeout=60, env={"PYTHONPATH": str(REPO / "app")})
    assert result.returncode == 0, result.stderr
    assert "--gateway" in result.stdout


def test_the_fleet_client_names_a_gateway_that_does_not_answer():
    result = subprocess.run([sys.executable, "-S", "-m", "sglang_rvv.bench.fleet", "--gateway", "http://127.0.0.1:9"],
                            capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(REPO / "app")})
    assert result.returncode == 1
    assert "http://127.0.0.1:9/workers did not answer as a gateway" in result.stderr
    assert "make gateway" in result.stderr
