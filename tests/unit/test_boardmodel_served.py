"""The served token's pricing (boardmodel/served.py): the scheduler's kernel as counted, the rest at
the by-thread estimate, the bytes from the server's own report (no qemu needed; the counts
themselves: make served-count)."""

from __future__ import annotations

import pytest

from sglang_rvv.boardmodel import counts, model, served, tool


def _component(insns: float, vec: float = 0.0) -> dict:
    return {**dict.fromkeys(counts.FIELDS, 0.0), "insns": insns, "vec_insns": vec, "vec_lmul": vec}


def _scheduler(kernel: float, rest: dict[str, float], thread_estimate: float | None) -> dict:
    raw = {name: _component(0.0) for name in counts.COMPONENT_NAMES}
    raw["kernel"] = _component(kernel, vec=kernel / 2)
    raw.update({name: _component(v) for name, v in rest.items()})
    out = {"per_token_raw": raw}
    if thread_estimate is not None:
        out["thread_estimate"] = thread_estimate
    return out


def test_the_rest_is_scaled_to_the_thread_estimate_in_the_processs_proportions():
    scheduler = _scheduler(200e6, {"interpreter": 30e6, "torch": 10e6}, thread_estimate=220e6)
    components = served.token_components(scheduler)
    assert components["kernel"] == scheduler["per_token_raw"]["kernel"]
    assert components["interpreter"]["insns"] == pytest.approx(15e6)  # 20 M outside, split 3:1
    assert components["torch"]["insns"] == pytest.approx(5e6)


def test_a_count_without_thread_rows_is_refused():
    with pytest.raises(tool.ToolError, match="threads=1"):
        served.token_components(_scheduler(1e6, {"interpreter": 1e6}, thread_estimate=None))


def test_rows_price_the_reports_packed_bytes_at_each_thread_count():
    counted = {"processes": {"scheduler": _scheduler(200e6, {"interpreter": 40e6}, thread_estimate=224.6e6)}}
    report = {"packed": ["qkv_proj", "lm_head"], "skipped": {}, "packed_bytes": 400_000_000,
              "layouts": {"lm_head": "int8"}, "config": {"lm_head_exact_candidates": 0}}
    rows = served.priced_rows("qwen3-0.6b", "int4", counted, report, (4, 8))
    assert [r["threads"] for r in rows] == [4, 8]
    for row in rows:
        want = model.predict(served.token_components(counted["processes"]["scheduler"]), 400_000_000,
                             row["threads"])
        assert row["modelled_tok_s"] == pytest.approx(want["tok_per_s"])
        assert row["outside_kernels_per_token"] == pytest.approx(24.6e6)
        assert (row["bytes_per_token"], row["lm_head"], row["speculative"]) == (400_000_000, "int8", None)
    # 400 MB at the stated bandwidth bounds the token; the 24.6 M outside add their serial seconds.
    stream = 400_000_000 / model.c("bandwidth_bytes_per_s")
    assert rows[0]["modelled_tok_s"] == pytest.approx(1 / (stream + rows[0]["seconds_outside_kernels"]))
    assert rows[0]["seconds_outside_kernels"] == pytest.approx(
        24.6e6 / model.c("ipc_interpreter") / model.c("freq_hz"))


@pytest.mark.parametrize("report", [
    {"packed": ["qkv_proj"], "skipped": {}, "packed_bytes": 1, "layouts": {}},
    {"packed": ["lm_head"], "skipped": {"model.layers.0.mlp.down_proj": "shape gate"}, "packed_bytes": 1,
     "layouts": {}},
])
def test_a_server_that_left_weights_row_major_is_refused_by_name(report):
    with pytest.raises(tool.ToolError, match="row-major"):
        served.streamed_bytes(report)


@pytest.mark.parametrize("argv, needle", [
    (["--tokens", "7,3"], "the second longer"),
    (["--tokens", "x"], "SHORT,LONG"),
    (["--threads", "9"], "8 cores"),
    (["--layouts", "int3"], "invalid choice"),
    (["--candidates", "-1"], "0 (off)"),
])
def test_bad_arguments_exit_with_the_message(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        served.parse(argv)
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err


def test_an_unknown_shape_is_refused_before_anything_is_counted():
    args = served.parse(["--shapes", "qwen9"])
    with pytest.raises(tool.ToolError, match="no model shape 'qwen9'"):
        served.count_all(args, counter=object(), root=object())
