"""Kernels from the patched RVV PyTorch branch (``rvv_pytorch_inductor``).

That branch registers ``torch.ops.prims.rvv_pack_bf16_weight`` and
``torch.ops.prims.rvv_packed_bf16_linear`` with the same layout contract as
:mod:`sglang_rvv.layout`; Inductor lowers the linear prim to its VecRVV
microkernels. Here we only delegate to them, so Inductor still sees the prim.
The branch has no quantized prims: int8 and int4 are refused, and the policy
serves those projections in BF16 (``report.layout_fallbacks`` says so).
"""

from __future__ import annotations

import torch

from ..layout import LAYOUT_VERSION
from . import gate

NAME = "rvv_prims"
GATE = gate.SEED  # see kernels/gate.py
_PACK = "rvv_pack_bf16_weight"
_LINEAR = "rvv_packed_bf16_linear"


def status() -> tuple[bool, str]:
    if all(hasattr(torch.ops.prims, name) for name in (_PACK, _LINEAR)):
        return True, f"torch {torch.__version__} registers the RVV branch's prims"
    return False, (f"this torch ({torch.__version__}) does not register torch.ops.prims.{_PACK}/{_LINEAR}; "
                   "install the patched RVV PyTorch wheel")


def layout_refusal(name: str) -> str | None:
    if name == "bf16":
        return None
    return (f"provider rvv_prims (the RVV PyTorch branch's prims) has no {name} kernels; "
            f"use SGLANG_RVV_OP_PROVIDER=rvv for {name}")


def pack(weight: torch.Tensor) -> torch.Tensor:
    return getattr(torch.ops.prims, _PACK)(weight, LAYOUT_VERSION)


def linear(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return getattr(torch.ops.prims, _LINEAR)(input, packed_weight, out_features, LAYOUT_VERSION)


# Under Inductor the prim is kept as is: the RVV branch lowers it itself.
decompose = linear
