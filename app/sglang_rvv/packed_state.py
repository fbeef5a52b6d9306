"""Module-owned packed weights: one record per routed module, the buffers, and their release.

Each routed module holds one object in its ``__dict__`` (:data:`RECORD_ATTR`): its route
(:class:`routing.ModuleRoute`), whose ``record`` (:class:`PackedRecord`) holds the one
:class:`PackedWeightSource` the plan was made for, the layout the module is packed in and the
names of its packed buffers. The packed tensors themselves are non-persistent buffers of the
module, so they live and die with it, the allocator sees them, and ``state_dict()`` never
carries them into a checkpoint. Before every use the source is compared with the module's
current weight, and any difference means the packed copy is stale and must not be used.

What the record cannot see: an in-place write through ``weight.data`` keeps
identity, storage, shape and version counter. The contract is that whoever
mutates weights in place calls ``invalidate_rvv_packed_weights(model)``
afterwards (SGLang's weight-update path does so through our hook).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from . import layout
from .kernels import chosen
from .ops import PACK_OPS

# Where a routed module keeps its route, which holds the record (in its __dict__: not a
# submodule, not state). routing.ROUTE_ATTR is this name.
RECORD_ATTR = "_sglang_rvv_route"
# The packed tensors' buffer names, in the order of a layout's tensors: BF16 has one,
# int8/int4 two (qweight and scales in the provider's physical form).
BUFFER = "_sglang_rvv_packed_weight"
SCALES_BUFFER = "_sglang_rvv_packed_scales"
BUFFERS = (BUFFER, SCALES_BUFFER)


def _version(weight: torch.Tensor) -> int | None:
    # Inference tensors have no version counter; the other checks still hold.
    try:
        return weight._version
    except RuntimeError:
        return None


@dataclass(frozen=True)
class PackedWeightSource:
    """The weight a plan (and its packed buffers) was made for. ``data_ptr`` is where its first
    element lives (storage and offset in one): with the shape, strides and dtype it names the
    very bytes a pack read."""

    tensor_ref: weakref.ReferenceType
    data_ptr: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    # Whether it lives on the CPU, not its device: only CPU weights are packed, and reading
    # .device builds a torch.device, about twice the instructions of .is_cpu, on every call.
    is_cpu: bool
    version: int | None

    @classmethod
    def capture(cls, weight: torch.Tensor) -> PackedWeightSource:
        return cls(
            tensor_ref=weakref.ref(weight),
            data_ptr=weight.data_ptr(),
            shape=tuple(weight.shape),
            stride=tuple(weight.stride()),
            dtype=weight.dtype,
            is_cpu=weight.is_cpu,
            version=_version(weight),
        )

    def matches(self, weight: torch.Tensor) -> bool:
        # Every call of a packed projection runs this, so it reads each property once, the one
        # an in-place update bumps first; an inference tensor (version None) has no counter to read.
        return (
            self.tensor_ref() is weight
            and (self.version is None or self.version == weight._version)
            and self.data_ptr == weight.data_ptr()
            and weight.shape == self.shape
            and weight.stride() == self.stride
            and weight.dtype == self.dtype
            and weight.is_cpu is self.is_cpu
        )


@dataclass(frozen=True)
class PackedLayout:
    """A layout as a module is packed in it: name, version and effective group along K (0 for bf16)."""

    name: str
    version: int
    group: int = 0

    @classmethod
    def of(cls, name: str, group_size: int, in_features: int) -> PackedLayout:
        """The layout ``name`` at the API's ``group_size`` for a weight of ``in_features``;
        raises :class:`layout.LayoutError` when the layout refuses that K."""
        if name == "bf16":
            return cls(name, layout.LAYOUT_VERSION)
        q_layout = layout.quant_layout(name)
        return cls(name, q_layout.version, layout.effective_group_size(q_layout, group_size, in_features))

    def nbytes(self, out_features: int, in_features: int) -> int:
        """The bytes the chosen provider's packed tensors of an ``[N, K]`` weight occupy."""
        if self.name == "bf16":
            return layout.packed_bytes(out_features, in_features)
        q_layout = layout.quant_layout(self.name)
        return layout.form_bytes(chosen()[0].quantized_form(q_layout, out_features, in_features, self.group))


class PackedRecord:
    """What one routed module's plan knows of its weight: the source, and its packed buffers' layout."""

    __slots__ = ("source", "layout", "buffers")

    def __init__(self):
        self.source: PackedWeightSource | None = None
        self.layout: PackedLayout | None = None  # of the buffers; None while the module holds none
        self.buffers: tuple[str, ...] = ()

    def tensors(self, module: torch.nn.Module, weight: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """``module``'s packed tensors if they still reflect ``weight`` (the source check), else ``None``."""
        if not self.buffers or self.source is None or not self.source.matches(weight):
            return None
        return tuple(map(module._buffers.__getitem__, self.buffers))


def record_of(module: torch.nn.Module) -> PackedRecord | None:
    route = module.__dict__.get(RECORD_ATTR)
    return None if route is None else route.record


def pack_into(module: torch.nn.Module, weight: torch.Tensor, packed_layout: PackedLayout) -> tuple[torch.Tensor, ...]:
    """Pack ``weight`` in ``packed_layout`` into buffers owned by ``module``; the record's source must
    already be ``weight``'s (the plan captured it)."""
    release(module)  # free the old copy before allocating the new one
    record = record_of(module)
    with torch.inference_mode(False), torch.no_grad():
        if packed_layout.name == "bf16":
            packed = (PACK_OPS["bf16"](weight.detach()),)
        else:
            q_layout = layout.quant_layout(packed_layout.name)
            group_size = layout.api_group_size(q_layout, packed_layout.group, weight.shape[1])
            packed = tuple(PACK_OPS[packed_layout.name](weight.detach(), group_size))
    for name, tensor in zip(BUFFERS, packed, strict=False):
        module.register_buffer(name, tensor, persistent=False)
    record.layout, record.buffers = packed_layout, BUFFERS[: len(packed)]
    return packed


def valid_packed(module: torch.nn.Module, weight: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """The packed tensors if they still reflect ``weight``, else ``None``."""
    record = record_of(module)
    return None if record is None else record.tensors(module, weight)


def has_packed(module: torch.nn.Module) -> bool:
    record = record_of(module)
    return record is not None and bool(record.buffers)


def nbytes(module: torch.nn.Module) -> int:
    """The bytes of ``module``'s packed tensors (scales included): what a call streams through the kernel."""
    record = record_of(module)
    if record is None:
        return 0
    return sum(module._buffers[name].numel() * module._buffers[name].element_size() for name in record.buffers)


def release(module: torch.nn.Module) -> None:
    """Drop the packed buffers; the record keeps its source (the plan's weight)."""
    record = record_of(module)
    for name in BUFFERS:
        module._buffers.pop(name, None)
    if record is not None:
        record.layout, record.buffers = None, ()
