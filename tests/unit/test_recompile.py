"""recompile: a function's own source compiled again with some expressions changed, and refused
where the source is not the code that runs."""

from __future__ import annotations

import functools
import importlib.util
import sys

import pytest
import torch

from sglang_rvv import recompile

SOURCE = '''
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Identity()
        self.scale = 2

    def forward(self, residual, hidden_states, cache):
        out = cache.update(self.inner(hidden_states), 1)
        return residual + out * self.scale

    @staticmethod
    def wrapped(x):
        return x


def adds(residual, hidden_states):
    return residual + hidden_states, hidden_states + residual
'''


@pytest.fixture
def module(tmp_path):
    path = tmp_path / "recompile_sample.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("recompile_sample", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    yield loaded, path
    sys.modules.pop("recompile_sample", None)


class _Cache:
    def update(self, x, scale):
        return x * scale


def test_only_the_named_addition_becomes_a_call(module):
    sample, _ = module
    calls = recompile.Calls("add_", add=("residual", "hidden_states"))
    seen = []
    changed = recompile.recompiled(sample.adds, [calls], {"add_": lambda a, b: seen.append((a, b)) or a * b})
    assert calls.count == 1
    assert changed(2, 5) == (10, 7) and seen == [(2, 5)]  # the other order stays an addition
    assert sample.adds(2, 5) == (7, 7)  # the module keeps its function


def test_children_are_read_live_from_modules_and_a_method_call_becomes_a_call(module):
    sample, _ = module
    children, update = recompile.ChildModules(["inner"]), recompile.Calls("update_", method=("cache", "update"))
    forward = recompile.recompiled(sample.Block.forward, [children, update],
                                   {"update_": lambda cache, x, scale: cache.update(x, scale + 1)})
    assert (children.count, update.count) == (1, 1) and "inner" not in forward.__code__.co_names
    block, x = sample.Block(), torch.ones(2)
    assert torch.equal(forward(block, torch.zeros(2), x, _Cache()), x * 2 * 2)
    block.inner = torch.nn.Linear(2, 2, bias=False)  # replaced: the live child runs, never the old one
    torch.nn.init.zeros_(block.inner.weight)
    assert torch.equal(forward(block, torch.ones(2), x, _Cache()), torch.ones(2))
    del block.inner
    with pytest.raises(KeyError, match="inner"):
        forward(block, torch.ones(2), x, _Cache())


def test_source_that_is_not_the_running_code_is_refused(module):
    sample, path = module
    calls = recompile.Calls("add_", add=("residual", "hidden_states"))
    path.write_text(SOURCE.replace("return residual + hidden_states, hidden_states + residual",
                                   "return residual + hidden_states, residual - hidden_states"))
    assert recompile.recompiled(sample.adds, [calls], {"add_": None}) is None and calls.count == 0
    path.unlink()
    assert recompile.recompiled(sample.adds, [calls], {"add_": None}) is None


def test_decorated_wrapped_and_closures_are_refused(module):
    sample, _ = module
    calls = recompile.Calls("add_", add=("residual", "hidden_states"))
    assert recompile.recompiled(sample.Block.wrapped, [calls], {}) is None  # a decorated def
    assert recompile.recompiled(functools.partial(sample.adds, 1), [calls], {}) is None  # no code
    scale = 3

    def closure(residual, hidden_states):
        return (residual + hidden_states) * scale

    assert recompile.recompiled(closure, [calls], {}) is None
    assert recompile.recompiled(len, [calls], {}) is None


def test_a_child_its_class_names_is_no_child_read():
    """A child registered under a name the class defines (a property) is read by attribute as the
    property, so ChildModules must not make it a ``_modules`` read."""

    class WithHead(torch.nn.Module):
        @property
        def head(self):
            return "the property"

    module = WithHead()
    module.body, module.head = torch.nn.Identity(), torch.nn.Identity()
    assert set(module._modules) == {"body", "head"} and module.head == "the property"
    assert recompile.child_names(module) == {"body"}
