"""transformers' KV cache layer, grown in place (sglang_rvv.hf_cache): the same keys and values as
DynamicLayer's concatenation at every step, no copy of the cache per step, and no view anyone
kept ever changed."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from sglang_rvv import fused, hf_cache, tiny


def _steps(n: int, seed: int, rows: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, 3, rows, 8, generator=g).bfloat16(), torch.randn(2, 3, rows, 8, generator=g).bfloat16())
            for _ in range(n)]


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
    policy's wrapper (sglang_rvv.fused, here over transformers' own attention): the same greedy
    tokens as with DynamicLayer's concatenation."""
    model = tiny.build_model("qwen3", seed=0)
    prompt = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(4))

    def generate():
        with torch.inference_mode():
            return model.generate(prompt, max_new_tokens=12, do_sample=False, min_new_tokens=12,
                                  return_dict_in_generate=True)

    as_built = generate()
    for module in model.modules():
        if type(module).__name__ == "Qwen3Attention":
            module.forward = fused._hf_growing_cache(type(module).forward).__get__(module)
    grown = generate()
    assert torch.equal(grown.sequences, as_built.sequences)
    assert {type(layer).__name__ for layer in grown.past_key_values.layers} == {"GrowingLayer"}
