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
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_rvv_boot.pth"
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


class _TorchvisionExtensionFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision.extension":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, _define_missing_torchvision_ops)
        return spec


def activate() -> None:
    if os.environ.get("SGLANG_RVV_BOOT", "1") == "0":
        return
    if not any(isinstance(f, _TorchvisionExtensionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchvisionExtensionFinder())
        sys.meta_path.append(_SglKernelFallbackFinder())


def install(site_packages: Path | None = None) -> Path:
    """Write the .pth that activates these hooks at interpreter start."""
    target = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text("import sglang_rvv_boot; sglang_rvv_boot.activate()\n")
    return target


if __name__ == "__main__":
    print(f"installed {install()}")
