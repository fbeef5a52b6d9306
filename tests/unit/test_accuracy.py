"""Each layout's model accuracy against BF16 row-major, held to a measured floor.

Floors measured on the seeded tiny models (random weights, 2 layers; accuracy.measure with its
prompts, 8 greedy steps and 2 windows of 128 byte tokens of the corpus) on this x86 VM, generic
provider: bf16 47 dB / 98-100 % / perplexity equal; int8 33-34 dB / 100 %; int4 12.6-13.2 dB,
greedy agreement 55-89 %. Random weights give near-flat logits, so a greedy pick flips on tiny
noise and perplexity sits near the vocabulary size: these floors catch a broken layout, they
do not say what int4 costs a trained model (run accuracy.measure on a real checkpoint for that).
"""

import math

import pytest

from sglang_rvv import accuracy, tiny

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
    print("\n".join(r.summary() for r in results))
    for result in results:
        min_db, min_agreement, max_ratio = FLOORS[result.weight_dtype]
        assert result.logits_sqnr_db >= min_db, result.summary()
        assert result.greedy_agreement >= min_agreement, result.summary()
        assert math.isfinite(result.perplexity) and result.perplexity <= max_ratio * result.reference_perplexity, \
            result.summary()
    # The layouts order as their bits do.
    by_layout = {r.weight_dtype: r.logits_sqnr_db for r in results}
    assert by_layout["bf16"] > by_layout["int8"] > by_layout["int4"]


def test_byte_tokens_need_a_byte_vocabulary():
    with pytest.raises(ValueError, match="at least 256"):
        accuracy.byte_tokens("x", 100)
