"""Exact greedy picks from a quantized lm_head: its logits' top candidates rescored from the BF16 rows.

A quantized lm_head streams fewer bytes than the BF16 one, but its argmax is not always the BF16
head's. The BF16 weight stays in memory as the source of truth, so the few rows of the best
candidates can be read again: :func:`rescore` recomputes the top ``k`` logits of each row from
them and caps every other logit just below the least of those, so the argmax is always a
candidate, and it is the BF16 head's whenever that is among the ``k``.
``accuracy.lm_head_candidates`` measures how often it is, and so which ``k`` a model needs.
:class:`ExactPickRoute` is lm_head's route when the config asks for it
(``RvvPolicyConfig.lm_head_exact_candidates``).

Sampling at a temperature sees the candidates exact and the rest of the distribution quantized
and capped: not the BF16 distribution (``accuracy.lm_head_candidates`` gives the KL).
"""

from __future__ import annotations

import math

import torch

from .routing import ModuleRoute, Status


def rescore(logits: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, k: int,
            bias: torch.Tensor | None = None) -> torch.Tensor:
    """``logits`` ``[..., V]`` of ``input`` ``[..., K]`` through a quantized copy of ``weight``
    ``[V, K]``, with each row's top ``k`` recomputed from ``weight`` (fp32 products and sums, rounded
    to the logits' dtype once) and every other logit capped just below the least of them."""
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    rows = input.reshape(-1, input.shape[-1]).float()
    top = flat.topk(min(k, vocab), -1).indices                                  # [R, k]
    exact = torch.bmm(weight[top].float(), rows.unsqueeze(-1)).squeeze(-1)      # [R, k]
    if bias is not None:
        exact += bias.float()[top]
    exact = exact.to(flat.dtype)
    floor = torch.nextafter(exact.min(-1, keepdim=True).values, torch.tensor(-math.inf, dtype=flat.dtype))
    return torch.minimum(flat, floor).scatter_(-1, top, exact).reshape(logits.shape)


class ExactPickRoute(ModuleRoute):
    """lm_head's route when the config asks for exact greedy picks
    (``lm_head_exact_candidates``): a packed quantized call's logits get their top candidates
    rescored from the BF16 weight (:func:`rescore`). Not :class:`ModuleRoute` itself,
    so the C call (route_call.cpp, which takes that type only) hands it to this one."""

    __slots__ = ()

    def call(self, module, input, weight, bias=None) -> torch.Tensor:
        out = ModuleRoute.call(self, module, input, weight, bias)
        k = self.context.config.lm_head_exact_candidates
        packed = self.record.layout
        if k and self.status == Status.PACKED and packed is not None and packed.name != "bf16":
            out = rescore(out, input, weight, k, bias)
        return out

    __call__ = call


def route_class(projection: str, config) -> type[ModuleRoute]:
    """The route type a projection takes under ``config``."""
    if projection == "lm_head" and config.lm_head_exact_candidates:
        return ExactPickRoute
    return ModuleRoute
