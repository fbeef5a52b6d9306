"""Portable kernels for the packed layouts, written in plain torch ops: the x86 CI stand-in.

BF16: ``linear`` is the eager kernel (one batched matmul over the N blocks). ``decompose`` is
what Inductor traces instead of the opaque op: a reduction over K whose innermost loop runs
along the 32 contiguous output channels of a block, so the generated code streams the packed
weight once, in memory order.

INT8/INT4 keep the values of :func:`layout.quantize_reference` in aten's own forms
(:data:`layout.ATEN_INT8`, :data:`layout.GROUPED_INT8`, :data:`layout.ATEN_INT4`), because
aten has fast CPU kernels for them and Inductor keeps them as extern calls. Measured on this
2-core x86 CI VM (torch 2.13, best of 20 calls, µs, while another build loaded both cores, so
read the ratios, not the times):

=================  ========  =============  ==============  ==============================
shape, M           F.linear  int8pack_mm    int4pack G=32   int8 G=128 dequant + F.linear
=================  ========  =============  ==============  ==============================
2048x2048, M=1        429        183             149                 2059
2048x2048, M=4        604        282             284                 9471
2048x2048, M=16      4476      12721            3658                 2705
8192x2048, M=1       7059       6997             679                64856
=================  ========  =============  ==============  ==============================

So per-channel int8 (the default) takes ``aten._weight_int8pack_mm`` and int4 takes
``aten._weight_int4pack_mm_for_cpu`` (its dequantization is ``(u - 8) * scale + zero`` with
``u`` the unsigned nibble, checked numerically: a zero of 0 and our ``q + 8`` nibble give the
symmetric ``q * scale``). aten has no group-wise int8 kernel; per-group ``_weight_int8pack_mm``
calls summed in fp32 were no faster than dequantizing at M=1 (2080 vs 2059 µs at 2048x2048) and
4-30x slower at M=4..16, so group-wise int8 dequantizes to
fp32 (exact: an 8-bit q times a bf16 scale fits fp32's mantissa) and runs an fp32 ``F.linear``;
it is correct but slow here, and the route table sends its buckets to row-major where it
loses. Large M is slower than F.linear for int8pack_mm too; the route table measures that.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import layout
from ..layout import QuantLayout, pack_reference
from . import gate

NAME = "generic"
GATE = gate.SEED  # see kernels/gate.py


def status() -> tuple[bool, str]:
    return True, "portable torch kernels"


def layout_refusal(name: str) -> str | None:
    if name not in layout.WEIGHT_DTYPES:
        return f"generic has no layout {name!r}"
    if name != "bf16" and layout.QUANTIZED[name].activations != "bf16":
        return f"generic has no kernel that quantizes activations ({name} runs on the rvv provider)"
    return None


def pack(weight: torch.Tensor) -> torch.Tensor:
    return pack_reference(weight)


def linear(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    blocks, in_features, block_n = packed_weight.shape
    rows = input.shape[0]
    # [blocks, M, K] @ [blocks, K, 32] -> [blocks, M, 32]; expand() is a view.
    out = torch.bmm(input.unsqueeze(0).expand(blocks, rows, in_features), packed_weight)
    return out.permute(1, 0, 2).reshape(rows, blocks * block_n)[:, :out_features]


def decompose(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    blocks, in_features, block_n = packed_weight.shape
    rows = input.shape[0]
    products = input.float().reshape(rows, 1, in_features, 1) * packed_weight.float().unsqueeze(0)
    out = products.sum(dim=2).reshape(rows, blocks * block_n)[:, :out_features]
    return out.to(input.dtype)


def _form(q_layout: QuantLayout, in_features: int, group: int) -> str:
    if q_layout.bits == 4:
        return layout.ATEN_INT4
    return layout.ATEN_INT8 if group == in_features else layout.GROUPED_INT8


def quantized_form(q_layout: QuantLayout, out_features: int, in_features: int,
                   group: int) -> tuple[layout.TensorForm, layout.TensorForm]:
    """(shape, dtype) of the two tensors :func:`pack_quantized` returns."""
    return layout.form_tensors(_form(q_layout, in_features, group), q_layout, out_features, in_features, group)


def pack_quantized(weight: torch.Tensor, q_layout: QuantLayout, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    qweight, scales = layout.quantize_reference(weight, q_layout, layout.api_group_size(q_layout, group, k))
    q = layout.unpack_quantized(qweight, q_layout).transpose(1, 2).reshape(-1, qweight.shape[1] * (8 // q_layout.bits))
    s = scales.transpose(1, 2).reshape(-1, scales.shape[1])  # [Bn*32, Kp/G]
    form = _form(q_layout, k, group)
    if form == layout.ATEN_INT8:
        return F.pad(q[:n], (0, (-k) % layout.ATEN_INT8_K_MULTIPLE)).contiguous(), s[:n, 0].contiguous()
    if form == layout.GROUPED_INT8:
        return q[:n].contiguous(), s[:n].contiguous()
    nibbles = q.to(torch.int32) + 8  # padded rows are q = 0, scale = 0: they contribute 0
    scale_zeros = torch.stack((s.t(), torch.zeros_like(s.t())), dim=2).contiguous()
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 1), scale_zeros


def _pad_columns(input: torch.Tensor, columns: int) -> torch.Tensor:
    """``input`` with zero columns up to the packed K (the padded weight columns are q = 0)."""
    return input if input.shape[1] == columns else F.pad(input, (0, columns - input.shape[1]))


def linear_quantized(input: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor], q_layout: QuantLayout,
                     out_features: int, in_features: int) -> torch.Tensor:
    qweight, scales = packed
    if q_layout.bits == 4:
        kp = 2 * qweight.shape[1]
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(_pad_columns(input, kp), qweight, kp // scales.shape[0],
                                                          scales)
        return out[:, :out_features]
    if scales.dim() == 1:
        return torch.ops.aten._weight_int8pack_mm(_pad_columns(input, qweight.shape[1]), qweight, scales)
    group = qweight.shape[1] // scales.shape[1]
    weight = (qweight.view(out_features, -1, group).float() * scales.float().unsqueeze(2)).flatten(1)
    return F.linear(input.float(), weight[:, :in_features]).to(torch.bfloat16)


# Inductor keeps both aten kernels as extern calls, and traces the group-wise dequantize as code.
decompose_quantized = linear_quantized
