"""Buckets, the shape gate and shape keys."""

import pytest
import torch

from sglang_rvv import RvvPolicyConfig, install_rvv_policy, routing
from sglang_rvv.policy import policy_of
from sglang_rvv.route_table import Entry, RouteTable
from sglang_rvv.routing import Mode, Route, Status, bucket_rows, static_gate


def test_bucket_table():
    expected_small = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 16, 15: 16, 16: 16, 17: 32,
                      33: 64, 64: 64, 65: 128, 128: 128, 129: None, 0: None}
    for rows, bucket in expected_small.items():
        assert bucket_rows(rows, small_batch=True, projection="o_proj") == bucket, rows
    for rows in range(2, 16):
        assert bucket_rows(rows, small_batch=False, projection="o_proj") is None
        assert bucket_rows(rows, small_batch=True, projection="lm_head") == expected_small.get(
            rows, bucket_rows(rows, small_batch=True, projection="o_proj"))
    for rows in range(16, 200):
        assert bucket_rows(rows, small_batch=True, projection="lm_head") == (16 if rows == 16 else None)
    assert bucket_rows(16, small_batch=False, projection="lm_head") is None
    assert bucket_rows(1, small_batch=False, projection="lm_head") == 1


def test_every_row_count_maps_to_a_bounded_set():
    buckets = {bucket_rows(m, small_batch=True, projection="down_proj") for m in range(1, 1000)}
    assert buckets == {None, 1, 2, 4, 8, 16, 32, 64, 128}


@pytest.mark.parametrize(
    "projection,shape,dtype,bias,reason",
    [
        ("o_proj", (1024, 1024), torch.bfloat16, False, None),
        ("o_proj", (1023, 1024), torch.bfloat16, False, "below the 1024 minimum"),
        ("o_proj", (1024, 1000), torch.bfloat16, False, "below the 1024 minimum"),
        ("o_proj", (1024, 1024), torch.float32, False, "dtype torch.float32"),
        ("qkv_proj", (1024, 1024), torch.bfloat16, torch.bfloat16, None),  # added after the kernel
        ("qkv_proj", (1024, 1024), torch.bfloat16, torch.float32, "bias torch.float32 (1024,) on cpu"),
        ("q_norm", (1024, 1024), torch.bfloat16, False, "not one of"),
    ],
)
def test_static_gate(projection, shape, dtype, bias, reason):
    weight = torch.empty(shape, dtype=dtype)
    got = static_gate(projection, weight, torch.empty(shape[0], dtype=bias) if bias else None)
    if reason is None:
        assert got is None
    else:
        assert reason in got


def _counts(model):
    return policy_of(model).counters


def test_row_counts_route_as_documented(llama):
    install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False, small_batch=False))
    o_proj = llama.model.layers[0].self_attn.o_proj
    with torch.no_grad():
        for rows in (1, 3, 16, 20, 129):
            o_proj(torch.randn(rows, 1024, dtype=torch.bfloat16))
    c = _counts(llama)
    assert c[("o_proj", "packed_eager", "1")] == 1
    assert c[("o_proj", "row_major_gate", "none")] == 2  # 3 (small batch off) and 129
    assert c[("o_proj", "packed_eager", "16")] == 1
    assert c[("o_proj", "packed_eager", "32")] == 1
    assert c[("o_proj", "row_major_gate", "2")] == 0
    assert sum(v for (p, r, _), v in c.items() if p == "o_proj" and r == "row_major_gate") == 2


def test_grad_mode_falls_back_to_row_major(llama):
    install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False))
    x = torch.randn(1, 1024, dtype=torch.bfloat16, requires_grad=True)
    out = llama.model.layers[0].self_attn.o_proj(x)
    out.float().sum().backward()  # row-major F.linear keeps autograd working
    assert x.grad is not None
    assert _counts(llama)[("o_proj", "row_major_gate", "1")] == 1


def test_compiled_callables_are_bounded_and_reused(llama):
    install_rvv_policy(llama, RvvPolicyConfig())
    compiled = policy_of(llama).context.compiled
    before = set(compiled.keys())
    with torch.no_grad():
        for seq in (5, 6, 7, 8):  # prefill rows 5..8 share bucket 8
            llama(torch.randint(0, 2050, (1, seq)))
        llama(torch.randint(0, 2050, (1, 1)))
    # Only buckets 1 and 8 are compiled; other tests may have compiled more keys in this process.
    new = set(compiled.keys()) - before
    assert {k.rows for k in new} <= {1, 8}
    assert all(k.mode == routing.Mode.EXPLICIT_PACKED for k in new)
    assert len(new) <= len(routing.PROJECTIONS) * 2
    used = {(p, b) for (p, route, b) in _counts(llama) if route == routing.Route.PACKED_COMPILED}
    assert used == {(p, b) for p in routing.PROJECTIONS for b in ("1", "8")}
    c = _counts(llama)
    # 2 layers x (q, o) + lm_head per forward, all through compiled code
    assert c[("qkv_proj", "packed_compiled", "8")] == 4 * 2
    assert c[("lm_head", "packed_compiled", "8")] == 4
    assert c[("lm_head", "packed_compiled", "1")] == 1


def test_regional_compile_without_packing_compiles_row_major(llama):
    report = install_rvv_policy(llama, RvvPolicyConfig(packed_weight_mode="off"))
    assert report.packed == [] and report.packed_bytes == 0
    with torch.no_grad():
        llama(torch.randint(0, 2050, (1, 1)))
    c = _counts(llama)
    assert c[("o_proj", "row_major_compiled", "1")] == 2
    key = routing.RegionalShapeKey(torch.bfloat16, "cpu", "o_proj", 1, 1024, 1024, routing.Mode.ROW_MAJOR)
    assert key in policy_of(llama).context.compiled.keys()


def test_many_keys_and_grad_modes_never_hit_the_recompile_limit():
    """Each key owns its Dynamo cache: more keys than the per-code-object limit (8) all compile."""
    from sglang_rvv import ops

    weight = torch.randn(64, 64, dtype=torch.bfloat16)
    packed = ops.pack_bf16_weight(weight)
    compiled = routing.CompiledCallables()
    for rows in range(1, torch._dynamo.config.recompile_limit + 2):
        key = routing.RegionalShapeKey(torch.bfloat16, "cpu", "test_proj", rows, 64, 64, routing.Mode.EXPLICIT_PACKED)
        fn = compiled.get(key)
        x = torch.randn(rows, 64, dtype=torch.bfloat16)
        with torch.inference_mode():
            first = fn(x, packed, 64)
        second = fn(x, packed, 64)  # outside inference mode: another guard variant of the same key
        assert torch.equal(first, second)


def test_decide_is_a_function_of_rows_status_config_and_table():
    default_config, empty = RvvPolicyConfig(), RouteTable()

    def decide(rows, status, config=default_config, table=empty, shape=(1024, 1024), servable=True):
        return routing.decide("o_proj", rows, status, config, table, weight_shape=shape, servable=servable)

    key = routing.RegionalShapeKey(torch.bfloat16, "cpu", "o_proj", 4, 1024, 1024, Mode.EXPLICIT_PACKED)
    losing = RouteTable([Entry("o_proj", 4, 1024, 1024, packed_us=200.0, row_major_us=100.0, eager_us=300.0)])
    assert decide(3, Status.PACKED) == (Route.PACKED_COMPILED, 4, key)
    assert decide(3, Status.PACKED, table=losing) == (Route.ROW_MAJOR_MEASURED, 4, key)
    eager = RouteTable([Entry("o_proj", 4, 1024, 1024, packed_us=200.0, row_major_us=100.0, eager_us=50.0)])
    assert decide(3, Status.PACKED, table=eager) == (Route.PACKED_EAGER, 4, key)
    assert decide(3, Status.PACKED, RvvPolicyConfig(measure_routes=False), eager) == (Route.PACKED_COMPILED, 4, key)
    assert decide(3, Status.PACKED, RvvPolicyConfig(measure_routes=False), losing) == (Route.PACKED_COMPILED, 4, key)
    assert decide(3, Status.ROW_MAJOR_ONLY, table=losing) == (
        Route.ROW_MAJOR_COMPILED, 4, key._replace(mode=Mode.ROW_MAJOR))
    assert decide(3, Status.PACKED, RvvPolicyConfig(regional_compile=False)) == (Route.PACKED_EAGER, 4, None)
    assert decide(3, Status.BUDGET) == (Route.ROW_MAJOR_BUDGET, 4, None)
    assert decide(3, Status.INVALID, table=losing) == (Route.ROW_MAJOR_INVALID, 4, None)
    assert decide(3, Status.GATE) == (Route.ROW_MAJOR_GATE, 4, None)
    assert decide(3, Status.PACKED, servable=False) == (Route.ROW_MAJOR_GATE, 4, None)
    assert decide(129, Status.PACKED) == (Route.ROW_MAJOR_GATE, None, None)
    assert decide(1, Status.PACKED, shape=(1024, 512)) == (Route.ROW_MAJOR_GATE, 1, None)  # below MIN_WORK
