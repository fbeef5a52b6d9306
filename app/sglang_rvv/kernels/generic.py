"""Portable kernels for the packed layout, written in plain torch ops.

``linear`` is the eager kernel (one batched matmul over the N blocks).
``decompose`` is what Inductor traces instead of the opaque op: a reduction
over K whose innermost loop runs along the 32 contiguous output channels of a
block, so the generated code streams the packed weight once, in memory order.
"""

from __future__ import annotations

import torch

from ..layout import pack_reference

NAME = "generic"


def status() -> tuple[bool, str]:
    return True, "portable torch kernels"


def available() -> bool:
    return True


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
