"""How many bytes of packed weights this process may add.

The automatic budget is the memory really available to the process minus a
reserve. "Really available" is the smallest of:

* the host's ``MemAvailable`` (``/proc/meminfo``);
* for every cgroup v2 level from the process's own cgroup up to the root:
  ``memory.max - memory.current`` (a container's limit often sits on a parent);
* cgroup v1: ``memory.limit_in_bytes - memory.usage_in_bytes``.

The reserve is ``max(RESERVE_MIN_BYTES, RESERVE_FRACTION * available)``: room
for activations, the KV cache growth SGLang has not allocated yet, and the
allocator's slack. Projections that do not fit are skipped in priority order
(see :func:`plan_prefix`), and the model still starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
RESERVE_MIN_BYTES = 1024 * MIB
RESERVE_FRACTION = 0.10
_V1_UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a huge page-aligned number


@dataclass(frozen=True)
class Availability:
    bytes: int
    source: str  # which limit was the smallest, for the report


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def _meminfo_available(proc: Path) -> int | None:
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _own_cgroup_v2(proc: Path) -> str | None:
    try:
        for line in (proc / "self" / "cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        pass
    return None


def _cgroup_v2_headroom(cgroup_root: Path, proc: Path) -> list[tuple[int, str]]:
    own = _own_cgroup_v2(proc)
    if own is None:
        return []
    found = []
    level = Path(own)
    while True:
        directory = cgroup_root / str(level).lstrip("/")
        limit, current = _read_int(directory / "memory.max"), _read_int(directory / "memory.current")
        if limit is not None and current is not None:
            found.append((max(limit - current, 0), f"cgroup v2 {level}"))
        if level == level.parent:
            return found
        level = level.parent


def _cgroup_v1_headroom(cgroup_root: Path) -> list[tuple[int, str]]:
    directory = cgroup_root / "memory"
    limit = _read_int(directory / "memory.limit_in_bytes")
    usage = _read_int(directory / "memory.usage_in_bytes")
    if limit is None or usage is None or limit >= _V1_UNLIMITED:
        return []
    return [(max(limit - usage, 0), "cgroup v1 memory")]


def available_memory(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc")
) -> Availability:
    candidates = _cgroup_v2_headroom(cgroup_root, proc) + _cgroup_v1_headroom(cgroup_root)
    host = _meminfo_available(proc)
    if host is not None:
        candidates.append((host, "MemAvailable"))
    if not candidates:
        raise RuntimeError(
            "cannot tell how much memory is available (no /proc/meminfo, no cgroup "
            "limits); pass memory_budget_mib / --cpu-rvv-memory-budget-mib explicitly"
        )
    return Availability(*min(candidates))


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
