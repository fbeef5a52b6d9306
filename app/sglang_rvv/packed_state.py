"""Module-owned packed weights: the buffer, its recorded source, and its release.

The packed tensor is a non-persistent buffer of the module that uses it, so it
lives and dies with the module, the allocator sees it, and ``state_dict()``
never carries it into a checkpoint. Next to it we record where it came from;
before every use the record is compared with the module's current weight, and
any difference means the packed copy is stale and must not be used.

What the record cannot see: an in-place write through ``weight.data`` keeps
identity, storage, shape and version counter. The contract is that whoever
mutates weights in place calls ``invalidate_rvv_packed_weights(model)``
afterwards (SGLang's weight-update path does so through our hook).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from .layout import LAYOUT_VERSION
from .ops import pack_bf16_weight

BUFFER = "_sglang_rvv_packed_weight"
SOURCE = "_sglang_rvv_packed_source"


def _version(weight: torch.Tensor) -> int | None:
    # Inference tensors have no version counter; the other checks still hold.
    try:
        return weight._version
    except RuntimeError:
        return None


@dataclass(frozen=True)
class PackedWeightSource:
    """What a packed buffer was built from."""

    tensor_ref: weakref.ReferenceType
    storage_ptr: int
    storage_offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    version: int | None
    layout_version: int

    @classmethod
    def capture(cls, weight: torch.Tensor) -> PackedWeightSource:
        return cls(
            tensor_ref=weakref.ref(weight),
            storage_ptr=weight.untyped_storage().data_ptr(),
            storage_offset=weight.storage_offset(),
            shape=tuple(weight.shape),
            stride=tuple(weight.stride()),
            dtype=weight.dtype,
            device=weight.device,
            version=_version(weight),
            layout_version=LAYOUT_VERSION,
        )

    def matches(self, weight: torch.Tensor) -> bool:
        return (
            self.tensor_ref() is weight
            and self.storage_ptr == weight.untyped_storage().data_ptr()
            and self.storage_offset == weight.storage_offset()
            and self.shape == tuple(weight.shape)
            and self.stride == tuple(weight.stride())
            and self.dtype == weight.dtype
            and self.device == weight.device
            and self.version == _version(weight)
            and self.layout_version == LAYOUT_VERSION
        )


def pack_into(module: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """Pack ``weight`` into a buffer owned by ``module`` and record its source."""
    release(module)  # free the old copy before allocating the new one
    with torch.inference_mode(False), torch.no_grad():
        packed = pack_bf16_weight(weight.detach())
    module.register_buffer(BUFFER, packed, persistent=False)
    object.__setattr__(module, SOURCE, PackedWeightSource.capture(weight))
    return packed


def valid_packed(module: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor | None:
    """The packed buffer if it still reflects ``weight``, else ``None``."""
    packed = module._buffers.get(BUFFER)
    source = module.__dict__.get(SOURCE)
    if packed is None or source is None or not source.matches(weight):
        return None
    return packed


def has_packed(module: torch.nn.Module) -> bool:
    return module._buffers.get(BUFFER) is not None


def release(module: torch.nn.Module) -> int:
    """Drop the packed buffer and its record; returns the bytes freed."""
    packed = module._buffers.pop(BUFFER, None)
    module.__dict__.pop(SOURCE, None)
    return 0 if packed is None else packed.numel() * packed.element_size()
