"""Each image script's --help is its header comment, however long the header grows (lib.sh's usage):
images/scripts/ and the peer's build (peer/build.sh), which uses the same lib.sh."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "images" / "scripts"
WITH_HELP = sorted(p.relative_to(REPO).as_posix() for p in (*SCRIPTS.glob("*.sh"), *(REPO / "peer").glob("*.sh"))
                   if p.name != "lib.sh" and ("--help" in p.read_text() or "build_start " in p.read_text()))


def _header(path: Path) -> str:
    lines = path.read_text().splitlines()[1:]
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        header.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(header) + "\n"


def test_the_build_scripts_all_have_help():
    assert {f"images/scripts/{name}" for name in ("build-base.sh", "build-runtime.sh", "build-model.sh",
                                                  "build-cache.sh", "build-gateway.sh", "podman-setup.sh")} \
        | {"peer/build.sh"} <= set(WITH_HELP)


@pytest.mark.parametrize("script", WITH_HELP)
def test_help_prints_the_whole_header_and_exits_0(script):
    result = subprocess.run(["bash", REPO / script, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == _header(REPO / script)
