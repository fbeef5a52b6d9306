"""RVV BF16 Linear policy for SGLang and transformers models on CPU.

Public API::

    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, invalidate_rvv_packed_weights
"""

from .config import RvvPolicyConfig
from .policy import PolicyReport, install_rvv_policy, invalidate_rvv_packed_weights

__all__ = [
    "PolicyReport",
    "RvvPolicyConfig",
    "install_rvv_policy",
    "invalidate_rvv_packed_weights",
]
__version__ = "0.1.0"
