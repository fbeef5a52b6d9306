"""The policy's rules hold for every layout: the BF16 weight stays the source of truth, buffers
are checked before use, reloaded, invalidated and repacked, a tied lm_head stays tied, the budget
counts each layout's real bytes, and a refused layout falls back to a wider one, with the reason."""

import copy

import pytest
import torch

from sglang_rvv import RvvPolicyConfig, install_rvv_policy, invalidate_rvv_packed_weights, layout, ops, routing
from sglang_rvv.kernels import generic
from sglang_rvv.packed_state import BUFFERS, PackedLayout, nbytes, valid_packed
from sglang_rvv.policy import choose_layout, policy_of
from sglang_rvv.route_table import Shape
from support import assert_bf16_close

LAYOUTS = ["bf16", "int8", "int4"]
# The logits SQNR floor of each layout against the row-major BF16 model on the tiny (random weight)
# llama, 5 tokens; measured: bf16 identical (inf dB), int8 34.1 dB, int4 14.1 dB (test_accuracy.py
# holds the fuller measure, and says what random weights cannot tell).
MIN_SQNR = {"bf16": 35.0, "int8": 32.0, "int4": 12.0}


def _config(weight_dtype, **kw):
    return RvvPolicyConfig(regional_compile=False, weight_dtype=weight_dtype, **kw)


def _expected_layout(name, weight_dtype):
    return "int8" if name == "lm_head" and weight_dtype == "int4" else weight_dtype


def _assert_buffers_are_the_packing_of(module, packed_layout):
    """Every packed tensor is what the pack op makes of the module's current weight, now."""
    packed = valid_packed(module, module.weight)
    assert packed is not None
    if packed_layout.name == "bf16":
        fresh = (ops.pack_bf16_weight(module.weight),)
    else:
        q_layout = layout.quant_layout(packed_layout.name)
        fresh = ops.PACK_OPS[packed_layout.name](
            module.weight, layout.api_group_size(q_layout, packed_layout.group, module.weight.shape[1]))
    assert all(torch.equal(a, b) for a, b in zip(packed, fresh, strict=True))


def _random_like(tensor, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(tensor.shape, generator=g) * 0.05).to(tensor.dtype)


@pytest.mark.parametrize("weight_dtype", LAYOUTS)
def test_install_reports_each_layout_and_its_real_bytes(llama, weight_dtype):
    reference = copy.deepcopy(llama)
    report = install_rvv_policy(llama, _config(weight_dtype))
    assert report.weight_dtype == weight_dtype and len(report.packed) == 11 and not report.layout_fallbacks
    for name in report.packed:
        module = llama.get_submodule(name)
        assert report.layouts[name] == _expected_layout(name, weight_dtype)
        assert report.module_bytes[name] == nbytes(module) > 0
        assert set(module._buffers) & set(BUFFERS) and not set(module.state_dict()) & set(BUFFERS)
        if report.layouts[name] == "bf16":
            assert name not in report.group_sizes
        else:
            q_layout = layout.quant_layout(report.layouts[name])
            group = layout.effective_group_size(q_layout, q_layout.default_group_size, module.weight.shape[1])
            assert report.group_sizes[name] == group
            n, k = module.weight.shape
            assert nbytes(module) == layout.form_bytes(generic.quantized_form(q_layout, n, k, group))
    assert report.packed_bytes == sum(report.bytes_by_layout().values()) == policy_of(llama).packed_bytes()
    assert set(report.bytes_by_layout()) == {_expected_layout(n, weight_dtype) for n in report.packed}
    assert f"weight_dtype={weight_dtype}" in report.summary()
    ids = torch.tensor([[1, 5, 9, 200, 7]])
    with torch.no_grad():
        assert_bf16_close(llama(ids).logits.float(), reference(ids).logits.double(), MIN_SQNR[weight_dtype])


def test_quantized_bytes_are_fewer():
    sizes = {}
    for weight_dtype in LAYOUTS:
        from sglang_rvv import tiny

        sizes[weight_dtype] = install_rvv_policy(tiny.build_model("llama", seed=0), _config(weight_dtype)).packed_bytes
    assert sizes["int4"] < sizes["int8"] < 0.55 * sizes["bf16"]


@pytest.mark.parametrize("weight_dtype", LAYOUTS)
def test_reload_invalidate_and_replace_repack_from_the_bf16_weight(llama, weight_dtype):
    install_rvv_policy(llama, _config(weight_dtype))
    lm_head, o_proj = llama.lm_head, llama.model.layers[0].self_attn.o_proj
    layouts = {m: m.__dict__[routing.ROUTE_ATTR].record.layout for m in (lm_head, o_proj)}
    # load_state_dict: new values in place, the post-load hook repacks
    state = {k: _random_like(v, i) for i, (k, v) in enumerate(llama.state_dict().items())}
    llama.load_state_dict(state)
    for module, packed_layout in layouts.items():
        _assert_buffers_are_the_packing_of(module, packed_layout)
    # an in-place write, then the documented invalidate
    o_proj.weight.data.copy_(_random_like(o_proj.weight, 99))
    invalidate_rvv_packed_weights(llama)
    _assert_buffers_are_the_packing_of(o_proj, layouts[o_proj])
    # a replaced weight: the source check sees it at the next call, which repacks first
    o_proj.weight = torch.nn.Parameter(_random_like(o_proj.weight, 7), requires_grad=False)
    with torch.no_grad():
        llama(torch.tensor([[3]]))
    _assert_buffers_are_the_packing_of(o_proj, layouts[o_proj])
    assert policy_of(llama).report.layouts["model.layers.0.self_attn.o_proj"] == weight_dtype


@pytest.mark.parametrize("weight_dtype", LAYOUTS)
def test_lazy_mode_frees_a_stale_buffer_and_runs_row_major(llama, weight_dtype):
    install_rvv_policy(llama, _config(weight_dtype, eager_repack=False))
    llama.lm_head.weight = torch.nn.Parameter(_random_like(llama.lm_head.weight, 3))
    with torch.no_grad():
        llama(torch.tensor([[4]]))
    assert policy_of(llama).counters[("lm_head", "row_major_invalid", "1")] == 1
    assert nbytes(llama.lm_head) == 0 and valid_packed(llama.lm_head, llama.lm_head.weight) is None


@pytest.mark.parametrize("weight_dtype", LAYOUTS)
def test_a_tied_lm_head_stays_tied(qwen3, weight_dtype):
    report = install_rvv_policy(qwen3, _config(weight_dtype))
    assert report.tied_lm_head and qwen3.lm_head.weight is qwen3.model.embed_tokens.weight
    assert report.layouts["lm_head"] == _expected_layout("lm_head", weight_dtype)
    assert qwen3.model.embed_tokens.weight.dtype == torch.bfloat16  # the embedding is never packed


@pytest.mark.parametrize("weight_dtype", LAYOUTS)
def test_the_budget_counts_each_layouts_real_bytes(llama, weight_dtype):
    full = install_rvv_policy(llama, _config(weight_dtype))
    sizes = [full.module_bytes[name] for name in full.packed]
    budget_mib = sum(sizes[:4]) / (1024 * 1024)
    report = install_rvv_policy(llama, _config(weight_dtype, memory_budget_mib=budget_mib))
    assert report.packed == full.packed[:4] and report.packed_bytes == sum(sizes[:4])
    assert report.budget_cut == full.packed[4:] and f"{len(full.packed) - 4}x budget" in report.summary()
    assert policy_of(llama).packed_bytes() == report.packed_bytes
    # A budget change moves the cut back; the gauge's source follows.
    assert install_rvv_policy(llama, _config(weight_dtype)).packed_bytes == policy_of(llama).packed_bytes() \
        == full.packed_bytes


def test_changing_the_layout_repacks(llama):
    install_rvv_policy(llama, _config("bf16"))
    bf16_bytes = policy_of(llama).packed_bytes()
    report = install_rvv_policy(llama, _config("int8"))
    assert set(report.layouts.values()) == {"int8"} and policy_of(llama).packed_bytes() < 0.55 * bf16_bytes
    _assert_buffers_are_the_packing_of(llama.lm_head, PackedLayout("int8", 1, 1024))


def test_a_provider_without_a_layout_falls_back_with_the_reason(llama, monkeypatch):
    monkeypatch.setattr(generic, "layout_refusal",
                        lambda name: "an older kernel library" if name == "int4" else None)
    report = install_rvv_policy(llama, _config("int4"))
    assert set(report.layouts.values()) == {"int8"}
    assert report.layout_fallbacks["model.layers.0.mlp.down_proj"] == "int4 -> int8: int4: an older kernel library"
    assert "lm_head" not in report.layout_fallbacks  # int8 is what lm_head was asked for


def test_int4_a8_on_the_generic_provider_is_int4_with_the_reason(llama):
    """x86's provider has no kernel that quantizes activations: int4_a8's weights are int4's, and
    int4 serves them (the board's rvv provider runs int4_a8 itself: tests/images/test_board_model.py)."""
    report = install_rvv_policy(llama, _config("int4_a8"))
    assert report.layouts["model.layers.0.mlp.down_proj"] == "int4" and report.layouts["lm_head"] == "int8"
    why = report.layout_fallbacks["model.layers.0.mlp.down_proj"]
    assert why.startswith("int4_a8 -> int4: int4_a8: generic has no kernel that quantizes activations"), why
    _assert_buffers_are_the_packing_of(llama.model.layers[0].mlp.down_proj, PackedLayout("int4", 1, 32))


def test_a_layout_the_shape_or_values_refuse_falls_back():
    config = RvvPolicyConfig(weight_dtype="int4")
    packed_layout, why = choose_layout(config, "o_proj", torch.zeros(64, 16, dtype=torch.bfloat16))
    assert packed_layout == PackedLayout("int8", 1, 16) and "group size 32 is larger than K=16" in why
    bad = torch.zeros(64, 64, dtype=torch.bfloat16)
    bad[3, 5] = float("nan")
    packed_layout, why = choose_layout(config, "o_proj", bad)
    assert packed_layout.name == "bf16" and "int8: the weight has non-finite values" in why


def test_an_already_quantized_checkpoint_stays_gated(llama):
    o_proj = llama.model.layers[0].self_attn.o_proj
    o_proj.weight = torch.nn.Parameter(o_proj.weight.to(torch.float8_e4m3fn), requires_grad=False)
    report = install_rvv_policy(llama, _config("int8"))
    name = "model.layers.0.self_attn.o_proj"
    assert name not in report.packed and "weight dtype torch.float8_e4m3fn" in report.skipped[name]


def test_bad_config_names_the_choices():
    with pytest.raises(ValueError, match=r"weight_dtype='fp4' is not one of \('bf16', 'int8', 'int4', 'int4_a8'\)"):
        RvvPolicyConfig(weight_dtype="fp4")
    with pytest.raises(ValueError, match=r"group_size=48 is not one of int4's \(32, 64, 128\)"):
        RvvPolicyConfig(weight_dtype="int4", group_size=48)
    with pytest.raises(ValueError, match=r"group_size=0 is not one of int4's"):
        RvvPolicyConfig(weight_dtype="int4", group_size=0)
    with pytest.raises(ValueError, match="applies to int8/int4 only"):
        RvvPolicyConfig(group_size=32)
    with pytest.raises(ValueError, match="lm_head_dtype='int2'"):
        RvvPolicyConfig(lm_head_dtype="int2")
    config = RvvPolicyConfig(weight_dtype="int4", group_size=128, lm_head_dtype="int4")
    assert config.layout_for("lm_head") == "int4" and config.group_size_for("int4") == 128
    assert config.group_size_for("int8") == 0


def test_route_keys_and_table_shapes_separate_layouts(llama):
    install_rvv_policy(llama, RvvPolicyConfig(weight_dtype="int8", measure_routes=False))
    route = llama.lm_head.__dict__[routing.ROUTE_ATTR]
    decision = routing.decide("lm_head", 1, route.status, route.context.config, route.context.table,
                              weight_shape=llama.lm_head.weight.shape, servable=True,
                              packed_layout=route.record.layout)
    assert decision.key.layout == "int8" and decision.key.group == 1024
    bf16_key = decision.key._replace(layout="bf16", group=0)
    assert decision.key.shape == Shape("lm_head", 1, 2050, 1024, "int8", 1024) != bf16_key.shape
    with torch.no_grad():
        llama(torch.tensor([[1]]))
    assert decision.key in route.context.compiled.keys()
    assert policy_of(llama).counters[("lm_head", "packed_compiled", "1")] == 1
