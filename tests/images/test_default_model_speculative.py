"""NGRAM speculative decoding on the real default model: the plain server's greedy tokens, up to a
BF16 near-tie, and drafts accepted once the text has been seen (bench/speculative.py runs the
whole prompt set and prints the acceptance)."""

from __future__ import annotations

from sglang_rvv.bench import speculative

TOKENS = 48
# A verify step runs its drafts as rows of one batch (12 at once), a plain decode one row: the
# kernels round the BF16 logits of the same token apart by an ulp, which for SmolLM2's top
# logits (16 to 64) is up to 0.25 nats (README, "Speculative decoding", has the prompt set's).
TIE_NATS = 0.25 + 1e-3


def test_ngram_keeps_the_greedy_tokens_and_accepts_drafts_of_seen_text(default_checkpoint, tmp_path):
    texts = {name: speculative.chat_text(default_checkpoint, speculative.PROMPTS[name])
             for name in ("rewrite", "quote")}
    texts["rewrite, again"] = texts["rewrite"]  # its answer is in the NGRAM corpus now
    plain = speculative.serve_prompts(default_checkpoint, texts, TOKENS, log_path=tmp_path / "plain.log")
    ngram = speculative.serve_prompts(default_checkpoint, texts, TOKENS, speculative.ngram_args(),
                                      log_path=tmp_path / "ngram.log")
    for name in texts:
        assert plain[name]["verify_steps"] is None  # the plain server did not speculate
        assert ngram[name]["verify_steps"] <= ngram[name]["completion_tokens"], (name, ngram[name])
        diff = speculative.first_difference(ngram[name], plain[name])
        assert diff is None or (diff["gap_nats"] is not None and diff["gap_nats"] <= TIE_NATS), (name, diff)
    again = ngram["rewrite, again"]
    # Its own earlier answer drafts most of it: at least two new tokens a verify step.
    assert again["verify_steps"] * 2 <= again["completion_tokens"], again
