"""transformers' KV cache layer, grown in place (sglang_rvv.hf_cache) by the kernel library's
append_rows (its build for this host): the same keys and values as DynamicLayer's concatenation at
every step, no copy of the cache per step, and no view anyone kept ever changed."""

from __future__ import annotations

import host_kernels
import pytest
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from sglang_rvv import fused, hf_cache, recompile, tiny


@pytest.fixture(scope="module", autouse=True)
def native():
    return host_kernels.ops()


def _steps(n: int, seed: int, rows: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys [2, 3, rows, 8], and values read as a transpose of [2, rows, 3, 8], as transformers'
    projections give them (rows 24 values apart)."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 3, rows, 8, generator=g).bfloat16(),
             torch.randn(2, rows, 3, 8, generator=g).bfloat16().transpose(1, 2)) for _ in range(n)]


def test_a_grown_layer_holds_what_concatenation_holds_and_copies_rarely():
    grown, plain = DynamicLayer(), DynamicLayer()
    prompt = _steps(1, seed=0, rows=5)[0]
    grown.update(*prompt)  # the prefill, before the policy's attention first sees the layer
    plain.update(*prompt)
    hf_cache.grow(type("Cache", (), {"layers": [grown]})(), 0)
    assert type(grown).__name__ == "GrowingLayer" and isinstance(grown, DynamicLayer)
    buffers = set()
    kept = []
    for k, v in _steps(150, seed=1):
        keys, values = grown.update(k, v)
        want_keys, want_values = plain.update(k, v)
        assert torch.equal(keys, want_keys) and torch.equal(values, want_values)
        assert grown.get_seq_length() == plain.get_seq_length()
        buffers.add(keys.untyped_storage().data_ptr())
        kept.append((keys, keys.clone()))
    # 155 rows: a buffer of 5 + 64, then room for a quarter more each time.
    assert len(buffers) == 3
    assert all(torch.equal(view, copy) for view, copy in kept)  # no step wrote into a kept view


def test_a_replaced_or_cropped_cache_is_moved_not_overwritten():
    layer = DynamicLayer()
    hf_cache.grow(type("Cache", (), {"layers": [layer]})(), 0)
    for k, v in _steps(4, seed=2):
        layer.update(k, v)
    before = layer.keys
    layer.crop(2)  # transformers' own view of the first two rows, in the same buffer
    cropped = layer.keys
    saved = before.clone()
    k, v = _steps(1, seed=3)[0]
    keys, _ = layer.update(k, v)
    assert torch.equal(before, saved)  # the longer view someone kept is unchanged
    assert torch.equal(keys, torch.cat([cropped, k], dim=-2))
    assert keys.untyped_storage().data_ptr() != before.untyped_storage().data_ptr()


def test_only_plain_dynamic_layers_grow():
    cache = DynamicCache()
    sliding = DynamicSlidingWindowLayer(sliding_window=4)
    cache.layers = [DynamicLayer(), sliding]
    for index in (0, 1, 2, -1):
        hf_cache.grow(cache, index)
    hf_cache.grow(None, 0)
    assert type(cache.layers[0]).__name__ == "GrowingLayer" and type(cache.layers[1]) is DynamicSlidingWindowLayer


def test_a_model_decodes_the_same_tokens_with_the_grown_cache():
    """transformers' generate over a tiny Qwen3 whose attentions grow their layers through the
    policy's cache update (sglang_rvv.fused, here in transformers' own attention otherwise): the
    same greedy tokens as with DynamicLayer's concatenation."""
    model = tiny.build_model("qwen3", seed=0)
    prompt = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(4))

    def generate():
        with torch.inference_mode():
            return model.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12,
                                  return_dict_in_generate=True)

    as_built = generate()
    update = recompile.Calls("_sglang_rvv_cache_update", method=("past_key_values", "update"))
    attention = type(model.model.layers[0].self_attn)
    forward = recompile.recompiled(attention.forward, [update], {"_sglang_rvv_cache_update": fused._hf_cache_update})
    assert update.count == 1
    for module in model.modules():
        if type(module) is attention:
            module.forward = forward.__get__(module)
    grown = generate()
    assert torch.equal(grown.sequences, as_built.sequences)
    assert {type(layer).__name__ for layer in grown.past_key_values.layers} == {"GrowingLayer"}


def test_append_rows_writes_rows_of_any_strides_and_returns_the_view(native):
    buffer = torch.zeros(2, 3, 6, 4, dtype=torch.bfloat16)
    rows = torch.randn(2, 4, 3, 8).bfloat16()[..., ::2].transpose(1, 2)  # [2, 3, 4, 4], last dim strided
    view = native.append_rows(buffer, rows[:, :, :3], 1)
    assert view.shape == (2, 3, 4, 4) and view.data_ptr() == buffer.data_ptr()
    assert torch.equal(buffer[:, :, 1:4], rows[:, :, :3]) and not buffer[:, :, 0].any() and not buffer[:, :, 4:].any()
    with pytest.raises(RuntimeError, match="rows 4 to 7 do not fit the buffer's 6"):
        native.append_rows(buffer, rows[:, :, :3], 4)
    with pytest.raises(RuntimeError, match="of their dtype, got Float"):
        native.append_rows(buffer, rows.float(), 0)
