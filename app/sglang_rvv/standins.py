"""Import-only stand-ins for packages SGLang imports but never runs on a CPU.

SGLang imports ``triton`` unconditionally (61 modules of the CPU serving path, at
module level) and ``xgrammar`` in three function-call parsers; neither has a
riscv64 build. On CPU with the torch_native attention backend and no grammar
backend, no Triton kernel is launched and no grammar is compiled, so the imports
only need to succeed. :mod:`sglang_rvv_boot` loads these modules under the real
names only when the real package is not importable.

A stand-in module answers every attribute with a :class:`Stub`. For Triton,
decorators and their factories (``@triton.jit``, ``@triton.autotune(configs=
[triton.Config(...)])``) work at import time, and launching a decorated kernel
raises; for xgrammar, which SGLang only names at import time (imports,
annotations), every call raises. The NotImplementedError names the call, so a
code path that really needs the package fails loudly, never silently.
"""

from __future__ import annotations

import types

VERSION = "0.0.0"  # lower than any real release: version checks take their oldest path
# Packages whose objects SGLang calls at import time (decorator factories); any other
# stand-in raises at every call.
CALLED_AT_IMPORT = ("triton",)


def _missing(name: str) -> NotImplementedError:
    package = name.split(".", 1)[0]
    return NotImplementedError(
        f"{name}: {package} is an import-only stand-in here (sglang_rvv_boot; {package} has no build for "
        f"this platform); this feature needs the real {package}"
    )


class Stub:
    """Anything reached through a stand-in module."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        if self._name.split(".", 1)[0] not in CALLED_AT_IMPORT:
            raise _missing(f"{self._name}(...)")
        if len(args) == 1 and not kwargs and callable(args[0]):
            return Kernel(self._name, args[0])  # used as a decorator
        return Stub(f"{self._name}(...)")  # a factory: triton.Config(...), triton.autotune(...)

    def __getitem__(self, item):
        return Stub(f"{self._name}[...]")

    def __mro_entries__(self, bases):
        return (object,)  # class X(xgrammar.Something): import-time only

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class Kernel:
    """A function decorated by a stand-in: it keeps its name; launching it raises."""

    def __init__(self, decorator: str, fn):
        self.fn = fn
        self._name = f"{decorator}({getattr(fn, '__qualname__', fn)})"
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        raise _missing(self._name)

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return Stub(f"{self._name}.{attr}")


def make_module(name: str) -> types.ModuleType:
    """A stand-in module (a package, so that submodule imports reach the stand-in finder too)."""
    module = types.ModuleType(name, f"sglang_rvv import-only stand-in for {name}")
    module.__path__ = []
    module.__version__ = VERSION
    module.IS_SGLANG_RVV_STANDIN = True
    module.__getattr__ = lambda attr: _module_getattr(name, attr)
    return module


def _module_getattr(module: str, attr: str):
    if attr.startswith("__") and attr.endswith("__"):
        raise AttributeError(attr)
    return Stub(f"{module}.{attr}")
