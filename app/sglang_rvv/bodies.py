"""What a route runs, and the key a compiled callable is known by.

Each packed layout has two bodies: the compiled one goes through the traced custom ops of
:mod:`sglang_rvv.ops` (Inductor decomposes them into the provider's form), the eager one calls
the chosen provider's kernel itself. Row-major calls run ``F.linear``. One ``torch.compile``d
callable serves each :class:`RegionalShapeKey`, process-wide. :mod:`sglang_rvv.routing` decides
which of them a call takes; this module knows nothing of routes.
"""

from __future__ import annotations

import enum
import functools
import types
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import layout
from .kernels import chosen
from .ops import packed_bf16_linear, packed_int4_a8_linear, packed_int4_linear, packed_int8_linear
from .route_table import Shape


class Mode(enum.StrEnum):
    """Which operand a compiled callable multiplies by: the packed buffer or the weight itself."""

    EXPLICIT_PACKED = "explicit_packed"
    ROW_MAJOR = "row_major"


class RegionalShapeKey(NamedTuple):
    dtype: torch.dtype
    device_type: str
    projection: str
    rows: int
    out_features: int
    in_features: int
    mode: Mode
    layout: str = "bf16"  # the packed layout (row-major keys: bf16), and its group along K (0 for bf16)
    group: int = 0

    @property
    def shape(self) -> Shape:
        """What the route table knows this key by."""
        return Shape(self.projection, self.rows, self.out_features, self.in_features, self.layout, self.group)


def _packed_rows(input: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    return packed_bf16_linear(input, packed, out_features)


def _int8_rows(input: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    return packed_int8_linear(input, qweight, scales, out_features, input.shape[-1])


def _int4_rows(input: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    return packed_int4_linear(input, qweight, scales, out_features, input.shape[-1])


def _int4_a8_rows(input: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    return packed_int4_a8_linear(input, qweight, scales, out_features, input.shape[-1])


# The compiled body of each packed layout: (rows, *packed tensors, out_features), through the
# traced custom ops of :mod:`ops`, which Inductor decomposes into the provider's form.
PACKED_BODIES = {"bf16": _packed_rows, "int8": _int8_rows, "int4": _int4_rows, "int4_a8": _int4_a8_rows}


@functools.cache  # the provider is chosen once per process
def eager_body(layout_name: str) -> Callable:
    """The eager body of a packed layout: the chosen provider's kernel itself, called with what
    ``PACKED_BODIES`` takes, but with an input of any rank ([..., K] in, [..., N] out, as
    F.linear). The custom op's Python wrapper (a dispatcher round trip and the argument checks)
    and a reshape on each side cost about as much as the kernel's own entry on the board's
    in-order core, and an eager call needs none of them: the plan packed the operands for this
    weight, the decision checked the input (:func:`can_serve`), the native op checks its
    arguments again and takes the rows as they are (a provider's ``ANY_RANK``). Elsewhere the
    input is flattened here, and ``.contiguous()`` keeps the op's contract (a generic result may
    be a view of padded columns)."""
    provider = chosen()[0]
    if layout_name == "bf16":
        def rows(input, packed, out_features):
            return provider.linear(input, packed, out_features)
    else:
        quant = layout.quant_layout(layout_name)

        def rows(input, qweight, scales, out_features):
            return provider.linear_quantized(input, (qweight, scales), quant, out_features, input.shape[-1])

    if getattr(provider, "ANY_RANK", False):
        return rows

    def body(input, *operands):
        if input.dim() == 2:
            return rows(input, *operands).contiguous()
        out = rows(input.reshape(-1, input.shape[-1]), *operands).contiguous()
        return out.reshape(*input.shape[:-1], out.shape[-1])

    return body


@functools.cache
def eager_call(layout_name: str, out_features: int, in_features: int) -> tuple[Callable, tuple]:
    """``(fn, tail)`` for an eager call that takes the input as it is: ``fn(input, *packed, *tail)``.
    A provider with a native op hands out the op's own callable and its trailing arguments
    (``direct_op``): no Python frame between the route and the kernel's entry. Otherwise the eager
    body, with ``(out_features,)``."""
    direct_op = getattr(chosen()[0], "direct_op", None)
    if direct_op is not None:
        return direct_op(layout_name, out_features, in_features)
    return eager_body(layout_name), (out_features,)


def eager_entry(layout_name: str, weight: torch.Tensor, buffer_names: tuple[str, ...], out_features: int,
                in_features: int) -> tuple[Callable, object] | None:
    """``(fn, plan)`` where the provider has a native entry for the whole call (source check, packed
    buffers by name, op, bias): ``fn(plan, input, weight, module._buffers, bias)``, None once the
    plan no longer holds. None where it has none: :func:`eager_call` then."""
    direct_entry = getattr(chosen()[0], "direct_entry", None)
    if direct_entry is None:
        return None
    return direct_entry(layout_name, weight, buffer_names, out_features, in_features)


def native_entry() -> types.ModuleType | None:
    """The chosen provider's native entry module (``kernels/csrc/entry``), or None where it has none."""
    load = getattr(chosen()[0], "native_entry", None)
    return None if load is None else load()


def _row_major_rows(input: torch.Tensor, weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return F.linear(input, weight)


def _own_code(template: Callable, name: str) -> Callable:
    """A copy of ``template`` with a code object of its own.

    Dynamo keeps one cache, with its recompile limit, per code object. Sharing
    one across keys would make every call walk all keys' guards, and would hit
    the limit once enough keys (or grad/inference-mode variants) pile up.
    """
    code = template.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, template.__globals__, name, template.__defaults__)


class CompiledCallables:
    """One ``torch.compile``d callable per shape key, compiled on its first use."""

    __slots__ = ("_by_key",)

    def __init__(self):
        self._by_key: dict[RegionalShapeKey, Callable] = {}

    def get(self, key: RegionalShapeKey) -> Callable:
        fn = self._by_key.get(key)
        if fn is None:
            body = PACKED_BODIES[key.layout] if key.mode == Mode.EXPLICIT_PACKED else _row_major_rows
            name = f"rvv_{key.projection}_m{key.rows}_{key.out_features}x{key.in_features}_{key.mode}"
            if key.mode == Mode.EXPLICIT_PACKED:
                name += f"_{key.layout}" + (f"_g{key.group}" if key.group else "")
            fn = torch.compile(_own_code(body, name), dynamic=False, fullgraph=True)
            self._by_key[key] = fn
        return fn

    def keys(self) -> list[RegionalShapeKey]:
        return list(self._by_key)


# Process-wide: a key fully determines the artifact, so models and policies share them.
COMPILED = CompiledCallables()

