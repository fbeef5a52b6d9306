"""SGLang's hook for the fused kernels (:mod:`sglang_rvv.fused`): its RMSNorm and SiluAndMul ops.

SGLang's CPU path runs them through ``forward_cpu``, which calls ``sgl_kernel``'s CPU ops only on
an AMX CPU and torch's ops everywhere else, riscv64 included. Each op instance resolves its
callable once into ``_forward_method`` (sglang.kernels.fused_op.BaseFusedOp, checked against sglang
0.5.21); the hook gives that the RVV kernels, and a call they do not cover (another dtype, a
post-residual addition, an FP32 residual, a variance over part of the row) goes to the op's own
``forward_cpu``.
"""

from __future__ import annotations

from collections import Counter

import torch

from .. import fused

_NORM = "sglang.srt.layers.layernorm.RMSNorm"
_SILU = "sglang.srt.layers.activation.SiluAndMul"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def _norm_forward(self, x, residual=None, post_residual_addition=None, quant_linear=None):
    plain = (post_residual_addition is None and quant_linear is None
             and getattr(self, "variance_size_override", None) is None
             and not getattr(self, "fp32_residual", False) and getattr(self, "override_orig_dtype", None) is None)
    if plain and fused.servable(x, self.weight):
        if residual is None:
            return fused.rms_norm(x, self.weight, self.variance_epsilon)
        if fused.servable(residual) and residual.shape == x.shape:
            fused.add_rms_norm_(x, residual, self.weight, self.variance_epsilon)
            return x, residual
    return self.forward_cpu(x, residual, post_residual_addition, quant_linear)


def _silu_forward(self, x):
    d = x.shape[-1] // 2 if x.dim() else 0
    if d and x.shape[-1] == 2 * d and fused.servable(x):
        return fused.silu_mul(x[..., :d], x[..., d:])  # the halves' rows are 2d apart: the kernel reads them so
    return self.forward_cpu(x)


def install_sglang(model: torch.nn.Module) -> Counter:
    given: Counter = Counter()
    for module in model.modules():
        name = _qualname(type(module))
        if name == _NORM and hasattr(module, "variance_epsilon"):
            fused.give_forward(module, _norm_forward, attr="_forward_method")
            given["rmsnorm"] += 1
        elif name == _SILU:
            fused.give_forward(module, _silu_forward, attr="_forward_method")
            given["silu_mul"] += 1
    return given
