"""images/lock.toml: `make lock` refreshes the pins that follow from the repo; a stale pin is named."""

from __future__ import annotations

import subprocess

from image_support import LOCK_PY, REPO


def _lock_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", LOCK_PY, *args], capture_output=True, text=True, timeout=60)


def test_the_committed_lock_is_current():
    result = _lock_py("check")
    assert result.returncode == 0, result.stderr


def test_refresh_rewrites_stale_derived_pins_and_nothing_else(tmp_path):
    good = (REPO / "images" / "lock.toml").read_text()
    stale = (good.replace('version = "0.5.21"', 'version = "0.0.1"', 1)
                 .replace('inductor_cache_key = "', 'inductor_cache_key = "0000', 1))
    assert stale != good
    lock = tmp_path / "lock.toml"
    lock.write_text(stale)

    check = _lock_py("--lock", str(lock), "check")
    assert check.returncode == 1
    assert "sglang.version 0.0.1 != requirements/lock.txt sglang==0.5.21" in check.stderr
    assert "inductor_cache_key is stale" in check.stderr

    refresh = _lock_py("--lock", str(lock), "refresh")
    assert refresh.returncode == 0, refresh.stderr
    assert "sglang.version: 0.0.1 -> 0.5.21" in refresh.stdout
    assert lock.read_text() == good  # comments, order and every other pin untouched


def test_a_stale_kernels_digest_is_named_and_refreshed(tmp_path):
    good = (REPO / "images" / "lock.toml").read_text()
    stale = good.replace('source_sha256 = "', 'source_sha256 = "0000', 1)
    assert stale != good
    lock = tmp_path / "lock.toml"
    lock.write_text(stale)

    check = _lock_py("--lock", str(lock), "check")
    assert check.returncode == 1
    assert "arch.riscv64.kernels.source_sha256 is stale: app/sglang_rvv/kernels/csrc gives" in check.stderr

    refresh = _lock_py("--lock", str(lock), "refresh")
    assert refresh.returncode == 0, refresh.stderr
    assert lock.read_text() == good
