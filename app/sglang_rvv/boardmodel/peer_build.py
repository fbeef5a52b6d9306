"""Where the peer's builds are (peer/build.sh), and whether one is whole: its ``peer.json``, which
the build renames into place last. Nothing here builds: a missing build is one line naming the
command that makes it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .tool import REPO, ToolError, lock

VARIANTS = ("rvv", "ime", "host")


def peer_dir() -> Path:
    return Path(os.environ.get("SGLANG_RVV_PEER_DIR", REPO / ".cache" / "peer"))


@dataclass(frozen=True)
class Build:
    variant: str
    path: Path
    manifest: dict

    def binary(self, name: str) -> Path:
        path = self.path / "bin" / name
        if not path.is_file():
            raise ToolError(f"the peer's {self.variant} build has no {name} ({path}): rebuild it with "
                            f"peer/build.sh {self.variant}")
        return path

    @property
    def sysroot(self) -> Path:
        return self.path / "sysroot"


def qemu_cpu(base: str) -> str:
    """The peer's qemu ``-cpu``: the counting one's (``base``) with the K1 extensions ggml's RVV
    build uses (images/lock.toml [peer.llama_cpp] qemu_cpu_extensions)."""
    return f"{base},{lock()['peer']['llama_cpp']['qemu_cpu_extensions']}"


def require(variant: str) -> Build:
    """The whole build of ``variant``, built from the lock's sdist; else a ToolError naming the fix."""
    if variant not in VARIANTS:
        raise ToolError(f"unknown peer build {variant!r}: choose one of {', '.join(VARIANTS)}")
    path = peer_dir() / f"llama.cpp-{variant}"
    stamp = path / "peer.json"
    if not stamp.is_file():
        raise ToolError(f"missing peer build: {path} has no peer.json; build it with peer/build.sh {variant} "
                        "(make peer-build)")
    manifest = json.loads(stamp.read_text())
    want = lock()["peer"]["llama_cpp"]["sha256"]
    if manifest.get("sdist_sha256") != want:
        raise ToolError(f"the peer build {path} is of sdist {manifest.get('sdist_sha256', '?')[:12]}, images/lock.toml "
                        f"[peer.llama_cpp] pins {want[:12]}: rebuild it with peer/build.sh {variant}")
    return Build(variant, path, manifest)
