"""An int4 lm_head with exact greedy picks (config.lm_head_exact_candidates, sglang_rvv.exact_pick):
its top candidates rescored from the BF16 rows pick the BF16 head's token whenever it is one, through
the policy's own route, and the knob is refused where there is nothing to rescore."""

import copy

import pytest
import torch
import torch.nn.functional as F

from sglang_rvv import RvvPolicyConfig, exact_pick, install_rvv_policy, routing
from sglang_rvv.policy import policy_of

IDS = torch.tensor([[1, 7, 42, 99, 3, 250, 17, 8, 64, 5, 300, 12]])


def _policy(model, k: int) -> torch.nn.Module:
    # BF16 body, int4 lm_head: the body's hidden states are the ones the BF16 head is asked about.
    install_rvv_policy(model, RvvPolicyConfig(regional_compile=False, lm_head_dtype="int4",
                                              lm_head_exact_candidates=k))
    return model


def _logits_and_truth(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits, and the BF16 lm_head's pick from the same final hidden states."""
    with torch.no_grad():
        out = model(IDS, output_hidden_states=True)
    bf16 = F.linear(out.hidden_states[-1][0], model.lm_head.weight)
    return out.logits[0].float(), bf16.argmax(-1)


@pytest.fixture
def plain(qwen3):
    return _logits_and_truth(_policy(copy.deepcopy(qwen3), 0))


def test_rescored_candidates_pick_the_bf16_heads_token_whenever_it_is_one(qwen3, plain):
    plain_logits, truth = plain
    assert (plain_logits.argmax(-1) != truth).any(), "int4 alone should miss some picks on this model"
    for k in (2, 8):
        model = _policy(copy.deepcopy(qwen3), k)
        assert type(model.lm_head.__dict__[routing.ROUTE_ATTR]) is exact_pick.ExactPickRoute
        logits, same_truth = _logits_and_truth(model)
        assert torch.equal(same_truth, truth)
        among = (plain_logits.topk(k, -1).indices == truth[:, None]).any(-1)
        picks = logits.argmax(-1)
        assert torch.equal(picks[among], truth[among]), k
        # Whatever it picks is a candidate of the quantized logits.
        assert (plain_logits.topk(k, -1).indices == picks[:, None]).any(-1).all(), k
    # Every logit rescored: the BF16 head's picks at every position.
    vocab = qwen3.config.vocab_size
    logits, _ = _logits_and_truth(_policy(copy.deepcopy(qwen3), vocab))
    assert torch.equal(logits.argmax(-1), truth)


def test_the_knob_changes_the_route_in_place_without_repacking(qwen3):
    model = _policy(qwen3, 0)
    route = model.lm_head.__dict__[routing.ROUTE_ATTR]
    buffers = dict(model.lm_head._buffers)
    assert type(route) is routing.ModuleRoute
    report = install_rvv_policy(model, RvvPolicyConfig(regional_compile=False, lm_head_dtype="int4",
                                                       lm_head_exact_candidates=8))
    assert model.lm_head.__dict__[routing.ROUTE_ATTR] is route and type(route) is exact_pick.ExactPickRoute
    assert all(model.lm_head._buffers[name] is tensor for name, tensor in buffers.items())
    assert "lm_head" in report.packed and report.config["lm_head_exact_candidates"] == 8
    install_rvv_policy(model, RvvPolicyConfig(regional_compile=False, lm_head_dtype="int4"))
    assert type(route) is routing.ModuleRoute and policy_of(model) is not None


def test_rescore_caps_every_other_logit_below_the_candidates():
    weight = torch.randn(50, 16).to(torch.bfloat16)
    x = torch.randn(3, 16).to(torch.bfloat16)
    noisy = (F.linear(x, weight).float() + torch.randn(3, 50)).to(torch.bfloat16)
    out = exact_pick.rescore(noisy, x, weight, 5)
    top = noisy.topk(5, -1).indices
    exact = F.linear(x.float(), weight.float()).to(torch.bfloat16)
    assert torch.equal(out.gather(-1, top), exact.gather(-1, top))
    rest = torch.ones_like(out, dtype=torch.bool).scatter_(-1, top, False)
    least = out.gather(-1, top).min(-1, keepdim=True).values
    assert (out[rest].view(3, -1) < least).all()
    assert out.dtype == torch.bfloat16 and out.shape == noisy.shape


@pytest.mark.parametrize(("fields", "message"), [
    ({"lm_head_exact_candidates": 8}, r"rescores a quantized lm_head, and lm_head's layout here is bf16: set "
                                      r"lm_head_dtype \(or weight_dtype\) to int8 or int4, or leave it 0"),
    ({"lm_head_exact_candidates": -1, "lm_head_dtype": "int4"}, r"must be a whole number >= 0 \(0: off\)"),
    ({"lm_head_exact_candidates": True, "lm_head_dtype": "int4"}, r"must be a whole number >= 0"),
])
def test_the_knob_is_refused_where_there_is_nothing_to_rescore(fields, message):
    with pytest.raises(ValueError, match=message):
        RvvPolicyConfig(**fields)
