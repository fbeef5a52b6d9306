"""The traced custom ops of every packed layout, in ``torch.ops.sglang_rvv``.

- BF16: ``pack_bf16_weight(weight)`` and ``packed_bf16_linear(input, packed_weight, out_features)``;
- INT8/INT4: ``pack_int8_weight(weight, group_size)`` -> ``(qweight, scales)`` and
  ``packed_int8_linear(input, qweight, scales, out_features, in_features)``, and the same for int4.
  ``group_size`` is the API's (0 = one scale per output channel, int8 only); the pair is the chosen
  provider's physical form (:func:`kernels.chosen`), holding :func:`layout.quantize_reference`'s values.

All are real custom ops (schema, CPU kernel, fake kernel), so ``torch.compile`` traces them like
any aten op. For Inductor, the linear ops are decomposed into the provider's traceable form (see
:mod:`sglang_rvv.kernels`): code Inductor generates (generic BF16 and group-wise int8), aten's
int8/int4 kernels (generic), the RVV branch's prim, or the native RVV op (called as an extern
kernel); never a call back into Python.

``PROVIDER``, ``PROVIDER_NAME`` and ``PROVIDER_REASON`` are read through :func:`kernels.chosen`
on first access, so importing this module chooses no provider.
"""

from __future__ import annotations

import torch
from torch._inductor.decomposition import register_decomposition

from . import layout
from .kernels import chosen
from .layout import QuantLayout


def __getattr__(name: str):
    if name == "PROVIDER":
        return chosen()[0]
    if name == "PROVIDER_NAME":
        return chosen()[0].NAME
    if name == "PROVIDER_REASON":
        return chosen()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_lib = torch.library.Library("sglang_rvv", "DEF")
_lib.define("pack_bf16_weight(Tensor weight, int layout_version=1) -> Tensor")
_lib.define(
    "packed_bf16_linear(Tensor input, Tensor packed_weight, SymInt out_features, "
    "int layout_version=1) -> Tensor"
)


def _pack(weight: torch.Tensor, layout_version: int = layout.LAYOUT_VERSION) -> torch.Tensor:
    layout.check_weight(weight, layout_version)
    return chosen()[0].pack(weight)


def _pack_fake(weight: torch.Tensor, layout_version: int = layout.LAYOUT_VERSION) -> torch.Tensor:
    layout.check_weight(weight, layout_version)
    return weight.new_empty(layout.packed_shape(*weight.shape))


def _with_rows(fn, input, *args, out_features):
    """Run a 2-D kernel on ``input`` flattened to rows, restoring leading dims."""
    rows = input.reshape(-1, input.shape[-1])
    out = fn(rows, *args)
    return out.reshape(*input.shape[:-1], out_features)


def _linear(input, packed_weight, out_features, layout_version=layout.LAYOUT_VERSION):
    layout.check_linear_args(input, packed_weight, out_features, layout_version)
    # Custom ops must not return a view of an input; .contiguous() also drops
    # the padded columns from the result's storage.
    return _with_rows(chosen()[0].linear, input, packed_weight, out_features,
                      out_features=out_features).contiguous()


def _linear_fake(input, packed_weight, out_features, layout_version=layout.LAYOUT_VERSION):
    layout.check_linear_args(input, packed_weight, out_features, layout_version)
    return input.new_empty((*input.shape[:-1], out_features))


def _linear_decomposed(input, packed_weight, out_features, layout_version=layout.LAYOUT_VERSION):
    layout.check_linear_args(input, packed_weight, out_features, layout_version)
    return _with_rows(chosen()[0].decompose, input, packed_weight, out_features, out_features=out_features)


_lib.impl("pack_bf16_weight", _pack, "CPU")
_lib.impl("packed_bf16_linear", _linear, "CPU")
torch.library.register_fake("sglang_rvv::pack_bf16_weight", _pack_fake, lib=_lib)
torch.library.register_fake("sglang_rvv::packed_bf16_linear", _linear_fake, lib=_lib)
register_decomposition(torch.ops.sglang_rvv.packed_bf16_linear.default)(_linear_decomposed)


# --- int8 / int4 ------------------------------------------------------------------------


def _check_version(q_layout: QuantLayout, layout_version: int) -> None:
    if layout_version != q_layout.version:
        raise layout.LayoutError(
            f"{q_layout.name} layout version {layout_version} is not supported: this build of sglang_rvv "
            f"implements version {q_layout.version}; repack with pack_{q_layout.name}_weight"
        )


def _group(q_layout: QuantLayout, weight: torch.Tensor, group_size: int, layout_version: int) -> int:
    _check_version(q_layout, layout_version)
    if weight.dim() != 2:
        raise layout.LayoutError(
            f"pack_{q_layout.name}_weight expects a 2-D [N, K] weight, got shape {tuple(weight.shape)}")
    return layout.effective_group_size(q_layout, group_size, weight.shape[1])


def _check_linear(q_layout, input, qweight, scales, out_features, in_features, layout_version) -> None:
    _check_version(q_layout, layout_version)
    provider = chosen()[0]
    layout.check_quantized_linear_args(
        input, (qweight, scales), q_layout, out_features, in_features,
        lambda group: provider.quantized_form(q_layout, out_features, in_features, group))


def _define_quantized(q_layout: QuantLayout) -> None:
    name = q_layout.name
    default_group = q_layout.default_group_size
    _lib.define(f"pack_{name}_weight(Tensor weight, int group_size={default_group}, int layout_version=1) "
                "-> (Tensor, Tensor)")
    _lib.define(f"packed_{name}_linear(Tensor input, Tensor qweight, Tensor scales, SymInt out_features, "
                "SymInt in_features, int layout_version=1) -> Tensor")

    def pack(weight, group_size=default_group, layout_version=1):
        group = _group(q_layout, weight, group_size, layout_version)
        layout.check_quantizable(weight, q_layout)
        return chosen()[0].pack_quantized(weight, q_layout, group)

    def pack_fake(weight, group_size=default_group, layout_version=1):
        group = _group(q_layout, weight, group_size, layout_version)
        forms = chosen()[0].quantized_form(q_layout, *weight.shape, group)
        return tuple(weight.new_empty(shape, dtype=dtype) for shape, dtype in forms)

    def linear(input, qweight, scales, out_features, in_features, layout_version=1):
        _check_linear(q_layout, input, qweight, scales, out_features, in_features, layout_version)
        return _with_rows(chosen()[0].linear_quantized, input, (qweight, scales), q_layout, out_features,
                          in_features, out_features=out_features).contiguous()

    def linear_fake(input, qweight, scales, out_features, in_features, layout_version=1):
        _check_linear(q_layout, input, qweight, scales, out_features, in_features, layout_version)
        return input.new_empty((*input.shape[:-1], out_features))

    def linear_decomposed(input, qweight, scales, out_features, in_features, layout_version=1):
        _check_linear(q_layout, input, qweight, scales, out_features, in_features, layout_version)
        return _with_rows(chosen()[0].decompose_quantized, input, (qweight, scales), q_layout, out_features,
                          in_features, out_features=out_features)

    _lib.impl(f"pack_{name}_weight", pack, "CPU")
    _lib.impl(f"packed_{name}_linear", linear, "CPU")
    torch.library.register_fake(f"sglang_rvv::pack_{name}_weight", pack_fake, lib=_lib)
    torch.library.register_fake(f"sglang_rvv::packed_{name}_linear", linear_fake, lib=_lib)
    register_decomposition(getattr(torch.ops.sglang_rvv, f"packed_{name}_linear").default)(linear_decomposed)


for _layout in layout.QUANTIZED.values():
    _define_quantized(_layout)

pack_bf16_weight = torch.ops.sglang_rvv.pack_bf16_weight
packed_bf16_linear = torch.ops.sglang_rvv.packed_bf16_linear
pack_int8_weight = torch.ops.sglang_rvv.pack_int8_weight
packed_int8_linear = torch.ops.sglang_rvv.packed_int8_linear
pack_int4_weight = torch.ops.sglang_rvv.pack_int4_weight
packed_int4_linear = torch.ops.sglang_rvv.packed_int4_linear
pack_int4_a8_weight = torch.ops.sglang_rvv.pack_int4_a8_weight
packed_int4_a8_linear = torch.ops.sglang_rvv.packed_int4_a8_linear
# The linear op of each layout, by name.
LINEAR_OPS = {"bf16": packed_bf16_linear, "int8": packed_int8_linear, "int4": packed_int4_linear,
              "int4_a8": packed_int4_a8_linear}
PACK_OPS = {"bf16": pack_bf16_weight, "int8": pack_int8_weight, "int4": pack_int4_weight,
            "int4_a8": pack_int4_a8_weight}
