"""The peer compare's host half: one model prices both engines (threads, prefill), the published
anchors are held to the row they compare with, the targets' ratios, the GGUF names, and the clear
refusals (no qemu, no llama.cpp build needed)."""

from __future__ import annotations

import pytest

from sglang_rvv.bench.report import peer as report_peer
from sglang_rvv.boardmodel import compare, counts, model, peer, peer_build, peer_models, run, tool


def zero(**values):
    return {**dict.fromkeys(counts.FIELDS, 0), **values}


def step(scalar: int, vector: int, outside: int) -> dict:
    """One phase: the kernel's scalar and LMUL-1 vector instructions, and the rest's."""
    out = {name: zero() for name in counts.COMPONENT_NAMES}
    out["kernel"] = zero(insns=scalar + vector, vec_insns=vector, vec_lmul=vector)
    out["other"] = zero(insns=outside)
    return out


def counted(name: str, decode: dict, prefill: dict, tokens: int = 128) -> dict:
    return {"workload": {"name": name, "prefill_len": tokens}, "shape": run.shape(name),
            "phases": {run.PER_TOKEN: {"components": decode}, run.PREFILL: {"components": prefill}}}


def test_the_kernel_splits_over_the_threads_and_the_rest_stays_serial():
    s = step(160_000_000, 0, 7_000_000)  # 160 M scalar kernel instructions at IPC 1
    four, eight = model.predict(s, 0, 4), model.predict(s, 0, 8)
    assert four["component_seconds"]["kernel"] == pytest.approx(0.1 / 4)
    assert eight["component_seconds"]["kernel"] == pytest.approx(0.1 / 8)
    assert four["component_seconds"]["other"] == eight["component_seconds"]["other"] == pytest.approx(0.00625)
    assert model.predict(s, 0) == four  # the default is the constant kernel_threads (4)
    # A large stream bounds the token whatever the threads.
    assert model.predict(s, 450_000_000, 8)["bound"] == "weight stream"


def test_a_prefill_is_priced_by_its_vector_work_and_grows_by_its_multiply_adds():
    shape = run.shape("tinyllama-1.1b")
    pp = step(0, 16_000_000_000, 128_000_000)  # LMUL-1 vector ops: VLEN/DLEN = 2 cycles each
    p = model.predict_prefill(pp, 640_000_000, shape, 128, threads=8)
    assert p["bound"] == "kernel instructions"
    assert p["seconds"] == pytest.approx(32e9 / 1.6e9 / 8 + 128e6 / 0.7 / 1.6e9)
    assert p["tok_per_s"] == pytest.approx(128 / p["seconds"])
    longer = model.predict_prefill(pp, 640_000_000, shape, 128, 512, threads=8)
    growth = model.prefill_macs(shape, 512) / model.prefill_macs(shape, 128)
    assert 4 < growth < 4.2  # the attention grows with the position, the projections do not
    assert longer["component_seconds"]["kernel"] == pytest.approx(p["component_seconds"]["kernel"] * growth)
    assert longer["component_seconds"]["other"] == pytest.approx(p["component_seconds"]["other"] * 4)


def test_the_calibration_anchor_gets_its_error_and_a_bound_only_its_ratio():
    rows = []
    for name, path, fmt, threads in (("tinyllama-1.1b", "vec_dot", "Q4_K_M", 8), ("qwen3-0.6b", "repack", "Q4_0", 4)):
        result = counted(name, step(300_000_000, 250_000_000, 9_000_000), step(0, 30_000_000_000, 300_000_000))
        rows.append(compare.priced_row(result, "llama.cpp", path, fmt, threads, 640_000_000))
    anchors = compare.held_to_anchors(rows)
    tiny = next(a for a in anchors if a["model"] == "tinyllama-1.1b")
    assert tiny["use"] == "calibration" and tiny["comparable"].startswith("llama.cpp vec_dot tinyllama-1.1b")
    assert tiny["error"]["decode"] == pytest.approx(rows[0]["modelled_decode_tok_s"] / 8.29 - 1)
    assert rows[0]["published_tok_s"] == {"decode": 8.29, "prefill": 12.46, "prefill_test": "pp512"}
    assert tiny["error"]["prefill"] == pytest.approx(rows[0]["modelled_anchor_prefill_tok_s"] / 12.46 - 1)
    assert rows[0]["modelled_anchor_prefill_tok_s"] < rows[0]["modelled_prefill_tok_s"]  # pp512 costs more a token
    assert rows[0]["modelled_prefill_tokens"] == 128 and rows[0]["prefill_tokens"] == 128  # priced at the target's
    ime = next(a for a in anchors if a["model"] == "qwen3-0.6b")
    assert ime["use"] == "bound" and ime["comparable"].startswith("llama.cpp repack qwen3-0.6b")  # the best plain path
    assert rows[1]["published_tok_s"] is None  # a bound never calibrates a row
    missing = next(a for a in anchors if a["model"] == "qwen2.5-0.5b")
    assert missing["comparable"] is None and "error" not in missing


def test_an_anchor_is_never_matched_to_another_thread_count(capsys):
    result = counted("tinyllama-1.1b", step(1, 0, 1), step(1, 0, 1))
    rows = [compare.priced_row(result, "llama.cpp", "vec_dot", "Q4_K_M", 4, 1)]
    anchors = compare.held_to_anchors(rows)
    assert all(a["comparable"] is None for a in anchors)
    assert "no comparable count (needs llama.cpp vec_dot tinyllama-1.1b Q4_K_M at 8 threads)" in capsys.readouterr().err


def test_the_targets_are_ours_over_llama_cpps_plain_q4_0_at_the_same_threads():
    ours = counted("qwen3-0.6b", step(100, 0, 100), step(1000, 0, 100))
    theirs = counted("qwen3-0.6b", step(100, 0, 50), step(1000, 0, 300))
    rows = [compare.priced_row(ours, "sglang-rvv", "policy forward", "int4", t, 350_000_000) for t in (4, 8)]
    rows += [compare.priced_row(theirs, "llama.cpp", "vec_dot", "Q4_0", t, 380_000_000) for t in (4, 8)]
    rows += [compare.priced_row(theirs, "llama.cpp", "vec_dot", "Q8_0", 4, 680_000_000)]
    out = compare.ratios(rows)
    assert {(r["what"], r["threads"]) for r in out} == {("decode", 4), ("decode", 8), ("prefill128", 4),
                                                        ("prefill128", 8)}
    decode = next(r for r in out if r["what"] == "decode" and r["threads"] == 4)
    assert decode["ratio"] == pytest.approx(380 / 350)  # both stream-bound: the bytes decide
    assert decode["met"] is False and decode["target"] == 1.2


def test_a_served_row_is_held_to_the_decode_target_and_has_no_prefill():
    theirs = counted("qwen3-0.6b", step(100, 0, 50), step(1000, 0, 300))
    row = {"shape": "qwen3-0.6b", "layout": "int4", "threads": 4, "kernel_per_token": 200e6,
           "outside_kernels_per_token": 20e6, "lm_head": "int8", "bytes_per_token": 400e6, "modelled_tok_s": 9.5,
           "bound": "weight stream"}
    rows = [compare.served_row(row), compare.priced_row(theirs, "llama.cpp", "repack", "Q4_0", 4, 380_000_000)]
    out = compare.ratios(rows)
    assert [(r["what"], r["ours"]) for r in out] == [("decode", "served int4")]
    assert out[0]["ratio"] == pytest.approx(9.5 / rows[1]["modelled_decode_tok_s"])
    assert rows[0]["decode_instructions"] == 220e6 and rows[0]["modelled_prefill_tok_s"] is None
    anchors = compare.held_to_anchors(rows)
    for r in rows:
        r.pop("_counted")
    text = report_peer.section({"label": compare.LABEL, "peers": rows, "ratios": out, "anchors": anchors,
                                "constants": model.constants_json()})
    served = next(line for line in text.splitlines() if line.startswith("| sglang-rvv | served"))
    assert "| not counted | n/a |" in served and "| 9.50 |" in served


def test_bad_arguments_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        compare.parse(["--layouts", "int3"])
    assert "unknown layout 'int3'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.parse(["--threads", "16"])
    assert "the K1 has 8 cores" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.parse(["--prefill", "0"])
    assert "give at least 1 token" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare.parse(["--paths", "gemm"])
    assert "--paths: choose from vec_dot, repack or none" in capsys.readouterr().err
    assert compare.parse(["--layouts", "none"]).layouts == []
    assert compare.parse(["--paths", "none"]).paths == []


def test_a_missing_peer_build_names_the_command_that_makes_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SGLANG_RVV_PEER_DIR", str(tmp_path))
    with pytest.raises(tool.ToolError, match=r"missing peer build: .*llama.cpp-rvv has no peer.json; build it with "
                                             r"peer/build.sh rvv \(make peer-build\)"):
        peer_build.require("rvv")
    (tmp_path / "llama.cpp-host").mkdir()
    (tmp_path / "llama.cpp-host" / "peer.json").write_text('{"sdist_sha256": "0123456789abcdef"}')
    with pytest.raises(tool.ToolError, match=r"of sdist 0123456789ab, images/lock.toml \[peer.llama_cpp\] pins "):
        peer_build.require("host")
    with pytest.raises(tool.ToolError, match="unknown peer build 'arm'"):
        peer_build.require("arm")
    # peer-compare says it in one line, before anything is counted, and writes nothing.
    capsys.readouterr()
    assert compare.main(["--shapes", "qwen3-0.6b", "--run-dir", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.startswith("peer-compare: error: the peer build ")
    assert not (tmp_path / "run").exists()


def test_an_unknown_shape_is_named_before_anything_is_built():
    with pytest.raises(tool.ToolError, match=r"no model shape 'gpt2'"):
        compare.count_all(compare.parse(["--shapes", "gpt2"]))


def test_gguf_names_follow_llama_cpps_converter():
    assert peer_models.gguf_name("model.layers.3.self_attn.q_proj.weight") == "blk.3.attn_q.weight"
    assert peer_models.gguf_name("model.layers.0.self_attn.k_norm.weight") == "blk.0.attn_k_norm.weight"
    assert peer_models.gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert peer_models.gguf_name("model.embed_tokens.weight") == "token_embd.weight"
    assert peer_models.gguf_name("lm_head.weight") == "output.weight"
    assert peer_models.gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    import torch

    rows = torch.arange(8).reshape(8, 1)  # one head of 8: HF's halves [0..3][4..7] become pairs
    assert peer_models._llama_permute(rows, 1).flatten().tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_the_peer_names_its_phases_as_the_appliances_guest_does():
    work = peer.PeerWork("qwen3-0.6b", "Q4_0")
    assert work.label == "llama.cpp-qwen3-0.6b-Q4_0-vec_dot"
    assert run.phase_marks(work) == {"prefill": ("1", "2"), "decode1": ("2", "3"), "decode2": ("3", "4"),
                                     run.PREFILL: ("5", "6")}
    ours = run.Workload("tiny", policy=True, calls=8, prefill_len=128)
    assert run.phase_marks(ours)[run.PREFILL] == ("10", "11")  # after the projection calls' marks
    assert counts.component_of("libggml-cpu.so") == "kernel"
    assert counts.component_of("libllama.so") == counts.component_of("libggml-base.so") == "other"


def test_a_short_counted_prefill_is_priced_at_the_targets_128_tokens():
    result = counted("qwen3-0.6b", step(1, 0, 1), step(0, 1_600_000_000, 16_000_000), tokens=16)
    row = compare.priced_row(result, "llama.cpp", "repack", "Q4_0", 4, 375_000_000)
    assert row["prefill_tokens"] == 16 and row["prefill16_instructions"] == 1_616_000_000
    shape = run.shape("qwen3-0.6b")
    growth = model.prefill_macs(shape, 128) / model.prefill_macs(shape, 16)
    seconds = 3.2e9 * growth / 1.6e9 / 4 + 16e6 * 8 / 0.7 / 1.6e9
    assert row["modelled_prefill_tok_s"] == pytest.approx(128 / seconds)


def test_the_unquantized_types_are_written_without_llama_quantize(tmp_path, monkeypatch):
    import gguf
    import numpy as np
    import torch

    from sglang_rvv import tiny

    monkeypatch.setenv("SGLANG_RVV_PEER_DIR", str(tmp_path))  # no llama.cpp-host here
    shape = run.shape("tiny")
    path = peer_models.model_file("tiny", shape, "F16", log=lambda text: None)
    assert path.name == "tiny-F16.gguf" and not (tmp_path / "gguf" / "tiny-BF16.gguf").exists()
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    down = tensors["blk.1.ffn_down.weight"]
    assert down.tensor_type == gguf.GGMLQuantizationType.F16
    weights = tiny.build_model(shape["arch"], seed=0, **{k: v for k, v in shape.items() if k != "arch"}).state_dict()
    want = weights["model.layers.1.mlp.down_proj.weight"].to(torch.float16).numpy()
    assert np.array_equal(np.asarray(down.data).reshape(want.shape), want)
    assert tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    # Made once: a second ask finds it fresh; a quantized type still needs the host's llama-quantize.
    stamp = path.stat().st_mtime_ns
    assert peer_models.model_file("tiny", shape, "F16", log=lambda text: None).stat().st_mtime_ns == stamp
    with pytest.raises(tool.ToolError, match=r"missing peer build: .*llama.cpp-host has no peer.json"):
        peer_models.model_file("tiny", shape, "Q4_0", log=lambda text: None)
