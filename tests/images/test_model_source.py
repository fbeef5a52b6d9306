"""The real-model path of images/scripts/model.sh against a local mirror: pinned revision, every
file checked against the lock, nothing installed unless all of them match."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest
from image_support import REPO

from sglang_rvv.checkpoint import write_tiny_checkpoint

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("mirror-source") / "ckpt"
    write_tiny_checkpoint(path, "qwen3")
    return path


def _lock_with_mirror_model(tmp_path, checkpoint):
    shas = "\n".join(f'"{p.name}" = "{hashlib.sha256(p.read_bytes()).hexdigest()}"'
                     for p in sorted(checkpoint.iterdir()))
    lock = tmp_path / "lock.toml"
    lock.write_text((REPO / "images" / "lock.toml").read_text() + f'''
[models.mirror-test]
kind = "hf"
repo = "local/tiny-qwen3"
revision = "{REVISION}"
[models.mirror-test.sha256]
{shas}
''')
    return lock


def _model_sh(tmp_path, lock, mirror):
    env = {**os.environ, "SGLANG_RVV_LOCK": str(lock), "SGLANG_RVV_HF_MIRROR": str(mirror),
           "SGLANG_RVV_BUILD_DIR": str(tmp_path / "build")}
    return subprocess.run([REPO / "images" / "scripts" / "model.sh", "mirror-test"], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_mirrored_revision_is_verified_and_installed(tmp_path, checkpoint):
    lock = _lock_with_mirror_model(tmp_path, checkpoint)
    mirror = tmp_path / "mirror"
    shutil.copytree(checkpoint, mirror / "local" / "tiny-qwen3" / REVISION)
    result = _model_sh(tmp_path, lock, mirror)
    assert result.returncode == 0, result.stderr
    installed = tmp_path / "build" / "models" / "mirror-test"
    assert result.stdout.strip() == str(installed)
    assert sorted(p.name for p in installed.iterdir()) == sorted(p.name for p in checkpoint.iterdir())


def test_a_tampered_mirror_file_is_named_and_nothing_is_installed(tmp_path, checkpoint):
    lock = _lock_with_mirror_model(tmp_path, checkpoint)
    mirror = tmp_path / "mirror"
    shutil.copytree(checkpoint, mirror / "local" / "tiny-qwen3" / REVISION)
    (mirror / "local" / "tiny-qwen3" / REVISION / "config.json").write_text("{}")
    result = _model_sh(tmp_path, lock, mirror)
    assert result.returncode == 1
    assert "models.mirror-test:" in result.stderr and "config.json sha256" in result.stderr
    assert "nothing was installed" in result.stderr
    assert not (tmp_path / "build" / "models" / "mirror-test").exists()
    assert not list((tmp_path / "build" / "models").glob("*.tmp-*")), "a temporary directory was left behind"


def test_a_revision_missing_from_the_mirror_says_where_it_looked(tmp_path, checkpoint):
    lock = _lock_with_mirror_model(tmp_path, checkpoint)
    result = _model_sh(tmp_path, lock, tmp_path / "empty-mirror")
    assert result.returncode == 1
    assert f"local/tiny-qwen3/{REVISION} not found in the mirror" in result.stderr
