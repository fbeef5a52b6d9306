"""SGLang's hook for the fused kernels (:mod:`sglang_rvv.fused`): its RMSNorm, SiluAndMul and
RotaryEmbedding ops.

Where a hook's kernel works in place or on SGLang's own layout, the hook calls the library's
``try_`` op (:class:`sglang_rvv.fused._NativeOps`): it asks in C++ what a Python check would ask
first, a few hundred bytecodes a call on the board's interpreter, and runs the kernel or refuses.

SGLang's CPU path runs them through ``forward_cpu``, which calls ``sgl_kernel``'s CPU ops only on
an AMX CPU and torch's ops everywhere else, riscv64 included. Each op instance resolves its
callable once into ``_forward_method`` (sglang.kernels.fused_op.BaseFusedOp, checked against sglang
0.5.21); the hook gives that the RVV kernels, and a call they do not cover (another dtype, a
post-residual addition, an FP32 residual, a variance over part of the row, a rotary of part of
the head or not neox style, an FP32 cos/sin cache) goes to the op's own ``forward_cpu``. A
subclass of RotaryEmbedding that brings its own forward (mrope, YaRN variants that override it)
keeps it: only the class's own forward_cpu is replaced.

The decode attention and the KV cache's row store are the attention backend's
(:mod:`sglang_rvv.srt.attention`), not a module's.

The greedy sampler's next tokens are ``torch.argmax(logits, -1)`` in ``Sampler.forward``
(sglang/srt/layers/sampler.py, checked against sglang 0.5.21): over Qwen3's 151,936 FP32 logits a
scalar pass of 1.4 M instructions a token under qemu (the serving count, README). The hook gives
``Sampler.forward`` (once per process, when a model with RadixAttention modules gets the kernels)
a ``torch`` whose ``argmax`` is the top-1 kernel where that covers the call
(:func:`sglang_rvv.fused.sampler_with_top1`); every other name is torch's, and every other module
keeps torch.

Before the sampler, ``LogitsProcessor._copy_logits_to_buffer`` widens the lm_head's BF16 logits to
FP32 (``.float()``, or ``copy_`` into a graph's buffer): Debian's torch does it 16 values at a
time through memcpy calls, about 2.3 M instructions a Qwen3 token (the serving count). The hook
(once per process, with the sampler's) widens them first with the widening kernel, the same
bits, cut to the vocabulary as SGLang cuts them; the original then finds FP32 logits, so its
``.float()`` returns them as they are and a buffer takes them by an FP32 copy.

SGLang's model code reads each child module as an attribute (``self.qkv_proj``), through
``nn.Module.__getattr__``. Each ``forward*`` method of a ``sglang.srt.models`` class that does is
compiled again from its source with those reads made ``self._modules[...]`` reads
(:mod:`sglang_rvv.recompile`; ``children`` in the report), where its source is its code.

Qwen3's attention norms each head of q and k through ``apply_qk_norm`` (sglang/srt/models/utils.py,
checked against sglang 0.5.21), which on a CPU without SGLang's own kernel copies q and k to rows
of head_dim, calls each norm module and views the results back. The same recompiled methods call
:func:`_qk_norm` in its place (``qk_norm`` in the report): one native call that norms the heads in
place, as SGLang's CPU kernel does, where both norms are plain RMSNorms given the kernels;
SGLang's function otherwise.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections import Counter

import torch

from .. import fused, recompile

_NORM = "sglang.srt.layers.layernorm.RMSNorm"
_SILU = "sglang.srt.layers.activation.SiluAndMul"
_ROTARY = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding"
_RADIX = "sglang.srt.layers.radix_attention.RadixAttention"
_MODELS = "sglang.srt.models."
_QK_NORM = "apply_qk_norm"
_QK_NORM_PARAMS = ("q", "k", "q_norm", "k_norm", "head_dim", "alt_stream", "allow_inplace")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def _plain_norm(norm) -> bool:
    """Whether an RMSNorm given :func:`_norm_forward` is the plain one: its variance over the whole
    row, its residual and output in the input's dtype."""
    return (getattr(norm, "variance_size_override", None) is None and not getattr(norm, "fp32_residual", False)
            and getattr(norm, "override_orig_dtype", None) is None)


def _norm_forward(self, x, residual=None, post_residual_addition=None, quant_linear=None):
    if post_residual_addition is None and quant_linear is None and _plain_norm(self):
        weight = fused.module_tensor(self, "weight")
        if residual is None:
            if fused.servable(x, weight):
                return fused.rms_norm(x, weight, self.variance_epsilon)
        elif fused.NATIVE.try_fused_add_rmsnorm(x, residual, weight, self.variance_epsilon):
            return x, residual
    return self.forward_cpu(x, residual, post_residual_addition, quant_linear)


def _given_norm(norm) -> bool:
    """Whether ``norm`` is SGLang's RMSNorm, given :func:`_norm_forward`, and plain."""
    forward = norm.__dict__.get("_forward_method")
    return getattr(forward, "__func__", None) is _norm_forward and _plain_norm(norm)


def _qk_norm(q, k, q_norm, k_norm, head_dim, alt_stream=None, allow_inplace=True):
    # SGLang's apply_qk_norm (sglang/srt/models/utils.py, checked against 0.5.21) on the CPU copies
    # q and k (strided splits of the qkv row) to rows of head_dim, norms them through each norm
    # module and views them back: 6 torch ops and 2 module calls a layer. In place, as SGLang's
    # own CPU kernel does it where it has one.
    if allow_inplace and _given_norm(q_norm) and _given_norm(k_norm):
        q_weight, k_weight = fused.module_tensor(q_norm, "weight"), fused.module_tensor(k_norm, "weight")
        if q_weight.shape[0] == head_dim and fused.NATIVE.try_qk_rmsnorm(q, k, q_weight, k_weight,
                                                                         q_norm.variance_epsilon,
                                                                         k_norm.variance_epsilon):
            return q, k
    from sglang.srt.models import utils

    return utils.apply_qk_norm(q, k, q_norm, k_norm, head_dim, alt_stream, allow_inplace)


def _qk_norm_names(function: types.FunctionType) -> dict[str, object]:
    """``{"apply_qk_norm": _qk_norm}`` where ``function`` calls SGLang's apply_qk_norm of the
    signature :func:`_qk_norm` was checked against; ``{}`` otherwise."""
    if _QK_NORM not in function.__code__.co_names:
        return {}
    from sglang.srt.models import utils

    original = function.__globals__.get(_QK_NORM)
    if original is not utils.apply_qk_norm or tuple(inspect.signature(original).parameters) != _QK_NORM_PARAMS:
        return {}
    return {_QK_NORM: _qk_norm}


def _silu_forward(self, x):
    if fused.servable(x) and x.shape[-1] % 2 == 0:
        return fused.silu_and_mul(x)
    return self.forward_cpu(x)


def _rotary_forward(self, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
    # One native call: the cache rows' gather (flatten, index_select, unsqueeze), four views and two
    # slices around the kernel were 9 more torch ops a layer, thousands of instructions each in
    # Debian's torch.
    cache = fused.module_tensor(self, "cos_sin_cache")
    if fused_set_kv_buffer_arg is None and self.is_neox_style and self.rotary_dim == self.head_size:
        rotated = fused.NATIVE.try_rotary_neox_at(positions if offsets is None else positions + offsets, query, key,
                                                  cache)
        if rotated:
            return tuple(rotated)
    return self.forward_cpu(positions, query, key, offsets, fused_set_kv_buffer_arg)


def _own_rotary(cls: type) -> bool:
    """Whether ``cls`` is RotaryEmbedding, or a subclass that keeps its forward_cpu and forward_native."""
    for base in cls.__mro__:
        if _qualname(base) == _ROTARY:
            return base.forward_cpu is cls.forward_cpu and base.forward_native is cls.forward_native
    return False


def _hook(cls: type, name: str, make) -> bool:
    """Give ``cls.<name>`` what ``make`` makes of it, once per process (the hooked function keeps the
    original as ``sglang_rvv_original``); whether the class holds it. ``make`` returns None for code
    it does not cover (not the SGLang it was checked against): the class then keeps its own."""
    current = getattr(cls, name)
    if hasattr(current, "sglang_rvv_original"):
        return True
    hooked = make(current)
    if hooked is None:
        return False
    hooked.sglang_rvv_original = current
    setattr(cls, name, hooked)
    return True



def _widening_copy(original):
    def run(self, logits, logits_metadata, use_buffer=True):
        if fused.widen_servable(logits):
            logits = fused.widen(logits[..., :self.vocab_size])
        return original(self, logits, logits_metadata, use_buffer)
    return run





def _give_top1() -> bool:
    from sglang.srt.layers.sampler import Sampler

    return _hook(Sampler, "forward", fused.sampler_with_top1)


def _give_widen() -> bool:
    from sglang.srt.layers.logits_processor import LogitsProcessor

    return _hook(LogitsProcessor, "_copy_logits_to_buffer", _widening_copy)



def _forwards(cls: type) -> list[str]:
    """The ``forward*`` methods that SGLang's model code (``sglang.srt.models``) defines for ``cls``."""
    return sorted({name for base in cls.__mro__ if base.__module__.startswith(_MODELS)
                   for name, value in vars(base).items()
                   if name.startswith("forward") and isinstance(value, types.FunctionType)})


@functools.cache
def _model_code(cls: type, name: str, children: frozenset[str]) -> tuple[types.FunctionType | None, bool, bool]:
    """``cls.<name>`` compiled again with its children read from ``_modules``
    (:class:`..recompile.ChildModules`) and its apply_qk_norm :func:`_qk_norm`; None where it does
    neither or its source is not its code. Then whether it reads children, and calls _qk_norm."""
    function = getattr(cls, name)
    reads, names = recompile.ChildModules(children), _qk_norm_names(function)
    changed = recompile.recompiled(function, [reads], names)
    if changed is None or not (reads.count or names):
        return None, False, False
    return changed, bool(reads.count), bool(names)


def _give_model_code(module: torch.nn.Module) -> tuple[bool, bool]:
    """Give a module of SGLang's model code its ``forward*`` methods with their children read from
    ``_modules`` (a decoder layer, attention and MLP read 13 children a Qwen3 layer a step, each
    through ``nn.Module.__getattr__``, about 40 bytecodes) and the QK norm in one call. Whether any
    method reads children so, and whether any calls :func:`_qk_norm`."""
    cls, children = type(module), recompile.child_names(module)
    reads = qk_norm = False
    for name in _forwards(cls) if children else ():
        changed, its_reads, its_qk_norm = _model_code(cls, name, children)
        if changed is not None:
            fused.give_forward(module, changed, attr=name)
            reads, qk_norm = reads or its_reads, qk_norm or its_qk_norm
    return reads, qk_norm


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
        elif name.startswith(_MODELS):
            for kind, given_it in zip(("children", "qk_norm"), _give_model_code(module), strict=True):
                if given_it:
                    given[kind] += 1
    if given["attention"]:
        if _give_top1():
            given["top1"] += 1
        if _give_widen():
            given["widen"] += 1
    return given
