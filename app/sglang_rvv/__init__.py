"""RVV BF16 Linear policy for SGLang and transformers models on CPU.

Public API::

    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, invalidate_rvv_packed_weights

The names load on first use, so that light submodules (the container entrypoint, the
cache manifest check) can run without importing torch.
"""

from importlib import import_module

__all__ = [
    "PolicyReport",
    "RvvPolicyConfig",
    "install_rvv_policy",
    "invalidate_rvv_packed_weights",
]
__version__ = "0.1.0"

_PUBLIC = {
    "PolicyReport": ".policy",
    "RvvPolicyConfig": ".config",
    "install_rvv_policy": ".policy",
    "invalidate_rvv_packed_weights": ".policy",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
