"""SGLang's hook for the fused kernels (:mod:`sglang_rvv.fused`): its RMSNorm, SiluAndMul and
RotaryEmbedding ops.

SGLang's CPU path runs them through ``forward_cpu``, which calls ``sgl_kernel``'s CPU ops only on
an AMX CPU and torch's ops everywhere else, riscv64 included. Each op instance resolves its
callable once into ``_forward_method`` (sglang.kernels.fused_op.BaseFusedOp, checked against sglang
0.5.21); the hook gives that the RVV kernels, and a call they do not cover (another dtype, a
post-residual addition, an FP32 residual, a variance over part of the row, a rotary of part of
the head or not neox style, an FP32 cos/sin cache) goes to the op's own ``forward_cpu``. A
subclass of RotaryEmbedding that brings its own forward (mrope, YaRN variants that override it)
keeps it: only the class's own forward_cpu is replaced.

The decode attention is the attention backend's, not a module's: torch_native (the backend the
appliance serves with on the CPU) gathers each request's keys from the paged KV cache and runs
torch's scalar sdpa per request, per layer. The hook replaces its decode loop
(``TorchNativeAttnBackend._run_sdpa_forward_decode``, once per process, when a model with
RadixAttention modules gets the kernels) with one paged kernel call per layer that reads the cache
rows in place. A decode it does not cover (a sliding window, cross attention, an encoder, another
dtype) runs the original loop.

The greedy sampler's next tokens are ``torch.argmax(logits, -1)`` in ``Sampler.forward``
(sglang/srt/layers/sampler.py, checked against sglang 0.5.21): over Qwen3's 151,936 FP32 logits a
scalar pass of 1.4 M instructions a token under qemu (the serving count, README). The hook gives
``Sampler.forward`` (once per process, with the attention's) a ``torch`` whose ``argmax`` is the
top-1 kernel where that covers the call (:func:`sglang_rvv.fused.sampler_with_top1`); every other
name is torch's, and every other module keeps torch.
"""

from __future__ import annotations

from collections import Counter

import torch

from .. import fused

_NORM = "sglang.srt.layers.layernorm.RMSNorm"
_SILU = "sglang.srt.layers.activation.SiluAndMul"
_ROTARY = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding"
_RADIX = "sglang.srt.layers.radix_attention.RadixAttention"


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def _norm_forward(self, x, residual=None, post_residual_addition=None, quant_linear=None):
    plain = (post_residual_addition is None and quant_linear is None
             and getattr(self, "variance_size_override", None) is None
             and not getattr(self, "fp32_residual", False) and getattr(self, "override_orig_dtype", None) is None)
    weight = fused.module_tensor(self, "weight")
    if plain and fused.servable(x, weight):
        if residual is None:
            return fused.rms_norm(x, weight, self.variance_epsilon)
        if fused.servable(residual) and residual.shape == x.shape:
            fused.add_rms_norm_(x, residual, weight, self.variance_epsilon)
            return x, residual
    return self.forward_cpu(x, residual, post_residual_addition, quant_linear)


def _silu_forward(self, x):
    d = x.shape[-1] // 2 if x.dim() else 0
    if d and x.shape[-1] == 2 * d and fused.servable(x):
        return fused.silu_mul(x[..., :d], x[..., d:])  # the halves' rows are 2d apart: the kernel reads them so
    return self.forward_cpu(x)


def _rotary_forward(self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
    cache = fused.module_tensor(self, "cos_sin_cache")
    if (fused_set_kv_buffer_arg is None and self.is_neox_style and self.rotary_dim == self.head_size
            and cache.dtype is torch.bfloat16 and query.dim() == 2 and key.dim() == 2):
        at = positions if offsets is None else positions + offsets
        # [tokens, heads * d] as the kernel's [batch = tokens, heads, seq = 1, d]; the cache row
        # of each token holds cos then sin, d/2 each.
        tokens, d, half = query.shape[0], self.head_size, self.head_size // 2
        table = cache.index_select(0, at.flatten()).unsqueeze(1)
        q, k = query.view(tokens, -1, 1, d), key.view(tokens, -1, 1, d)
        cos, sin = table[..., :half], table[..., half:]
        if fused.rotary_servable(q, k, cos, sin):
            q_out, k_out = fused.rotary(q, k, cos, sin)
            return q_out.view(query.shape), k_out.view(key.shape)
    return self.forward_cpu(positions, query, key, offsets, fused_set_kv_buffer_arg)


def _own_rotary(cls: type) -> bool:
    """Whether ``cls`` is RotaryEmbedding, or a subclass that keeps its forward_cpu and forward_native."""
    for base in cls.__mro__:
        if _qualname(base) == _ROTARY:
            return base.forward_cpu is cls.forward_cpu and base.forward_native is cls.forward_native
    return False


def _paged_decode(original):
    def run(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, encoder_lens=None,
            scaling=None, enable_gqa=False, causal=False, is_cross_attn=False, sliding_window_size=None):
        if (encoder_lens is None and not causal and not is_cross_attn and sliding_window_size is None
                and fused.paged_attention_servable(query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                                   seq_lens)):
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5  # sdpa's default
            fused.decode_attention_paged(query, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, scale,
                                         output)
            return output
        return original(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                        encoder_lens, scaling, enable_gqa, causal, is_cross_attn, sliding_window_size)
    run.sglang_rvv_original = original
    return run


def _give_paged_decode() -> None:
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    current = TorchNativeAttnBackend._run_sdpa_forward_decode
    if not hasattr(current, "sglang_rvv_original"):
        TorchNativeAttnBackend._run_sdpa_forward_decode = _paged_decode(current)


def _give_top1() -> bool:
    """Give SGLang's sampler the top-1 kernel; whether it has it."""
    from sglang.srt.layers.sampler import Sampler

    current = Sampler.forward
    if hasattr(current, "sglang_rvv_original"):
        return True
    hooked = fused.sampler_with_top1(current)
    if hooked is None:
        return False
    hooked.sglang_rvv_original = current
    Sampler.forward = hooked
    return True


def install_sglang(model: torch.nn.Module) -> Counter:
    given: Counter = Counter()
    for module in model.modules():
        name = _qualname(type(module))
        if name == _RADIX:
            given["attention"] += 1
        if _own_rotary(type(module)) and hasattr(module, "cos_sin_cache"):
            fused.give_forward(module, _rotary_forward, attr="_forward_method")
            given["rotary"] += 1
        elif name == _NORM and hasattr(module, "variance_epsilon"):
            fused.give_forward(module, _norm_forward, attr="_forward_method")
            given["rmsnorm"] += 1
        elif name == _SILU:
            fused.give_forward(module, _silu_forward, attr="_forward_method")
            given["silu_mul"] += 1
    if given["attention"]:
        _give_paged_decode()
        if _give_top1():
            given["top1"] += 1
    return given
