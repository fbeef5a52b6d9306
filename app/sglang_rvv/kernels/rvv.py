"""This project's RVV BF16 kernels (``kernels/csrc``), loaded as a torch extension.

``images/scripts/build-kernels.sh`` cross-compiles them for the riscv64 image's torch into
``libsglang_rvv_kernels.so``, with ``kernels.json`` beside it (compiler, flags, source digest,
torch version, layout version). Loading the library registers ``torch.ops.sglang_rvv_native``;
the fake kernels registered here give its ops shapes, so under ``torch.compile`` Inductor keeps
the linear ops as extern calls into the RVV kernels (``decompose`` and ``decompose_quantized``
are the opaque ops themselves). Besides bf16 the library implements the int8 and int4 layouts
(``pack_quantized`` / ``linear_quantized``, physical form ``(qweight, scales)`` as in
:mod:`sglang_rvv.layout`); a library built before them lacks their ops, and
:func:`layout_refusal` says so. The library also holds the rest of a decode step's kernels
(RMSNorm, SiLU x mul, the rotary embedding, the decode attention, the logits' top-1 and widening)
and SGLang's KV store, which :mod:`sglang_rvv.fused` calls.

The library is looked for at ``$SGLANG_RVV_KERNELS_LIB``, else at ``lib/libsglang_rvv_kernels.so``
in this package. It is used only on a riscv64 CPU that reports V, when ``kernels.json`` names the
running torch and the library loads; :func:`status` says which check failed.
"""

from __future__ import annotations

import functools
import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from .. import host, layout
from . import entry, gate

NAME = "rvv"
GATE = gate.RVV  # see kernels/gate.py
# Every packed call is one native op, opaque to Inductor: a compiled callable could only wrap it in
# Dynamo's guards and Inductor's wrapper, so routing calls it as it is and nothing is compiled.
# Counted under emulation (the board-model gate, tests/images/test_board_model.py): Dynamo's part
# alone is about 18 times the whole eager route's cost outside the kernel (168 k against 9.1 k).
COMPILE_PACKED = False
LIB_ENV = "SGLANG_RVV_KERNELS_LIB"
DEFAULT_LIB = Path(__file__).resolve().parent / "lib" / "libsglang_rvv_kernels.so"
HWCAP_V = 1 << (ord("V") - ord("A"))
ANY_RANK = True  # the native linear ops take [..., K] inputs and give [..., N] (bodies.eager_body)


def library_path() -> Path:
    return Path(os.environ.get(LIB_ENV) or DEFAULT_LIB)


def status() -> tuple[bool, str]:
    """``(True, what runs)`` once the library is loaded and usable, else ``(False, why not)``."""
    return _probe(str(library_path()))


def pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.sglang_rvv_native.pack_bf16_weight(weight, layout.LAYOUT_VERSION)


def linear(input: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return torch.ops.sglang_rvv_native.packed_bf16_linear(input, packed_weight, out_features, layout.LAYOUT_VERSION)


# Inductor keeps the native op as an extern kernel call; its fake kernel gives the shapes.
decompose = linear


@functools.cache
def native_op(name: str) -> Callable:
    """``sglang_rvv_native::<name>``'s own C++ callable (torch/_ops.py's ``OpOverload._op``):
    ``torch.ops`` wraps it in two Python ``__call__`` frames (the overload packet's and the
    overload's), on every call."""
    op = getattr(torch.ops.sglang_rvv_native, name).default
    return getattr(op, "_op", op)


def direct_op(name: str, out_features: int, in_features: int) -> tuple[Callable, tuple]:
    """The eager route's call of layout ``name``: the native op's C++ callable and the arguments
    after the packed tensors, so ``fn(input, *packed, *tail)``. ``torch.ops`` wraps that callable
    in two Python ``__call__`` frames (the overload packet's and the overload's): about 8.5 k of
    the 20 k instructions a bare op call costs under emulation, on every projection call."""
    if name == "bf16":
        return native_op("packed_bf16_linear"), (out_features, layout.LAYOUT_VERSION)
    quant = layout.quant_layout(name)
    return native_op(f"packed_{name}_linear"), (out_features, in_features, quant.version)


def native_entry() -> ModuleType | None:
    """The native entry module beside the loaded library (:mod:`.entry`), or None when it is not there."""
    return entry.load(str(entry.path_beside(library_path())))


def direct_entry(name: str, weight: torch.Tensor, buffer_names: tuple[str, ...], out_features: int,
                 in_features: int) -> tuple[Callable, object] | None:
    """The native entry's call of a module packed in layout ``name``: ``(linear, plan)``, so
    ``linear(plan, input, weight, module._buffers, bias)`` gives the output, or None once the plan
    no longer holds (:mod:`.entry`). None when the entry library is not there: ``direct_op`` then."""
    native = native_entry()
    if native is None:
        return None
    version = layout.LAYOUT_VERSION if name == "bf16" else layout.quant_layout(name).version
    return native.linear, native.plan(entry.KINDS[name], weight, buffer_names, out_features, in_features, version)


def layout_refusal(name: str) -> str | None:
    """None if the loaded library implements layout ``name``, else why not, in one line."""
    if name == "bf16":
        return None
    if name not in layout.QUANTIZED:
        return f"unknown layout {name!r}; the rvv kernels implement {', '.join(layout.WEIGHT_DTYPES)}"
    ok, why = status()
    if not ok:
        return why
    if not _has_ops(name):
        return (f"the kernel library {library_path()} has no sglang_rvv_native::packed_{name}_linear (built "
                f"before the {name} layout); rebuild it with images/scripts/build-kernels.sh")
    return None


def _has_ops(name: str) -> bool:
    return all(hasattr(torch.ops.sglang_rvv_native, op) for op in (f"pack_{name}_weight", f"packed_{name}_linear"))


def quantized_form(quant: layout.QuantLayout, out_features: int, in_features: int,
                   group: int) -> tuple[layout.TensorForm, layout.TensorForm]:
    """(shape, dtype) of the two tensors :func:`pack_quantized` returns: the blocked layout."""
    return layout.form_tensors(layout.BLOCKED, quant, out_features, in_features, group)


def pack_quantized(weight: torch.Tensor, quant: layout.QuantLayout, group: int) -> tuple[torch.Tensor, ...]:
    """(qweight, scales) in the blocked layout; ``group`` is the effective G (K for per channel)."""
    return getattr(torch.ops.sglang_rvv_native, f"pack_{quant.name}_weight")(weight, group, quant.version)


def linear_quantized(input: torch.Tensor, packed: tuple[torch.Tensor, ...], quant: layout.QuantLayout,
                     out_features: int, in_features: int) -> torch.Tensor:
    qweight, scales = packed
    return getattr(torch.ops.sglang_rvv_native, f"packed_{quant.name}_linear")(
        input, qweight, scales, out_features, in_features, quant.version)


decompose_quantized = linear_quantized


def isa_has_v(isa: str) -> bool:
    """Whether an ISA string (``rv64imafdcv_zicbom_...``) has V among its single-letter extensions."""
    single_letters = isa.lower().split("_")[0]
    return single_letters.startswith("rv64") and "v" in single_letters[4:]


def missing_v() -> str | None:
    """Why this CPU does not count as having V, or None when /proc/cpuinfo or AT_HWCAP reports it."""
    isa, caps = host.cpu_isa(), host.hwcap()
    if (isa is not None and isa_has_v(isa)) or (caps is not None and caps & HWCAP_V):
        return None
    return (f"the CPU reports no V (vector) extension: /proc/cpuinfo isa {isa or 'absent'}, "
            f"AT_HWCAP {'unreadable' if caps is None else hex(caps)} without bit 'V'")


@functools.cache
def _probe(path_text: str) -> tuple[bool, str]:
    machine = platform.machine()
    if machine != "riscv64":
        return False, f"not a riscv64 machine ({machine})"
    reason = missing_v()
    if reason:
        return False, reason
    path = Path(path_text)
    if not path.is_file():
        return False, (f"no kernel library at {path} (build it with images/scripts/build-kernels.sh, "
                       f"or point {LIB_ENV} at one)")
    manifest = path.with_name("kernels.json")
    try:
        built = json.loads(manifest.read_text())
        built_torch, built_layout = built["torch_version"], built["layout_version"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return False, f"cannot read {manifest}: {exc}"
    if built_torch != torch.__version__:
        return False, (f"{path} was built for torch {built_torch}, this is torch {torch.__version__}: "
                       "refusing to load it (rebuild with images/scripts/build-kernels.sh)")
    if built_layout != layout.LAYOUT_VERSION:
        return False, (f"{path} implements packed layout version {built_layout}, this sglang_rvv "
                       f"uses {layout.LAYOUT_VERSION}")
    if hasattr(torch.ops.sglang_rvv_native, "kernel_isa"):
        # A second registration of the namespace throws from a static initializer: that aborts.
        return False, f"another kernel library already registered torch.ops.sglang_rvv_native; not loading {path}"
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return False, f"loading {path} failed: {(str(exc).splitlines() or [type(exc).__name__])[0]}"
    isa = torch.ops.sglang_rvv_native.kernel_isa()
    if not isa.startswith("rvv"):
        return False, (f"{path} found no V in AT_HWCAP (this Linux kernel does not enable V for user "
                       f"space), so it would run its scalar twins ({isa})")
    _register_fakes()
    return True, f"native RVV kernels ({isa}) from {path}"


@functools.cache
def _register_fakes() -> None:
    def pack_fake(weight, layout_version):
        layout.check_weight(weight, layout_version)
        return weight.new_empty(layout.packed_shape(*weight.shape))

    def linear_fake(input, packed_weight, out_features, layout_version):
        layout.check_linear_args(input, packed_weight, out_features, layout_version)
        return input.new_empty((*input.shape[:-1], out_features))  # any rank, as the op takes it

    torch.library.register_fake("sglang_rvv_native::pack_bf16_weight", pack_fake)
    torch.library.register_fake("sglang_rvv_native::packed_bf16_linear", linear_fake)
    for quant in layout.QUANTIZED.values():
        if _has_ops(quant.name):  # not layout_refusal: this runs inside the status() probe
            _register_quantized_fakes(quant)


def _register_quantized_fakes(quant: layout.QuantLayout) -> None:
    # Shapes only: the native ops check their arguments when they run.
    def pack_fake(weight, group, layout_version):
        qshape, sshape = layout.quantized_shapes(quant, *weight.shape, group)
        qdtype = torch.int8 if quant.bits == 8 else torch.uint8
        return weight.new_empty(qshape, dtype=qdtype), weight.new_empty(sshape)

    def linear_fake(input, qweight, scales, out_features, in_features, layout_version):
        return input.new_empty((*input.shape[:-1], out_features))

    torch.library.register_fake(f"sglang_rvv_native::pack_{quant.name}_weight", pack_fake)
    torch.library.register_fake(f"sglang_rvv_native::packed_{quant.name}_linear", linear_fake)
