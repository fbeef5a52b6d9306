"""Where the fused kernels (tests/integration/test_fused_twins.py) plug in: transformers' modules
and SGLang's take them only where they cover the call, each hook once, and a transformers model
whose norms and MLPs run them keeps its logits. On x86 the policy never picks them (they are the
rvv provider's), so the hooks are called directly with the host's scalar twins.
"""

from __future__ import annotations

import sys

import host_kernels
import pytest
import torch
import torch.nn.functional as F

from sglang_rvv import fused, hf_step, tiny
from sglang_rvv.direct_call import DirectCall
from support import sqnr_db


@pytest.fixture(scope="module")
def native():
    return host_kernels.ops()


_randn = host_kernels.bf16_randn
_bf16 = host_kernels.bf16_zeros


def test_a_layers_residual_add_takes_the_kernel_only_where_it_covers_the_call(native, monkeypatch):
    added = []
    monkeypatch.setattr(fused, "residual_add", lambda a, b: added.append(tuple(a.shape)) or native.residual_add(a, b))
    a = _randn(2, 8, seed=1)
    assert torch.equal(fused._hf_residual_add(a, a), a + a) and added == [(2, 8)]
    grad = a.clone().requires_grad_()
    scalar = torch.tensor(1.5, dtype=torch.bfloat16)
    # float32, a broadcast, strided, autograd, 0-d
    for x, y in [(a.float(), a.float()), (a, a[:1]), (a.t(), a.t()), (grad, a), (scalar, scalar)]:
        assert torch.equal(fused._hf_residual_add(x, y), x + y)
    assert added == [(2, 8)]
    assert fused._hf_residual_add(grad, a).requires_grad


def test_argmax_takes_the_kernel_only_where_it_covers_the_call(native, monkeypatch):
    ran = []
    monkeypatch.setattr(fused, "top1", lambda x: ran.append(tuple(x.shape)) or native.top1(x))
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(4))
    covered = [((x, -1), {}), ((x,), {"dim": 1}), ((x.bfloat16(),), {"dim": -1})]
    others = [((x, 0), {}), ((x,), {}), ((x, -1, True), {}), ((x.half(), -1), {}), ((x.double(), -1), {}),
              ((x[:, ::2], -1), {})]
    for args, kwargs in covered + others:
        assert torch.equal(fused.argmax(*args, **kwargs), torch.argmax(*args, **kwargs)), (args, kwargs)
    out = torch.empty(3, dtype=torch.long)
    fused.argmax(x, -1, out=out)
    assert torch.equal(out, torch.argmax(x, -1))
    assert ran == [(3, 50)] * len(covered)


def test_hf_greedy_generation_takes_the_top1(native, monkeypatch):
    """The model's own _sample, rebound: each new token is the kernel's top-1, and the tokens are
    the same; transformers' GenerationMixin keeps its code for every other model."""
    from transformers.generation.utils import GenerationMixin

    model = tiny.build_model("llama", seed=0)
    prompt = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(3))
    original = GenerationMixin._sample

    def generate():
        with torch.inference_mode():
            return model.generate(prompt, max_new_tokens=4, do_sample=False, min_new_tokens=4)

    as_built = generate()
    picked = []
    monkeypatch.setattr(fused, "top1", lambda x: picked.append(tuple(x.shape)) or native.top1(x))
    assert fused.install_hf(model)["top1"] == 1
    assert torch.equal(generate(), as_built)
    assert picked == [(1, model.config.vocab_size)] * 4
    assert GenerationMixin._sample is original and original.__globals__["torch"] is torch
    fused.take_back(model)
    picked.clear()
    generate()
    assert picked == []


def test_sglangs_sampler_takes_the_top1_once(monkeypatch):
    """SGLang's Sampler.forward, rebound once per process: its torch.argmax is the kernel's, every
    other name its module's torch, and SGLang's module keeps torch."""
    from sglang.srt.layers.sampler import Sampler

    from sglang_rvv.srt import fused as srt_fused

    original = Sampler.forward
    monkeypatch.setattr(Sampler, "forward", original)  # put back after the test
    assert srt_fused._give_top1() and srt_fused._give_top1()
    hooked = Sampler.forward
    assert hooked.sglang_rvv_original is original and hooked.__code__ is original.__code__
    seen = hooked.__globals__["torch"]
    assert seen.argmax is fused.argmax and seen.float32 is torch.float32 and seen.nn is torch.nn
    assert original.__globals__["torch"] is torch


def test_sglangs_logits_are_widened_by_the_kernel_once(native, monkeypatch):
    """SGLang's LogitsProcessor._copy_logits_to_buffer, hooked once per process: BF16 logits padded
    past the vocabulary come back FP32, cut to it, the same bits as the original's .float(); into a
    graph's buffer too; FP32 logits and a call the kernel does not cover go to the original alone."""
    from types import SimpleNamespace

    from sglang.srt.layers.logits_processor import LogitsProcessor

    from sglang_rvv.srt import fused as srt_fused

    original = LogitsProcessor._copy_logits_to_buffer
    monkeypatch.setattr(LogitsProcessor, "_copy_logits_to_buffer", original)  # put back after the test
    widened = []
    monkeypatch.setattr(fused, "widen", lambda x: widened.append(tuple(x.shape)) or native.widen(x))
    srt_fused._give_widen()
    srt_fused._give_widen()
    hooked = LogitsProcessor._copy_logits_to_buffer
    assert hooked.sglang_rvv_original is original
    processor = SimpleNamespace(vocab_size=1000)
    logits = torch.randn(2, 1024, generator=torch.Generator().manual_seed(5)).bfloat16()
    no_buffer = SimpleNamespace(next_token_logits_buffer=None)
    want = original(processor, logits, no_buffer)
    got = hooked(processor, logits, no_buffer)
    assert got.dtype is torch.float32 and got.shape == (2, 1000) and torch.equal(got, want)
    buffer = torch.empty(2, 1000)
    got = hooked(processor, logits, SimpleNamespace(next_token_logits_buffer=buffer))
    assert got is buffer and torch.equal(buffer, want)
    assert widened == [(2, 1000)] * 2
    for other in (logits.float(), logits.half(), logits[:, ::2]):
        assert torch.equal(hooked(processor, other, no_buffer), original(processor, other, no_buffer))
    assert widened == [(2, 1000)] * 2


def test_the_rvv_attention_backend_stores_kv_rows_by_the_op(native, monkeypatch):
    """The RVV backend stores a layer's K and V rows by the row store where that covers the call:
    the cache rows are the pool's own index store's; an int32 slot list, a pool that is not a
    plain row store and a process without the kernels go to SGLang's set_kv_buffer (False)."""
    from types import SimpleNamespace

    from sglang_rvv.srt.attention import RvvAttnBackend

    stored = []
    monkeypatch.setattr(fused.NATIVE, "try_store_kv", lambda *args: stored.append(1) or native.try_store_kv(*args))
    backend = object.__new__(RvvAttnBackend)
    backend.kernels, backend.plain_pool, backend.swa_out_cache_loc = True, True, None
    layer = SimpleNamespace(layer_id=3, is_cross_attention=False)
    k, v = _randn(2, 2, 8, seed=3), _randn(2, 2, 8, seed=4)
    for loc, covered in ((torch.tensor([5, 11]), True), (torch.tensor([5, 11], dtype=torch.int32), False)):
        backend.token_to_kv_pool = SimpleNamespace(start_layer=2, k_buffer=[None, _randn(20, 2, 8, seed=1)],
                                                   v_buffer=[None, _randn(20, 2, 8, seed=2)])
        want_k, want_v = backend.token_to_kv_pool.k_buffer[1].clone(), backend.token_to_kv_pool.v_buffer[1].clone()
        want_k[loc.long()], want_v[loc.long()] = k, v
        assert backend._store(layer, SimpleNamespace(out_cache_loc=loc), k, v) is covered
        if covered:
            assert torch.equal(backend.token_to_kv_pool.k_buffer[1], want_k)
            assert torch.equal(backend.token_to_kv_pool.v_buffer[1], want_v)
    assert stored == [1, 1]
    for attr in ("kernels", "plain_pool"):
        setattr(backend, attr, False)
        assert backend._store(layer, SimpleNamespace(out_cache_loc=torch.tensor([5, 11])), k, v) is False
        setattr(backend, attr, True)
    assert stored == [1, 1]


def _logits(model, prompt):
    """The logits of the prompt's prefill and of one decode step after it (the decode attention)."""
    with torch.inference_mode():
        out = model(prompt[:, :-1], use_cache=True)
        step = model(prompt[:, -1:], past_key_values=out.past_key_values, use_cache=True)
        return torch.cat([out.logits, step.logits], dim=1)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_hf_modules_get_the_kernels_and_keep_the_logits(native, arch, monkeypatch):
    """The logits agree within the kernels' roundings (a random tiny model's near-tied logits may
    swap a greedy token: the same-tokens check is on the real default model, test_default_model.py).
    Each module's kernel is watched here, so the decode step goes through the modules, not the
    layer's one-frame step (the same kernels: tests/integration/test_hf_step.py)."""
    monkeypatch.setattr(hf_step, "_step", lambda *args: None)
    model = tiny.build_model(arch, seed=0)
    prompt = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(2))
    as_built = _logits(model, prompt)
    attended, added = [], []
    def spy(*args):
        attended.append(tuple(args[0].shape))
        return native.decode_attention(*args)
    monkeypatch.setattr(fused, "decode_attention", spy)
    monkeypatch.setattr(fused, "residual_add", lambda a, b: added.append(tuple(a.shape)) or native.residual_add(a, b))
    modeling = sys.modules[type(model).__module__]
    original_rotary = modeling.apply_rotary_pos_emb
    classes = {name: type(m) for name, m in model.named_modules()}
    given = fused.install_hf(model)
    layers = model.config.num_hidden_layers
    norms = 2 * layers + 1 + (2 * layers if arch == "qwen3" else 0)  # Qwen3 adds q_norm and k_norm
    assert given == {"attention": layers, "rmsnorm": norms, "rotary": layers, "silu_mul": layers, "top1": 1,
                     "kv_cache": layers, "residual_add": layers, "layer_step": layers, "layer_list": 1}
    assert sqnr_db(_logits(model, prompt), as_built) > 30
    # The prefill's attention (6 queries) is transformers' own; the decode step's runs the kernel.
    heads, d = model.config.num_attention_heads, model.config.head_dim
    assert len(attended) == layers and set(attended) == {(1, heads, 1, d)}
    # Each layer's two residual adds run the kernel, in the prefill (5 tokens) and the decode step.
    hidden = model.config.hidden_size
    assert added == [(1, 5, hidden)] * 2 * layers + [(1, 1, hidden)] * 2 * layers
    # The attention's rotary is rebound in its own copy of the forward: transformers' module keeps its
    # function, so another model in the process runs it unchanged.
    assert modeling.apply_rotary_pos_emb is original_rotary
    other = tiny.build_model(arch, seed=1)
    assert all("forward" not in m.__dict__ for m in other.modules())
    # Each given module is called without nn.Module.__call__ (direct_call), under its class's name;
    # the decoder layers keep transformers' own __call__ (gradient checkpointing's).
    given_modules = [m for m in model.modules() if fused.MARK_ATTR in m.__dict__ and m is not model.model.layers]
    assert given_modules and all(isinstance(m, DirectCall) != (m in model.model.layers) for m in given_modules)
    assert type(model.model.layers) is hf_step.LayerList  # the layer list: its slice kept (test_hf_step.py)
    assert all(type(m).__name__ == classes[n].__name__ for n, m in model.named_modules())
    # Taken back: every module runs its class's forward again, as its own class.
    # (An attention is one module; the model itself was given its greedy sampling.)
    assert sum(fused.take_back(m) for m in model.modules()) == norms + 3 * layers + 2
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert {name: type(m) for name, m in model.named_modules()} == classes


def test_sglang_modules_get_the_kernels_and_skip_module_call(native, monkeypatch):
    """SGLang's RMSNorm and SiluAndMul, given the kernels, are called without nn.Module.__call__
    (direct_call) and give their own forward's result within one rounding; taken back, they are
    their classes again."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm

    from sglang_rvv.srt import fused as srt_fused

    model = torch.nn.Sequential(RMSNorm(256), SiluAndMul()).requires_grad_(False)  # as SGLang loads it
    model[0].weight.data = _randn(256, seed=3)
    x, gate_up = _randn(3, 256, seed=4), _randn(3, 512, seed=5)
    as_built = model[0](x), model[1](gate_up)
    classes = [type(m) for m in model]
    ran = []

    def spy(name):
        op = getattr(fused, name)
        return lambda *args: ran.append(name) or op(*args)

    for name in ("rms_norm", "silu_and_mul"):
        monkeypatch.setattr(fused, name, spy(name))
    assert srt_fused.install_sglang(model) == {"rmsnorm": 1, "silu_mul": 1}
    assert all(isinstance(m, DirectCall) and type(m).__name__ == c.__name__
               for m, c in zip(model, classes, strict=True))
    for got, want in zip((model[0](x), model[1](gate_up)), as_built, strict=True):
        assert sqnr_db(got, want) > 40
    assert ran == ["rms_norm", "silu_and_mul"]
    assert sum(fused.take_back(m) for m in model) == 2
    assert [type(m) for m in model] == classes


def test_sglang_rotary_takes_the_kernel_at_its_positions(native, monkeypatch):
    """SGLang's RotaryEmbedding (Qwen3-0.6B's head), given the kernels, rotates the query and key
    split from one qkv row by one native call, within one rounding of its own forward_native; a
    rotary of part of the head keeps SGLang's code."""
    from sglang.srt.layers.rotary_embedding import base
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    from sglang_rvv.srt import fused as srt_fused

    monkeypatch.setattr(base, "_is_cpu", True)  # as the appliance imports it (SGLANG_USE_CPU_ENGINE=1)
    ran = []
    monkeypatch.setattr(fused.NATIVE, "try_rotary_neox_at",
                        lambda *args: ran.append(args[0]) or native.try_rotary_neox_at(*args))
    whole, part = (RotaryEmbedding(128, dim, 4096, 1e6, True, torch.bfloat16) for dim in (128, 64))
    qkv = _randn(3, (16 + 2 * 8) * 128, seed=9)
    q, k, _ = qkv.split([16 * 128, 8 * 128, 8 * 128], dim=-1)
    positions = torch.tensor([0, 17, 4095])
    wants = [rope.forward_native(positions, q.clone(), k.clone()) for rope in (whole, part)]
    assert srt_fused.install_sglang(torch.nn.Sequential(whole, part)) == {"rotary": 2}
    for rope, want in zip((whole, part), wants, strict=True):
        got = rope(positions, q, k)
        assert got[0].shape == q.shape and got[1].shape == k.shape
        assert sqnr_db(got[0], want[0]) > 40 and sqnr_db(got[1], want[1]) > 40
    assert len(ran) == 1 and ran[0] is positions  # the whole head only
    assert whole(positions.int(), q, k)[0].shape == q.shape and len(ran) == 2  # int32 positions: refused, SGLang's


class _Projection(torch.nn.Module):
    """A projection as SGLang's linear layers return it, ``(output, bias)``: the MLP's children."""

    def __init__(self, out_features: int, in_features: int, seed: int):
        super().__init__()
        self.weight = torch.nn.Parameter(_randn(out_features, in_features, seed=seed), requires_grad=False)

    def forward(self, x, forward_batch=None):
        return F.linear(x, self.weight), None


def test_sglang_model_code_reads_its_children_from_modules(native):
    """SGLang's LlamaMLP.forward (its own source, compiled again) reads its children from
    ``_modules`` (no child name left to look up), gives its class's forward's bits, uses a child
    replaced by ``setattr``, and is taken back."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.models.llama import LlamaMLP

    from sglang_rvv.srt import fused as srt_fused

    mlp = LlamaMLP.__new__(LlamaMLP)  # SGLang's constructor needs its tensor-parallel groups
    torch.nn.Module.__init__(mlp)
    mlp.gate_up_proj, mlp.down_proj, mlp.act_fn = _Projection(128, 32, 1), _Projection(32, 64, 2), SiluAndMul()
    mlp.requires_grad_(False)
    x = _randn(3, 32, seed=3)
    assert srt_fused.install_sglang(mlp) == {"children": 1, "silu_mul": 1}
    given, original = mlp.__dict__["forward"].__func__.__code__, LlamaMLP.forward.__code__
    children = {"gate_up_proj", "act_fn", "down_proj"}
    assert set(given.co_names) == set(original.co_names) - children | {"_modules"}
    assert isinstance(mlp, DirectCall) and type(mlp).__name__ == "LlamaMLP"
    assert torch.equal(mlp(x), LlamaMLP.forward(mlp, x))
    mlp.down_proj = _Projection(32, 64, 4)
    assert torch.equal(mlp(x), LlamaMLP.forward(mlp, x))
    assert fused.take_back(mlp) and type(mlp) is LlamaMLP and "forward" not in mlp.__dict__


def test_sglang_qwen3_attention_norms_q_and_k_in_one_call(native, monkeypatch):
    """SGLang's Qwen3Attention.forward_prepare_native (its own source, compiled again) norms q and
    k in place by one native call instead of apply_qk_norm's copies and two norm calls: the same
    bits as its class's method over the same modules. Norms that are not plain keep apply_qk_norm."""
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import base
    from sglang.srt.models import utils
    from sglang.srt.models.qwen3 import Qwen3Attention

    from sglang_rvv.srt import fused as srt_fused

    monkeypatch.setattr(base, "_is_cpu", True)  # as the appliance imports it (SGLANG_USE_CPU_ENGINE=1)
    attention = Qwen3Attention.__new__(Qwen3Attention)  # SGLang's constructor needs its tensor-parallel groups
    torch.nn.Module.__init__(attention)
    attention.q_size, attention.kv_size, attention.head_dim, attention.alt_stream = 4 * 64, 2 * 64, 64, None
    attention.qkv_proj = _Projection(8 * 64, 96, 1)
    attention.q_norm, attention.k_norm = RMSNorm(64, eps=1e-6), RMSNorm(64, eps=1e-6)
    attention.q_norm.weight.data, attention.k_norm.weight.data = _randn(64, seed=2), _randn(64, seed=3)
    attention.rotary_emb = base.RotaryEmbedding(64, 64, 4096, 1e6, True, torch.bfloat16)
    attention.requires_grad_(False)
    positions, x = torch.tensor([3, 9]), _randn(2, 96, seed=4)
    ran = []
    monkeypatch.setattr(fused.NATIVE, "try_qk_rmsnorm", lambda *args: ran.append("qk") or native.try_qk_rmsnorm(*args))
    given = srt_fused.install_sglang(attention)
    assert given == {"children": 1, "qk_norm": 1, "rmsnorm": 2, "rotary": 1}
    got = attention.forward_prepare_native(positions, x)
    want = Qwen3Attention.forward_prepare_native(attention, positions, x)  # apply_qk_norm, the norms given the kernels
    assert ran == ["qk"] and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    original = utils.apply_qk_norm
    monkeypatch.setattr(utils, "apply_qk_norm", lambda *args: ran.append("sglang") or original(*args))
    attention.k_norm.fp32_residual = True  # not the plain norm: SGLang's apply_qk_norm takes it
    again = attention.forward_prepare_native(positions, x)
    assert ran == ["qk", "sglang"] and all(sqnr_db(g, w) > 40 for g, w in zip(again, want, strict=True))


def test_a_module_given_two_methods_gets_both_back():
    """An attention's forward and the method it calls, both given: both are taken back, and the
    module is its class again."""
    module = torch.nn.Linear(2, 2)
    cls, forward = type(module), module.forward
    fused.give_forward(module, lambda self, x: "given", attr="forward")
    fused.give_forward(module, lambda self: "prepared", attr="forward_prepare")
    assert module(1) == "given" and module.forward_prepare() == "prepared" and isinstance(module, DirectCall)
    assert fused.take_back(module) and not fused.take_back(module)
    assert type(module) is cls and module.forward == forward and not hasattr(module, "forward_prepare")


def test_a_module_tensor_is_its_parameter_its_buffer_or_its_attribute():
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(torch.ones(2))
    module.register_buffer("table", torch.zeros(3), persistent=False)
    module.plain = torch.full((1,), 7.0)
    assert fused.module_tensor(module, "weight") is module.weight
    assert fused.module_tensor(module, "table") is module.table
    assert fused.module_tensor(module, "plain") is module.plain
    module.weight = torch.nn.Parameter(torch.zeros(2))  # replaced: the live one is read
    assert fused.module_tensor(module, "weight") is module._parameters["weight"]
    with pytest.raises(AttributeError):
        fused.module_tensor(module, "missing")


def test_a_decoder_layer_forward_is_rewritten_only_with_its_residual_adds():
    """The rewritten forward is transformers' own code with its two additions made calls and its
    children read from ``_modules``; a forward that adds in another order keeps its own (the
    refusals of source that is not the code are recompile's, tests/unit/test_recompile.py)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    children = frozenset(("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"))
    rewritten = fused._hf_layer_forward(Qwen3DecoderLayer, children)
    original = Qwen3DecoderLayer.forward.__code__
    assert set(rewritten.__code__.co_names) == set(original.co_names) - children | {"_sglang_rvv_residual_add",
                                                                                     "_modules"}
    assert rewritten.__code__.co_varnames == original.co_varnames
    assert rewritten.__code__.co_filename == original.co_filename

    class OtherOrder(Qwen3DecoderLayer):
        def forward(self, hidden_states, **kwargs):
            residual = hidden_states
            return hidden_states + residual

    assert fused._hf_layer_forward(OtherOrder, children) is None


def test_a_call_the_kernels_do_not_take_runs_the_modules_own_code(native):
    model = tiny.build_model("llama", seed=0)
    fused.install_hf(model)
    norm = model.model.norm
    x = torch.randn(2, 3, model.config.hidden_size)  # float32: not the kernels'
    assert torch.equal(norm(x), type(norm).forward(norm, x))


def test_off_x86_and_a_library_without_the_kernels_fall_back_with_a_reason(native, monkeypatch, caplog):
    fused.available.cache_clear()
    try:
        ok, why = fused.available()
        assert not ok and "provider generic" in why  # x86: the fused kernels are the rvv provider's
        fused.available.cache_clear()
        monkeypatch.setenv(fused.ENV_VAR, "0")
        assert fused.available() == (False, f"turned off by {fused.ENV_VAR}=0")
        # The policy's install then leaves every module as built, and says why.
        model = tiny.build_model("llama", seed=0)
        given, reason = fused.install(model, fused.install_hf, enabled=True)
        assert given == {} and reason == f"turned off by {fused.ENV_VAR}=0"
        assert all(fused.MARK_ATTR not in m.__dict__ for m in model.modules())
    finally:
        fused.available.cache_clear()


def test_a_library_without_the_kernels_warns_once_and_keeps_torchs_ops(native, monkeypatch, caplog):
    """An rvv provider whose library predates an op (here: one it never had) leaves the modules as
    built, with one warning line that names the op and the fix."""
    class OldLibrary:
        NAME = "rvv"

    monkeypatch.setattr(fused, "chosen", lambda: (OldLibrary, "test"))
    monkeypatch.setattr(fused, "NATIVE_OPS", (*fused.NATIVE_OPS, "rope_from_the_future"))
    fused.available.cache_clear()
    try:
        model = tiny.build_model("llama", seed=0)
        with caplog.at_level("WARNING", logger="sglang_rvv"):
            given, reason = fused.install(model, fused.install_hf, enabled=True)
            fused.install(model, fused.install_hf, enabled=True)  # asked again: no second line
        assert given == {} and "sglang_rvv_native::rope_from_the_future" in reason
        assert "build-kernels.sh" in reason
        assert [r.getMessage() for r in caplog.records] == [f"sglang_rvv: {reason}"]
    finally:
        fused.available.cache_clear()


# Shapes the kernels do not cover, by name: each is refused before any kernel runs (a Python check,
# or the library's try_ op, given the native ops), so the module's own torch code takes the call
# (test_a_call_the_kernels_do_not_take_runs_the_modules_own_code).
UNCOVERED = {
    "a norm weight of another size than the hidden": lambda n: fused.servable(_bf16(1, 576), _bf16(575)),
    "an odd rotary head dim": lambda n: fused.rotary_servable(_bf16(1, 2, 1, 63), _bf16(1, 2, 1, 63),
                                                            _bf16(1, 1, 32), _bf16(1, 1, 32)),
    "a rotary table shorter than half the head": lambda n: fused.rotary_servable(
        _bf16(1, 2, 1, 64), _bf16(1, 2, 1, 64), _bf16(1, 1, 31), _bf16(1, 1, 31)),
    "an odd rotary cache (SGLang's layout)": lambda n: n.try_rotary_neox_at(
        torch.zeros(1, dtype=torch.int64), _bf16(1, 2 * 63), _bf16(1, 63), _bf16(8, 63)),
    "SGLang's query of part-heads": lambda n: n.try_rotary_neox_at(
        torch.zeros(1, dtype=torch.int64), _bf16(1, 96), _bf16(1, 64), _bf16(8, 64)),
    "int32 positions": lambda n: n.try_rotary_neox_at(
        torch.zeros(1, dtype=torch.int32), _bf16(1, 128), _bf16(1, 64), _bf16(8, 64)),
    "a GQA ratio that is not whole (3 query heads on 2)": lambda n: fused.attention_servable(
        _bf16(1, 3, 1, 64), _bf16(1, 2, 5, 64), _bf16(1, 2, 5, 64)),
    "keys of another head dim than the query": lambda n: fused.attention_servable(
        _bf16(1, 4, 1, 64), _bf16(1, 2, 5, 32), _bf16(1, 2, 5, 32)),
    "more than one query": lambda n: fused.attention_servable(_bf16(1, 4, 2, 64), _bf16(1, 2, 5, 64),
                                                              _bf16(1, 2, 5, 64)),
    "a paged GQA ratio that is not whole": lambda n: n.try_decode_attention_paged(
        _bf16(1, 3, 64), _bf16(8, 2, 64), _bf16(8, 2, 64), torch.zeros(1, 8, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), 1.0, _bf16(1, 3, 64)),
    "QK norm weights of two head dims": lambda n: n.try_qk_rmsnorm(_bf16(1, 128), _bf16(1, 64), _bf16(64), _bf16(32),
                                                                  1e-6, 1e-6),
    "a residual of another shape": lambda n: n.try_fused_add_rmsnorm(_bf16(2, 64), _bf16(1, 64), _bf16(64), 1e-6),
    "a KV cache of another dtype": lambda n: n.try_store_kv(_bf16(1, 2, 8), _bf16(1, 2, 8), torch.zeros(4, 2, 8),
                                                           torch.zeros(4, 2, 8), torch.zeros(1, dtype=torch.int64)),
}


@pytest.mark.parametrize("case", list(UNCOVERED))
def test_a_shape_the_kernels_do_not_cover_is_refused_before_they_run(native, case):
    assert UNCOVERED[case](native) in (False, [])


def test_the_covered_neighbours_of_those_shapes_are_taken(native):
    """The same checks pass a shape one step away, so the refusals above are the shapes', not the checks'."""
    assert fused.servable(_bf16(1, 576), _bf16(576))
    assert fused.rotary_servable(_bf16(1, 2, 1, 64), _bf16(1, 2, 1, 64), _bf16(1, 1, 32), _bf16(1, 1, 32))
    assert len(native.try_rotary_neox_at(torch.zeros(1, dtype=torch.int64), _bf16(1, 128), _bf16(1, 64),
                                         _bf16(8, 64))) == 2
    assert fused.attention_servable(_bf16(1, 4, 1, 64), _bf16(1, 2, 5, 64), _bf16(1, 2, 5, 64))
    assert native.try_decode_attention_paged(_bf16(1, 4, 64), _bf16(8, 2, 64), _bf16(8, 2, 64),
                                             torch.zeros(1, 8, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                                             torch.ones(1, dtype=torch.int64), 1.0, _bf16(1, 4, 64))
    assert native.try_qk_rmsnorm(_bf16(1, 128), _bf16(1, 64), _bf16(64), _bf16(64), 1e-6, 1e-6)
    assert native.try_fused_add_rmsnorm(_bf16(2, 64), _bf16(2, 64), _bf16(64), 1e-6)
    assert native.try_store_kv(_bf16(1, 2, 8), _bf16(1, 2, 8), _bf16(4, 2, 8), _bf16(4, 2, 8),
                               torch.zeros(1, dtype=torch.int64))
