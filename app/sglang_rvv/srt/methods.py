"""Quant methods that route SGLang's projections through the policy.

Linear layers get a subclass of ``UnquantizedLinearMethod`` and lm_head a
subclass of ``UnquantizedEmbeddingMethod``, so SGLang's isinstance checks keep
holding. The lm_head method is not one of the names ``LogitsProcessor``
treats as "plain" (it matches them by class name), so the logits matmul calls
its ``apply``; ``embedding()`` is inherited, so a tied embedding lookup keeps
using the original weight.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod

from ..direct_call import direct_class
from ..routing import ROUTE_ATTR, ModuleRoute, accelerated

_PLAIN_METHODS = (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)


class _Routed:
    """``apply`` through the layer's route."""

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        # Reading _parameters skips nn.Module.__getattr__, a Python call, on every projection of every step.
        try:
            weight = layer._parameters["weight"]
        except KeyError:  # a weight set as a plain attribute
            weight = layer.weight
        return layer.__dict__[ROUTE_ATTR](layer, x, weight, bias)


class RvvLinearMethod(_Routed, UnquantizedLinearMethod):
    pass


class RvvLmHeadMethod(_Routed, UnquantizedEmbeddingMethod):
    pass


def sglang_gate(module: torch.nn.Module) -> str | None:
    """Why an SGLang projection module must stay as SGLang built it."""
    tp_size = getattr(module, "tp_size", 1)
    if tp_size != 1:
        return f"gate: tensor parallel size {tp_size} (the policy packs unsharded weights only)"
    method = getattr(module, "quant_method", None)
    if not isinstance(method, _PLAIN_METHODS):
        return f"gate: quantized ({type(method).__name__})"
    return None


def install_route(module: torch.nn.Module, route: ModuleRoute) -> None:
    accelerated()  # the routes' call in C where the provider has a native entry
    module.__dict__[ROUTE_ATTR] = route
    # SGLang calls its projections as modules: without nn.Module.__call__ where that would only
    # call forward (as transformers' routed Linears are called).
    module.__class__ = direct_class(type(module))
    method = module.quant_method
    if isinstance(method, (RvvLinearMethod, RvvLmHeadMethod)):
        return
    module.quant_method = RvvLinearMethod() if isinstance(method, UnquantizedLinearMethod) else RvvLmHeadMethod()
