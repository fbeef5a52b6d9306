"""The packed BF16 weight layout: the one place that defines it.

A row-major Linear weight ``[N, K]`` becomes ``[ceil(N / BLOCK_N), K, BLOCK_N]``:
the last dimension holds ``BLOCK_N`` consecutive output channels, which is the
contiguous vector the RVV microkernel loads per K step (block_n = 32 at VLEN 256
for BF16). ``N`` is zero-padded up to a multiple of ``BLOCK_N``; callers pass the
real ``out_features`` to the linear op, which slices the padding away.

The layout is a runtime contract identified by ``LAYOUT_VERSION``. It is never
written to a checkpoint: whoever runs the model rebuilds it after loading.
"""

from __future__ import annotations

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
