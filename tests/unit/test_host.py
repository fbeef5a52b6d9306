"""Host facts from cgroups and /proc: the CPUs and the memory this process may use."""

import os

import pytest

from sglang_rvv.host import Availability, available_memory, usable_cpus

GIB = 1024**3


def _tree(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "cgroup", tmp_path / "proc"


def _meminfo(gib):
    return f"MemTotal: 99999999 kB\nMemAvailable: {gib * 1024 * 1024} kB\n"


def test_cgroup_v2_limit_on_a_parent_wins(tmp_path):
    cgroup, proc = _tree(tmp_path, {
        "proc/meminfo": _meminfo(20),
        "proc/self/cgroup": "0::/machine/ctr\n",
        "cgroup/machine/ctr/memory.max": "max\n",
        "cgroup/machine/ctr/memory.current": str(1 * GIB),
        "cgroup/machine/memory.max": str(4 * GIB),
        "cgroup/machine/memory.current": str(3 * GIB),
    })
    got = available_memory(cgroup, proc)
    assert got.bytes == 1 * GIB and got.source == "cgroup v2 /machine"


def test_cgroup_v2_container_limit(tmp_path):
    cgroup, proc = _tree(tmp_path, {
        "proc/meminfo": _meminfo(20),
        "proc/self/cgroup": "0::/\n",
        "cgroup/memory.max": str(2 * GIB),
        "cgroup/memory.current": str(GIB // 2),
    })
    assert available_memory(cgroup, proc).bytes == GIB + GIB // 2


def test_cgroup_v1_limit_and_unlimited(tmp_path):
    cgroup, proc = _tree(tmp_path, {
        "proc/meminfo": _meminfo(20),
        "proc/self/cgroup": "4:memory:/docker/x\n",
        "cgroup/memory/memory.limit_in_bytes": str(3 * GIB),
        "cgroup/memory/memory.usage_in_bytes": str(1 * GIB),
    })
    assert available_memory(cgroup, proc) == Availability(2 * GIB, "cgroup v1 memory")
    (cgroup / "memory/memory.limit_in_bytes").write_text(str(9223372036854771712))
    assert available_memory(cgroup, proc) == Availability(20 * GIB, "MemAvailable")


def test_no_information_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="memory_budget_mib"):
        available_memory(tmp_path / "none", tmp_path / "none")


def test_usable_cpus_honours_the_cgroup_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert usable_cpus(tmp_path) == min(2, len(os.sched_getaffinity(0)))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path) == len(os.sched_getaffinity(0))
