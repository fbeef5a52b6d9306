"""Model adapters: which modules are projections, of which kind, and how to route them.

An adapter knows one family of model classes. It lists the projection modules
in priority order (model order: layer by layer, then lm_head), maps each onto
one of the five projection kinds, installs its route, and checks that
a tied lm_head is still tied.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch.nn.modules import module as nn_module

from .archs import SUPPORTED
from .direct_call import DirectCall
from .fused import install_hf
from .routing import ROUTE_ATTR, ModuleRoute, accelerated

log = logging.getLogger("sglang_rvv")
_HF_KINDS = {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
    "o_proj": "o_proj",
    "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
    "down_proj": "down_proj",
}


class TiedLmHeadError(RuntimeError):
    pass


@dataclass(frozen=True)
class Adapter:
    name: str
    kinds: dict[str, str]  # last name component -> projection kind
    detect: Callable[[torch.nn.Module], bool]
    install_route: Callable[[torch.nn.Module, ModuleRoute], None]
    lm_head_tied: Callable[[torch.nn.Module], bool]
    # Why a module must be left exactly as the framework built it (not even routed).
    module_gate: Callable[[torch.nn.Module], str | None] = lambda module: None
    # Gives the model's norm and MLP modules the fused kernels (fused.install's hook): the
    # number of modules per kind of kernel. None: the family has no such hook.
    fused_modules: Callable[[torch.nn.Module], Counter] | None = None

    def projections(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, str]]:
        # Duplicates kept: a tied SGLang lm_head *is* model.embed_tokens, and it
        # is only a projection under its second name.
        seen: set[int] = set()
        for name, module in model.named_modules(remove_duplicate=False):
            kind = "lm_head" if name == "lm_head" else self.kinds.get(name.rpartition(".")[2])
            if kind is None or id(module) in seen:
                continue
            if isinstance(getattr(module, "weight", None), torch.Tensor):
                seen.add(id(module))
                yield name, module, kind

    def validate_tied_lm_head(self, model: torch.nn.Module) -> bool:
        """Raise if the config ties lm_head to embed_tokens but the model no longer does."""
        if not getattr(model.config, "tie_word_embeddings", False):
            return False
        if not self.lm_head_tied(model):
            raise TiedLmHeadError(
                f"{type(model).__name__}: config.tie_word_embeddings is True but lm_head and "
                "model.embed_tokens no longer share their weight; the RVV policy never "
                "replaces weights, so something else untied them - reload the model"
            )
        return True


# -- Hugging Face transformers ------------------------------------------------

class RoutedLinear(DirectCall):
    """Mixin put in front of a Linear's class: a call goes through its route."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # nn.Linear registers both names (bias as None); reading _parameters skips
        # nn.Module.__getattr__, a Python call each, on every projection of every step.
        params = self._parameters
        try:
            weight, bias = params["weight"], params["bias"]
        except KeyError:  # a weight or bias set as a plain attribute
            weight, bias = self.weight, self.bias
        return self.__dict__[ROUTE_ATTR](self, input, weight, bias)


_ROUTED_CLASSES: dict[type, type] = {}


def _accelerate_routed_linear() -> None:
    """Where the routes run natively (:func:`routing.accelerated`), a routed Linear's call goes
    straight to its route in C as well: what :meth:`DirectCall.__call__` and
    :meth:`RoutedLinear.forward` do, down to calling the route, with the same checks and their
    Python as the fallback (``kernels/csrc/entry/route_call.cpp``)."""
    native = accelerated()
    if native is None or "__call__" in RoutedLinear.__dict__:
        return
    try:
        RoutedLinear.__call__ = native.module_method(RoutedLinear, DirectCall.__call__, RoutedLinear.forward,
                                                     ROUTE_ATTR, vars(nn_module))
    except (TypeError, ValueError) as exc:
        log.warning("sglang_rvv: routed Linears keep their Python call: %s", exc)


def install_routed_linear(module: torch.nn.Module, route: ModuleRoute) -> None:
    _accelerate_routed_linear()
    module.__dict__[ROUTE_ATTR] = route
    cls = type(module)
    if issubclass(cls, RoutedLinear):
        return
    routed = _ROUTED_CLASSES.get(cls)
    if routed is None:
        # A subclass keeps isinstance(module, nn.Linear) and the state_dict keys.
        routed = type(f"RvvRouted{cls.__name__}", (RoutedLinear, cls), {"__module__": __name__})
        _ROUTED_CLASSES[cls] = routed
    module.__class__ = routed


def _detect_hf(model: torch.nn.Module) -> bool:
    transformers = sys.modules.get("transformers")
    return (
        transformers is not None
        and isinstance(model, transformers.PreTrainedModel)
        and getattr(model.config, "model_type", None) in SUPPORTED
        and hasattr(model, "lm_head")
    )


def _hf_tied(model: torch.nn.Module) -> bool:
    return model.lm_head.weight is model.get_input_embeddings().weight


HF_ADAPTER = Adapter(
    name="transformers", kinds=_HF_KINDS, detect=_detect_hf, install_route=install_routed_linear,
    lm_head_tied=_hf_tied, fused_modules=install_hf,
)


# -- Plain torch modules named like Hugging Face's ----------------------------

def _detect_hf_named(model: torch.nn.Module) -> bool:
    return (
        isinstance(getattr(model, "lm_head", None), torch.nn.Linear)
        and isinstance(getattr(getattr(model, "model", None), "embed_tokens", None), torch.nn.Embedding)
        and hasattr(model, "config")
    )


def _hf_named_tied(model: torch.nn.Module) -> bool:
    return model.lm_head.weight is model.model.embed_tokens.weight


def hf_named_adapter(name: str = "hf_named") -> Adapter:
    """An adapter for a plain torch causal LM laid out like a transformers Llama.

    Nothing is detected by class: pass it as ``install_rvv_policy(model, adapter=...)``.
    It fits a model with ``model.embed_tokens`` (``nn.Embedding``), an ``lm_head``
    (``nn.Linear``) and a ``config`` whose ``tie_word_embeddings`` says whether
    ``lm_head.weight is model.embed_tokens.weight``. Projections are the
    ``nn.Linear`` modules named ``q_proj``/``k_proj``/``v_proj``/``o_proj``/
    ``gate_proj``/``up_proj``/``down_proj`` (kinds as in transformers) and ``lm_head``.
    """
    return Adapter(
        name=name, kinds=_HF_KINDS, detect=_detect_hf_named, install_route=install_routed_linear,
        lm_head_tied=_hf_named_tied,
    )


# -- Registered by framework packages ----------------------------------------

# Tried in order by resolve_adapter. A framework's package registers its own adapter
# (sglang_rvv.srt does for SGLang's models, before it installs the policy), so this module and
# the policy above it never import SGLang.
_ADAPTERS: list[Adapter] = [HF_ADAPTER]


def register(adapter: Adapter) -> None:
    """Make ``adapter`` the first one :func:`resolve_adapter` tries; registering it again is a no-op."""
    if adapter not in _ADAPTERS:
        _ADAPTERS.insert(0, adapter)


def resolve_adapter(model: torch.nn.Module) -> Adapter | None:
    return next((a for a in _ADAPTERS if a.detect(model)), None)
