"""Kernel providers for the packed layouts, chosen once per process, on first use.

A provider is a module with:

- ``NAME``, and ``status()``: ``(True, what runs)`` or ``(False, why it cannot run here)``;
- BF16: ``pack(weight)``, ``linear(input_2d, packed, out_features)`` and ``decompose(...)``
  (what Inductor traces);
- ``layout_refusal(name)``: ``None`` if it implements layout ``name`` (``"bf16"``, ``"int8"``,
  ``"int4"``), else why not, in one line (the policy then falls back to a wider layout);
- INT8/INT4 (:class:`layout.QuantLayout`, ``group`` the effective group size along K):
  ``quantized_form(layout, out_features, in_features, group)``, the ``(shape, dtype)`` of each
  tensor it packs into (one of :mod:`layout`'s physical forms: budgets and fake kernels use it),
  ``pack_quantized(weight, layout, group)`` (those tensors, holding the values of
  :func:`layout.quantize_reference`), ``linear_quantized(input_2d, packed, layout, out_features,
  in_features)`` and ``decompose_quantized(...)`` (what Inductor traces).

Preferred first: ``rvv_prims`` (the patched RVV torch's prims, where the running torch registers
them), ``rvv`` (this project's RVV kernels, ``libsglang_rvv_kernels.so``, on a riscv64 CPU with V),
``generic`` (portable torch ops). ``SGLANG_RVV_OP_PROVIDER=rvv|generic|rvv_prims`` forces one, for
A/B runs on the board. :func:`chosen` makes the choice the first time a kernel or a name is
needed, so importing a module for a name or an enum never loads a native library.
"""

from __future__ import annotations

import functools
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


@functools.cache
def chosen() -> tuple[ModuleType, str]:
    """This process's provider and why: :func:`choose_provider`, asked once."""
    return choose_provider()
