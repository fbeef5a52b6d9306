"""The kernel library's scalar twins, built for this host (tests/host_kernels.py), against the layout contract.

The twins are the oracle the RVV kernels are held to under qemu (tests/images/test_rvv_kernels.py),
so here they meet :mod:`sglang_rvv.layout` on every case that is too slow for emulation: the
native pack equals ``quantize_reference`` bit for bit; the linear equals the exact reference
(``quantized_linear_reference``; for bf16 the fp32 chain, exact because a product of two BF16
values is exact in fp32) on small shapes and stays within FP32 accumulation error of an fp64
reference of the dequantized weight on larger ones, for every M in 1..130; and bad calls get one
clean RuntimeError naming the problem. The first build takes about a minute; after that the
library is kept while its inputs are unchanged.

The library is loaded into this test process: from then on torch.ops.sglang_rvv_native exists in
it (the x86 providers never look at it).
"""

from __future__ import annotations

import math

import host_kernels
import pytest
import torch
from host_kernels import QUANT, ROUTED, VERSION, K, N, bits, linear, pack

from sglang_rvv import layout

ROWS = range(1, 131)
LARGE = [(2048, 2048, 1), (1000, 333, 17), (96, 4096, 5)]  # N, K, M: several K panels, many blocks


@pytest.fixture(scope="module")
def native():
    ops = host_kernels.ops()
    assert ops.kernel_isa() == "generic"  # off riscv64 the twins are the only choice
    return ops


_randn = host_kernels.bf16_randn


def _assert_within_fp32_error(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, chain: int) -> None:
    """|out - x @ w.T| (fp64) within one BF16 rounding plus ``chain`` FP32 roundings of sum |x||w|."""
    ref = x.double() @ weight.double().T
    abs_sum = x.double().abs() @ weight.double().abs().T
    bound = 2.0**-8 * ref.abs() + (1 + 2.0**-8) * chain * 2.0**-24 * abs_sum + 1e-30
    excess = (out.double() - ref).abs() - bound
    worst = int(excess.argmax())
    assert bool((excess <= 0).all()), (f"output {worst} off by {excess.flatten()[worst].item():.3g} beyond the FP32 "
                                       f"accumulation bound (chain {chain})")


def _bf16_chain_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The bf16 kernels' result exactly: fma(x, w, acc) in k order is fp32 acc + (x * w), the product of two
    BF16 values being exact in fp32."""
    xf, wf = x.float(), weight.float()
    acc = torch.zeros(x.shape[0], weight.shape[0])
    for k in range(x.shape[1]):
        acc = acc + xf[:, k : k + 1] * wf[:, k]
    return acc.to(torch.bfloat16)


# --- bf16 ----------------------------------------------------------------------------------


def test_bf16_pack_is_the_reference_layout(native):
    for n, k in ((1, 1), (31, 7), (33, 333), (1000, 64)):
        weight = _randn(n, k, seed=n + k)
        assert torch.equal(native.pack_bf16_weight(weight, VERSION), layout.pack_reference(weight)), (n, k)


def test_bf16_linear_every_row_count_is_the_fp32_chain(native):
    weight, x = _randn(N, K, seed=1), _randn(max(ROWS), K, seed=2)
    packed = native.pack_bf16_weight(weight, VERSION)
    full = native.packed_bf16_linear(x, packed, N, VERSION)
    assert torch.equal(bits(full), bits(_bf16_chain_reference(x, weight)))
    for m in ROWS:
        assert torch.equal(bits(native.packed_bf16_linear(x[:m], packed, N, VERSION)), bits(full[:m])), m


@pytest.mark.parametrize("n,k,m", LARGE)
def test_bf16_linear_large_shapes(native, n, k, m):
    weight, x = _randn(n, k, seed=n + k), _randn(m, k, seed=m)
    out = native.packed_bf16_linear(x, native.pack_bf16_weight(weight, VERSION), n, VERSION)
    assert torch.equal(bits(out), bits(_bf16_chain_reference(x, weight)))
    _assert_within_fp32_error(out, x, weight, chain=k)


def test_bf16_empty_k_is_zero(native):
    packed = native.pack_bf16_weight(torch.empty(40, 0, dtype=torch.bfloat16), VERSION)
    out = native.packed_bf16_linear(torch.empty(3, 0, dtype=torch.bfloat16), packed, 40, VERSION)
    assert torch.equal(bits(out), torch.zeros(3, 40, dtype=torch.int16))


# --- int8 / int4 ---------------------------------------------------------------------------


@pytest.mark.parametrize("quant,group_size", QUANT)
@pytest.mark.parametrize("n,k", [(N, K), (33, 300), (1, 64), (64, 129)])
def test_pack_is_the_reference_quantization(native, quant, group_size, n, k):
    weight = _randn(n, k, seed=3 * n + k)
    weight[0, : k // 2] = 0  # a group of zeros: scale 0, q 0
    qweight, scales = pack(native, quant, weight, group_size)
    want_q, want_s = layout.quantize_reference(weight, quant, group_size)
    assert (qweight.dtype, scales.dtype) == (want_q.dtype, want_s.dtype)
    assert torch.equal(qweight, want_q)
    assert torch.equal(bits(scales), bits(want_s))


@pytest.mark.parametrize("quant,group_size", QUANT)
def test_pack_round_trip_within_half_a_step(native, quant, group_size):
    weight = _randn(N, K, seed=4) * 3
    qweight, scales = pack(native, quant, weight, group_size)
    restored = layout.dequantize_reference(qweight, scales, quant, N, K)
    group = layout.effective_group_size(quant, group_size, K)
    step = scales.double().transpose(1, 2).reshape(-1, scales.shape[1])[:N].repeat_interleave(group, dim=1)[:, :K]
    error = (restored - weight.double()).abs()
    assert bool((error <= 0.5 * step * (1 + 2.0**-20)).all()), float((error / step).max())


@pytest.mark.parametrize("quant,group_size", QUANT)
def test_linear_small_shapes_are_the_exact_reference(native, quant, group_size):
    weight, x = _randn(40, K, seed=5), _randn(5, K, seed=6)
    x[0, 3], x[4, 69] = 0.0, -0.0
    packed = pack(native, quant, weight, group_size)
    for rows in (x[:1], x[1:4], x):
        want = layout.quantized_linear_reference(rows, *packed, quant, 40)
        assert torch.equal(bits(linear(native, quant, rows, packed, 40, K)), bits(want)), rows.shape[0]


@pytest.mark.parametrize("quant,group_size", QUANT)
def test_linear_every_row_count(native, quant, group_size):
    """Every M in 1..130 gives the same rows as one call of 130, and those are within FP32 error of fp64."""
    weight, x = _randn(N, K, seed=7), _randn(max(ROWS), K, seed=8)
    packed = pack(native, quant, weight, group_size)
    full = linear(native, quant, x, packed, N, K)
    assert full.shape == (max(ROWS), N) and full.dtype == torch.bfloat16
    group = layout.effective_group_size(quant, group_size, K)
    _assert_within_fp32_error(full, x, layout.dequantize_reference(*packed, quant, N, K),
                              chain=K + math.ceil(K / group))
    for m in ROWS:
        assert torch.equal(bits(linear(native, quant, x[:m], packed, N, K)), bits(full[:m])), m


@pytest.mark.parametrize("quant,group_size", QUANT + [pytest.param(layout.INT4, 128, id="int4-g128")])
@pytest.mark.parametrize("n,k,m", LARGE)
def test_linear_large_shapes(native, quant, group_size, n, k, m):
    weight, x = _randn(n, k, seed=n * k), _randn(m, k, seed=m + 1)
    packed = pack(native, quant, weight, group_size)
    out = linear(native, quant, x, packed, n, k)
    group = layout.effective_group_size(quant, group_size, k)
    _assert_within_fp32_error(out, x, layout.dequantize_reference(*packed, quant, n, k), chain=k + math.ceil(k / group))


def _with_threads(count: int, call):
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return call()
    finally:
        torch.set_num_threads(threads)


# 1000: many blocks; 20 and 10: one block on two threads, which the entry point splits into half
# blocks, one a thread (at 10 the second half is all padding and skipped).
@pytest.mark.parametrize("n", [1000, 20, 10])
@pytest.mark.parametrize("quant,group_size", [pytest.param(None, 0, id="bf16"), *QUANT])
def test_thread_count_and_half_blocks_change_no_bit(native, quant, group_size, n):
    weight, x = _randn(n, 333, seed=9), _randn(9, 333, seed=10)
    if quant is None:
        packed = native.pack_bf16_weight(weight, VERSION)
        def call():
            return native.packed_bf16_linear(x, packed, n, VERSION)
    else:
        packed = pack(native, quant, weight, group_size)
        def call():
            return linear(native, quant, x, packed, n, 333)
    one, two = _with_threads(1, call), _with_threads(2, call)
    assert torch.equal(bits(one), bits(two))


@pytest.mark.parametrize("quant,group_size", [pytest.param(None, 0, id="bf16"), *QUANT])
def test_an_input_of_any_rank_is_its_rows(native, quant, group_size):
    """[..., K] in, [..., N] out, as F.linear: transformers' [batch, seq, K] and a 1-D [K] input
    give the bits of their rows as [M, K] (the eager route then reshapes nothing)."""
    weight, x = _randn(N, K, seed=15), _randn(6, K, seed=16)
    packed = native.pack_bf16_weight(weight, VERSION) if quant is None else pack(native, quant, weight, group_size)
    def call(rows):
        if quant is None:
            return native.packed_bf16_linear(rows, packed, N, VERSION)
        return linear(native, quant, rows, packed, N, K)
    flat = call(x)
    for shaped in (x.view(2, 3, K), x.view(1, 6, 1, K), x[0]):
        out = call(shaped)
        assert out.shape == (*shaped.shape[:-1], N) and out.is_contiguous()
        assert torch.equal(bits(out.reshape(-1, N)), bits(flat[: out.numel() // N]))
    assert call(x[:0].view(0, 1, K)).shape == (0, 1, N)


@pytest.mark.parametrize("quant,group_size", ROUTED)
def test_the_eager_routes_direct_entry_is_the_op_itself(native, quant, group_size):
    """kernels.rvv.direct_op: the op's own callable with its trailing arguments, as the eager route
    calls it (fn(input, *packed, *tail)), gives the bits of the op called through torch.ops."""
    from sglang_rvv.kernels import rvv

    weight, x = _randn(N, K, seed=17), _randn(1, 1, K, seed=18)
    if quant is None:
        packed = (native.pack_bf16_weight(weight, VERSION),)
        through_ops = native.packed_bf16_linear(x, *packed, N, VERSION)
    else:
        packed = pack(native, quant, weight, group_size)
        through_ops = linear(native, quant, x, packed, N, K)
    fn, tail = rvv.direct_op("bf16" if quant is None else quant.name, N, K)
    assert not hasattr(fn, "__code__")  # no Python frame between the route and the kernel's entry
    assert torch.equal(bits(fn(x, *packed, *tail)), bits(through_ops))


@pytest.mark.parametrize("quant,group_size", QUANT)
def test_special_values(native, quant, group_size):
    """NaN and infinities in the input reach exactly the outputs an fp64 reference says; NaN is 0x7FC0."""
    weight, x = _randn(N, K, seed=11), _randn(4, K, seed=12)
    x[0, 5], x[1, 7], x[2, 9] = float("nan"), float("inf"), float("-inf")
    packed = pack(native, quant, weight, group_size)
    out = linear(native, quant, x, packed, N, K)
    ref = x.double() @ layout.dequantize_reference(*packed, quant, N, K).T
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.isinf(), ref.isinf()) and torch.equal(out[out.isinf()].double(), ref[out.isinf()])
    assert set(bits(out)[out.isnan()].tolist()) <= {0x7FC0}


# --- int4 with int8 activations ------------------------------------------------------------


def _a8(native, x, packed, n, k):
    return native.packed_int4_a8_linear(x, *packed, n, k, VERSION)


@pytest.mark.parametrize("group_size", [32, 64])
def test_a8_small_shapes_are_the_exact_reference(native, group_size):
    """Bit for bit layout.quantized_linear_a8_reference, with rows holding a NaN, an infinity, values
    too small to scale (d = 0: zeros), all zeros, and a signed zero."""
    weight, x = _randn(40, K, seed=5), _randn(7, K, seed=6)
    x[0, 3] = float("nan")
    x[1, 60] = float("inf")
    x[2], x[3] = 1e-38, 0.0
    x[4, 69] = -0.0
    packed = pack(native, layout.INT4, weight, group_size)
    for rows in (x[:1], x[1:4], x):
        want = layout.quantized_linear_a8_reference(rows, *packed, 40)
        assert torch.equal(bits(_a8(native, rows, packed, 40, K)), bits(want)), rows.shape[0]
    out = _a8(native, x, packed, 40, K)
    assert out[:2].isnan().all() and set(bits(out[:2]).flatten().tolist()) == {0x7FC0}
    assert (out[2:4] == 0).all() and not out[4:].isnan().any()


@pytest.mark.parametrize("group_size", [32, 128])
def test_a8_every_row_count_and_its_error(native, group_size):
    """Every M in 1..130 gives the rows of one call of 130 (each row quantized on its own), and the
    int8 activations stay within a few ulp of BF16 of the weight-only result: SQNR against fp64 of
    the dequantized weight at least 38 dB (the weight-only kernel's is about 55)."""
    k = 333
    weight, x = _randn(N, k, seed=7), _randn(max(ROWS), k, seed=8)
    packed = pack(native, layout.INT4, weight, group_size)
    full = _a8(native, x, packed, N, k)
    ref = x.double() @ layout.dequantize_reference(*packed, layout.INT4, N, k).T
    sqnr = 10 * math.log10(ref.pow(2).sum() / (full.double() - ref).pow(2).sum())
    assert sqnr >= 38.0, sqnr
    for m in ROWS:
        assert torch.equal(bits(_a8(native, x[:m], packed, N, k)), bits(full[:m])), m


@pytest.mark.parametrize("n", [1000, 20, 10])
def test_a8_thread_count_and_half_blocks_change_no_bit(native, n):
    weight, x = _randn(n, 333, seed=9), _randn(9, 333, seed=10)
    packed = pack(native, layout.INT4, weight, 32)
    def call():
        return _a8(native, x, packed, n, 333)
    assert torch.equal(bits(_with_threads(1, call)), bits(_with_threads(2, call)))


# --- bad calls -----------------------------------------------------------------------------


def _bad_calls(native):
    weight, x = _randn(64, 64, seed=13), _randn(2, 64, seed=14)
    q8, s8 = native.pack_int8_weight(weight, 32, VERSION)
    q4, s4 = native.pack_int4_weight(weight, 32, VERSION)
    return {
        "float weight": (lambda: native.pack_int8_weight(weight.float(), 32, VERSION), "expects a bfloat16 weight"),
        "1-D weight": (lambda: native.pack_int4_weight(weight[0], 32, VERSION), "expects a 2-D [N, K] weight"),
        "group 0": (lambda: native.pack_int8_weight(weight, 0, VERSION), "group size 0 must be in 1..K=64"),
        "group above K": (lambda: native.pack_int4_weight(weight, 128, VERSION), "group size 128 must be in 1..K"),
        "odd int4 group": (lambda: native.pack_int4_weight(weight, 33, VERSION), "must be a multiple of 2"),
        "pack layout version": (lambda: native.pack_int8_weight(weight, 32, 2), "packed layout version 2"),
        "non-finite weight": (lambda: native.pack_int4_weight(weight.clone().fill_(float("inf")), 32, VERSION),
                              "non-finite values"),
        "float input": (lambda: native.packed_int8_linear(x.float(), q8, s8, 64, 64, VERSION),
                        "expects a bfloat16 input"),
        "0-d input": (lambda: native.packed_int4_linear(x[0, 0], q4, s4, 64, 64, VERSION),
                      "expects an [..., K] input, got a 0-d tensor"),
        "linear layout version": (lambda: native.packed_int4_linear(x, q4, s4, 64, 64, 7), "packed layout version 7"),
        "int8 qweight to the int4 op": (lambda: native.packed_int4_linear(x, q8, s8, 64, 64, VERSION),
                                        "expects a uint8 qweight"),
        "K mismatch": (lambda: native.packed_int8_linear(_randn(2, 32, seed=1), q8, s8, 64, 32, VERSION),
                       "in_features=32 does not fit a qweight packed with Kp=64"),
        "input K mismatch": (lambda: native.packed_int8_linear(_randn(2, 48, seed=1), q8, s8, 64, 64, VERSION),
                             "input has K=48 features"),
        "scales of another weight": (lambda: native.packed_int8_linear(x, q8, s8[:1], 64, 64, VERSION),
                                     "expects bfloat16 scales of shape [2, Kp/G, 32]"),
        "float scales": (lambda: native.packed_int8_linear(x, q8, s8.float(), 64, 64, VERSION),
                         "expects bfloat16 scales"),
        "out_features too large": (lambda: native.packed_int4_linear(x, q4, s4, 65, 64, VERSION),
                                   "out_features=65 does not fit"),
        "int4 group of 2 to the a8 op": (lambda: native.packed_int4_a8_linear(x, *native.pack_int4_weight(
            weight, 2, VERSION), 64, 64, VERSION), "group size 2 is not a multiple of 16"),
        "int8 qweight to the a8 op": (lambda: native.packed_int4_a8_linear(x, q8, s8, 64, 64, VERSION),
                                      "expects a uint8 qweight"),
    }


BAD_CALLS = ("float weight", "1-D weight", "group 0", "group above K", "odd int4 group", "pack layout version",
             "non-finite weight", "float input", "0-d input", "linear layout version", "int8 qweight to the int4 op",
             "K mismatch", "input K mismatch", "scales of another weight", "float scales", "out_features too large",
             "int4 group of 2 to the a8 op", "int8 qweight to the a8 op")


@pytest.mark.parametrize("case", BAD_CALLS)
def test_bad_calls_raise_one_clear_line(native, case):
    call, words = _bad_calls(native)[case]
    with pytest.raises(RuntimeError) as raised:
        call()
    first = str(raised.value).splitlines()[0]
    assert first.startswith("sglang_rvv_native::") and words in first, first


# --- the eager route's native entry (csrc/entry) ---------------------------------------------
