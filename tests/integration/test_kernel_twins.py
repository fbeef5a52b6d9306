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

from sglang_rvv import layout

VERSION = 1
N, K = 100, 70  # a 4-column tail block; K off every group size
ROWS = range(1, 131)
QUANT = [pytest.param(layout.INT8, 32, id="int8-g32"), pytest.param(layout.INT8, 0, id="int8-per-channel"),
         pytest.param(layout.INT4, 32, id="int4-g32"), pytest.param(layout.INT4, 64, id="int4-g64")]
# The layouts the eager route calls: int4_a8 beside the weight-only ones (its kernel: the a8 tests below).
ROUTED = [pytest.param(None, 0, id="bf16"), *QUANT, pytest.param(layout.INT4_A8, 32, id="int4_a8-g32")]
LARGE = [(2048, 2048, 1), (1000, 333, 17), (96, 4096, 5)]  # N, K, M: several K panels, many blocks


@pytest.fixture(scope="module")
def native():
    ops = host_kernels.ops()
    assert ops.kernel_isa() == "generic"  # off riscv64 the twins are the only choice
    return ops


_randn = host_kernels.bf16_randn


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _group(quant: layout.QuantLayout, group_size: int, k: int) -> int:
    return layout.effective_group_size(quant, group_size, k)


def _pack(native, quant, weight, group_size):
    return getattr(native, f"pack_{quant.name}_weight")(weight, _group(quant, group_size, weight.shape[1]), VERSION)


def _linear(native, quant, x, packed, n, k):
    return getattr(native, f"packed_{quant.name}_linear")(x, *packed, n, k, VERSION)


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
    assert torch.equal(_bits(full), _bits(_bf16_chain_reference(x, weight)))
    for m in ROWS:
        assert torch.equal(_bits(native.packed_bf16_linear(x[:m], packed, N, VERSION)), _bits(full[:m])), m


@pytest.mark.parametrize("n,k,m", LARGE)
def test_bf16_linear_large_shapes(native, n, k, m):
    weight, x = _randn(n, k, seed=n + k), _randn(m, k, seed=m)
    out = native.packed_bf16_linear(x, native.pack_bf16_weight(weight, VERSION), n, VERSION)
    assert torch.equal(_bits(out), _bits(_bf16_chain_reference(x, weight)))
    _assert_within_fp32_error(out, x, weight, chain=k)


def test_bf16_empty_k_is_zero(native):
    packed = native.pack_bf16_weight(torch.empty(40, 0, dtype=torch.bfloat16), VERSION)
    out = native.packed_bf16_linear(torch.empty(3, 0, dtype=torch.bfloat16), packed, 40, VERSION)
    assert torch.equal(_bits(out), torch.zeros(3, 40, dtype=torch.int16))


# --- int8 / int4 ---------------------------------------------------------------------------


@pytest.mark.parametrize("quant,group_size", QUANT)
@pytest.mark.parametrize("n,k", [(N, K), (33, 300), (1, 64), (64, 129)])
def test_pack_is_the_reference_quantization(native, quant, group_size, n, k):
    weight = _randn(n, k, seed=3 * n + k)
    weight[0, : k // 2] = 0  # a group of zeros: scale 0, q 0
    qweight, scales = _pack(native, quant, weight, group_size)
    want_q, want_s = layout.quantize_reference(weight, quant, group_size)
    assert (qweight.dtype, scales.dtype) == (want_q.dtype, want_s.dtype)
    assert torch.equal(qweight, want_q)
    assert torch.equal(_bits(scales), _bits(want_s))


@pytest.mark.parametrize("quant,group_size", QUANT)
def test_pack_round_trip_within_half_a_step(native, quant, group_size):
    weight = _randn(N, K, seed=4) * 3
    qweight, scales = _pack(native, quant, weight, group_size)
    restored = layout.dequantize_reference(qweight, scales, quant, N, K)
    group = _group(quant, group_size, K)
    step = scales.double().transpose(1, 2).reshape(-1, scales.shape[1])[:N].repeat_interleave(group, dim=1)[:, :K]
    error = (restored - weight.double()).abs()
    assert bool((error <= 0.5 * step * (1 + 2.0**-20)).all()), float((error / step).max())


@pytest.mark.parametrize("quant,group_size", QUANT)
def test_linear_small_shapes_are_the_exact_reference(native, quant, group_size):
    weight, x = _randn(40, K, seed=5), _randn(5, K, seed=6)
    x[0, 3], x[4, 69] = 0.0, -0.0
    packed = _pack(native, quant, weight, group_size)
    for rows in (x[:1], x[1:4], x):
        want = layout.quantized_linear_reference(rows, *packed, quant, 40)
        assert torch.equal(_bits(_linear(native, quant, rows, packed, 40, K)), _bits(want)), rows.shape[0]


@pytest.mark.parametrize("quant,group_size", QUANT)
def test_linear_every_row_count(native, quant, group_size):
    """Every M in 1..130 gives the same rows as one call of 130, and those are within FP32 error of fp64."""
    weight, x = _randn(N, K, seed=7), _randn(max(ROWS), K, seed=8)
    packed = _pack(native, quant, weight, group_size)
    full = _linear(native, quant, x, packed, N, K)
    assert full.shape == (max(ROWS), N) and full.dtype == torch.bfloat16
    group = _group(quant, group_size, K)
    _assert_within_fp32_error(full, x, layout.dequantize_reference(*packed, quant, N, K),
                              chain=K + math.ceil(K / group))
    for m in ROWS:
        assert torch.equal(_bits(_linear(native, quant, x[:m], packed, N, K)), _bits(full[:m])), m


@pytest.mark.parametrize("quant,group_size", QUANT + [pytest.param(layout.INT4, 128, id="int4-g128")])
@pytest.mark.parametrize("n,k,m", LARGE)
def test_linear_large_shapes(native, quant, group_size, n, k, m):
    weight, x = _randn(n, k, seed=n * k), _randn(m, k, seed=m + 1)
    packed = _pack(native, quant, weight, group_size)
    out = _linear(native, quant, x, packed, n, k)
    group = _group(quant, group_size, k)
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
        packed = _pack(native, quant, weight, group_size)
        def call():
            return _linear(native, quant, x, packed, n, 333)
    one, two = _with_threads(1, call), _with_threads(2, call)
    assert torch.equal(_bits(one), _bits(two))


@pytest.mark.parametrize("quant,group_size", [pytest.param(None, 0, id="bf16"), *QUANT])
def test_an_input_of_any_rank_is_its_rows(native, quant, group_size):
    """[..., K] in, [..., N] out, as F.linear: transformers' [batch, seq, K] and a 1-D [K] input
    give the bits of their rows as [M, K] (the eager route then reshapes nothing)."""
    weight, x = _randn(N, K, seed=15), _randn(6, K, seed=16)
    packed = native.pack_bf16_weight(weight, VERSION) if quant is None else _pack(native, quant, weight, group_size)
    def call(rows):
        if quant is None:
            return native.packed_bf16_linear(rows, packed, N, VERSION)
        return _linear(native, quant, rows, packed, N, K)
    flat = call(x)
    for shaped in (x.view(2, 3, K), x.view(1, 6, 1, K), x[0]):
        out = call(shaped)
        assert out.shape == (*shaped.shape[:-1], N) and out.is_contiguous()
        assert torch.equal(_bits(out.reshape(-1, N)), _bits(flat[: out.numel() // N]))
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
        packed = _pack(native, quant, weight, group_size)
        through_ops = _linear(native, quant, x, packed, N, K)
    fn, tail = rvv.direct_op("bf16" if quant is None else quant.name, N, K)
    assert not hasattr(fn, "__code__")  # no Python frame between the route and the kernel's entry
    assert torch.equal(_bits(fn(x, *packed, *tail)), _bits(through_ops))


@pytest.mark.parametrize("quant,group_size", QUANT)
def test_special_values(native, quant, group_size):
    """NaN and infinities in the input reach exactly the outputs an fp64 reference says; NaN is 0x7FC0."""
    weight, x = _randn(N, K, seed=11), _randn(4, K, seed=12)
    x[0, 5], x[1, 7], x[2, 9] = float("nan"), float("inf"), float("-inf")
    packed = _pack(native, quant, weight, group_size)
    out = _linear(native, quant, x, packed, N, K)
    ref = x.double() @ layout.dequantize_reference(*packed, quant, N, K).T
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.isinf(), ref.isinf()) and torch.equal(out[out.isinf()].double(), ref[out.isinf()])
    assert set(_bits(out)[out.isnan()].tolist()) <= {0x7FC0}


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
    packed = _pack(native, layout.INT4, weight, group_size)
    for rows in (x[:1], x[1:4], x):
        want = layout.quantized_linear_a8_reference(rows, *packed, 40)
        assert torch.equal(_bits(_a8(native, rows, packed, 40, K)), _bits(want)), rows.shape[0]
    out = _a8(native, x, packed, 40, K)
    assert out[:2].isnan().all() and set(_bits(out[:2]).flatten().tolist()) == {0x7FC0}
    assert (out[2:4] == 0).all() and not out[4:].isnan().any()


@pytest.mark.parametrize("group_size", [32, 128])
def test_a8_every_row_count_and_its_error(native, group_size):
    """Every M in 1..130 gives the rows of one call of 130 (each row quantized on its own), and the
    int8 activations stay within a few ulp of BF16 of the weight-only result: SQNR against fp64 of
    the dequantized weight at least 38 dB (the weight-only kernel's is about 55)."""
    k = 333
    weight, x = _randn(N, k, seed=7), _randn(max(ROWS), k, seed=8)
    packed = _pack(native, layout.INT4, weight, group_size)
    full = _a8(native, x, packed, N, k)
    ref = x.double() @ layout.dequantize_reference(*packed, layout.INT4, N, k).T
    sqnr = 10 * math.log10(ref.pow(2).sum() / (full.double() - ref).pow(2).sum())
    assert sqnr >= 38.0, sqnr
    for m in ROWS:
        assert torch.equal(_bits(_a8(native, x[:m], packed, N, k)), _bits(full[:m])), m


@pytest.mark.parametrize("n", [1000, 20, 10])
def test_a8_thread_count_and_half_blocks_change_no_bit(native, n):
    weight, x = _randn(n, 333, seed=9), _randn(9, 333, seed=10)
    packed = _pack(native, layout.INT4, weight, 32)
    def call():
        return _a8(native, x, packed, n, 333)
    assert torch.equal(_bits(_with_threads(1, call)), _bits(_with_threads(2, call)))


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


@pytest.fixture
def direct_entry(native, monkeypatch):
    """kernels.rvv.direct_entry over the host build: the entry beside the host kernel library."""
    from sglang_rvv.kernels import rvv

    monkeypatch.setenv(rvv.LIB_ENV, str(host_kernels.build()))
    return rvv.direct_entry


def _packed_module(native, quant, group_size, weight):
    packed = (native.pack_bf16_weight(weight, VERSION),) if quant is None else _pack(native, quant, weight, group_size)
    return dict(zip(("packed", "scales"), packed, strict=False)), packed


@pytest.mark.parametrize("quant,group_size", ROUTED)
def test_the_native_entry_gives_the_ops_bits_with_the_bias_added(native, direct_entry, quant, group_size):
    weight, bias = _randn(N, K, seed=21), _randn(N, seed=22)
    buffers, packed = _packed_module(native, quant, group_size, weight)
    name = "bf16" if quant is None else quant.name
    fn, plan = direct_entry(name, weight, tuple(buffers), N, K)
    # Any rank, as the op takes it; 1200 rows are past the work under which the entry keeps the GIL.
    for x in (_randn(1, K, seed=23), _randn(2, 3, K, seed=24), _randn(1200, K, seed=29)):
        through_ops = (native.packed_bf16_linear(x, *packed, N, VERSION) if quant is None
                       else _linear(native, quant, x, packed, N, K))
        assert torch.equal(_bits(fn(plan, x, weight, buffers, None)), _bits(through_ops))
        assert torch.equal(_bits(fn(plan, x, weight, buffers, bias)), _bits(through_ops.clone().add_(bias)))


def test_the_native_entry_refuses_every_weight_the_source_check_refuses(native, direct_entry):
    """None (the route then re-plans) for each change PackedWeightSource.matches catches, and for a
    released buffer; the plan holds no reference to its weight."""
    import gc
    import weakref

    weight, x = _randn(N, K, seed=25), _randn(1, K, seed=26)
    buffers, _ = _packed_module(native, None, 0, weight)
    fn, plan = direct_entry("bf16", weight, ("packed",), N, K)
    assert fn(plan, x, weight, buffers, None) is not None
    assert fn(plan, x, weight.clone(), buffers, None) is None  # another tensor with the same values
    assert fn(plan, x, weight, {}, None) is None  # the packed buffer released
    assert fn(plan, x, weight, {"packed": "not a tensor"}, None) is None
    weight.data = weight.data.clone()  # the same object, other bytes
    assert fn(plan, x, weight, buffers, None) is None
    fn, plan = direct_entry("bf16", weight, ("packed",), N, K)
    with torch.no_grad():
        weight.mul_(1)  # in place: the version counter moves
    assert fn(plan, x, weight, buffers, None) is None
    with torch.inference_mode():  # no version counter: identity, bytes and form still checked
        frozen = _randn(N, K, seed=25)
        fn, plan = direct_entry("bf16", frozen, ("packed",), N, K)
        assert fn(plan, x, frozen, buffers, None) is not None
        assert fn(plan, x, frozen.t().contiguous().t(), buffers, None) is None
    gone = weakref.ref(weight)
    del weight
    gc.collect()
    assert gone() is None


def test_the_native_entry_raises_the_ops_error_in_one_line_and_refuses_bad_arguments(native, direct_entry):
    weight = _randn(N, K, seed=27)
    buffers, _ = _packed_module(native, None, 0, weight)
    fn, plan = direct_entry("bf16", weight, ("packed",), N, K)
    with pytest.raises(RuntimeError) as raised:
        fn(plan, _randn(1, K + 1, seed=28), weight, buffers, None)
    assert str(raised.value).startswith("sglang_rvv_native::packed_bf16_linear") and "\n" not in str(raised.value)
    with pytest.raises(TypeError, match="input and weight must be tensors"):
        fn(plan, [1.0] * K, weight, buffers, None)
    with pytest.raises(ValueError, match="plan: kind 1"):
        direct_entry("int8", weight, ("packed",), N, K)  # int8 has two buffers


def test_the_native_entry_leaves_a_dispatch_mode_and_the_profiler_the_dispatchers_full_call(native, direct_entry):
    """The entry sends a plain call straight to the op's CPU kernel (redispatch); a call that a
    TorchDispatchMode or the profiler would see through torch.ops still reaches them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    weight, x = _randn(N, K, seed=30), _randn(1, K, seed=31)
    buffers, packed = _packed_module(native, None, 0, weight)
    fn, plan = direct_entry("bf16", weight, ("packed",), N, K)
    want = _bits(native.packed_bf16_linear(x, *packed, N, VERSION))

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.name())
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        assert torch.equal(_bits(fn(plan, x, weight, buffers, None)), want)
        with Seen() as seen:
            assert torch.equal(_bits(fn(plan, x, weight, buffers, None)), want)
        with torch.profiler.profile() as profile:
            fn(plan, x, weight, buffers, None)
    assert "sglang_rvv_native::packed_bf16_linear" in seen.ops, seen.ops
    assert "sglang_rvv_native::packed_bf16_linear" in {event.name for event in profile.events()}


@pytest.mark.parametrize("quant,group_size", [pytest.param(None, 0, id="bf16"), *QUANT])
def test_the_native_ops_fake_kernels_give_the_ops_shapes_at_any_rank(native, quant, group_size):
    """What torch.compile traces the native ops with (kernels.rvv registers them when the library
    loads): the op's output shape, [..., N] for an [..., K] input."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sglang_rvv.kernels import rvv

    rvv._register_fakes()
    packed = _pack(native, quant, _randn(N, K, seed=35), group_size) if quant else (
        native.pack_bf16_weight(_randn(N, K, seed=35), VERSION),)
    for x in (_randn(3, K, seed=36), _randn(2, 3, K, seed=37)):
        real = native.packed_bf16_linear(x, *packed, N, VERSION) if quant is None else _linear(
            native, quant, x, packed, N, K)
        with FakeTensorMode() as mode:
            fakes = [mode.from_tensor(t) for t in (x, *packed)]
            fake = native.packed_bf16_linear(*fakes, N, VERSION) if quant is None else _linear(
                native, quant, fakes[0], fakes[1:], N, K)
        assert fake.shape == real.shape


def test_small_outputs_reuse_dead_outputs_blocks_and_never_a_live_ones(native):
    """outputs.cpp: an output's block is kept when it dies and handed to a later output of its
    size; outputs alive at once never share one, and each keeps its own bits."""
    weight = _randn(N, K, seed=32)
    packed = native.pack_bf16_weight(weight, VERSION)
    xs = [_randn(1, K, seed=40 + i) for i in range(8)]
    wants = [_bits(native.packed_bf16_linear(x, packed, N, VERSION)).clone() for x in xs]
    live = [native.packed_bf16_linear(x, packed, N, VERSION) for x in xs]  # more than the kept blocks
    assert len({out.data_ptr() for out in live}) == len(live)
    assert all(torch.equal(_bits(out), want) for out, want in zip(live, wants, strict=True))
    dead = {out.data_ptr() for out in live}
    del live
    again = [native.packed_bf16_linear(x, packed, N, VERSION) for x in xs[:4]]
    assert {out.data_ptr() for out in again} <= dead
    assert all(torch.equal(_bits(out), want) for out, want in zip(again, wants[:4], strict=True))


def test_while_the_profiler_records_memory_an_output_is_torchs_allocation(native):
    weight, x = _randn(N, K, seed=33), _randn(1, K, seed=34)
    packed = native.pack_bf16_weight(weight, VERSION)
    for _ in range(2):  # the second output could take the first one's kept block
        native.packed_bf16_linear(x, packed, N, VERSION)
    with torch.profiler.profile(profile_memory=True) as profile:
        native.packed_bf16_linear(x, packed, N, VERSION)
    usage = [event.cpu_memory_usage for event in profile.key_averages()
             if event.key == "sglang_rvv_native::packed_bf16_linear"]
    assert usage and usage[0] >= N * 2, usage


def test_the_entrys_round_trip_holds_when_the_first_call_comes_from_inference_mode(direct_entry):
    """The entry loads at a route's first memoised call, which SGLang makes in inference mode, where
    a new tensor has no version counter for the round trip's stale case."""
    from sglang_rvv.kernels import entry, rvv

    module = entry.load(str(entry.path_beside(rvv.library_path())))
    assert module is not None
    with torch.inference_mode():
        assert entry.round_trip(module) is None


def test_an_entry_library_that_is_not_there_leaves_the_op_call_with_one_warning(native, tmp_path, caplog):
    from sglang_rvv.kernels import entry

    assert entry.load(str(tmp_path / entry.ENTRY_NAME)) is None
    assert f"no {tmp_path / entry.ENTRY_NAME} beside the kernel library" in caplog.text


# --- the routes' __call__ in C (csrc/entry/route_call.cpp) -----------------------------------


@pytest.fixture
def native_routes(native, monkeypatch):
    """The rvv provider over the host twins (the ISA probe would refuse them here), so a policy's
    routes get the entry's C __call__ as on the board; the classes get their Python call back after."""
    from sglang_rvv import adapters, bodies, kernels, routing
    from sglang_rvv.kernels import rvv

    # Everything the process keeps of its one chosen provider; a stale eager body (another test
    # in the process chose generic first) gave the planning call generic's bits and the memoised
    # C call the twins', one logit apart.
    derived = (kernels.chosen, routing.accelerated, bodies.eager_body, bodies.eager_call)
    monkeypatch.setenv(rvv.LIB_ENV, str(host_kernels.build()))
    monkeypatch.setattr(kernels, "choose_provider", lambda forced=None: (rvv, "the host twins, for this test"))
    monkeypatch.setattr(routing.ModuleRoute, "__call__", routing.ModuleRoute.call)
    for cache in derived:
        cache.cache_clear()
    yield routing
    if "__call__" in adapters.RoutedLinear.__dict__:
        del adapters.RoutedLinear.__call__
    for cache in derived:
        cache.cache_clear()


def _routed_tiny(seed: int = 0, **config):
    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, tiny

    model = tiny.build_model("llama", seed=seed)
    install_rvv_policy(model, RvvPolicyConfig(regional_compile=False, measure_routes=False, fused_ops=False, **config))
    return model


def test_the_routes_c_call_gives_the_python_calls_bits_and_counts(native_routes):
    """A decode step through the C methods and through the routes' Python call: the same logits bit
    for bit and the same counters, and the memoised o_proj call is the op's bits."""
    from sglang_rvv import adapters
    from sglang_rvv.policy import policy_of

    routing = native_routes
    model = _routed_tiny()
    assert type(routing.ModuleRoute.__dict__["__call__"]).__name__ == "method_descriptor"
    assert type(adapters.RoutedLinear.__dict__["__call__"]).__name__ == "method_descriptor"
    prompt = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(2))
    counters = policy_of(model).counters
    runs = {}
    for mode in ("c", "python"):
        if mode == "python":  # the same routes and memos, through the Python code the C stands for
            routing.ModuleRoute.__call__ = routing.ModuleRoute.call
            del adapters.RoutedLinear.__call__
        with torch.inference_mode():
            model(prompt)  # plans (the first run) or re-uses the memos
            before = counters.copy()
            logits = model(prompt[:, :1]).logits
        runs[mode] = (logits, counters - before)
    assert torch.equal(_bits(runs["c"][0]), _bits(runs["python"][0]))
    assert runs["c"][1] == runs["python"][1] and runs["c"][1]["o_proj", "packed_eager", "1"] == 2, runs["c"][1]


def test_a_memoised_planned_call_runs_no_python_frame(native_routes):
    """What the C methods are for: a routed Linear's memoised call reaches the kernel with no Python
    frame on the way (DirectCall.__call__, RoutedLinear.forward and ModuleRoute.call stay out)."""
    import sys

    model = _routed_tiny(seed=2)
    o_proj = model.model.layers[0].self_attn.o_proj
    x = _randn(1, 1, o_proj.in_features, seed=4)
    frames = []
    with torch.inference_mode():
        o_proj(x)  # plans it
        sys.setprofile(lambda frame, event, arg: event == "call" and frames.append(frame.f_code.co_qualname))
        try:
            o_proj(x)
        finally:
            sys.setprofile(None)
    assert frames == [], frames


def test_the_routes_c_call_re_plans_a_changed_weight_and_leaves_hooks_and_grad_to_python(native_routes):
    routing = native_routes
    model = _routed_tiny(seed=1)
    o_proj = model.model.layers[0].self_attn.o_proj
    route = o_proj.__dict__[routing.ROUTE_ATTR]
    x = _randn(1, 1, o_proj.in_features, seed=3)

    def op_bits():
        packed = o_proj._buffers[route.record.buffers[0]]
        return _bits(torch.ops.sglang_rvv_native.packed_bf16_linear(x, packed, o_proj.out_features, VERSION))

    with torch.inference_mode():
        o_proj(x)  # plans the decode shape
        assert route.memo.calls[x.shape, x.dtype, True].plan is not None
        assert torch.equal(_bits(o_proj(x)), op_bits())
    with torch.no_grad():
        o_proj.weight.mul_(2)  # in place: the plan no longer holds, the route re-plans and repacks
        assert torch.equal(_bits(o_proj(x)), op_bits())
        o_proj.weight = torch.nn.Parameter(o_proj.weight.detach().clone().neg_(), requires_grad=False)
        assert torch.equal(_bits(o_proj(x)), op_bits())  # another weight object
        handle = o_proj.register_forward_hook(lambda module, args, out: out * 2)
        hooked = o_proj(x)
        handle.remove()
        assert torch.equal(_bits(hooked), _bits(torch.ops.sglang_rvv_native.packed_bf16_linear(
            x, o_proj._buffers[route.record.buffers[0]], o_proj.out_features, VERSION) * 2))
        o_proj.forward = lambda input: input[..., :7]  # set on the instance: it is what a call runs
        assert o_proj(x).shape[-1] == 7
        del o_proj.forward
    o_proj.weight.requires_grad_(True)
    y = o_proj(x.float().to(torch.bfloat16).requires_grad_(True))  # grad on: row-major F.linear, autograd kept
    y.sum().backward()
    assert o_proj.weight.grad is not None


def test_the_routes_c_call_reuses_its_last_memo_hit_only_until_the_memo_changes(native_routes):
    """route_call.cpp keeps a memo's last hit with its shape; a new decision for any shape
    (CallMemo.remember) drops it, so the next call takes the new decision."""
    routing = native_routes
    model = _routed_tiny(seed=3)
    o_proj = model.model.layers[0].self_attn.o_proj
    route = o_proj.__dict__[routing.ROUTE_ATTR]
    one, two = _randn(1, 1, o_proj.in_features, seed=5), _randn(1, 2, o_proj.in_features, seed=6)

    def op_bits(x):
        packed = o_proj._buffers[route.record.buffers[0]]
        return _bits(torch.ops.sglang_rvv_native.packed_bf16_linear(x, packed, o_proj.out_features, VERSION))

    with torch.inference_mode():
        for x in (one, two, one, two):  # plans each shape, then the C call alternates between them
            assert torch.equal(_bits(o_proj(x)), op_bits(x))
        assert route.memo.last == (tuple(two.shape), route.memo.calls[two.shape, two.dtype, True])
        row_major = ("o_proj", "row_major_test", "2")
        route.memo.remember(two, routing.MemoCall(row_major, None, 2, 2, False, ()))
        assert route.memo.last is None
        assert torch.equal(_bits(o_proj(two)), _bits(torch.nn.functional.linear(two, o_proj.weight)))
        assert route.context.counters[row_major] == 1


def test_the_routes_c_method_refuses_a_class_without_the_slots_it_reads(native_routes):
    from sglang_rvv import packed_state

    routing = native_routes
    native = routing.accelerated()

    class NoSlots:
        def __call__(self, *args):
            return args

    with pytest.raises(ValueError, match="NoSlots has no __slots__ member context"):
        native.route_method(NoSlots, NoSlots.__call__, packed_state.PackedRecord, routing.RouteContext,
                            routing.CallMemo, torch.bfloat16, 0, 6)


def test_with_regional_compile_the_rvv_providers_packed_calls_are_not_compiled(native_routes):
    """The rvv provider's packed calls are native ops: with regional compile on (the flag's default)
    they still take the eager route, at M=1 and in a bucket, and the warm-up compiles nothing and
    says why."""
    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, tiny
    from sglang_rvv.policy import policy_of
    from sglang_rvv.warmup import warm_up

    model = tiny.build_model("llama", seed=0)
    install_rvv_policy(model, RvvPolicyConfig(measure_routes=False, fused_ops=False))
    assert policy_of(model).config.regional_compile
    # The compiled callables are the process's (other tests may have compiled these shapes): the
    # warm-up must add none of them and compile nothing.
    compiled = policy_of(model).context.compiled
    before = set(compiled.keys())
    report = warm_up(policy_of(model))
    assert set(compiled.keys()) == before and report.compiled == 0, report
    assert "native op" in report.packed_not_compiled and "not compiled" in report.summary()
    counters = policy_of(model).counters
    o_proj = model.model.layers[0].self_attn.o_proj
    with torch.inference_mode():
        for rows in (1, 3):
            o_proj(_randn(1, rows, o_proj.in_features, seed=rows))
    assert counters == {("o_proj", "packed_eager", "1"): 1, ("o_proj", "packed_eager", "4"): 1}, counters
