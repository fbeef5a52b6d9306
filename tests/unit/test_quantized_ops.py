"""The int8/int4 custom ops on the generic provider: values, numerics, compile, bad input.

Numerics are judged against an fp64 linear of the *dequantized* weight (layout.dequantize_reference
of the contract's blocked bits): the kernels must be exact up to FP32 accumulation and one bf16
rounding of the output, so every output obeys
    |out - ref| <= 2^-8 * |ref| + 2^-20 * K * (|x| @ |w_deq|^T)
(half a bf16 ulp is at most 2^-8 of the value; an fp32 sum of K products errs by at most
K * 2^-24 of the sum of their magnitudes, taken with a 16x margin for the aten kernels' blocking).
"""

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from torch._subclasses.fake_tensor import FakeTensorMode

from sglang_rvv import layout, ops
from sglang_rvv.kernels import generic, rvv_prims
from sglang_rvv.layout import INT4, INT8, LayoutError

CASES = [(INT8, 0), (INT8, 32), (INT4, 32), (INT4, 64)]
IDS = [f"{q.name}-g{g}" for q, g in CASES]


def _bf16(shape, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _assert_within_bound(out, x, w_deq):
    ref = x.double() @ w_deq.T
    magnitude = x.double().abs() @ w_deq.abs().T
    bound = 2.0**-8 * ref.abs() + 2.0**-20 * x.shape[-1] * magnitude
    excess = (out.double() - ref).abs() - bound
    worst = int(excess.argmax())
    assert excess.max() <= 0, (f"output {divmod(worst, ref.shape[1])} is {float(out.flatten()[worst])}, "
                               f"reference {float(ref.flatten()[worst])}, bound {float(bound.flatten()[worst])}")


def _dequantized(weight, q_layout, group_size):
    qweight, scales = layout.quantize_reference(weight, q_layout, group_size)
    return layout.dequantize_reference(qweight, scales, q_layout, *weight.shape)


@pytest.mark.parametrize("q_layout,group_size", CASES, ids=IDS)
def test_every_m_of_an_off_block_shape_is_within_fp32_accumulation(q_layout, group_size):
    n, k = 97, 70  # N off the 32-block, K off every group and off aten int8's 16
    weight = _bf16((n, k), 0)
    qweight, scales = ops.PACK_OPS[q_layout.name](weight, group_size)
    w_deq = _dequantized(weight, q_layout, group_size)
    for m in range(1, 131):
        x = _bf16((m, k), m)
        out = ops.LINEAR_OPS[q_layout.name](x, qweight, scales, n, k)
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        _assert_within_bound(out, x, w_deq)


@pytest.mark.parametrize("q_layout,group_size", CASES, ids=IDS)
@pytest.mark.parametrize("n,k,m", [(1056, 1000, 1), (2050, 1024, 7), (1030, 2080, 16), (64, 256, 130)])
def test_sampled_larger_shapes(q_layout, group_size, n, k, m):
    weight = _bf16((n, k), n + k)
    packed = ops.PACK_OPS[q_layout.name](weight, group_size)
    x = _bf16((m, k), m)
    _assert_within_bound(ops.LINEAR_OPS[q_layout.name](x, *packed, n, k), x, _dequantized(weight, q_layout, group_size))


@pytest.mark.parametrize("q_layout,group_size", CASES, ids=IDS)
def test_pack_holds_the_reference_values(q_layout, group_size):
    """An identity input reads each dequantized weight back through the op: q * scale is exact in
    fp32, so the output is that product rounded once to bf16, the reference's rounded the same way."""
    n, k = 70, 96
    weight = _bf16((n, k), 3)
    packed = ops.PACK_OPS[q_layout.name](weight, group_size)
    through_op = ops.LINEAR_OPS[q_layout.name](torch.eye(k, dtype=torch.bfloat16), *packed, n, k)
    assert torch.equal(through_op.T, _dequantized(weight, q_layout, group_size).to(torch.bfloat16))


@pytest.mark.parametrize("q_layout,group_size", CASES, ids=IDS)
def test_round_trip_is_within_half_a_quantization_step(q_layout, group_size):
    n, k = 97, 200
    weight = _bf16((n, k), 5) * 0.02
    qweight, scales = layout.quantize_reference(weight, q_layout, group_size)
    group = layout.effective_group_size(q_layout, group_size, k)
    step = scales.double().transpose(1, 2).reshape(-1, scales.shape[1]).repeat_interleave(group, 1)[:n, :k]
    error = (layout.dequantize_reference(qweight, scales, q_layout, n, k) - weight.double()).abs()
    # Half a step, plus the scale's own bf16 rounding at the group's largest |w| (<= qmax * 2^-8 steps).
    assert (error <= step * (0.5 + 2.0**-8)).all()


def test_packed_bytes_are_the_forms_bytes():
    weight = _bf16((97, 70), 0)
    for q_layout, group_size in CASES:
        packed = ops.PACK_OPS[q_layout.name](weight, group_size)
        group = layout.effective_group_size(q_layout, group_size, 70)
        form = generic.quantized_form(q_layout, 97, 70, group)
        assert tuple((tuple(t.shape), t.dtype) for t in packed) == form
        assert sum(t.numel() * t.element_size() for t in packed) == layout.form_bytes(form)


@pytest.mark.parametrize("q_layout,group_size", CASES, ids=IDS)
@pytest.mark.parametrize("m", [1, 16])
def test_compiled_op_is_aten_code_not_a_python_callback(q_layout, group_size, m):
    n, k = 1030, 1024
    weight = _bf16((n, k), 1)
    packed = ops.PACK_OPS[q_layout.name](weight, group_size)
    linear = ops.LINEAR_OPS[q_layout.name]
    fn = torch.compile(lambda x, q, s: linear(x, q, s, n, k), dynamic=False, fullgraph=True)
    x = _bf16((m, k), m)
    out, (code, *_) = run_and_get_code(fn, x, *packed)
    # Decomposed: aten extern kernels or generated code (the op's name is left only in comments).
    assert "torch.ops.sglang_rvv" not in code
    if q_layout is INT4:
        assert "_weight_int4pack_mm_for_cpu" in code
    elif group_size == 0:
        assert "_weight_int8pack_mm" in code
    assert torch.equal(out, linear(x, *packed, n, k))


def test_fake_kernels_give_the_forms_shapes():
    with FakeTensorMode():
        weight = torch.empty(100, 64, dtype=torch.bfloat16)
        qweight, scales = ops.pack_int4_weight(weight, 32)
        assert (tuple(qweight.shape), tuple(scales.shape)) == ((128, 32), (2, 128, 2))
        out = ops.packed_int4_linear(torch.empty(3, 5, 64, dtype=torch.bfloat16), qweight, scales, 100, 64)
        assert out.shape == (3, 5, 100)
        with pytest.raises(LayoutError, match="K=64"):
            ops.packed_int4_linear(torch.empty(3, 8, dtype=torch.bfloat16), qweight, scales, 100, 64)


def test_bad_input_gets_one_clear_error():
    weight = _bf16((64, 96), 0)
    q8 = ops.pack_int8_weight(weight, 0)
    q4 = ops.pack_int4_weight(weight, 32)
    x = _bf16((2, 96), 1)
    cases = [
        (lambda: ops.pack_int4_weight(weight, 48), r"group size 48 is not one of \(32, 64, 128\)"),
        (lambda: ops.pack_int4_weight(weight, 0), "group size 0 is not one of"),
        (lambda: ops.pack_int8_weight(weight, 128), "group size 128 is larger than K=96"),
        (lambda: ops.pack_int8_weight(weight.to(torch.int8), 0), "already quantized"),
        (lambda: ops.pack_int8_weight(weight.float(), 0), "quantizes a bfloat16 weight"),
        (lambda: ops.pack_int4_weight(weight[0], 32), "2-D"),
        (lambda: ops.pack_int8_weight(torch.full((4, 32), float("inf"), dtype=torch.bfloat16), 0), "non-finite"),
        (lambda: ops.pack_int8_weight(weight, 0, 2), "int8 layout version 2"),
        (lambda: ops.packed_int8_linear(x.float(), *q8, 64, 96), "bfloat16 input"),
        (lambda: ops.packed_int8_linear(_bf16((2, 64), 2), *q8, 64, 96), "K=96"),
        (lambda: ops.packed_int8_linear(x, *q4, 64, 96), "not the int8 form"),
        (lambda: ops.packed_int4_linear(x, *q4, 100, 96), "not the int4 form"),
        (lambda: ops.packed_int4_linear(x, *q4, 64, 96, 3), "int4 layout version 3"),
    ]
    for call, needle in cases:
        with pytest.raises(LayoutError, match=needle):
            call()


def test_providers_say_which_layouts_they_have():
    assert [generic.layout_refusal(name) for name in layout.WEIGHT_DTYPES[:3]] == [None, None, None]
    assert "no kernel that quantizes activations" in generic.layout_refusal("int4_a8")
    assert rvv_prims.layout_refusal("bf16") is None
    assert "rvv_prims" in rvv_prims.layout_refusal("int8") and "SGLANG_RVV_OP_PROVIDER=rvv" in \
        rvv_prims.layout_refusal("int4")
