"""The policy on generated Hugging Face models (Llama untied, Qwen2 tied with biased q/k/v, Qwen3 tied)."""

import json

import pytest
import torch

from sglang_rvv import RvvPolicyConfig, install_rvv_policy, tiny
from sglang_rvv.adapters import TiedLmHeadError
from sglang_rvv.layout import packed_bytes
from sglang_rvv.packed_state import BUFFER
from sglang_rvv.policy import policy_of
from sglang_rvv.routing import bucket_rows
from support import assert_bf16_close

PROMPT = torch.tensor([[3, 141, 59, 26, 535]])


def _logits(model, ids=PROMPT):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen2", True), ("qwen3", True)])
def test_logits_report_tying_and_state_dict(arch, tied):
    model = tiny.build_model(arch, seed=1)
    reference = _logits(model)
    keys = list(model.state_dict())
    embed = model.get_input_embeddings().weight

    report = install_rvv_policy(model, RvvPolicyConfig())

    assert_bf16_close(_logits(model).float(), reference.float())
    assert list(model.state_dict()) == keys
    assert not any(BUFFER in k for k in model.state_dict())
    assert report.adapter == "transformers" and report.provider == "generic"
    assert report.tied_lm_head is tied
    assert (model.lm_head.weight is embed) is tied
    assert model.get_input_embeddings().weight is embed  # embedding lookup keeps the original

    per_layer = ["self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    expected = [f"model.layers.{i}.{p}" for i in range(2) for p in per_layer] + ["lm_head"]
    assert report.packed == expected
    kv = {f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("k_proj", "v_proj")}
    assert set(report.skipped) == kv
    assert all("N=256" in r for r in report.skipped.values())
    expected_bytes = 2 * (2 * packed_bytes(1024, 1024) + 2 * packed_bytes(2080, 1024)
                          + packed_bytes(1024, 2080)) + packed_bytes(2050, 1024)
    assert report.packed_bytes == expected_bytes
    assert json.loads(report.to_json())["packed_bytes"] == expected_bytes
    counts = policy_of(model).counters.by_route()
    assert counts["packed_compiled"] == len(expected) and counts["row_major_gate"] == 4


def test_the_modules_a_quantized_layout_leaves_on_their_bf16_weight_are_named():
    # The tiny models' k and v projections (N=256) are under the generic provider's shape gate:
    # asked for int8, they serve F.linear on their BF16 weight, and the report says so.
    model = tiny.build_model("llama", seed=1)
    assert install_rvv_policy(model, RvvPolicyConfig()).bf16_weight == {}  # bf16 asked: nothing to name
    report = install_rvv_policy(model, RvvPolicyConfig(weight_dtype="int8"))
    kv = {f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("k_proj", "v_proj")}
    assert report.bf16_weight == {name: report.skipped[name] for name in kv}
    assert f"bf16_weight={len(kv)}" in report.summary()


def test_install_twice_never_packs_twice(llama):
    first = install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False))
    buffers = {n: m._buffers[BUFFER] for n, m in llama.named_modules() if BUFFER in m._buffers}
    second = install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False))
    assert second.packed == first.packed and second.packed_bytes == first.packed_bytes
    for name, module in llama.named_modules():
        if name in buffers:
            assert module._buffers[BUFFER] is buffers[name]


def test_generate_matches_row_major(qwen3):
    reference = tiny.build_model("qwen3", seed=0)
    install_rvv_policy(qwen3, RvvPolicyConfig())
    with torch.no_grad():
        out = qwen3.generate(PROMPT, max_new_tokens=6, do_sample=False)
        teacher = reference(out).logits[0]
    # Each greedy pick must be the row-major argmax, up to bf16 near-ties.
    for pos in range(PROMPT.shape[1] - 1, out.shape[1] - 1):
        logits = teacher[pos].float()
        assert logits[out[0, pos + 1]] >= logits.max() - 0.05
    counts = policy_of(qwen3).counters
    # generate() asks for the last position only: prefill and 5 decode steps are M=1
    assert counts[("lm_head", "packed_compiled", "1")] == 6


def test_unknown_architecture_is_left_untouched():
    model = tiny.build_model("llama").model  # the bare decoder: no lm_head, not a CausalLM
    before = [type(m) for m in model.modules()]
    report = install_rvv_policy(model, RvvPolicyConfig())
    assert report.adapter is None and report.packed == []
    assert "no adapter for LlamaModel" in report.reason
    assert [type(m) for m in model.modules()] == before


def test_broken_tying_is_refused():
    model = tiny.build_model("qwen3")
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with pytest.raises(TiedLmHeadError, match="tie_word_embeddings is True"):
        install_rvv_policy(model, RvvPolicyConfig())


@pytest.mark.parametrize("rows", [1, 3, 20])  # direct, padded to a small-batch bucket, a prefill bucket
def test_a_biased_projection_is_packed_and_adds_its_bias(rows):
    model = tiny.build_model("qwen2", seed=2)
    q_proj = model.model.layers[0].self_attn.q_proj
    assert q_proj.bias is not None and q_proj.bias.float().std() > 0.1  # tiny.py draws the biases
    install_rvv_policy(model, RvvPolicyConfig(regional_compile=False))
    x = torch.randn(rows, 1024, dtype=torch.bfloat16)
    with torch.no_grad():
        out = q_proj(x)
        reference = torch.nn.functional.linear(x.float(), q_proj.weight.float(), q_proj.bias.float())
    bucket = bucket_rows(rows, small_batch=True, projection="qkv_proj")
    assert policy_of(model).counters[("qkv_proj", "packed_eager", str(bucket))] == 1
    assert_bf16_close(out.float(), reference)
    # the same call again takes the memoised path, which adds the bias too
    with torch.no_grad():
        assert torch.equal(q_proj(x), out)


@pytest.mark.parametrize("hook", ["forward", "forward_pre", "global_forward"])
def test_a_routed_projection_still_runs_its_hooks(hook):
    """A routed projection's call skips nn.Module.__call__ only where that would just call forward:
    a hook of the module's, or a global one, still runs, on the packed route."""
    model = tiny.build_model("llama", seed=3)
    install_rvv_policy(model, RvvPolicyConfig(regional_compile=False))
    o_proj = model.model.layers[0].self_attn.o_proj
    x = torch.randn(1, 1024, dtype=torch.bfloat16)
    seen = []
    if hook == "forward":
        handle = o_proj.register_forward_hook(lambda module, args, out: seen.append(out.shape) or out * 2)
    elif hook == "forward_pre":
        handle = o_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape) or (args[0] * 2,))
    else:
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, out: seen.append(out.shape) or (out * 2 if module is o_proj else out))
    with torch.no_grad():
        hooked = o_proj(x)
        handle.remove()
        plain = o_proj(x)
    assert seen and torch.equal(hooked, plain * 2)
    routes = policy_of(model).counters.by_route()
    assert routes == {"packed_eager": 2}, routes
