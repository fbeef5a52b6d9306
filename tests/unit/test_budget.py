"""The memory budget: the packed prefix that fits (what is available: test_host.py)."""

import pytest
import torch

from sglang_rvv import RvvPolicyConfig, budget, install_rvv_policy
from sglang_rvv.budget import MIB, plan_prefix
from sglang_rvv.layout import packed_bytes
from support import assert_bf16_close

GIB = 1024 * MIB


def test_auto_budget_keeps_the_reserve():
    assert budget.auto_budget_bytes(16 * GIB) == 16 * GIB - int(1.6 * GIB)
    assert budget.auto_budget_bytes(2 * GIB) == 1 * GIB
    assert budget.auto_budget_bytes(512 * MIB) == 0


def test_plan_is_a_strict_prefix():
    assert plan_prefix([4, 4, 1, 1], 8) == 2
    assert plan_prefix([4, 5, 1], 8) == 1  # the 1 after the cut stays out
    assert plan_prefix([], 0) == 0
    assert plan_prefix([1, 2], 100) == 2


def test_negative_budget_is_refused():
    with pytest.raises(ValueError, match="memory_budget_mib=-1"):
        RvvPolicyConfig(memory_budget_mib=-1)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_tiny_budget_packs_nothing_and_stays_correct(llama):
    ids = torch.tensor([[7, 8, 9]])
    reference = _logits(llama, ids)
    report = install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False, memory_budget_mib=1))
    assert report.packed == [] and report.packed_bytes == 0
    assert all(r.startswith(("gate:", "budget:")) for r in report.skipped.values())
    assert_bf16_close(_logits(llama, ids).float(), reference.double())


def test_middle_budget_packs_the_documented_prefix(llama):
    # Model order: layer 0 q, o, gate, up, down, then layer 1, then lm_head.
    sizes = [packed_bytes(1024, 1024), packed_bytes(1024, 1024), packed_bytes(2080, 1024),
             packed_bytes(2080, 1024), packed_bytes(1024, 2080)]
    budget_bytes = sum(sizes) + sizes[0] + sizes[1] + sizes[2] // 2  # ends inside layer 1's gate_proj
    report = install_rvv_policy(llama, RvvPolicyConfig(
        regional_compile=False, memory_budget_mib=budget_bytes / MIB))
    assert report.packed == [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj",
        "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.o_proj",
    ]
    assert report.packed_bytes == sum(sizes) + sizes[0] + sizes[1]
    assert report.skipped["lm_head"].startswith("budget:")
    assert "cut at model.layers.1.mlp.gate_proj" in report.skipped["model.layers.1.mlp.down_proj"]
    ids = torch.tensor([[1, 2]])
    from sglang_rvv.policy import policy_of

    _logits(llama, ids)
    counts = policy_of(llama).counters
    assert counts[("lm_head", "row_major_budget", "2")] == 1
    assert counts[("o_proj", "packed_eager", "2")] == 2
