"""Kernel providers for the packed layout, chosen once per process.

A provider is a module with ``NAME``, ``status()`` (``(True, what runs)`` or ``(False, why it
cannot run here)``), ``available()``, ``pack(weight)``, ``linear(input_2d, packed, out_features)``
and ``decompose(...)`` (what Inductor traces). Preferred first: ``rvv_prims`` (the patched RVV
torch's prims, where the running torch registers them), ``rvv`` (this project's RVV kernels,
``libsglang_rvv_kernels.so``, on a riscv64 CPU with V), ``generic`` (portable torch ops).
``SGLANG_RVV_OP_PROVIDER=rvv|generic|rvv_prims`` forces one, for A/B runs on the board.
"""

from __future__ import annotations

import logging
import os
import platform
from types import ModuleType

from . import generic, rvv, rvv_prims

PROVIDERS: dict[str, ModuleType] = {p.NAME: p for p in (rvv_prims, rvv, generic)}
ENV_VAR = "SGLANG_RVV_OP_PROVIDER"
log = logging.getLogger("sglang_rvv")


def choose_provider(forced: str | None = None) -> tuple[ModuleType, str]:
    """The provider for this process, and why it was picked.

    On riscv64, where the RVV kernels are expected, falling back to ``generic`` logs one
    warning line with the reason; elsewhere ``generic`` is simply the choice.
    """
    forced = forced if forced is not None else os.environ.get(ENV_VAR) or None
    if forced is not None:
        if forced not in PROVIDERS:
            raise ValueError(f"{ENV_VAR}={forced!r} is not a provider; choose one of {sorted(PROVIDERS)}")
        ok, why = PROVIDERS[forced].status()
        if not ok:
            raise RuntimeError(f"{ENV_VAR}={forced!r} was requested but {forced} cannot run here: {why}; "
                               "unset the variable to pick a provider automatically")
        return PROVIDERS[forced], f"forced by {ENV_VAR}: {why}"
    passed_over = []
    for provider in PROVIDERS.values():
        ok, why = provider.status()
        if ok:
            break
        passed_over.append(f"{provider.NAME}: {why}")
    if provider is generic and platform.machine() == "riscv64":
        log.warning("sglang_rvv: op provider generic (portable torch kernels), not the RVV kernels: %s",
                    rvv.status()[1])
    return provider, "; ".join([why, *passed_over])
