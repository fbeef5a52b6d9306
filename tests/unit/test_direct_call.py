"""direct_call: a module called without nn.Module.__call__ gets what nn.Module.__call__ would give it."""

import pytest
import torch

from sglang_rvv.direct_call import DirectCall, direct_class


class Scale(torch.nn.Module):
    def forward(self, x, y=None, *, z=None):
        return x * 2 + (0 if y is None else y) + (0 if z is None else z)


class KeywordsOnly(torch.nn.Module):
    def forward(self, hidden_states=None, bias=None):
        return hidden_states + bias


def _direct(module: torch.nn.Module) -> torch.nn.Module:
    module.__class__ = direct_class(type(module))
    return module


@pytest.mark.parametrize("call", [
    lambda m, x: m(x), lambda m, x: m(x, x), lambda m, x: m(x, z=x), lambda m, x: m(x, x, z=x)])
def test_every_way_of_passing_arguments_reaches_forward(call):
    x = torch.arange(3.0)
    plain, direct = Scale(), _direct(Scale())
    assert isinstance(direct, DirectCall) and type(direct).__name__ == "Scale"
    assert torch.equal(call(direct, x), call(plain, x))


@pytest.mark.parametrize("hook", ["module", "global"])
def test_a_keyword_call_with_a_hook_runs_the_hook(hook):
    module = _direct(KeywordsOnly())
    seen = []
    def record(mod, args, kwargs, out):
        seen.append(sorted(kwargs))
        return out * 10
    if hook == "module":
        handle = module.register_forward_hook(record, with_kwargs=True)
    else:
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda mod, args, out: seen.append(type(mod).__name__) or out * 10)
    x = torch.ones(2)
    assert torch.equal(module(hidden_states=x, bias=x), torch.full((2,), 20.0))
    handle.remove()
    assert seen and torch.equal(module(hidden_states=x, bias=x), torch.full((2,), 2.0))


def test_one_class_per_class_and_a_direct_class_stays_itself():
    assert direct_class(Scale) is direct_class(Scale)
    assert direct_class(direct_class(Scale)) is direct_class(Scale)


def test_a_class_with_a_call_of_its_own_keeps_it():
    class Counted(Scale):
        calls = 0

        def __call__(self, *args, **kwargs):
            type(self).calls += 1
            return super().__call__(*args, **kwargs)

    assert direct_class(Counted) is Counted
    module = _direct(Counted())
    module(torch.ones(1))
    assert Counted.calls == 1
