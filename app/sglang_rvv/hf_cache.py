"""transformers' KV cache, appended in place.

A ``DynamicLayer`` (transformers 5.12's default cache layer) concatenates its whole cache with
each step's keys and values (``torch.cat``), so every cached key and value is copied again at
every decode step: bytes that grow with the context, and in Debian's riscv64 torch a 32-byte
memcpy call per 16 values (a Qwen3-0.6B step at a 6-token context spent about 2.5 M instructions
in it under qemu; at 500 tokens a step would copy about 57 MB). :func:`grow` makes a layer a
growing one, once, the first time the policy's attention sees it: its keys and values are then
views of a buffer with room to spare, and a step writes only its own rows.

A step writes only past the end of the view the layer last returned, into rows no view covers;
a layer whose keys were replaced since (a crop, a beam reordering, a copy of the cache) first
moves them into a new buffer. So no view anyone kept ever changes. The rows are written by the
kernel library's ``append_rows`` (the policy grows a layer only where that library is loaded).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .kernels.rvv import native_op

# Room for at least this many more rows, else for a quarter of the length: a copy of the cache
# every few dozen steps at first, amortised O(1) per step after, and at most a quarter unused.
SPARE_MIN = 64
_HELD = {"keys": "_sglang_rvv_keys", "values": "_sglang_rvv_values"}  # (buffer, view) in a layer's dict


def appended(layer: object, name: str, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``torch.cat([old, new], dim=-2)`` of [batch, heads, seq, d] tensors, as a view of a buffer
    the layer holds: ``new`` written in place where ``old`` is the view it returned last and the
    buffer has room, else both copied into a new buffer."""
    held = layer.__dict__.get(_HELD[name])
    length, n = (old.shape[2] if old.dim() == 4 else 0), new.shape[2]
    total = length + n
    if held is not None and held[1] is old and total <= held[0].shape[2]:
        buffer = held[0]
    else:
        if new.dim() != 4 or not new.is_cpu or (old.numel() and (old.dim() != 4 or old.shape[:2] != new.shape[:2]
                                               or old.shape[3] != new.shape[3] or old.dtype != new.dtype
                                               or old.device != new.device)):
            return torch.cat([old, new], dim=-2)  # not a step of this cache: transformers' own
        batch, heads, _, d = new.shape
        buffer = new.new_empty(batch, heads, total + max(SPARE_MIN, total // 4), d)
        if length:
            buffer.narrow(2, 0, length).copy_(old)
    # buffer[:, :, length:total] = new, and the view buffer[:, :, :total]: one call for what narrow,
    # copy_ and narrow from Python did in three ops.
    view = native_op("append_rows")(buffer, new, length)
    layer.__dict__[_HELD[name]] = (buffer, view)
    return view


@functools.cache
def _classes() -> tuple[type, type, Callable]:
    """(transformers' DynamicLayer, its growing subclass, the base ``Cache.update``)."""
    from transformers.cache_utils import Cache, DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A DynamicLayer whose update appends in place (the module's docstring); otherwise the same."""

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self.keys = appended(self, "keys", self.keys, key_states)
            self.values = appended(self, "values", self.values, value_states)
            return self.keys, self.values

    return DynamicLayer, GrowingLayer, Cache.update


def step_buffers(cache: object, index: int, batch: int, head_dim: int) -> tuple | None:
    """Where a decode step of one row for layer ``index`` of a transformers cache goes in place:
    ``(layer, key buffer, value buffer, length)`` when the cache is one whose update is the base
    ``Cache.update`` (no offloading) and the layer a growing one (:func:`grow`) whose keys and values
    are the views it returned last, [batch, heads, length, head_dim] of buffers with room for one
    more row: what :func:`appended` would then write in place. None otherwise."""
    _, growing, base_update = _classes()
    if type(cache).update is not base_update or cache.offloading:
        return None
    layers = cache.layers
    if not 0 <= index < len(layers):
        return None
    layer = layers[index]
    if type(layer) is not growing:
        return None
    held_keys, held_values = layer.__dict__.get(_HELD["keys"]), layer.__dict__.get(_HELD["values"])
    if held_keys is None or held_values is None or held_keys[1] is not layer.keys or held_values[1] is not layer.values:
        return None
    keys, values = held_keys[0], held_values[0]
    length = layer.keys.shape[2]
    if not (keys.dtype is torch.bfloat16 and values.dtype is torch.bfloat16 and keys.shape == values.shape
            and keys.shape[0] == batch and keys.shape[3] == head_dim and layer.values.shape[2] == length
            and length < keys.shape[2]):
        return None
    return layer, keys, values, length


def stepped(layer: object, key_buffer: torch.Tensor, keys: torch.Tensor, value_buffer: torch.Tensor,
            values: torch.Tensor) -> None:
    """Record a step that :func:`step_buffers` found room for: the layer's keys and values are now
    these views of its buffers, as :func:`appended` leaves them."""
    layer.keys, layer.values = keys, values
    layer.__dict__[_HELD["keys"]] = (key_buffer, keys)
    layer.__dict__[_HELD["values"]] = (value_buffer, values)


def grow(cache: object, index: int) -> None:
    """Make layer ``index`` of a transformers cache a growing one where it is a plain DynamicLayer
    (not a sliding window, a static or an offloaded layer: those keep their own update)."""
    layers = getattr(cache, "layers", None)
    if layers is not None and 0 <= index < len(layers):
        dynamic, growing, _ = _classes()
        if type(layers[index]) is dynamic:
            layers[index].__class__ = growing
