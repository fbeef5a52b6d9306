"""Kernel providers for the packed layout, chosen once per process.

A provider is a module with ``NAME``, ``available()``, ``pack(weight)``,
``linear(input_2d, packed, out_features)`` and ``decompose(...)`` (what Inductor
traces). The patched RVV prims win when the running torch has them; otherwise
the portable generic kernels run. ``SGLANG_RVV_OP_PROVIDER=generic|rvv_prims``
forces a choice, for A/B runs on the board.
"""

from __future__ import annotations

import os
from types import ModuleType

from . import generic, rvv

PROVIDERS: dict[str, ModuleType] = {rvv.NAME: rvv, generic.NAME: generic}
ENV_VAR = "SGLANG_RVV_OP_PROVIDER"


def select_provider(forced: str | None = None) -> ModuleType:
    forced = forced if forced is not None else os.environ.get(ENV_VAR) or None
    if forced is not None:
        if forced not in PROVIDERS:
            raise ValueError(
                f"{ENV_VAR}={forced!r} is not a provider; choose one of {sorted(PROVIDERS)}"
            )
        if not PROVIDERS[forced].available():
            raise RuntimeError(
                f"{ENV_VAR}={forced!r} was requested but this torch ({_torch_version()}) does "
                "not register torch.ops.prims.rvv_pack_bf16_weight/rvv_packed_bf16_linear; "
                "install the patched RVV PyTorch wheel or unset the variable"
            )
        return PROVIDERS[forced]
    return next(p for p in PROVIDERS.values() if p.available())


def _torch_version() -> str:
    import torch

    return torch.__version__
