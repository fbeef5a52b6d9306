"""Packed state never outlives its weight: property-based lifecycle sequences."""

import copy

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_rvv import RvvPolicyConfig, install_rvv_policy, invalidate_rvv_packed_weights, tiny
from sglang_rvv.layout import unpack_reference
from sglang_rvv.packed_state import BUFFER, valid_packed
from sglang_rvv.policy import policy_of
from support import assert_bf16_close

LINEARS = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj",
           "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj", "lm_head"]

seeds = st.integers(0, 2**16)
steps = st.one_of(
    st.tuples(st.just("install"), st.sampled_from([None, 0, 3, 6, 12]), st.booleans()),
    st.tuples(st.just("load_state_dict"), seeds),
    st.tuples(st.just("replace_weight"), st.sampled_from(LINEARS), seeds),
    st.tuples(st.just("to_dtype"), st.sampled_from([torch.float32, torch.bfloat16])),
    st.tuples(st.just("mutate_and_invalidate"), st.sampled_from(LINEARS), seeds),
    st.tuples(st.just("forward"), st.integers(1, 20)),
)


def _random_like(tensor, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tensor.shape, generator=g) * 0.05).to(tensor.dtype)


def _check_forward(model, reference, rows, seed=0):
    ids = torch.randint(0, 2050, (1, rows), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    assert_bf16_close(got.float(), want.double())
    # Every buffer still in use is exactly the packing of the module's current weight.
    for name, module in model.named_modules():
        packed = module._buffers.get(BUFFER)
        if packed is not None and valid_packed(module, module.weight) is not None:
            assert torch.equal(unpack_reference(packed, module.weight.shape[0]), module.weight), name


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(steps, min_size=1, max_size=8), st.integers(1, 20))
def test_outputs_always_match_a_row_major_model(sequence, last_rows):
    model = tiny.build_model("llama", seed=0, num_hidden_layers=1)
    reference = copy.deepcopy(model)
    install_rvv_policy(model, RvvPolicyConfig(regional_compile=False))
    for step in sequence:
        kind = step[0]
        if kind == "install":
            install_rvv_policy(model, RvvPolicyConfig(
                regional_compile=False, memory_budget_mib=step[1], small_batch=step[2]))
        elif kind == "load_state_dict":
            state = {k: _random_like(v, step[1] + i) for i, (k, v) in enumerate(model.state_dict().items())}
            model.load_state_dict(state)
            reference.load_state_dict(state)
        elif kind == "replace_weight":
            for m in (model, reference):
                module = m.get_submodule(step[1])
                module.weight = torch.nn.Parameter(_random_like(module.weight, step[2]))
        elif kind == "to_dtype":
            model.to(step[1])
            reference.to(step[1])
        elif kind == "mutate_and_invalidate":
            for m in (model, reference):
                weight = m.get_submodule(step[1]).weight
                weight.data.copy_(_random_like(weight, step[2]))
            invalidate_rvv_packed_weights(model)
        else:
            _check_forward(model, reference, step[1])
    _check_forward(model, reference, last_rows, seed=1)


def _packed_modules(model):
    return {n for n, m in model.named_modules() if BUFFER in m._buffers}


def test_in_place_write_needs_invalidate(llama):
    """The documented contract: weight.data.copy_ is invisible until invalidate."""
    reference = copy.deepcopy(llama)
    install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False))
    new = _random_like(llama.lm_head.weight, 7)
    for m in (llama, reference):
        m.lm_head.weight.data.copy_(new)
    ids = torch.tensor([[5]])
    with torch.no_grad():
        want = reference(ids).logits
        stale = llama(ids).logits
        assert (stale - want).abs().max() > 0.1  # the stale packed copy was used
        report = invalidate_rvv_packed_weights(llama)
        assert_bf16_close(llama(ids).logits.float(), want.double())
    assert "lm_head" in report.packed


def test_load_state_dict_repacks_without_growing(llama):
    report = install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False))
    state = {k: _random_like(v, i) for i, (k, v) in enumerate(llama.state_dict().items())}
    old = llama.lm_head._buffers[BUFFER]
    llama.load_state_dict(state)
    new = llama.lm_head._buffers[BUFFER]
    assert new is not old
    assert torch.equal(unpack_reference(new, 2050), state["lm_head.weight"])
    assert policy_of(llama).packed_bytes() == report.packed_bytes


def test_to_dtype_never_uses_a_stale_buffer(llama):
    install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False))
    ids = torch.tensor([[1, 2, 3]])
    llama.to(torch.float32)
    with torch.no_grad():
        llama(ids)
    assert _packed_modules(llama) == set()  # float32 weights: nothing packed, nothing held
    llama.to(torch.bfloat16)
    with torch.no_grad():
        llama(ids)
    assert len(_packed_modules(llama)) == 11
    counts = policy_of(llama).counters.by_route()
    assert counts.get("row_major_invalid", 0) == 0


def test_lazy_mode_runs_row_major_until_invalidate(llama):
    install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False, eager_repack=False))
    llama.lm_head.weight = torch.nn.Parameter(_random_like(llama.lm_head.weight, 3))
    with torch.no_grad():
        llama(torch.tensor([[4]]))
    counts = policy_of(llama).counters
    assert counts[("lm_head", "row_major_invalid", "1")] == 1
    assert "lm_head" not in _packed_modules(llama)
    invalidate_rvv_packed_weights(llama, repack=True)
    assert "lm_head" in _packed_modules(llama)
