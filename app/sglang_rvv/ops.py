"""``torch.ops.sglang_rvv.pack_bf16_weight`` and ``torch.ops.sglang_rvv.packed_bf16_linear``.

Both are real custom ops (schema, CPU kernel, fake kernel), so ``torch.compile``
traces them like any aten op. For Inductor, the linear op is decomposed into the
provider's traceable form (see :mod:`sglang_rvv.kernels`): a reduction Inductor
generates the loop nest for (generic), the RVV branch's prim (which that torch's
Inductor lowers itself), or the native RVV op (called as an extern kernel); never
a call back into Python.
"""

from __future__ import annotations

import torch
from torch._inductor.decomposition import register_decomposition

from . import layout
from .kernels import choose_provider

PROVIDER, PROVIDER_REASON = choose_provider()
PROVIDER_NAME: str = PROVIDER.NAME

_lib = torch.library.Library("sglang_rvv", "DEF")
_lib.define("pack_bf16_weight(Tensor weight, int layout_version=1) -> Tensor")
_lib.define(
    "packed_bf16_linear(Tensor input, Tensor packed_weight, SymInt out_features, "
    "int layout_version=1) -> Tensor"
)


def _pack(weight: torch.Tensor, layout_version: int = layout.LAYOUT_VERSION) -> torch.Tensor:
    layout.check_weight(weight, layout_version)
    return PROVIDER.pack(weight)


def _pack_fake(weight: torch.Tensor, layout_version: int = layout.LAYOUT_VERSION) -> torch.Tensor:
    layout.check_weight(weight, layout_version)
    return weight.new_empty(layout.packed_shape(*weight.shape))


def _with_rows(fn, input, packed_weight, out_features):
    """Run a 2-D kernel on ``input`` flattened to rows, restoring leading dims."""
    rows = input.reshape(-1, input.shape[-1])
    out = fn(rows, packed_weight, out_features)
    return out.reshape(*input.shape[:-1], out_features)


def _linear(input, packed_weight, out_features, layout_version=layout.LAYOUT_VERSION):
    layout.check_linear_args(input, packed_weight, out_features, layout_version)
    # Custom ops must not return a view of an input; .contiguous() also drops
    # the padded columns from the result's storage.
    return _with_rows(PROVIDER.linear, input, packed_weight, out_features).contiguous()


def _linear_fake(input, packed_weight, out_features, layout_version=layout.LAYOUT_VERSION):
    layout.check_linear_args(input, packed_weight, out_features, layout_version)
    return input.new_empty((*input.shape[:-1], out_features))


def _linear_decomposed(input, packed_weight, out_features, layout_version=layout.LAYOUT_VERSION):
    layout.check_linear_args(input, packed_weight, out_features, layout_version)
    return _with_rows(PROVIDER.decompose, input, packed_weight, out_features)


_lib.impl("pack_bf16_weight", _pack, "CPU")
_lib.impl("packed_bf16_linear", _linear, "CPU")
torch.library.register_fake("sglang_rvv::pack_bf16_weight", _pack_fake, lib=_lib)
torch.library.register_fake("sglang_rvv::packed_bf16_linear", _linear_fake, lib=_lib)
register_decomposition(torch.ops.sglang_rvv.packed_bf16_linear.default)(_linear_decomposed)

pack_bf16_weight = torch.ops.sglang_rvv.pack_bf16_weight
packed_bf16_linear = torch.ops.sglang_rvv.packed_bf16_linear
