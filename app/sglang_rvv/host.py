"""What the host lets this process have and what it is: every fact read from cgroups and /proc.

* the CPUs: :func:`usable_cpus` (affinity mask, capped by the cgroup CPU quota),
  :func:`cpu_model` and :func:`cpu_isa` (``/proc/cpuinfo``) and :func:`hwcap` (``AT_HWCAP``);
* the memory: :func:`available_memory` (``MemAvailable`` and every cgroup limit above the
  process), :func:`peak_rss_bytes` (``VmHWM``) and :func:`reset_peak_rss` (``clear_refs``).

The readers take their roots as arguments where the tests need a fake tree; the defaults are
the real ones. Standard library only: the container entrypoint reads these before torch.
"""

from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
_V1_UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a huge page-aligned number
AT_HWCAP = 16  # the auxiliary vector entry of the CPU capability bits


# -- CPUs ------------------------------------------------------------------------

def _cgroup_cpu_limit(root: Path) -> int | None:
    try:
        quota, period = (root / "cpu.max").read_text().split()  # cgroup v2
    except (OSError, ValueError):
        try:  # cgroup v1
            quota = (root / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (root / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None  # "max" / -1: no quota
    return -(-int(quota) // int(period))


def affinity() -> list[int]:
    """The CPUs this process may run on (its affinity mask), in order."""
    return sorted(os.sched_getaffinity(0))


def usable_cpus(cgroup_root: Path = CGROUP_ROOT) -> int:
    """CPUs in this process's affinity mask, capped by the cgroup CPU quota."""
    cpus = len(affinity())
    limit = _cgroup_cpu_limit(cgroup_root)
    return max(1, min(cpus, limit) if limit else cpus)


def cpu_model() -> str:
    """The CPU's name from /proc/cpuinfo ("model name" on x86, "isa"/"uarch" on RISC-V)."""
    try:
        text = (PROC / "cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    first_cpu = text.split("\n\n")[0]
    fields = dict(line.split(":", 1) for line in first_cpu.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    found = [fields[key] for key in ("model name", "isa", "uarch") if key in fields]
    return "; ".join(found) or platform.processor() or "unknown"


def cpu_isa() -> str | None:
    """The first ``isa`` line of /proc/cpuinfo (a riscv64 Linux kernel writes one per hart)."""
    try:
        with open(PROC / "cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "isa":
                    return value.strip()
    except OSError:
        pass
    return None


def hwcap() -> int | None:
    """AT_HWCAP from /proc/self/auxv (what the Linux kernel, or qemu-user, grants user space)."""
    try:
        data = (PROC / "self" / "auxv").read_bytes()
    except OSError:
        return None
    for key, value in struct.iter_unpack("=QQ", data[: len(data) // 16 * 16]):
        if key == AT_HWCAP:
            return value
    return None


# -- memory ----------------------------------------------------------------------

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


def available_memory(cgroup_root: Path = CGROUP_ROOT, proc: Path = PROC) -> Availability:
    """The memory really available to this process: the smallest of

    * the host's ``MemAvailable`` (``/proc/meminfo``);
    * for every cgroup v2 level from the process's own cgroup up to the root:
      ``memory.max - memory.current`` (a container's limit often sits on a parent);
    * cgroup v1: ``memory.limit_in_bytes - memory.usage_in_bytes``.
    """
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


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """A process's peak RSS (VmHWM), or None where the kernel does not report it."""
    status = (PROC / str(pid) / "status").read_text()
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), None)


def reset_peak_rss() -> None:
    """Start this process's VmHWM again from its current RSS (``clear_refs`` 5)."""
    (PROC / "self" / "clear_refs").write_text("5")
