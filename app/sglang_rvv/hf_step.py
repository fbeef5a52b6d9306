"""A transformers decoder layer's decode step in one Python frame.

With the fused kernels a Qwen3-0.6B decode step is still about 18 M instructions outside the kernel
library under emulation, 11 M of them the interpreter's: per layer about 140 Python-level calls
(the layer's, the attention's, the norms' and the MLP's forwards, the kernels' checks, the cache
update) and a dozen torch views between the kernels. A step whose every module would take the
fused kernels anyway (:mod:`.fused`) runs here as the same kernels in the same order, so the same
bits: the input norm, the q/k/v projections (their own calls: route, memo, source check), one
``attention_step`` (the QK norm, the rotary embedding, the append to the cache and the decode
attention), the o projection, the residual add, the post-attention norm, the gate and up
projections, SiLU x mul, the down projection and the second residual add.

Anything else runs the layer's own forward (transformers' code, with the fused kernels wherever they
cover it): a prefill or any step of more than one token, a mask, training, grad, hooks on a module
whose forward this skips, a module the policy did not give a fused forward, a norm weight the norm
kernel would not take, an attention implementation other than sdpa or eager, a sliding window, a
cache that is not a plain growing one with room for the row (:mod:`.hf_cache`), an argument this
does not know.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.nn.modules import module as _nn_module

from . import hf_cache
from .kernels.rvv import native_op

# The layer's keyword arguments this step knows (transformers 5.12's decoder layers and what
# generate passes them); any other one goes to the layer's own forward.
KNOWN_ARGS = frozenset(("attention_mask", "position_ids", "past_key_values", "use_cache", "position_embeddings",
                        "cache_position"))
# The attention interfaces whose decode step is plain softmax attention over every key when no mask
# is passed: the decode kernel may stand in for them (here, and in fused's attention interfaces).
PLAIN_ATTENTION = frozenset(("sdpa", "eager"))
_BF16 = torch.bfloat16
_config_attribute = object.__getattribute__


def layer_forward(layer_forward_of_class: Callable, mark: str, decode_layer: Callable | None) -> Callable:
    """A decoder layer's forward that takes the one-frame step where it can (the module's docstring)
    and otherwise calls ``layer_forward_of_class`` (the layer's forward with the fused kernels);
    ``mark`` is the attribute :func:`fused.give_forward` leaves in a module it gave a forward. The
    step is ``decode_layer`` (the native entry's, ``csrc/entry/layer_step.cpp``: the ops without
    torch.ops' argument parsing) or, without it, :func:`decode_layer_ops`: the same calls."""
    run = decode_layer if decode_layer is not None else decode_layer_ops

    def forward(self, hidden_states, *args, **kwargs):
        step = None if args else _step(self, hidden_states, kwargs, mark)
        if step is None:
            return layer_forward_of_class(self, hidden_states, *args, **kwargs)
        operands, cache_layer = step
        done = run(*operands)
        if done is None:  # a module by itself would not take its kernel here
            return layer_forward_of_class(self, hidden_states, *args, **kwargs)
        hf_cache.stepped(cache_layer, operands[16], done[1], operands[17], done[2])
        return done[0]

    return forward


def decode_layer_ops(x, in_weight, in_eps, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, q_weight,
                     k_weight, q_eps, k_eps, cos, sin, key_buffer, value_buffer, length, scale, post_weight, post_eps):
    """The native entry's ``decode_layer`` as torch.ops calls, in its order: (the layer's output, the
    cache's keys and values, each the first ``length + 1`` rows of its buffer), or None, with
    nothing run, where :func:`operands_covered` says no."""
    if not operands_covered(x, in_weight, post_weight, q_weight, k_weight, cos, sin, key_buffer):
        return None
    h = native_op("rmsnorm")(x, in_weight, in_eps)
    attended, keys, values = native_op("attention_step")(q_proj(h), k_proj(h), v_proj(h), q_weight, k_weight, q_eps,
                                                         k_eps, cos, sin, key_buffer, value_buffer, length, scale)
    hidden = native_op("residual_add")(x, o_proj(attended))
    h = native_op("rmsnorm")(hidden, post_weight, post_eps)
    return native_op("residual_add")(hidden, down_proj(native_op("silu_mul")(gate_proj(h), up_proj(h)))), keys, values


def _norm_weight_ok(weight: torch.Tensor | None, size: int) -> bool:
    return (weight is not None and weight.dtype is _BF16 and weight.dim() == 1 and weight.shape[0] == size
            and weight.is_contiguous())


def operands_covered(x, in_weight, post_weight, q_weight, k_weight, cos, sin, key_buffer) -> bool:
    """Whether each module called by itself would take its kernel on these (fused.servable and
    rotary_servable's terms), so the step gives their bits: no grad, a contiguous bfloat16 input of
    one token on the CPU, bfloat16 norm weights the kernel takes, a rotary table of the whole head.
    (layer_step.cpp's ``covered`` asks the same.)"""
    if (torch.is_grad_enabled() or x.dtype is not _BF16 or x.dim() != 3 or x.shape[1] != 1 or not x.is_cpu
            or not x.is_contiguous() or key_buffer.dim() != 4):
        return False
    hidden, d = x.shape[2], key_buffer.shape[3]
    if (not _norm_weight_ok(in_weight, hidden) or not _norm_weight_ok(post_weight, hidden)
            or (q_weight is None) != (k_weight is None)
            or (q_weight is not None and not (_norm_weight_ok(q_weight, d) and _norm_weight_ok(k_weight, d)))):
        return False
    return (cos.dtype is _BF16 and sin.dtype is _BF16 and cos.dim() == 3 and cos.shape[1] == 1 and cos.shape[2] == d
            and cos.shape[0] in (1, x.shape[0]) and sin.shape == cos.shape and sin.stride() == cos.stride()
            and cos.stride(2) == 1)


def _step(layer, hidden_states, kwargs, mark):
    """The step's operands (decode_layer's, in its order) and the cache layer it appends to, or None
    where the layer's own forward must run; the operands' tensors are the step's own question
    (:func:`operands_covered`)."""
    if not (kwargs.keys() <= KNOWN_ARGS and kwargs.get("attention_mask") is None and not layer.training
            and not (_nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks
                     or _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks)):
        return None
    children = layer._modules
    attn, mlp = children.get("self_attn"), children.get("mlp")
    in_norm, post_norm = children.get("input_layernorm"), children.get("post_attention_layernorm")
    if attn is None or mlp is None or in_norm is None or post_norm is None:
        return None
    parts = attn._modules
    q_norm, k_norm = parts.get("q_norm"), parts.get("k_norm")
    if (q_norm is None) != (k_norm is None) or attn.training or attn.__dict__.get("sliding_window") is not None:
        return None
    # The config's attention implementation as its property reads it, without PretrainedConfig's
    # Python __getattribute__ and the property's frame (three calls a layer); a transformers that
    # keeps it elsewhere reads None here and takes the layer's own forward.
    if _config_attribute(attn.config, "__dict__").get("_attn_implementation_internal") not in PLAIN_ATTENTION:
        return None
    # The modules whose work this runs without calling them: each must hold the policy's fused
    # forward (``mark``) and have no hook and no module.compile().
    for module in (attn, mlp, in_norm, post_norm, q_norm, k_norm):
        if module is None:  # no QK norm (Llama, Qwen2)
            break
        if (mark not in module.__dict__ or module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks or module._backward_pre_hooks or module._compiled_call_impl is not None):
            return None
    cos, sin = kwargs.get("position_embeddings") or (None, None)
    cache = kwargs.get("past_key_values")
    if cos is None or cache is None:
        return None
    found = hf_cache.step_buffers(cache, attn.layer_idx, hidden_states.shape[0], attn.head_dim)
    if found is None:
        return None
    cache_layer, key_buffer, value_buffer, length = found
    projections = mlp._modules
    in_weight, post_weight = in_norm._parameters.get("weight"), post_norm._parameters.get("weight")
    q_weight, q_eps = (None, 0.0) if q_norm is None else (q_norm._parameters.get("weight"), q_norm.variance_epsilon)
    k_weight, k_eps = (None, 0.0) if k_norm is None else (k_norm._parameters.get("weight"), k_norm.variance_epsilon)
    if in_weight is None or post_weight is None or (q_norm is not None and (q_weight is None or k_weight is None)):
        return None  # a norm whose weight is not a parameter: its own forward
    return (hidden_states, in_weight, in_norm.variance_epsilon, parts["q_proj"], parts["k_proj"], parts["v_proj"],
            parts["o_proj"], projections["gate_proj"], projections["up_proj"], projections["down_proj"], q_weight,
            k_weight, q_eps, k_eps, cos, sin, key_buffer, value_buffer, length, attn.scaling, post_weight,
            post_norm.variance_epsilon), cache_layer


@functools.cache
def bound(layer_forward_of_class: Callable, mark: str, decode_layer: Callable | None) -> Callable:
    """:func:`layer_forward`, one per class's forward and step."""
    return layer_forward(layer_forward_of_class, mark, decode_layer)


class LayerList(torch.nn.ModuleList):
    """transformers' decoder layer list, whose model forward slices it at every step
    (``self.layers[: self.config.num_hidden_layers]``): ``ModuleList`` builds a new list for a
    slice, a ``Module.__init__`` and an ``add_module`` per layer whose ``hasattr`` raises
    AttributeError through ``Module.__getattr__`` (about 3.7 k bytecodes a Qwen3-0.6B step). This
    one gives the list it built for the last slice again while that slice holds the same modules
    as it holds them, and builds a new one otherwise, as ModuleList does."""

    def __getitem__(self, idx):
        if type(idx) is not slice:
            return super().__getitem__(idx)
        modules = list(self._modules.values())[idx]
        last = self.__dict__.get("_sglang_rvv_slice")
        if last is not None and last[0] == idx and last[1] == modules and list(last[2]._modules.values()) == modules:
            return last[2]
        sliced = super().__getitem__(idx)
        self.__dict__["_sglang_rvv_slice"] = (idx, modules, sliced)
        return sliced


# Under ModuleList's names, as direct_call's classes keep theirs: code matching modules by class name
# (transformers', SGLang's) sees what it saw.
LayerList.__name__, LayerList.__qualname__ = torch.nn.ModuleList.__name__, torch.nn.ModuleList.__qualname__
LayerList.__module__ = torch.nn.ModuleList.__module__
