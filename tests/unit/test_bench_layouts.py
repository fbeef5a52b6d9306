"""The layouts benchmark's arithmetic, table and availability check (nothing timed)."""

import argparse

import pytest
import torch

from sglang_rvv.bench import layouts


def _row(weight_dtype, rows, packed_us, linear_us=100.0, read_us=None, bytes_per_call=8 << 20):
    row = dict(projection="o_proj", n=2048, k=2048, weight_dtype=weight_dtype, rows=rows, routes=["packed_compiled"],
               bytes_per_call=bytes_per_call, packed_us=packed_us, linear_us=linear_us)
    if read_us is not None:
        row["read_us"] = read_us
    return row


def test_ratios_are_to_the_same_cells_bf16_packed_and_f_linear():
    results = layouts.with_ratios([
        _row("bf16", 1, 80.0, read_us=70.0),
        _row("int8", 1, 50.0, read_us=40.0, bytes_per_call=4 << 20),
        _row("int4", 1, 40.0, bytes_per_call=2 << 20) | {"read_us": 20.0},
        dict(projection="o_proj", n=2048, k=2048, weight_dtype="int4", rows=4, not_available="why"),
    ])
    bf16, int8, int4, missing = results
    assert bf16["vs_bf16_packed"] == 1.0 and int8["vs_bf16_packed"] == 80 / 50 and int4["vs_bf16_packed"] == 2.0
    assert int8["vs_linear"] == 100 / 50
    assert int8["packed_gbs"] == pytest.approx((4 << 20) / 50e-6 / 1e9)  # its own bytes, scales included
    assert int4["of_read"] == pytest.approx(20 / 40)  # same bytes: the time ratio
    assert "packed_gbs" not in missing


def test_the_table_says_not_available_with_the_reason():
    table = layouts.format_table(layouts.with_ratios([
        _row("bf16", 1, 80.0, read_us=70.0),
        dict(projection="o_proj", n=2048, k=2048, weight_dtype="int8", rows=1, not_available="packed as bf16"),
    ]))
    lines = table.splitlines()
    assert lines[0].count("|") == lines[2].count("|") == lines[3].count("|") == 14
    assert "| int8 | 1 | not available: packed as bf16 |" in lines[3]
    assert "| 8.00 | 80 | n/a | 100 |" in lines[2] and "88%" in lines[2]  # a run without the eager time


def test_the_faster_packed_call_sets_the_bandwidth_as_the_route_table_would_serve_it():
    eager_wins, compiled_wins = layouts.with_ratios([
        _row("bf16", 1, 80.0, read_us=40.0) | {"eager_us": 50.0},
        _row("int8", 1, 60.0, read_us=20.0, bytes_per_call=4 << 20) | {"eager_us": 70.0},
    ])
    assert eager_wins["packed_gbs"] == pytest.approx((8 << 20) / 50e-6 / 1e9) and eager_wins["of_read"] == 40 / 50
    assert compiled_wins["vs_bf16_packed"] == 50 / 60 and compiled_wins["vs_linear"] == 100 / 60
    row = layouts.format_table([eager_wins]).splitlines()[2]
    assert "| 8.00 | 80 | 50 | 100 | 167.8 |" in row


def test_an_unknown_dtype_is_an_argparse_error():
    with pytest.raises(argparse.ArgumentTypeError, match="choose a comma-separated subset of bf16,int8,int4"):
        layouts._dtypes("bf16,fp8")
    assert layouts._dtypes("int4, bf16") == ["int4", "bf16"]


def test_a_layout_the_policy_cannot_build_is_not_available_not_a_crash():
    linears = [torch.nn.Linear(1024, 512, bias=False, dtype=torch.bfloat16).requires_grad_(False) for _ in range(2)]
    policy, missing = layouts._policy(linears, "o_proj", "bf16x")  # a dtype no config accepts
    assert policy is None and missing.startswith("ValueError: ")
    policy, missing = layouts._policy(linears, "o_proj", "bf16")  # N=512: below the gate's minimum
    assert missing.startswith("packed 0 of 2 copies: ") and "below the 1024 minimum" in missing
