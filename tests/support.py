"""Helpers shared by the tests: numerics and process memory."""

from __future__ import annotations

import torch

# The app's own metric (the riscv64 smoke judges with it too), re-exported for the tests.
from sglang_rvv.smoke import MIN_SQNR_DB, sqnr_db

__all__ = ["MIN_SQNR_DB", "assert_bf16_close", "rss_bytes", "sqnr_db"]


def assert_bf16_close(actual: torch.Tensor, reference: torch.Tensor, min_db: float = MIN_SQNR_DB):
    assert actual.shape == reference.shape, (actual.shape, reference.shape)
    db = sqnr_db(actual, reference)
    assert db >= min_db, f"SQNR {db:.1f} dB below {min_db} dB"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
