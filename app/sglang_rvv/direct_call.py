"""Calling a module the policy gave a forward without ``nn.Module.__call__``, where that would only
call the forward: the routed projections and transformers' modules with a fused forward."""

from __future__ import annotations

import torch
from torch.nn.modules import module as _nn_module

_KEYWORDS_ONLY = object()  # a call with no positional argument


class DirectCall:
    """Mixin put in front of a module's class.

    ``nn.Module.__call__`` (two frames, the compile and tracing checks, eight hook dicts) costs
    about 9 k instructions a call under emulation: on the board, that is every projection, norm
    and MLP call of every decode step. Where it would only call forward (no hook of the
    module's or a global one, no ``module.compile()``), this calls forward without those
    frames. (Under ``torch.jit.trace`` it would call ``_slow_forward``, which only names the
    traced ops' scope.)
    """

    def __call__(self, input=_KEYWORDS_ONLY, /, *args, **kwargs):
        # The input bound by name, not packed into a tuple to unpack again: a projection's, a
        # norm's or an MLP's one argument costs about 1 k instructions less a call.
        if (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks or self._backward_pre_hooks
                or self._compiled_call_impl is not None
                or _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks
                or _nn_module._global_backward_hooks or _nn_module._global_backward_pre_hooks):
            return torch.nn.Module.__call__(self, *(() if input is _KEYWORDS_ONLY else (input,)), *args, **kwargs)
        if input is _KEYWORDS_ONLY:  # transformers calls its attention modules by keyword
            return self.forward(*args, **kwargs)
        if args or kwargs:
            return self.forward(input, *args, **kwargs)
        return self.forward(input)


_CLASSES: dict[type, type] = {}


def direct_class(cls: type) -> type:
    """``cls`` with :class:`DirectCall` in front, one per class. It keeps ``cls``'s name, module and
    qualified name, as transformers and SGLang match modules by class name; ``isinstance`` and the
    state_dict keys hold as for a subclass. A class with a ``__call__`` of its own keeps it: that
    call is not only the forward."""
    if issubclass(cls, DirectCall) or cls.__call__ is not torch.nn.Module.__call__:
        return cls
    direct = _CLASSES.get(cls)
    if direct is None:
        direct = _CLASSES[cls] = type(cls.__name__, (DirectCall, cls),
                                      {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    return direct
