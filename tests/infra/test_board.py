"""The board is what the images and the benchmarks assume: riscv64 with RVV, 16 GB,
podman with a compose command, the tuning applied."""

from __future__ import annotations

import re

import pytest


def test_architecture_is_riscv64(target):
    target.require("board")
    assert target.host.system_info.arch == "riscv64"


def test_cpu_has_the_vector_extension(target):
    target.require("board")
    target.require_hardware("RVV (the V extension in /proc/cpuinfo's ISA string)")
    isa = re.search(r"^isa\s*:\s*(\S+)", target.host.file("/proc/cpuinfo").content_string, re.M)
    assert isa, "/proc/cpuinfo has no isa line"
    assert re.match(r"rv64[a-uw-z]*v", isa.group(1).split("_")[0]), f"no V in {isa.group(1)}"


def test_memory_is_a_16_gb_board(target):
    target.require("board")
    target.require_hardware("the 16 GB memory check")
    total_kib = int(re.search(r"MemTotal:\s+(\d+)", target.host.file("/proc/meminfo").content_string).group(1))
    assert total_kib / 2**20 >= 15, f"MemTotal {total_kib / 2**20:.1f} GiB"


def test_podman_and_its_compose_command(target):
    target.require("board")
    version = target.run_ok("podman --version").split()[-1]
    assert tuple(map(int, version.split(".")[:2])) >= (4, 3), version
    fact = target.local_fact("sglang_rvv_podman")
    assert fact["version"] == version
    expected = "podman compose" if tuple(map(int, version.split(".")[:2])) >= (4, 7) else "podman-compose"
    assert fact["compose"] == expected
    assert "podman-compose" in target.run_ok("podman-compose --version")
    conf = target.host.file("/etc/containers/containers.conf.d/50-sglang-rvv.conf")
    assert conf.exists and "default_ulimits" in conf.content_string


def test_cpufreq_governor_is_performance(target):
    target.require("board")
    target.require_hardware("the cpufreq governor (qemu-user has no cpufreq)")
    governors = target.run_ok("cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor").split()
    assert governors and set(governors) == {target.vars.get("board_tuning_governor", "performance")}


def test_server_thread_count_is_written(target):
    target.require("board")
    env = target.host.file(target.vars.get("sglang_rvv_env_file", "/etc/sglang-rvv/runtime.env")).content_string
    threads = int(re.search(r"^OMP_NUM_THREADS=(\d+)$", env, re.M).group(1))
    assert threads == int(target.vars.get("board_tuning_omp_threads", target.run_ok("nproc").strip()))


@pytest.mark.parametrize("path", ["/etc/ansible/facts.d", "/etc/sglang-rvv"])
def test_provisioned_files_are_root_owned(target, path):
    target.require("board")
    directory = target.host.file(path)
    assert directory.is_directory and directory.user == "root" and directory.mode == 0o755
