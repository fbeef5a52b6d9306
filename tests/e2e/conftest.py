"""Shared fixtures for the end-to-end tests: tiny checkpoints, one Inductor cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_rvv.checkpoint import write_tiny_checkpoint
from sglang_rvv.tiny import ARCHS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def inductor_cache_dir() -> Path:
    """The Inductor cache every server of the session shares.

    The Makefile exports ``TORCHINDUCTOR_CACHE_DIR``; a bare ``pytest`` run gets the
    same default, so compiled artifacts are reused either way. Servers inherit
    ``os.environ``, so setting it here reaches them.
    """
    path = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(REPO / ".cache" / "inductor")))
    path.mkdir(parents=True, exist_ok=True)
    return path


class TinyCheckpoints:
    """``tiny_checkpoints[arch]``: the directory of that tiny checkpoint, written on first use."""

    def __init__(self, root: Path):
        self.root = root
        self._paths: dict[str, Path] = {}

    def __getitem__(self, arch: str) -> Path:
        if arch not in ARCHS:
            raise KeyError(f"unknown tiny architecture {arch!r}; choose one of {sorted(ARCHS)}")
        if arch not in self._paths:
            path = self.root / arch
            write_tiny_checkpoint(path, arch)
            self._paths[arch] = path
        return self._paths[arch]


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> TinyCheckpoints:
    return TinyCheckpoints(tmp_path_factory.mktemp("tiny-checkpoints"))


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    """Directory for server logs (pytest keeps the last few runs' temp dirs for inspection)."""
    return tmp_path_factory.mktemp("server-logs")
