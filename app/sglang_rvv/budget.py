"""How many bytes of packed weights this process may add.

The automatic budget is the memory really available to the process
(:func:`sglang_rvv.host.available_memory`: ``MemAvailable`` and every cgroup
limit above the process) minus a reserve.

The reserve is ``max(RESERVE_MIN_BYTES, RESERVE_FRACTION * available)``: room
for activations, the KV cache growth SGLang has not allocated yet, and the
allocator's slack. Projections that do not fit are skipped in priority order
(see :func:`plan_prefix`), and the model still starts.
"""

from __future__ import annotations

MIB = 1024 * 1024
RESERVE_MIN_BYTES = 1024 * MIB
RESERVE_FRACTION = 0.10


def auto_budget_bytes(available: int) -> int:
    return max(available - max(RESERVE_MIN_BYTES, int(RESERVE_FRACTION * available)), 0)


def plan_prefix(sizes: list[int], budget: int) -> int:
    """How many leading candidates fit in ``budget``.

    Candidates come in priority order; the plan is a strict prefix, so the
    first one that does not fit ends it (a budget change never reshuffles
    which projections are packed, it only moves the cut).
    """
    used = 0
    for count, size in enumerate(sizes):
        if used + size > budget:
            return count
        used += size
    return len(sizes)
