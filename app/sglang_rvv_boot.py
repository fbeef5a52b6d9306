"""Interpreter-start hooks for an environment that runs sglang_rvv.

Installed as ``sglang_rvv_boot.pth`` in site-packages (``python -m sglang_rvv_boot``),
so they are active in every process, SGLang's scheduler subprocesses included,
before anything imports sglang. Nothing here imports torch; each hook acts only
when its module is imported. ``SGLANG_RVV_BOOT=0`` switches them off.

* ``sgl_kernel``: SGLang's CPU engine imports a CPU build of ``sgl_kernel`` that
  has no PyPI release. When no real ``sgl_kernel`` is importable (the finder sits
  last on ``sys.meta_path``), ``sglang_rvv/sgl_kernel_fallback.py`` is loaded
  under that name. A real package on the board always wins.
* ``torchvision``: SGLang imports it unconditionally, and the only x86 wheel is a
  CUDA build whose ``_C`` extension cannot load under CPU torch; its
  ``_meta_registrations`` then fails on the undefined ``torchvision::nms``. When
  (and only when) ``_C`` failed to load, we define the two schemas it registers
  fakes for, so torchvision imports; its compiled ops stay unavailable, which
  text serving never needs.
* ``triton``, ``xgrammar``: SGLang imports both without a guard, neither has a
  riscv64 build, and on CPU neither runs. When (and only when) no real package
  is importable (this finder too sits last), ``sglang_rvv/standins.py``
  answers the imports of the modules in ``STANDINS``, and the first use in a
  process tree is logged once. Every other importer sees the package as
  absent: torch probes for Triton in dozens of modules (``try: from triton...
  except ImportError``) and SGLang guards its other xgrammar imports, and both
  would build on a stand-in. ``torch.utils._triton.has_triton_package`` (which
  may ask ``find_spec``) answers False too.
* ``sglang.srt.utils.common.is_cpu``: SGLang's CPU engine accepts x86_64 and
  aarch64 hosts only; on riscv64 it is answered as on those, by
  ``SGLANG_USE_CPU_ENGINE=1``. It is patched right after SGLang defines it,
  before any module computes its module-level ``_is_cpu``.
"""

from __future__ import annotations

import builtins
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import platform
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_rvv_boot.pth"
# Each stand-in and the importers it serves (module names, or prefixes ending in "."): the
# modules that import the package unconditionally.
STANDINS = {
    "triton": ("sglang.",),  # 61 modules of the CPU serving path, at module level
    "xgrammar": tuple(f"sglang.srt.function_call.{name}" for name in
                      ("inkling_detector", "kimik3_detector", "kimik3_structural_tag")),
}
# Set once a stand-in was logged; child processes inherit it, so a server logs it once.
STANDIN_LOGGED_ENV = "SGLANG_RVV_STANDINS_LOGGED"
_TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_torchvision_lib = None  # keeps the torch.library registration alive


class _SglKernelFallbackFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "sgl_kernel":
            return None
        package = importlib.util.find_spec("sglang_rvv")
        if package is None or not package.submodule_search_locations:
            return None
        location = Path(list(package.submodule_search_locations)[0]) / "sgl_kernel_fallback.py"
        return importlib.util.spec_from_file_location("sgl_kernel", location)


def _serves(package: str, importer: str) -> bool:
    return any(importer == who or (who.endswith(".") and importer.startswith(who)) for who in STANDINS[package])


def _importer() -> str:
    """The module whose code runs the import being resolved (past importlib's own frames)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (name.startswith("importlib") or name == __name__ or frame.f_code.co_filename.startswith("<frozen")):
            return name
        frame = frame.f_back
    return ""


def _only_for_its_importers(original):
    """``__import__`` that refuses a stand-in, once one is loaded, to the importers it does not serve."""
    def __import__(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.partition(".")[0]
        if (level == 0 and top in STANDINS and not _serves(top, str((globals or {}).get("__name__", "")))
                and _is_standin(top)):
            raise ModuleNotFoundError(f"No module named {top!r}", name=top)
        return original(name, globals, locals, fromlist, level)

    __import__.sglang_rvv_standins = True
    return __import__


class _StandinLoader(importlib.abc.Loader):
    def create_module(self, spec):
        from sglang_rvv.standins import make_module

        if not getattr(builtins.__import__, "sglang_rvv_standins", False):
            builtins.__import__ = _only_for_its_importers(builtins.__import__)
        if "." not in spec.name and not os.environ.get(STANDIN_LOGGED_ENV):
            os.environ[STANDIN_LOGGED_ENV] = "1"
            print(f"sglang_rvv_boot: {spec.name} is not installed; using an import-only stand-in "
                  f"(on CPU SGLang never runs it; stand-ins: {', '.join(STANDINS)})", file=sys.stderr)
        return make_module(spec.name)

    def exec_module(self, module):
        pass


class _StandinFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".", 1)[0]
        if top not in STANDINS or not _serves(top, _importer()):
            return None
        return importlib.machinery.ModuleSpec(name, _StandinLoader(), is_package=True)


def _is_standin(name: str) -> bool:
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "IS_SGLANG_RVV_STANDIN", False)
    return importlib.machinery.PathFinder.find_spec(name) is None


def _no_standin_triton(torch_triton) -> None:
    if _is_standin("triton"):
        torch_triton.has_triton_package = functools.cache(lambda: False)


def _riscv64_cpu_engine(common) -> None:
    if platform.machine().lower() != "riscv64":
        return

    @functools.lru_cache(maxsize=1)
    def is_cpu() -> bool:
        return os.getenv("SGLANG_USE_CPU_ENGINE", "0") == "1"

    common.is_cpu = is_cpu


def _define_missing_torchvision_ops(extension) -> None:
    global _torchvision_lib
    if extension._has_ops():
        return
    import torch

    _torchvision_lib = torch.library.Library("torchvision", "DEF")
    for schema in _TORCHVISION_SCHEMAS:
        _torchvision_lib.define(schema)


class _ThenLoader(importlib.abc.Loader):
    """Run the original loader, then a hook on the fresh module."""

    def __init__(self, loader, hook):
        self._loader, self._hook = loader, hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._hook(module)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Runs a hook on a module right after its own code, before anyone imports from it."""

    HOOKS = {
        "torchvision.extension": _define_missing_torchvision_ops,
        "torch.utils._triton": _no_standin_triton,
        "sglang.srt.utils.common": _riscv64_cpu_engine,
    }

    def find_spec(self, name, path=None, target=None):
        hook = self.HOOKS.get(name)
        if hook is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, hook)
        return spec


def activate() -> None:
    if os.environ.get("SGLANG_RVV_BOOT", "1") == "0":
        return
    if not any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
        sys.meta_path.append(_SglKernelFallbackFinder())
        sys.meta_path.append(_StandinFinder())


def install(site_packages: Path | None = None) -> Path:
    """Write the .pth that activates these hooks at interpreter start."""
    target = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text("import sglang_rvv_boot; sglang_rvv_boot.activate()\n")
    return target


if __name__ == "__main__":
    print(f"installed {install()}")
