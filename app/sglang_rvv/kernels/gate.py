"""The shape gate's thresholds: how large a projection must be for a provider's packed kernel to pay.

Each provider names its own (``GATE``); :mod:`sglang_rvv.routing` applies the chosen provider's.
"""

from __future__ import annotations

from typing import NamedTuple


class ShapeGate(NamedTuple):
    min_features: int  # N and K at least this
    min_work: int      # M * N * K at least this, per call


# The design notes' gate (N, K >= 1024, M*N*K >= 1e6): where the generic kernels pay on x86, whose
# alternative is oneDNN's F.linear (SmolLM2's 576-wide projections ran 1.1-3.8x slower packed).
SEED = ShapeGate(1024, 1_000_000)
# The rvv kernels' alternative is Debian's riscv64 torch built without V: a Qwen3-0.6B decode step
# took 13.3 G instructions through its F.linear against 157 M in the packed kernels (board.md), and
# the policy's eager call costs about 89 k. At N = K = 128 F.linear's scalar BF16 path already
# needs ~0.4 M, so every call from there up is cheaper packed, and small models (SmolLM2-135M:
# hidden 576) run the kernels in every projection.
RVV = ShapeGate(128, 0)
