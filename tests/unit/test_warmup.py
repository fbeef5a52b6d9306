"""Warm-up: every compiled key of a model before the first call."""

import logging
import re

import torch

from sglang_rvv import RvvPolicyConfig, install_rvv_policy, routing
from sglang_rvv.policy import policy_of
from sglang_rvv.warmup import inductor_cache_counts, warm_up
from support import packed_keys


def test_warm_up_compiles_every_bucket_and_later_calls_compile_nothing(llama, caplog):
    # Compiling is the subject here; the route table (test_route_table.py) would send buckets row-major.
    install_rvv_policy(llama, RvvPolicyConfig(measure_routes=False))
    policy = policy_of(llama)
    with caplog.at_level(logging.INFO, logger="sglang_rvv"):
        report = warm_up(policy)

    expected = {f"{p} m={m} {n}x{k} {routing.Mode.EXPLICIT_PACKED}" for p, m, n, k, *_ in packed_keys(policy)}
    assert len(expected) >= 20  # o/gate/up/down x 8 buckets minus the small-work ones
    assert expected <= set(report.keys)
    assert not policy.counters, "warm-up calls must not show up in the routing counters"
    assert "shape keys" in report.summary()
    # Progress on a long step: its first key and its last, each a line (a board's warm-up takes minutes).
    # (report.keys also holds keys that earlier tests in this process compiled: the callables are process-wide.)
    progress = [r.getMessage() for r in caplog.records if "warm-up:" in r.getMessage()]
    first = re.match(r"sglang_rvv: warm-up: 1/(\d+) keys compiled or loaded", progress[0])
    assert first and int(first.group(1)) >= len(expected), progress
    total = int(first.group(1))
    assert progress[-1].startswith(f"sglang_rvv: warm-up: {total}/{total} keys"), progress

    before = inductor_cache_counts()
    with torch.no_grad():
        for rows in (1, 3, 7, 16, 40, 128):
            llama(torch.randint(0, 2000, (1, rows)))
    assert inductor_cache_counts() == before, "a call after warm-up compiled or loaded an artifact"
    assert policy.counters.by_route().get(routing.Route.PACKED_COMPILED, 0) > 0


def test_warm_up_without_regional_compile_does_nothing(llama):
    install_rvv_policy(llama, RvvPolicyConfig(regional_compile=False))
    report = warm_up(policy_of(llama))
    assert report.keys == [] and report.compiled == 0
