"""Each layout's model accuracy against BF16 row-major, held to a measured floor.

Measured on the seeded tiny models (random weights, 2 layers) on this x86 VM, generic provider,
with this test's set (2 prompts, 8 greedy steps, one window of 128 byte tokens of the corpus);
logits SQNR / greedy agreement / perplexity (bf16 row-major's):
    llama  bf16 47.9 dB / 93.8 % / 2522.9 (2522.5)   qwen3  bf16 47.2 dB / 100 % / 2024.7 (2025.4)
           int8 34.1 dB / 100 % / 2518.1                    int8 33.7 dB / 100 % / 2025.4
           int4 13.5 dB / 68.8 % / 2513.7                   int4 13.1 dB / 75.0 % / 2044.7
(the full accuracy.measure set, 4 prompts and 2 windows: int8 33.6 / 33.1 dB, int4 13.2 / 12.6 dB).
Random weights give near-flat logits, so a greedy pick flips on tiny noise (even bf16 packed
against row-major) and perplexity sits near the vocabulary size: these floors catch a broken
layout; they do not say what int4 costs a trained model (run accuracy.measure on a real
checkpoint, with its tokenizer, for that).
"""

import pytest

from sglang_rvv import accuracy, tiny
from support import assert_layout_floors

FLOORS = {  # layout: (min logits SQNR dB, min greedy agreement, max perplexity ratio to bf16)
    "bf16": (40.0, 0.9, 1.001),
    "int8": (30.0, 0.9, 1.01),
    "int4": (10.0, 0.4, 1.05),
}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_each_layout_keeps_its_floor(arch):
    model = tiny.build_model(arch, seed=0)
    results = accuracy.measure(model, list(FLOORS), prompts=accuracy.PROMPTS[:2], text_windows=1,
                               tokenize=lambda text: accuracy.byte_tokens(text, model.config.vocab_size))
    assert_layout_floors(results, FLOORS)


def test_byte_tokens_need_a_byte_vocabulary():
    with pytest.raises(ValueError, match="at least 256"):
        accuracy.byte_tokens("x", 100)


def test_rescoring_a_quantized_lm_heads_candidates_from_bf16_picks_the_bf16_argmax_whenever_it_is_one():
    model = tiny.build_model("qwen3", seed=0)
    vocab = model.config.vocab_size
    found = accuracy.lm_head_candidates(model, ["int4", "int8"], prompts=accuracy.PROMPTS[:2], new_tokens=8,
                                        candidates=(1, 4, vocab),
                                        tokenize=lambda text: accuracy.byte_tokens(text, vocab))
    assert found["positions"] == 2 * 8 and found["vocab"] == vocab
    for name, result in found["layouts"].items():
        within = [result["within"][k] for k in (1, 4, vocab)]
        assert within == sorted(within) and within[-1] == 1.0, name
        assert result["within"][1] == result["greedy_agreement"], name
        assert 0 <= result["worst_rank"] < vocab
        for k, rescored in result["rescored"].items():
            # The pick is a candidate, exact: the BF16 one whenever it is among them, and never another.
            assert rescored["greedy_agreement"] == result["within"][k], (name, k)
            assert rescored["kl"] <= result["kl_plain"] + 1e-12, (name, k)
        # Every logit rescored: the BF16 head's own distribution (up to the sums' order).
        assert result["rescored"][vocab]["greedy_agreement"] == 1.0 and result["rescored"][vocab]["kl"] < 1e-9, name
    assert found["layouts"]["int4"]["kl_plain"] > found["layouts"]["int8"]["kl_plain"]


def test_lm_head_candidates_measure_weight_only_layouts():
    model = tiny.build_model("llama", seed=0)
    with pytest.raises(ValueError, match=r"int4_a8 quantizes the activations too; it measures weight-only"):
        accuracy.lm_head_candidates(model, ["int4_a8"], prompts=accuracy.PROMPTS[:1], new_tokens=2,
                                    tokenize=lambda text: accuracy.byte_tokens(text, model.config.vocab_size))
