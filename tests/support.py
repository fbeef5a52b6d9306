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


def packed_keys(policy) -> set[tuple[str, int, int, int]]:
    """(projection, bucket, N, K) of every packed shape key ``policy`` can hit (the gate's MIN_WORK applied)."""
    from sglang_rvv import routing

    keys = set()
    for module, route in policy.routes():
        if route.status != routing.PACKED:
            continue
        n, k = module.weight.shape
        for rows in routing.buckets_for(route.projection, small_batch=policy.config.small_batch):
            if rows * n * k >= routing.MIN_WORK:
                keys.add((route.projection, rows, n, k))
    return keys
