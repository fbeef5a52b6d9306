"""The packed weight layouts: the one place that defines them.

A row-major Linear weight ``[N, K]`` becomes ``[ceil(N / BLOCK_N), K, BLOCK_N]``:
the last dimension holds ``BLOCK_N`` consecutive output channels, which is the
contiguous vector the RVV microkernel loads per K step (block_n = 32 at VLEN 256
for BF16). ``N`` is zero-padded up to a multiple of ``BLOCK_N``; callers pass the
real ``out_features`` to the linear op, which slices the padding away.

The layout is a runtime contract identified by ``LAYOUT_VERSION``. It is never
written to a checkpoint: whoever runs the model rebuilds it after loading.

The quantized layouts (:data:`QUANTIZED`) keep the same block family, so one kernel
structure serves all of them; each is built from the BF16 weight at pack time, which
stays the source of truth:

- ``int8`` (version 1): ``qweight`` int8 ``[B, Kp, 32]`` and ``scales`` bfloat16
  ``[B, Kp/G, 32]``, ``B = ceil(N/32)``, ``G`` the group size along K (``G = K``: one
  scale per output channel, int8 only), ``Kp = ceil(K/G)*G``. Element ``(b, k, j)`` is row
  ``n = 32*b + j``, column ``k``; one vector load of a scales row serves a block's 32 lanes.
- ``int4`` (version 1): ``qweight`` uint8 ``[B, Kp/2, 32]``, byte ``(b, i, j)`` =
  ``(q[n, 2i] + 8) | (q[n, 2i+1] + 8) << 4`` (two K steps share a byte, so one load
  serves two K steps for 32 lanes); ``scales`` as for int8; ``G`` even.
- ``int4_a8``: the int4 layout, bit for bit, whose linear quantizes the activations to int8
  per row and group as it runs (:func:`quantized_linear_a8_reference`): the weight stays 4 bits
  to an integer multiply (a Qwen3-0.6B token, counted under qemu: 105 M LMUL-weighted vector ops
  in the kernel library where int4 takes 189 M), at the cost of the activations' rounding (the
  kernel's SQNR about 45 dB where int4's is 55; on a real model no more than int4's own cost).

Both pad with zeros: rows ``n >= N`` (q = 0, scale = 0) and columns ``k >= K`` (q = 0),
so a K that is not a multiple of G stays exact. The quantization (round to nearest
even, clamped) and the linear's arithmetic order are defined by :func:`quantize_reference`
and :func:`quantized_linear_reference`; every kernel that claims a layout reproduces
them (the RVV kernels and their scalar twins bit for bit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

BLOCK_N = 32
LAYOUT_VERSION = 1


class LayoutError(ValueError):
    """A tensor does not fit the packed layout contract."""


def padded_out_features(out_features: int) -> int:
    return (out_features + BLOCK_N - 1) // BLOCK_N * BLOCK_N


def packed_shape(out_features: int, in_features: int) -> tuple[int, int, int]:
    return (padded_out_features(out_features) // BLOCK_N, in_features, BLOCK_N)


def packed_bytes(out_features: int, in_features: int, element_size: int = 2) -> int:
    """Bytes a packed copy of an ``[out_features, in_features]`` weight occupies."""
    return padded_out_features(out_features) * in_features * element_size


def check_layout_version(layout_version: int) -> None:
    if layout_version != LAYOUT_VERSION:
        raise LayoutError(
            f"packed layout version {layout_version} is not supported: this build of "
            f"sglang_rvv implements version {LAYOUT_VERSION}; repack the weight with "
            f"pack_bf16_weight(weight, layout_version={LAYOUT_VERSION})"
        )


def check_weight(weight: torch.Tensor, layout_version: int) -> None:
    """Validate a row-major weight before packing."""
    check_layout_version(layout_version)
    if weight.dim() != 2:
        raise LayoutError(
            f"pack_bf16_weight expects a 2-D [N, K] weight, got rank {weight.dim()} "
            f"with shape {tuple(weight.shape)}"
        )
    if weight.dtype != torch.bfloat16:
        raise LayoutError(
            f"pack_bf16_weight expects a bfloat16 weight, got {weight.dtype}; "
            "convert the model with .to(torch.bfloat16) first"
        )


def check_linear_args(
    input: torch.Tensor, packed_weight: torch.Tensor, out_features: int, layout_version: int
) -> None:
    """Validate the arguments of the packed linear op (eager and fake kernels alike)."""
    check_layout_version(layout_version)
    if packed_weight.dim() != 3 or packed_weight.shape[2] != BLOCK_N:
        raise LayoutError(
            f"packed_bf16_linear expects a packed weight of shape [ceil(N/{BLOCK_N}), K, "
            f"{BLOCK_N}], got {tuple(packed_weight.shape)}; pack it with pack_bf16_weight"
        )
    if input.dtype != torch.bfloat16 or packed_weight.dtype != torch.bfloat16:
        raise LayoutError(
            f"packed_bf16_linear expects bfloat16 input and weight, got input "
            f"{input.dtype} and weight {packed_weight.dtype}"
        )
    if input.dim() < 1:
        raise LayoutError("packed_bf16_linear expects an input of rank >= 1, got a scalar")
    in_features = packed_weight.shape[1]
    if input.shape[-1] != in_features:
        raise LayoutError(
            f"packed_bf16_linear: input has K={input.shape[-1]} features but the packed "
            f"weight was packed with K={in_features}"
        )
    blocks = packed_weight.shape[0]
    if not (blocks - 1) * BLOCK_N < out_features <= blocks * BLOCK_N:
        raise LayoutError(
            f"packed_bf16_linear: out_features={out_features} does not fit a packed weight "
            f"of {blocks} blocks of {BLOCK_N} (needs {(blocks - 1) * BLOCK_N + 1}.."
            f"{blocks * BLOCK_N})"
        )


def pack_reference(weight: torch.Tensor) -> torch.Tensor:
    """Pack ``[N, K]`` into the blocked layout, writing each element once.

    The destination is allocated once and filled in place, so packing a large
    weight never holds a padded intermediate copy next to the result.
    """
    n, k = weight.shape
    blocks, _, block_n = packed_shape(n, k)
    packed = torch.empty((blocks, k, block_n), dtype=weight.dtype, device=weight.device)
    full = n // block_n
    if full:
        packed[:full].copy_(weight[: full * block_n].view(full, block_n, k).transpose(1, 2))
    tail = n - full * block_n
    if tail:
        packed[full].zero_()
        packed[full, :, :tail].copy_(weight[full * block_n :].transpose(0, 1))
    return packed


def unpack_reference(packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """Inverse of :func:`pack_reference`: the row-major ``[out_features, K]`` weight."""
    blocks, k, block_n = packed.shape
    return packed.transpose(1, 2).reshape(blocks * block_n, k)[:out_features].contiguous()


# --- the quantized layouts -------------------------------------------------------------


@dataclass(frozen=True)
class QuantLayout:
    """One weight-only quantized layout: its name, version and integer range."""

    name: str
    version: int
    bits: int
    qmin: int
    qmax: int  # the scale maps a group's largest |w| to qmax
    group_sizes: tuple[int, ...]  # selectable G; 0 means one group of K (per output channel)
    default_group_size: int
    activations: str = "bf16"  # "int8": the linear quantizes its input per row and group


INT8 = QuantLayout("int8", 1, 8, -128, 127, (0, 32, 64, 128, 256), 0)
INT4 = QuantLayout("int4", 1, 4, -8, 7, (32, 64, 128), 32)
INT4_A8 = QuantLayout("int4_a8", 1, 4, -8, 7, (32, 64, 128), 32, activations="int8")
QUANTIZED = {layout.name: layout for layout in (INT8, INT4, INT4_A8)}
WEIGHT_DTYPES = ("bf16", *QUANTIZED)  # widest first: a refused layout falls back to the next wider one


def quant_layout(name: str) -> QuantLayout:
    try:
        return QUANTIZED[name]
    except KeyError:
        raise LayoutError(f"unknown quantized layout {name!r}; choose one of {sorted(QUANTIZED)}") from None


def effective_group_size(layout: QuantLayout, group_size: int, in_features: int) -> int:
    """The G a layout uses along K: ``group_size``, or K for 0 (per channel); checked."""
    if group_size not in layout.group_sizes:
        raise LayoutError(
            f"{layout.name}: group size {group_size} is not one of {layout.group_sizes} "
            f"(a power of two; 0 = one scale per output channel)"
        )
    if group_size == 0:  # only int8 offers it: int4's groups must be even
        return in_features
    if group_size > in_features:
        raise LayoutError(
            f"{layout.name}: group size {group_size} is larger than K={in_features}; pick a smaller one or 0"
        )
    return group_size


def api_group_size(layout: QuantLayout, group: int, in_features: int) -> int:
    """The group size the API names an effective ``group``: 0 for G = K where the layout offers it."""
    return 0 if group == in_features and 0 in layout.group_sizes else group


def padded_in_features(in_features: int, group: int) -> int:
    return (in_features + group - 1) // group * group


def quantized_shapes(layout: QuantLayout, out_features: int, in_features: int,
                     group: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(qweight shape, scales shape) of the blocked layout, for the effective group ``group``."""
    blocks = padded_out_features(out_features) // BLOCK_N
    kp = padded_in_features(in_features, group)
    rows = kp if layout.bits == 8 else kp // 2
    return (blocks, rows, BLOCK_N), (blocks, kp // group, BLOCK_N)


def quantized_bytes(layout: QuantLayout, out_features: int, in_features: int, group: int) -> int:
    """Bytes the blocked layout streams per call: quantized weights and their BF16 scales."""
    qshape, sshape = quantized_shapes(layout, out_features, in_features, group)
    return qshape[0] * qshape[1] * qshape[2] + 2 * sshape[0] * sshape[1] * sshape[2]


def check_quantizable(weight: torch.Tensor, layout: QuantLayout) -> None:
    if weight.dim() != 2:
        raise LayoutError(f"pack_{layout.name}_weight expects a 2-D [N, K] weight, got shape {tuple(weight.shape)}")
    if weight.dtype != torch.bfloat16:
        raise LayoutError(
            f"pack_{layout.name}_weight quantizes a bfloat16 weight, got {weight.dtype}; a checkpoint that is "
            "already quantized is served by its own quantization method, not by this policy"
        )
    if not bool(torch.isfinite(weight).all()):
        raise LayoutError(f"pack_{layout.name}_weight: the weight has non-finite values; it cannot be quantized")


def _blocked(weight: torch.Tensor, kp: int) -> torch.Tensor:
    """[N, K] -> float32 [B, 32, Kp], zero-padded in both dimensions (row n = 32*b + j)."""
    n, k = weight.shape
    padded = torch.zeros(padded_out_features(n), kp, dtype=torch.float32, device=weight.device)
    padded[:n, :k] = weight.float()
    return padded.view(-1, BLOCK_N, kp)


def quantize_reference(weight: torch.Tensor, layout: QuantLayout, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocked ``(qweight, scales)`` of a bfloat16 ``[N, K]`` weight: the definition of the bits.

    Per output row n and K group g: ``amax`` = the largest ``|w|`` (fp32), ``scale =
    bf16(amax / qmax)`` (an fp32 division, rounded to nearest even), ``q = clamp(rne(w /
    float(scale)), qmin, qmax)`` (fp32 division; q = 0 where the scale is 0).
    """
    check_quantizable(weight, layout)
    n, k = weight.shape
    group = effective_group_size(layout, group_size, k)
    kp = padded_in_features(k, group)
    w = _blocked(weight, kp)                                       # [B, 32, Kp]
    grouped = w.view(w.shape[0], BLOCK_N, kp // group, group)      # [B, 32, Kg, G]
    amax = grouped.abs().amax(dim=3)                               # [B, 32, Kg]
    scales = (amax / layout.qmax).to(torch.bfloat16)
    s = scales.float().unsqueeze(3)
    q = torch.where(s == 0, torch.zeros_like(grouped), torch.round(grouped / torch.where(s == 0, 1.0, s)))
    q = q.clamp(layout.qmin, layout.qmax).to(torch.int8).view(w.shape[0], BLOCK_N, kp)
    q = q.transpose(1, 2).contiguous()                             # [B, Kp, 32]
    if layout.bits == 4:
        nibbles = (q.to(torch.int16) + 8).to(torch.uint8)
        q = nibbles[:, 0::2, :] | (nibbles[:, 1::2, :] << 4)       # [B, Kp/2, 32]
    return q, scales.transpose(1, 2).contiguous()                  # scales [B, Kg, 32]


def unpack_quantized(qweight: torch.Tensor, layout: QuantLayout) -> torch.Tensor:
    """The integer values of a blocked qweight as int8 ``[B, Kp, 32]`` (int4 nibbles unpacked)."""
    if layout.bits == 8:
        return qweight
    low = (qweight & 0xF).to(torch.int16) - 8
    high = (qweight >> 4).to(torch.int16) - 8
    return torch.stack((low, high), dim=2).view(qweight.shape[0], -1, BLOCK_N).to(torch.int8)


def dequantize_reference(qweight: torch.Tensor, scales: torch.Tensor, layout: QuantLayout,
                         out_features: int, in_features: int) -> torch.Tensor:
    """The float64 ``[out_features, in_features]`` weight a blocked (qweight, scales) pair stands for."""
    q = unpack_quantized(qweight, layout).double()                 # [B, Kp, 32]
    group = q.shape[1] // scales.shape[1]
    s = scales.double().repeat_interleave(group, dim=1)            # [B, Kp, 32]
    w = (q * s).transpose(1, 2).reshape(-1, q.shape[1])            # [B*32, Kp]
    return w[:out_features, :in_features]


def _round_f32(value: Fraction) -> float:
    """An exact rational rounded once to float32 (nearest even): the result of an fp32 fma."""
    if value == 0:
        return 0.0  # +0: every chain starts from +0, and an exact zero sum rounds to +0
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if magnitude < Fraction(2) ** exponent:
        exponent -= 1  # now 2**exponent <= magnitude < 2**(exponent + 1)
    exponent = max(exponent, -126)  # subnormals share the smallest normal exponent
    mantissa = round(magnitude * 2 ** (23 - exponent))  # Fraction rounds half to even
    result = float(mantissa) * 2.0 ** (exponent - 23)
    return -result if value < 0 else result


def quantized_linear_reference(input: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                               layout: QuantLayout, out_features: int) -> torch.Tensor:
    """The kernels' result, bit for bit (slow, exact; for tests on small shapes): BF16 activations
    widened to fp32; for each output, per K group in order an fp32 fused multiply-add chain
    ``s = fma(x[k], q[k], s)`` from +0 over the group's real columns (k < K), then ``acc =
    fma(s, scale, acc)`` from +0; one rounding of ``acc`` to bfloat16 (nearest even). A layout
    with int8 activations: :func:`quantized_linear_a8_reference`."""
    if layout.activations == "int8":
        return quantized_linear_a8_reference(input, qweight, scales, out_features)
    k = input.shape[-1]
    rows = input.reshape(-1, k).float().tolist()
    q = unpack_quantized(qweight, layout).transpose(1, 2).reshape(qweight.shape[0] * BLOCK_N, -1)
    group = q.shape[1] // scales.shape[1]
    s = scales.float().transpose(1, 2).reshape(scales.shape[0] * BLOCK_N, -1)
    q_rows, s_rows = q[:out_features].tolist(), s[:out_features].tolist()
    out = torch.empty(len(rows), out_features, dtype=torch.float32)
    for m, x in enumerate(rows):
        xs = [Fraction(v) for v in x]
        for n in range(out_features):
            acc = 0.0
            for g, scale in enumerate(s_rows[n]):
                part = 0.0
                for kk in range(g * group, min(g * group + group, k)):
                    part = _round_f32(xs[kk] * q_rows[n][kk] + Fraction(part))
                acc = _round_f32(Fraction(part) * Fraction(scale) + Fraction(acc))
            out[m, n] = acc
    return out.to(torch.bfloat16).reshape(*input.shape[:-1], out_features)


def quantize_activations_reference(input: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 activations of ``packed_int4_a8_linear`` (kernels.h): ``(xq, d)``, xq int32 ``[M, Kp]``
    (zero past K) and d float32 ``[M, Kp/G]``. Per row and group: amax the largest ``|x|`` (NaN
    skipped); a group holding a NaN or an infinity gets d = NaN and xq = 0; amax = 0, or ``127 /
    amax`` overflowing, gives d = 0 and xq = 0; else ``inv = 127 / amax``, ``d = amax / 127`` (fp32
    divisions) and ``xq = rne(x * inv)`` (fp32 product)."""
    k = input.shape[-1]
    kp = padded_in_features(k, group)
    x = torch.zeros(input.reshape(-1, k).shape[0], kp, dtype=torch.float32)
    x[:, :k] = input.reshape(-1, k).float()
    grouped = x.view(x.shape[0], kp // group, group)
    finite = torch.isfinite(grouped).all(dim=2)
    amax = torch.where(torch.isnan(grouped), 0.0, grouped.abs()).amax(dim=2)
    inv = torch.full_like(amax, 127.0) / amax
    usable = finite & (amax != 0) & torch.isfinite(inv)
    d = torch.where(usable, amax / torch.full_like(amax, 127.0), 0.0)
    d = torch.where(finite, d, float("nan"))
    scaled = torch.where(usable.unsqueeze(2), grouped * torch.where(usable, inv, 0.0).unsqueeze(2), 0.0)
    return torch.round(scaled).to(torch.int32).view(x.shape[0], kp), d


def quantized_linear_a8_reference(input: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                                  out_features: int) -> torch.Tensor:
    """``packed_int4_a8_linear``'s result, bit for bit (exact; for tests): the int4 layout's
    weight, the activations of :func:`quantize_activations_reference`; per output and group in
    order, s = the integer sum of xq * q, ``t = fp32(float(s) * d)``, ``acc = fma(t, scale, acc)``
    from +0; one rounding to bfloat16."""
    q = unpack_quantized(qweight, INT4).transpose(1, 2).reshape(qweight.shape[0] * BLOCK_N, -1)[:out_features]
    group = q.shape[1] // scales.shape[1]
    xq, d = quantize_activations_reference(input, group)
    s = xq.view(xq.shape[0], 1, -1, group).mul(q.to(torch.int32).view(1, out_features, -1, group)).sum(dim=3)
    t = s.float() * d.unsqueeze(1)                                  # [M, N, Kp/G]: s < 2^24, one rounding
    scale = scales.float().transpose(1, 2).reshape(scales.shape[0] * BLOCK_N, -1)[:out_features]
    out = torch.empty(t.shape[0], out_features, dtype=torch.float32)
    for m, row in enumerate(t.tolist()):
        for n, terms in enumerate(row):
            acc = 0.0
            for g, term in enumerate(terms):
                acc = math.nan if math.isnan(term) or math.isnan(acc) else _round_f32(
                    Fraction(term) * Fraction(scale[n, g].item()) + Fraction(acc))
            out[m, n] = acc
    result = out.to(torch.bfloat16)
    result.view(torch.int16)[result.isnan()] = 0x7FC0  # the kernels' one NaN
    return result.reshape(*input.shape[:-1], out_features)


# --- physical forms of the quantized layouts ------------------------------------------
# A provider keeps a quantized weight as a pair of tensors in one of these forms. The values
# (q, scales) are always those of quantize_reference; only their arrangement differs.
# A form is described by the (shape, dtype) of each tensor, so budgets and fake kernels know
# a weight's real bytes and shapes before it is packed.

TensorForm = tuple[tuple[int, ...], torch.dtype]
BLOCKED = "blocked"            # the contract's [B, Kp(/2), 32] qweight and [B, Kp/G, 32] scales (rvv)
ATEN_INT8 = "aten_int8"        # per channel: int8 [N, K16] and bf16 [N], for aten._weight_int8pack_mm;
ATEN_INT8_K_MULTIPLE = 16      # K16 = K zero-padded to a multiple of 16: torch 2.13's kernel reads
                               # past the row (garbage, or a crash) for other K
GROUPED_INT8 = "grouped_int8"  # int8 [N, Kp] and bf16 [N, Kp/G], row-major (dequantized per call)
ATEN_INT4 = "aten_int4"        # aten._convert_weight_to_int4pack_for_cpu of the unsigned nibbles of
                               # [Bn*32, Kp] and bf16 [Kp/G, Bn*32, 2] (scale, zero = 0), for
                               # aten._weight_int4pack_mm_for_cpu, which computes (u - 8) * scale + zero


def form_tensors(form: str, layout: QuantLayout, out_features: int, in_features: int,
                 group: int) -> tuple[TensorForm, TensorForm]:
    """(shape, dtype) of each tensor of ``form`` for an ``[out_features, in_features]`` weight."""
    kp = padded_in_features(in_features, group)
    if form == BLOCKED:
        qshape, sshape = quantized_shapes(layout, out_features, in_features, group)
        return (qshape, torch.int8 if layout.bits == 8 else torch.uint8), (sshape, torch.bfloat16)
    if form == ATEN_INT8:
        k16 = padded_in_features(in_features, ATEN_INT8_K_MULTIPLE)
        return ((out_features, k16), torch.int8), ((out_features,), torch.bfloat16)
    if form == GROUPED_INT8:
        return ((out_features, kp), torch.int8), ((out_features, kp // group), torch.bfloat16)
    if form == ATEN_INT4:
        n = padded_out_features(out_features)
        return ((n, kp // 2), torch.uint8), ((kp // group, n, 2), torch.bfloat16)
    raise LayoutError(f"unknown physical form {form!r}; choose one of {BLOCKED, ATEN_INT8, GROUPED_INT8, ATEN_INT4}")


def form_bytes(tensors: tuple[TensorForm, ...]) -> int:
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in tensors)


def check_quantized_linear_args(input: torch.Tensor, packed: tuple[torch.Tensor, ...], layout: QuantLayout,
                                out_features: int, in_features: int, form_of) -> int:
    """Validate a quantized linear call; returns the effective group size the tensors were packed with.

    ``form_of(group)`` is the provider's :func:`form_tensors` for this weight: the tensors must be
    exactly one of its forms for a group size the layout offers.
    """
    op = f"packed_{layout.name}_linear"
    if input.dtype != torch.bfloat16:
        raise LayoutError(f"{op} expects a bfloat16 input, got {input.dtype}")
    if input.dim() < 1 or input.shape[-1] != in_features:
        raise LayoutError(f"{op}: input has shape {tuple(input.shape)}, needs [..., K={in_features}]")
    got = tuple((tuple(t.shape), t.dtype) for t in packed)
    for group_size in layout.group_sizes:
        if group_size > in_features:
            continue
        group = effective_group_size(layout, group_size, in_features)
        if got == form_of(group):
            return group
    raise LayoutError(
        f"{op}: packed tensors {got} are not the {layout.name} form of a [{out_features}, {in_features}] "
        f"weight at any group size of {layout.group_sizes}; pack it with pack_{layout.name}_weight"
    )
