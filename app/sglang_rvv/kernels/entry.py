"""The eager route's native projection call: ``libsglang_rvv_entry.so`` beside the kernel library.

One CPython function (``csrc/entry/python_entry.cpp``) does what a memoised packed call did
in Python and through ``torch.ops``: it checks the weight against the plan's stamp of it (as
:meth:`packed_state.PackedWeightSource.matches` does), looks the packed buffers up in the
module's buffer dict by name, and calls the packed op (straight to its CPU kernel where the
dispatcher would land there), adding the bias.
It returns ``None`` when the plan no longer holds, and the route then takes its full path.

:func:`load` gives the module, or ``None`` when the entry is not there (a kernel library built
before it, or one whose round trip fails here): the route then calls the op as before. The
entry needs the kernel library's ops registered, so only the ``rvv`` provider asks for it
(``rvv.direct_entry``), after its probe loaded the library.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.util
import logging
from pathlib import Path
from types import ModuleType

import torch

from .. import layout

ENTRY_NAME = "libsglang_rvv_entry.so"
MODULE_NAME = "_sglang_rvv_entry"  # its PyInit__sglang_rvv_entry
KINDS = {"bf16": 0, "int8": 1, "int4": 2, "int4_a8": 3}
log = logging.getLogger("sglang_rvv")


def path_beside(library: Path) -> Path:
    return library.with_name(ENTRY_NAME)


@functools.cache
def load(path_text: str) -> ModuleType | None:
    """The entry module at ``path_text`` once its round trip holds, else None (logged once)."""
    path = Path(path_text)
    if not path.is_file():
        log.warning("sglang_rvv: no %s beside the kernel library: projections call the op through torch.ops "
                    "(rebuild the kernels with images/scripts/build-kernels.sh)", path)
        return None
    try:
        loader = importlib.machinery.ExtensionFileLoader(MODULE_NAME, str(path))
        module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(MODULE_NAME, path,
                                                                                         loader=loader))
        loader.exec_module(module)
        problem = round_trip(module)
    except Exception as exc:  # noqa: BLE001 - any failure here only means the op is called as before
        problem = f"loading it failed: {(str(exc).splitlines() or [type(exc).__name__])[0]}"
    if problem:
        log.warning("sglang_rvv: not using %s: %s; projections call the op through torch.ops", path, problem)
        return None
    return module


def round_trip(module: ModuleType) -> str | None:
    """None if the entry gives the op's bits and refuses a stale weight, else what went wrong."""
    native = torch.ops.sglang_rvv_native
    # Outside inference mode even when the first call comes from inside it: the weight needs a
    # version counter for the stale case.
    with torch.inference_mode(False), torch.no_grad():
        weight = torch.arange(32 * 8, dtype=torch.float32).reshape(32, 8).div_(64).to(torch.bfloat16)
        x, bias = torch.ones(1, 8, dtype=torch.bfloat16), torch.full((32,), 0.5, dtype=torch.bfloat16)
        version = layout.LAYOUT_VERSION
        buffers = {"packed": native.pack_bf16_weight(weight, version)}
        plan = module.plan(KINDS["bf16"], weight, ("packed",), 32, 8, version)
        want = native.packed_bf16_linear(x, buffers["packed"], 32, version).add_(bias)
        got = module.linear(plan, x, weight, buffers, bias)
        if got is None or not torch.equal(got, want):
            return "its output differs from the op's"
        weight.add_(0)  # bumps the version counter: the stamp no longer holds
        if module.linear(plan, x, weight, buffers, None) is not None:
            return "it used a weight whose version changed"
    return None
