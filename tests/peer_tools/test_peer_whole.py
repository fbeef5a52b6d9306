"""llama.cpp's whole build (peer/build.sh rvv host): llama-bench and llama-quantize for riscv64, and
the host llama-quantize that makes every quantized GGUF file, which make peer-compare and make
reproduce need and make test's core build (tests/peer) leaves out."""

from __future__ import annotations

from pathlib import Path

import pytest
from image_support import lock_get, run

from sglang_rvv.boardmodel import compare, peer_build, peer_models

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def builds() -> tuple[peer_build.Build, peer_build.Build]:
    run([str(REPO / "peer" / "build.sh"), "rvv", "host"], timeout=5400)
    return peer_build.require("rvv"), peer_build.require("host")


def test_the_whole_build_has_every_tool_and_the_host_quantizer_knows_the_types(builds):
    rvv, host = builds
    assert (rvv.path / "march.txt").read_text().strip() == lock_get("peer.llama_cpp.march")
    for name in ("llama-bench", "llama-simple", "llama-quantize", "peer-count"):
        assert rvv.binary(name).is_file()
    assert {"Q4_0", "Q8_0", "Q4_K_M", "Q4_1"} <= peer_models.quantize_types(host.path)


def test_an_unknown_format_is_named_before_anything_is_counted(builds, capsys, tmp_path):
    assert compare.main(["--shapes", "tiny", "--formats", "Q3_X", "--layouts", "none",
                         "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("peer-compare: error: unknown format 'Q3_X': llama-quantize knows ") and "Q4_0" in err[-1]
    assert not (tmp_path / compare.RESULT).exists()
