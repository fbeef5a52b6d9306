"""The adapter of SGLang's models: registered with :mod:`sglang_rvv.adapters` by the plugin
before it installs the policy, so the policy never imports SGLang itself."""

from __future__ import annotations

import torch

from ..adapters import Adapter
from ..archs import sglang_classes
from .fused import install_sglang
from .methods import install_route, sglang_gate

# SGLang fuses q/k/v and gate/up, and names each projection module by its kind.
_KINDS = {k: k for k in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}


def _detect(model: torch.nn.Module) -> bool:
    cls = type(model)
    return f"{cls.__module__}.{cls.__name__}" in sglang_classes()


def _tied(model: torch.nn.Module) -> bool:
    return model.lm_head is model.model.embed_tokens


SGLANG_ADAPTER = Adapter(name="sglang", kinds=_KINDS, detect=_detect, install_route=install_route,
                         lm_head_tied=_tied, module_gate=sglang_gate, fused_modules=install_sglang)
