"""The suite's Hugging Face generate step: where greedy outputs part (the measured step is
tests/e2e/test_bench_hf_generate.py)."""

from __future__ import annotations

import pytest

from sglang_rvv.bench import hf_generate


def test_first_difference_names_the_step_and_row_majors_gap_against_the_near_tie_tolerance():
    import torch

    logits = [torch.tensor([0.0, 4.0, 1.0]), torch.tensor([3.0, 0.5, 2.97]), torch.tensor([1.0, 2.0, 0.0])]
    assert hf_generate.first_difference([1, 0, 1], logits, [1, 0, 1]) is None
    tie = hf_generate.first_difference([1, 0, 1], logits, [1, 2, 0])
    assert tie["step"] == 1 and tie["logit_gap"] == pytest.approx(0.03) and tie["near_tie"]
    assert tie["near_tie_tolerance"] == pytest.approx(3.0 / 64)
    past = hf_generate.first_difference([1, 0, 1], logits, [2, 0, 1])
    assert past["step"] == 0 and past["logit_gap"] == pytest.approx(3.0) and not past["near_tie"]
