"""The rest of a decode step on the RVV kernel library: RMSNorm (the residual add fused in), SiLU x
mul, the rotary embedding, the decode attention, transformers' residual adds, the logits' top-1
(greedy sampling) and their widening to FP32 (SGLang's sampler takes FP32), each one native call
in place of the scalar torch ops it replaces.

Debian's riscv64 torch runs every op outside the projections scalar, and on the board's in-order
core each op's dispatch costs tens of thousands of instructions: a Qwen3-0.6B decode step runs
113 RMSNorms of ~8 ops each, 28 rotary embeddings of ~16, and 28 attentions whose scalar sdpa
costs ~470 k instructions each; the argmax over Qwen3's 151,936 logits 1.4-2.4 M, and their
``.float()`` about 2.3 M (a memcpy call per 16 values), and transformers' two residual adds a
decoder layer about 46 k each (a scalar BF16 add). The kernels (``kernels/csrc/rmsnorm_*``,
``silu_mul_*``, ``rotary_*``, ``attention_*``, ``add_*``, ``top1_*``, ``widen_*``) run where
the chosen provider is ``rvv`` and the loaded library has them; :func:`available` says why not
otherwise, and ``SGLANG_RVV_FUSED_OPS=0`` turns them off for A/B runs. A library built before them
falls back to torch's ops with one warning line.

A call the kernels do not cover (not bfloat16, not on the CPU, not contiguous, autograd, a weight
of another size, a rotary of part of the head, an attention with a mask or of more than one
query) runs the module's own torch code, so a shape never gets a wrong result. What they compute
differs from torch's ops only in rounding: one rounding to BF16 of FP32 arithmetic (kernels.h),
where transformers' RMSNorm and rotary round two or three times.

:func:`install` puts the kernels into a model's modules, through the hooks its adapter names
(:attr:`adapters.Adapter.fused_modules`); :func:`install_hf` is transformers' hook, and
:mod:`sglang_rvv.srt.fused` SGLang's.
"""

from __future__ import annotations

import functools
import logging
import os
import types
from collections import Counter
from collections.abc import Callable

import torch

from . import hf_cache, hf_step, recompile
from .direct_call import direct_class
from .kernels import chosen
from .kernels.rvv import native_entry, native_op

ENV_VAR = "SGLANG_RVV_FUSED_OPS"
NATIVE_OPS = ("rmsnorm", "fused_add_rmsnorm", "qk_rmsnorm", "silu_mul", "silu_and_mul", "rotary_neox", "rotary_neox_at",
              "decode_attention", "decode_attention_paged", "residual_add", "top1", "widen", "store_kv",
              "append_rows", "attention_step", "try_fused_add_rmsnorm", "try_qk_rmsnorm", "try_rotary_neox_at",
              "try_decode_attention_paged", "try_store_kv")
# In a module's __dict__: (the attribute given a fused forward, what that attribute held before).
MARK_ATTR = "_sglang_rvv_fused"
log = logging.getLogger("sglang_rvv")

# transformers' classes of the supported architectures (archs.SUPPORTED) whose forward is the
# plain RMSNorm (weight * normalized, eps in variance_epsilon), the SiLU-gated MLP, or the
# attention that calls its module's apply_rotary_pos_emb (neox style: rotate_half) and attention
# interface.
HF_NORMS = frozenset(("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"))
HF_MLPS = frozenset(("LlamaMLP", "Qwen2MLP", "Qwen3MLP"))
HF_ATTENTIONS = frozenset(("LlamaAttention", "Qwen2Attention", "Qwen3Attention"))
# ... and whose decoder layers add ``residual + hidden_states`` twice.
HF_DECODER_LAYERS = frozenset(("LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"))
_HF_RESIDUAL_ADD = ("residual", "hidden_states")  # the operands' names, in transformers' order
_HF_CACHE_UPDATE = ("past_key_values", "update")  # the attention's call that updates its cache layer
_HF_ROTARY = "apply_rotary_pos_emb"
_HF_INTERFACES = "ALL_ATTENTION_FUNCTIONS"


@functools.cache
def available() -> tuple[bool, str]:
    """``(True, what runs)`` if the fused kernels serve this process, else ``(False, why not)``."""
    if os.environ.get(ENV_VAR, "1") == "0":
        return False, f"turned off by {ENV_VAR}=0"
    provider, _ = chosen()
    if provider.NAME != "rvv":
        return False, f"provider {provider.NAME}: the fused kernels are the rvv kernel library's"
    missing = [op for op in NATIVE_OPS if not hasattr(torch.ops.sglang_rvv_native, op)]
    if missing:
        why = (f"the kernel library has no sglang_rvv_native::{', '.join(missing)} (built before them); "
               "RMSNorm, SiLU x mul, the rotary embedding, attention, the residual add, the top-1, the logits' "
               "widening and the KV caches' store and append run torch's ops: rebuild it with "
               "images/scripts/build-kernels.sh")
        log.warning("sglang_rvv: %s", why)
        return False, why
    return True, f"{', '.join(NATIVE_OPS)} from the rvv kernel library ({provider.NAME})"


class _NativeOps:
    """The kernel library's ops by name, each its overload's own callable (torch/_ops.py's
    ``OpOverload._op``): ``torch.ops.sglang_rvv_native.<op>(...)`` first runs the packet's
    ``__call__``, a Python frame, on every one of a decode step's few hundred calls. Resolved on
    first use, as the library loads after this module.

    The ``try_`` ops (SGLang's hooks' calls: fused_add_rmsnorm, qk_rmsnorm, rotary_neox_at,
    decode_attention_paged and store_kv) run their op where its checks pass and the tensors are on
    the CPU outside autograd, and refuse the call otherwise (False, or [] for the rotary) with
    nothing written: the questions a Python check asked first, in C++ (register.cpp)."""

    def __getattr__(self, name: str) -> Callable:
        op = native_op(name)
        setattr(self, name, op)  # the next reads find it in the instance's dict
        return op


NATIVE = _NativeOps()


def module_tensor(module: torch.nn.Module, name: str) -> torch.Tensor | None:
    """``module.<name>`` for a parameter or buffer, read from the module's own dicts: the attribute
    read goes through ``nn.Module.__getattr__``, a Python call, on every norm of every step."""
    tensor = module._parameters.get(name)
    if tensor is None:
        tensor = module._buffers.get(name)
    return tensor if tensor is not None else getattr(module, name)


def servable(x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
    """Whether the kernels may take ``x`` (and a norm's ``weight``): bfloat16, on the CPU,
    contiguous, outside autograd, a 1-D weight as long as ``x``'s last dim."""
    if not (x.dtype is torch.bfloat16 and x.is_cpu and x.dim() >= 1 and x.is_contiguous()):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        return False
    return weight is None or (weight.dtype is torch.bfloat16 and weight.dim() == 1 and weight.is_contiguous()
                              and weight.shape[0] == x.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return NATIVE.rmsnorm(x, weight, eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return NATIVE.silu_mul(gate, up)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """:func:`silu_mul` of the two halves of ``x``'s rows (gate, then up), SGLang's layout: the
    same bits, without slicing them first."""
    return NATIVE.silu_and_mul(x)


def rotary_servable(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether :func:`rotary` may take these: bfloat16 on the CPU outside autograd, q and k
    [batch, heads, seq, d] with contiguous last dims, cos and sin [batch or 1, seq, >= d/2] alike.
    (Every attention of every step asks: each shape and stride is read once.)"""
    bf16 = torch.bfloat16
    if not (q.dtype is bf16 and k.dtype is bf16 and cos.dtype is bf16 and sin.dtype is bf16 and q.is_cpu):
        return False
    qs, ks, cs = q.shape, k.shape, cos.shape
    if len(qs) != 4 or len(ks) != 4 or len(cs) != 3:
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return False
    batch, _, seq, d = qs
    table_stride = cos.stride()
    return (d % 2 == 0 and ks[0] == batch and ks[2] == seq and ks[3] == d and cs[0] in (1, batch)
            and cs[1] == seq and 2 * cs[2] >= d and sin.shape == cs and sin.stride() == table_stride
            and table_stride[2] == 1 and q.stride(3) == 1 and k.stride(3) == 1)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated neox style by the first half of cos and sin (kernels.h's formula)."""
    return NATIVE.rotary_neox(q, k, cos, sin)


def attention_servable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`decode_attention` may take these: bfloat16 on the CPU outside autograd, one
    query [batch, q_heads, 1, d], k and v [batch, kv_heads, keys >= 1, d] alike, q_heads a multiple
    of kv_heads, contiguous last dims."""
    bf16 = torch.bfloat16
    if not (q.dtype is bf16 and k.dtype is bf16 and v.dtype is bf16 and q.is_cpu):
        return False
    qs, ks = q.shape, k.shape
    if len(qs) != 4 or len(ks) != 4 or qs[2] != 1 or v.shape != ks:
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    return (ks[0] == qs[0] and ks[3] == qs[3] and ks[1] > 0 and qs[1] % ks[1] == 0 and ks[2] > 0
            and q.stride(3) == 1 and k.stride(3) == 1 and v.stride(3) == 1)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T * scale) v for one query per head ([batch, 1, q_heads, d]: kernels.h's order)."""
    return NATIVE.decode_attention(q, k, v, scale)


def residual_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a + b`` of BF16 tensors of one shape, the same bits as torch's BF16 add, contiguous."""
    return NATIVE.residual_add(a, b)


def top1_servable(logits: torch.Tensor) -> bool:
    """Whether :func:`top1` may take ``logits``: bfloat16 or float32 on the CPU outside autograd,
    a non-empty contiguous last dim (the op checks that the rows are evenly spaced)."""
    return (logits.dtype in (torch.float32, torch.bfloat16) and logits.is_cpu and logits.dim() >= 1
            and logits.shape[-1] > 0 and logits.stride(-1) == 1
            and not (logits.requires_grad and torch.is_grad_enabled()))


def top1(logits: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(logits, -1)``, the same indices (the first NaN, else the first maximum)."""
    return NATIVE.top1(logits)


def argmax(input: torch.Tensor, dim: int | None = None, keepdim: bool = False, **kwargs) -> torch.Tensor:
    """``torch.argmax``, by :func:`top1` where that covers the call (the last dim, no ``out``)."""
    last = dim is not None and dim in (-1, input.dim() - 1)
    if last and not keepdim and not kwargs and top1_servable(input):
        return top1(input)
    return torch.argmax(input, dim, keepdim, **kwargs)


def widen_servable(logits: torch.Tensor) -> bool:
    """Whether :func:`widen` may take ``logits``: bfloat16 on the CPU outside autograd, a contiguous
    last dim (the op checks that the rows are evenly spaced)."""
    return (logits.dtype is torch.bfloat16 and logits.is_cpu and logits.dim() >= 1 and logits.stride(-1) == 1
            and not (logits.requires_grad and torch.is_grad_enabled()))


def widen(logits: torch.Tensor) -> torch.Tensor:
    """``logits.float()`` (the same bits), contiguous."""
    return NATIVE.widen(logits)


class _TorchWithTop1:
    """torch, as a sampler's code given :func:`rebound` sees it: its argmax is :func:`argmax`,
    every other name torch's."""

    argmax = staticmethod(argmax)

    def __getattr__(self, name: str):
        return getattr(torch, name)


TORCH_WITH_TOP1 = _TorchWithTop1()


def sampler_with_top1(function: Callable) -> Callable | None:
    """``function`` (a greedy sampler that calls ``torch.argmax``) calling :func:`argmax` instead;
    None for one that does not (not the code this was checked against)."""
    code = getattr(function, "__code__", None)
    if code is None or "torch" not in code.co_names or "argmax" not in code.co_names:
        return None
    return rebound(function, {"torch": TORCH_WITH_TOP1})


def rebound(function: Callable, names: dict[str, object]) -> Callable:
    """``function``'s code over a copy of its module's globals with ``names`` rebound: it then
    calls the kernels where it looked up those names, and every other user of the module keeps
    what the module holds."""
    copy = types.FunctionType(function.__code__, {**function.__globals__, **names}, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__
    return copy


_ABSENT = object()


def give_forward(module: torch.nn.Module, forward: Callable, attr: str = "forward") -> None:
    """Make ``forward`` (a function of the module) the callable the module's ``attr`` holds:
    transformers calls ``forward``, SGLang's fused ops their ``_forward_method`` (from their
    class's forward). A module may be given several (an attention's forward and the method it
    calls). The module also skips ``nn.Module.__call__`` where that would only call forward
    (:mod:`.direct_call`)."""
    cls, previous = module.__dict__.get(MARK_ATTR, (type(module), {}))
    previous.setdefault(attr, module.__dict__.get(attr, _ABSENT))
    setattr(module, attr, types.MethodType(forward, module))
    module.__class__ = direct_class(cls)
    module.__dict__[MARK_ATTR] = (cls, previous)


def take_back(module: torch.nn.Module) -> bool:
    """Give a module what it held before :func:`give_forward`; whether it had a fused forward."""
    mark = module.__dict__.pop(MARK_ATTR, None)
    if mark is None:
        return False
    module.__class__, previous = mark
    for attr, held in previous.items():
        if held is _ABSENT:
            module.__dict__.pop(attr, None)
        else:
            module.__dict__[attr] = held
    return True


def install(model: torch.nn.Module, hook: Callable[[torch.nn.Module], Counter] | None,
            enabled: bool) -> tuple[dict[str, int], str]:
    """Give ``model``'s modules the fused kernels through ``hook`` (the adapter's), or take them
    back (``enabled`` false, or the kernels unavailable); safe to call again. Returns the number
    of modules per kind of kernel, and why none when none."""
    for module in model.modules():
        take_back(module)
    if not enabled:
        return {}, "off in the policy's config (fused_ops=False)"
    if hook is None:
        return {}, "the model's adapter names no modules for the fused kernels"
    ok, why = available()
    if not ok:
        return {}, why
    given = hook(model)
    return dict(sorted(given.items())), why


# -- transformers -----------------------------------------------------------------------------------

# transformers' forwards below call the ops' own callables (NATIVE), not the wrappers above: a
# Python frame less for each of a Qwen3-0.6B step's 113 norms, 28 MLPs and 28 rotaries.
def _hf_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    weight = self._parameters.get("weight")
    if weight is None:
        weight = module_tensor(self, "weight")
    if weight is not None and servable(hidden_states, weight):
        return NATIVE.rmsnorm(hidden_states, weight, self.variance_epsilon)
    return type(self).forward(self, hidden_states)


def _hf_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    modules = self._modules  # not Module.__getattr__, a Python frame a child (recompile.ChildModules)
    gate, up = modules["gate_proj"](x), modules["up_proj"](x)
    if servable(gate) and servable(up) and gate.shape == up.shape:
        return modules["down_proj"](NATIVE.silu_mul(gate, up))
    hidden = modules["act_fn"](gate) * up
    return modules["down_proj"](hidden)


def _hf_residual_add(residual: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    """A decoder layer's ``residual + hidden_states``: by the kernel where it covers the call (BF16
    of one shape, no broadcast), else by torch."""
    # servable()'s checks inline for both (it runs twice a layer a step): one shape of one dim or more.
    bf16 = torch.bfloat16
    if (residual.dtype is bf16 and hidden_states.dtype is bf16 and residual.shape == hidden_states.shape
            and residual.dim() and residual.is_cpu and hidden_states.is_cpu and residual.is_contiguous()
            and hidden_states.is_contiguous()
            and not (torch.is_grad_enabled() and (residual.requires_grad or hidden_states.requires_grad))):
        return residual_add(residual, hidden_states)
    return residual + hidden_states


def _is_silu(act: object) -> bool:
    return isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _hf_rotary(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        # The whole head (cos as long as q's head: transformers' partial rotaries would not broadcast).
        if unsqueeze_dim == 1 and cos.shape[-1] == q.shape[-1] and rotary_servable(q, k, cos, sin):
            return NATIVE.rotary_neox(q, k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim)
    return apply_rotary_pos_emb


@functools.cache  # one wrapper per interface, shared by every attention module
def _hf_decode_attention(original: Callable) -> Callable:
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        # A decode step with no mask attends to every key: what the kernel computes. A mask,
        # dropout, a sliding window, a softcap or asked-for weights go to transformers' own.
        if (attention_mask is None and not dropout and kwargs.get("sliding_window") is None
                and kwargs.get("softcap") is None and not kwargs.get("output_attentions")
                and attention_servable(query, key, value)):
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            return decode_attention(query, key, value, scale), None
        return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)
    return attention


class _HfInterfaces:
    """transformers' attention registry as the policy's copy of an attention forward sees it: the
    decode kernel in front of the plain interfaces (sdpa, eager), every other one as registered."""

    def __init__(self, registry):
        self._registry = registry

    def get_interface(self, name, default):
        original = self._registry.get_interface(name, default)
        return _hf_decode_attention(original) if name in hf_step.PLAIN_ATTENTION else original


@functools.cache
def _hf_attention_forward(cls: type, children: frozenset[str]) -> tuple[Callable | None, tuple[str, ...]]:
    """``cls.forward`` calling the kernels where it calls its module's apply_rotary_pos_emb and
    attention interface, and which kinds it got: the same code, over a copy of the module's globals
    with those names rebound. transformers looks them up at every call, and rebinding them in its
    module would reach every model in the process; a copy given to the policy's modules
    (:func:`give_forward`) reaches only them. Where its source can be compiled again
    (:mod:`.recompile`), its children are also read from ``_modules`` and its cache update goes
    through :func:`_hf_cache_update` (``kv_cache``). ``(None, ())`` where the forward uses neither
    name."""
    forward = cls.forward
    code, scope = getattr(forward, "__code__", None), getattr(forward, "__globals__", {})
    if code is None:
        return None, ()
    rebinds, kinds = {}, []
    if _HF_ROTARY in code.co_names and callable(scope.get(_HF_ROTARY)):
        rebinds[_HF_ROTARY] = _hf_rotary(scope[_HF_ROTARY])
        kinds.append("rotary")
    if _HF_INTERFACES in code.co_names and hasattr(scope.get(_HF_INTERFACES), "get_interface"):
        rebinds[_HF_INTERFACES] = _HfInterfaces(scope[_HF_INTERFACES])
        kinds.append("attention")
    if not rebinds:
        return None, ()
    update = recompile.Calls("_sglang_rvv_cache_update", method=_HF_CACHE_UPDATE)
    changed = recompile.recompiled(forward, [recompile.ChildModules(children), update],
                                   {**rebinds, "_sglang_rvv_cache_update": _hf_cache_update})
    if changed is None:
        return rebound(forward, rebinds), tuple(kinds)
    return changed, (*kinds, "kv_cache") if update.count else tuple(kinds)


@functools.cache
def _hf_layer_forward(cls: type, children: frozenset[str]) -> Callable | None:
    """``cls.forward`` with each ``residual + hidden_states`` a call to :func:`_hf_residual_add`
    and its children read from ``_modules`` (:mod:`.recompile`): transformers' own code, compiled
    again from its source. None where that cannot be done or there is no such addition."""
    adds = recompile.Calls("_sglang_rvv_residual_add", add=_HF_RESIDUAL_ADD)
    layer = recompile.recompiled(cls.forward, [adds, recompile.ChildModules(children)],
                                 {"_sglang_rvv_residual_add": _hf_residual_add})
    return layer if adds.count else None


def _hf_cache_update(cache, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
    """An attention's ``past_key_values.update(...)``, first making the layer it updates a growing one
    (:mod:`.hf_cache`): its decode steps then append their keys and values in place."""
    hf_cache.grow(cache, layer_idx)
    return cache.update(key_states, value_states, layer_idx, *args, **kwargs)


@functools.cache
def _hf_sampling_class(cls: type) -> type | None:
    """``cls`` (direct-called, :func:`direct_class`) with its ``_sample`` calling the top-1 kernel;
    None where its ``_sample`` calls no ``torch.argmax``."""
    sample = sampler_with_top1(getattr(cls, "_sample", None))
    if sample is None:
        return None
    return type(cls.__name__, (direct_class(cls),), {"_sample": sample, "__module__": cls.__module__,
                                                     "__qualname__": cls.__qualname__})


def install_hf(model: torch.nn.Module) -> Counter:
    """transformers' hook: its RMSNorm, SiLU-gated MLP and attention modules (rotary embedding and
    decode attention, and a KV cache layer that grows in place: ``kv_cache``) and decoder layers
    (their residual adds, and their decode steps in one frame: ``layer_step``, :mod:`.hf_step`) of
    the supported architectures, and the model's greedy sampling
    (``GenerationMixin._sample``'s ``torch.argmax``, checked against transformers 5.12) as the top-1."""
    given: Counter = Counter()
    # The decoder layers' step through the native entry beside the library, where it has one.
    decode_layer = getattr(native_entry(), "decode_layer", None)
    sampling = _hf_sampling_class(type(model))
    if sampling is not None:
        # generate() looks _sample up on the model's class, not on the model: the model becomes an
        # instance of a subclass holding the rebound copy, as a fused forward's module does.
        model.__dict__[MARK_ATTR] = (type(model), {})
        model.__class__ = sampling
        given["top1"] += 1
    for module in model.modules():
        name = type(module).__name__
        if type(module) is torch.nn.ModuleList and len(module) and all(
                type(layer).__name__ in HF_DECODER_LAYERS for layer in module):
            # The model's forward slices it at every step: the slice it built last, while it holds.
            module.__dict__[MARK_ATTR] = (type(module), {})
            module.__class__ = hf_step.LayerList
            given["layer_list"] += 1
        elif (name in HF_ATTENTIONS
                and (attention := _hf_attention_forward(type(module), recompile.child_names(module)))[0] is not None):
            give_forward(module, attention[0])
            given.update(attention[1])
        elif name in HF_NORMS and hasattr(module, "variance_epsilon"):
            give_forward(module, _hf_norm_forward)
            given["rmsnorm"] += 1
        elif name in HF_MLPS and _is_silu(getattr(module, "act_fn", None)):
            give_forward(module, _hf_mlp_forward)
            given["silu_mul"] += 1
        elif (name in HF_DECODER_LAYERS
              and (layer := _hf_layer_forward(type(module), recompile.child_names(module))) is not None):
            # Its decode steps in one frame where every module under it took the kernels (hf_step).
            give_forward(module, hf_step.bound(layer, MARK_ATTR, decode_layer))
            given["residual_add"] += 1
            given["layer_step"] += 1
    return given
