"""images/lock.toml: `make lock` refreshes the pins that follow from the repo; a stale pin is named."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import tomllib

import pytest
from image_support import LOCK_PY, REPO


def _lock_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["python3", LOCK_PY, *args], capture_output=True, text=True, timeout=60)


def test_the_committed_lock_is_current():
    result = _lock_py("check")
    assert result.returncode == 0, result.stderr


# Each derived pin made stale (the edits), what `check` says of it, and what `refresh` says it changed.
STALE_PINS = {
    "versions and cache keys": (
        [('version = "0.5.21"', 'version = "0.0.1"'), ('inductor_cache_key = "', 'inductor_cache_key = "0000')],
        ["sglang.version 0.0.1 != requirements/lock.txt sglang==0.5.21", "inductor_cache_key is stale"],
        "sglang.version: 0.0.1 -> 0.5.21"),
    "the kernels' source digest": (
        [('\nsource_sha256 = "', '\nsource_sha256 = "0000')],  # not [tools.count]'s plugin_source_sha256
        ["arch.riscv64.kernels.source_sha256 is stale: app/sglang_rvv/kernels/csrc gives"],
        None),
}


@pytest.mark.parametrize("pins", list(STALE_PINS))
def test_refresh_rewrites_stale_derived_pins_and_nothing_else(tmp_path, pins):
    edits, check_messages, refresh_message = STALE_PINS[pins]
    good = (REPO / "images" / "lock.toml").read_text()
    stale = good
    for old, new in edits:
        stale = stale.replace(old, new, 1)
    assert stale != good
    lock = tmp_path / "lock.toml"
    lock.write_text(stale)

    check = _lock_py("--lock", str(lock), "check")
    assert check.returncode == 1
    for message in check_messages:
        assert message in check.stderr

    refresh = _lock_py("--lock", str(lock), "refresh")
    assert refresh.returncode == 0, refresh.stderr
    if refresh_message:
        assert refresh_message in refresh.stdout
    assert lock.read_text() == good  # comments, order and every other pin untouched


def test_a_copy_of_the_app_version_that_disagrees_is_named(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("lock_py", LOCK_PY)
    lock_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock_py)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name in lock_py.VERSION_COPIES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    monkeypatch.setattr(lock_py, "REPO_DIR", tmp_path)
    assert lock_py._version_copies(version) == []

    gateway = tmp_path / "compose/gateway.yaml"
    gateway.write_text(gateway.read_text().replace(f"gateway:{version}-", "gateway:0.0.9-"))
    (problem,) = lock_py._version_copies(version)
    assert problem.startswith(f"compose/gateway.yaml: app version 0.0.9 != pyproject.toml {version} "
                              "(a version bump edits pyproject.toml and every copy: app/sglang_rvv/__init__.py")
