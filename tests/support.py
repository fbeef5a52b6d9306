"""Helpers shared by the tests: numerics and process memory."""

from __future__ import annotations

import torch

# bf16 keeps 8 bits of mantissa: one rounding of the output alone costs ~48 dB.
MIN_SQNR_DB = 35.0


def sqnr_db(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """Signal-to-quantisation-noise ratio of ``actual`` against a high-precision reference."""
    reference = reference.double()
    noise = (actual.double() - reference).norm()
    if noise == 0:
        return float("inf")
    return float(20 * torch.log10(reference.norm() / noise))


def assert_bf16_close(actual: torch.Tensor, reference: torch.Tensor, min_db: float = MIN_SQNR_DB):
    assert actual.shape == reference.shape, (actual.shape, reference.shape)
    db = sqnr_db(actual, reference)
    assert db >= min_db, f"SQNR {db:.1f} dB below {min_db} dB"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
