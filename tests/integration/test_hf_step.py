"""A transformers decoder layer's decode step in one frame (sglang_rvv.hf_step) and its op,
``attention_step``, on the kernel library's build for this host: the same bits as the fused
kernels called one by one through transformers' own code, and that code wherever a step is not
one the frame covers."""

from __future__ import annotations

import contextlib
import inspect

import host_kernels
import pytest
import torch

from sglang_rvv import fused, hf_cache, hf_step, tiny
from sglang_rvv.kernels import rvv


@pytest.fixture(scope="module", autouse=True)
def native():
    return host_kernels.ops()


_randn = host_kernels.bf16_randn


@pytest.mark.parametrize("batch,q_heads,kv_heads,d,length,normed,table_batch", [
    (1, 16, 8, 128, 5, True, 1),   # Qwen3-0.6B's attention
    (1, 9, 3, 64, 0, False, 1),    # SmolLM2-135M's, at the first key
    (2, 4, 4, 8, 3, True, 2),      # a batch with a table per row
    (2, 6, 2, 16, 7, False, 1),    # a batch sharing one table, the last row of the buffer
])
def test_attention_step_is_the_ops_one_by_one(native, batch, q_heads, kv_heads, d, length, normed, table_batch):
    """QK norm, rotary, the two appends and the decode attention as transformers' route calls them,
    bit for bit; the buffers change only in row ``length``."""
    q, k, v = (_randn(batch, 1, h * d, seed=s) for s, h in ((1, q_heads), (2, kv_heads), (3, kv_heads)))
    q_weight, k_weight = (_randn(d, seed=4), _randn(d, seed=5)) if normed else (None, None)
    cos, sin = _randn(table_batch, 1, d, seed=6), _randn(table_batch, 1, d, seed=7)
    capacity = length + 1
    keys0, values0 = _randn(batch, kv_heads, capacity, d, seed=8), _randn(batch, kv_heads, capacity, d, seed=9)
    key_buffer, value_buffer = keys0.clone(), values0.clone()

    def heads(rows, n):
        return rows.view(batch, 1, n, d)

    qn = native.rmsnorm(heads(q, q_heads), q_weight, 1e-6) if normed else heads(q, q_heads)
    kn = native.rmsnorm(heads(k, kv_heads), k_weight, 1e-5) if normed else heads(k, kv_heads)
    q_rot, k_rot = native.rotary_neox(qn.transpose(1, 2), kn.transpose(1, 2), cos, sin)
    want_keys, want_values = keys0.clone(), values0.clone()
    want_keys[:, :, length] = k_rot[:, :, 0]
    want_values[:, :, length] = heads(v, kv_heads)[:, 0]
    want = native.decode_attention(q_rot, want_keys[:, :, :capacity], want_values[:, :, :capacity], 0.125)

    out, keys, values = native.attention_step(q, k, v, q_weight, k_weight, 1e-6, 1e-5, cos, sin, key_buffer,
                                              value_buffer, length, 0.125)
    assert out.shape == (batch, 1, q_heads * d) and torch.equal(out, want.reshape(batch, 1, -1))
    assert torch.equal(key_buffer, want_keys) and torch.equal(value_buffer, want_values)
    assert keys.shape == (batch, kv_heads, length + 1, d) and keys.data_ptr() == key_buffer.data_ptr()
    assert values.shape == keys.shape and values.data_ptr() == value_buffer.data_ptr()


def _step_call(**changes):
    q, k, v = _randn(1, 1, 32, seed=1), _randn(1, 1, 16, seed=2), _randn(1, 1, 16, seed=3)
    args = dict(q=q, k=k, v=v, q_weight=None, k_weight=None, q_eps=1e-6, k_eps=1e-6, cos=_randn(1, 1, 8, seed=4),
                sin=_randn(1, 1, 8, seed=5), key_buffer=_randn(1, 2, 4, 8, seed=6),
                value_buffer=_randn(1, 2, 4, 8, seed=7), length=2, scale=1.0)
    args.update(changes)
    return lambda n: n.attention_step(*args.values())


@pytest.mark.parametrize("call,message", [
    (_step_call(value_buffer=_randn(1, 2, 5, 8, seed=0)), "value buffers .batch, kv_heads, capacity, d. of one"),
    (_step_call(q=_randn(1, 1, 36, seed=0)), r"contiguous bfloat16 q, k and v \[1, 1, heads \* 8\]"),
    (_step_call(k=_randn(1, 2, 16, seed=0)), r"q, k and v \[1, 1, heads \* 8\], got BFloat16 \[1, 2, 16\]"),
    (_step_call(k=_randn(1, 1, 24, seed=0), v=_randn(1, 1, 24, seed=0)), "k and v of the buffers' 2 heads of 8"),
    (_step_call(q_weight=_randn(4, seed=0), k_weight=_randn(4, seed=0)), "norm weights of the head dim 8"),
    (_step_call(length=4), "rows 4 to 5 do not fit the buffer's 4"),
    (_step_call(cos=_randn(1, 1, 3, seed=0), sin=_randn(1, 1, 3, seed=0)), r"cos of shape \[batch, seq"),
], ids=["buffers", "part head", "two rows", "kv heads", "norm size", "full", "short table"])
def test_attention_step_refuses_a_bad_call_by_name(native, call, message):
    with pytest.raises(RuntimeError, match=message):
        call(native)


@contextlib.contextmanager
def _watched():
    """Yields a list that gets, for each decoder layer call, whether it took the one-frame step
    (its cache layer was stepped)."""
    taken, step, stepped = [], hf_step._step, hf_cache.stepped

    def asked(*args):
        taken.append(False)
        return step(*args)

    def done(*args):
        taken[-1] = True
        return stepped(*args)

    hf_step._step, hf_cache.stepped = asked, done
    try:
        yield taken
    finally:
        hf_step._step, hf_cache.stepped = step, stepped


def _decode(model, steps: int, prompt_len: int = 7):
    """The logits of ``steps`` greedy decode steps after a prefill, and for each layer call whether
    it took the one-frame step."""
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(2))
    logits = []
    with _watched() as taken, torch.inference_mode():
        out = model(prompt, use_cache=True)
        for _ in range(steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            out = model(token, past_key_values=out.past_key_values, use_cache=True)
            logits.append(out.logits)
    return torch.cat(logits, dim=1), taken


@pytest.fixture(params=["entry", "ops"])
def step_by(request, monkeypatch):
    """The native entry's decode_layer (beside the library the policy found), or torch.ops' calls
    (no entry there)."""
    if request.param == "entry":
        monkeypatch.setenv(rvv.LIB_ENV, str(host_kernels.build()))
    else:
        monkeypatch.setenv(rvv.LIB_ENV, str(host_kernels.OUT_DIR / "missing" / host_kernels.LIB_NAME))
    return request.param


def _layer_step_of(model):
    """What a decoder layer's one-frame step runs: the entry's decode_layer or decode_layer_ops."""
    run = inspect.getclosurevars(model.model.layers[0].forward.__func__).nonlocals["run"]
    return "ops" if run is hf_step.decode_layer_ops else run.__name__


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2"])
def test_a_layers_decode_steps_are_the_fused_modules_bits(arch, step_by, monkeypatch):
    """Twelve steps, two of them past the grown cache's room (the layer's own forward moves it),
    give the logits of the same kernels called one by one through transformers' code, bit for bit."""
    monkeypatch.setattr(hf_cache, "SPARE_MIN", 4)
    steps = 12
    stepped = tiny.build_model(arch, seed=0)
    assert fused.install_hf(stepped)["layer_step"] == stepped.config.num_hidden_layers
    assert _layer_step_of(stepped) == {"entry": "decode_layer", "ops": "ops"}[step_by]
    by_modules = tiny.build_model(arch, seed=0)
    fused.install_hf(by_modules)
    ours, taken = _decode(stepped, steps)
    monkeypatch.setattr(hf_step, "_step", lambda *args: None)
    theirs, _ = _decode(by_modules, steps)
    assert torch.equal(ours.view(torch.int16), theirs.view(torch.int16))
    layers = stepped.config.num_hidden_layers
    # Each layer's own forward runs the prefill, and the steps with no room: step 5 (7 prompt rows
    # and 4 spare) and step 10 (12 rows moved, and 4 spare).
    assert len(taken) == layers * (steps + 1)
    assert [i for i, took in enumerate(taken[::layers]) if not took] == [0, 5, 10]
    assert taken.count(False) == 3 * layers


def _one_step(model, grad: bool = False, **kwargs) -> bool:
    """Whether one decode step after a prefill took the one-frame step in every layer."""
    prompt = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode(not grad), torch.set_grad_enabled(grad):
        out = model(prompt, use_cache=True)
        with _watched() as taken:
            model(prompt[:, -1:], past_key_values=out.past_key_values, use_cache=True, **kwargs)
    return bool(taken) and all(taken)


def _hooked(part: str):
    def change(model):
        model.get_submodule(f"model.layers.0.{part}").register_forward_hook(lambda *args: None)
    return change


def _strided_norm(model):
    norm = model.model.layers[1].post_attention_layernorm
    norm.weight = torch.nn.Parameter(torch.stack([norm.weight, norm.weight], 1)[:, 0], requires_grad=False)


@pytest.mark.parametrize("change", [
    _hooked("self_attn.q_norm"), _hooked("mlp"), _hooked("input_layernorm"), _strided_norm,
    lambda model: setattr(model.model.layers[0].self_attn, "sliding_window", 4),
    lambda model: fused.take_back(model.model.layers[0].self_attn.k_norm),
], ids=["hooked q_norm", "hooked mlp", "hooked norm", "strided norm", "sliding window", "k_norm taken back"])
def test_a_step_the_frame_does_not_cover_runs_the_layers_own_forward(change):
    """A hook on a module the frame would not call, a norm the kernel would not take, a sliding
    window, a module without the policy's forward: that layer runs transformers' code."""
    model = tiny.build_model("qwen3", seed=0)
    fused.install_hf(model)
    assert _one_step(model)
    change(model)
    assert not _one_step(model)


def test_a_mask_grad_or_an_unknown_argument_runs_the_layers_own_forward():
    model = tiny.build_model("qwen3", seed=0)
    fused.install_hf(model)
    assert not _one_step(model, grad=True)  # autograd records
    assert not _one_step(model, output_attentions=True)  # transformers installs capturing hooks
    model = tiny.build_model("qwen3", seed=0)
    fused.install_hf(model)
    prompt = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        out = model(prompt, use_cache=True)
        layer = model.model.layers[0]
        cos_sin = model.model.rotary_emb(out.logits.new_zeros(1, 1, 1), torch.tensor([[4]]))
        hidden = _randn(1, 1, model.config.hidden_size, seed=1)
        for kwargs in ({"attention_mask": torch.zeros(1, 1, 1, 5, dtype=torch.bfloat16)}, {"softcap": 1.0}):
            assert hf_step._step(layer, hidden, {"position_embeddings": cos_sin, "past_key_values":
                                                 out.past_key_values, **kwargs}, fused.MARK_ATTR) is None
        assert hf_step._step(layer, hidden, {"position_embeddings": cos_sin, "past_key_values": out.past_key_values},
                             fused.MARK_ATTR) is not None
        # The cache's keys replaced (a crop, a reorder): the layer's own update moves them first.
        out.past_key_values.layers[0].keys = out.past_key_values.layers[0].keys.clone()
        assert hf_step._step(layer, hidden, {"position_embeddings": cos_sin, "past_key_values": out.past_key_values},
                             fused.MARK_ATTR) is None


def _layer_operands(model) -> list:
    """decode_layer's operands for layer 0 of ``model`` one step after a prefill."""
    prompt = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        out = model(prompt, use_cache=True)
        cos_sin = model.model.rotary_emb(out.logits.new_zeros(1, 1, 1), torch.tensor([[4]]))
        hidden = _randn(1, 1, model.config.hidden_size, seed=1)
        operands, _ = hf_step._step(model.model.layers[0], hidden, {"position_embeddings": cos_sin,
                                                                    "past_key_values": out.past_key_values},
                                    fused.MARK_ATTR)
    return list(operands)


@pytest.mark.parametrize("change,error,message", [
    (lambda o: o.pop(), TypeError, r"decode_layer\(x, in_weight, in_eps"),
    (lambda o: o.__setitem__(0, None), TypeError, "x must be a tensor, got NoneType"),
    (lambda o: o.__setitem__(3, lambda x: 3), TypeError, "returned int, not a tensor"),
    (lambda o: o.__setitem__(4, lambda x: 1 / 0), ZeroDivisionError, "division by zero"),
    (lambda o: o.__setitem__(18, o[16].shape[2]), RuntimeError, "do not fit the buffer's"),
], ids=["arity", "x", "projection result", "projection raises", "no room"])
def test_decode_layer_refuses_a_bad_call_by_name(monkeypatch, change, error, message):
    """The entry's step raises what its operands' problem is; a projection's own exception passes."""
    monkeypatch.setenv(rvv.LIB_ENV, str(host_kernels.build()))
    model = tiny.build_model("qwen3", seed=0)
    fused.install_hf(model)
    operands = _layer_operands(model)
    change(operands)
    with pytest.raises(error, match=message), torch.inference_mode():
        rvv.native_entry().decode_layer(*operands)


def test_the_layer_list_gives_its_last_slice_while_it_holds():
    """transformers' model forward slices its layer list at every step: the same list while the
    slice holds the same modules, a new one (as ModuleList builds) once it does not."""
    model = tiny.build_model("llama", seed=0)
    layers = model.model.layers
    assert fused.install_hf(model)["layer_list"] == 1 and type(layers) is hf_step.LayerList
    assert type(layers).__name__ == "ModuleList"
    first = layers[:2]
    assert layers[:2] is first and list(first) == list(layers) and layers[0] is first[0]
    assert layers[:1] is not first and list(layers[:1]) == [layers[0]]
    again = layers[:2]
    again.append(torch.nn.Identity())  # the caller changed the list it was given
    assert layers[:2] is not again and len(layers[:2]) == 2
    layers[1] = torch.nn.Identity()  # the model's own list changed
    assert layers[:2][1] is layers[1]
    fused.take_back(layers)
    assert type(layers) is torch.nn.ModuleList


@pytest.mark.parametrize("change", [
    lambda o: o.__setitem__(0, o[0].float()),
    lambda o: o.__setitem__(0, torch.stack([o[0], o[0]], -1)[..., 0]),
    lambda o: o.__setitem__(20, o[20][:-1]),
    lambda o: o.__setitem__(1, o[1].float()),
    lambda o: o.__setitem__(11, torch.stack([o[11], o[11]], 1)[:, 0]),
    lambda o: (o.__setitem__(14, o[14][..., :-2]), o.__setitem__(15, o[15][..., :-2])),
    lambda o: o.__setitem__(15, torch.stack([o[15], o[15]], -1)[..., 0]),
    lambda o: o.__setitem__(10, None),
], ids=["float input", "strided input", "short norm weight", "float norm weight", "strided k_norm weight",
        "partial rotary", "sin strides", "k_norm without q_norm"])
@pytest.mark.parametrize("by", ["entry", "ops"])
def test_the_step_refuses_what_a_module_by_itself_would_not_take(monkeypatch, change, by):
    """Where a module called by itself would run torch's code (fused.servable, rotary_servable), the
    step gives None with nothing run, the entry's and decode_layer_ops alike."""
    monkeypatch.setenv(rvv.LIB_ENV, str(host_kernels.build()))
    model = tiny.build_model("qwen3", seed=0)
    fused.install_hf(model)
    operands = _layer_operands(model)
    buffers = operands[16].clone(), operands[17].clone()
    change(operands)
    run = rvv.native_entry().decode_layer if by == "entry" else hf_step.decode_layer_ops
    with torch.inference_mode():
        assert run(*operands) is None
        # (a buffer's rows past the cache are unwritten memory: compared as bits)
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(operands[16:18], buffers,
                                                                                          strict=True))
    with torch.enable_grad():  # autograd would record: the modules' own code
        assert run(*_layer_operands(model)) is None
