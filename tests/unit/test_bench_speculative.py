"""The speculative benchmark's comparison of two servers' greedy tokens (bench/speculative.py)."""

from __future__ import annotations

from sglang_rvv.bench import speculative


def _reply(ids, tops=None):
    return {"output_ids": ids, "top_logprobs": tops or [{str(t): -1.0} for t in ids]}


def test_the_first_difference_and_how_far_below_the_plain_pick_it_was():
    plain = _reply([5, 6, 7], [{"5": -0.1}, {"6": -1.0, "9": -1.25, "4": -3.0}, {"7": -0.2}])
    assert speculative.first_difference(_reply([5, 6, 7]), plain) is None
    assert speculative.first_difference(_reply([5, 9, 1]), plain) == {
        "step": 1, "pick": 9, "base_pick": 6, "gap_nats": 0.25}
    assert speculative.first_difference(_reply([5, 8]), plain)["gap_nats"] is None  # not in its top 5
    # One ended first (at its EOS) and the tokens before agree.
    assert speculative.first_difference(_reply([5, 6]), plain) == {"step": 2, "pick": None, "base_pick": None,
                                                                   "gap_nats": None}


def test_the_ngram_options_name_the_trie_depth():
    assert speculative.ngram_args(64) == ("--speculative-algorithm", "NGRAM", "--speculative-ngram-max-trie-depth",
                                          "64")
