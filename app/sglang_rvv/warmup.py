"""Compile every shape key a model's projections can hit, before the first request.

Without it a server compiles a (projection, bucket, shape) key the first time
a request lands there, so early requests pay for Inductor. :func:`warm_up`
calls each routed projection once per bucket with zero rows, which compiles
each key, or loads it from the Inductor cache when a warm cache holds it. The
report counts both: on a warm cache ``compiled`` is 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from . import routing
from .policy import RvvPolicy

# Routes whose calls go through a compiled callable.
_COMPILED_STATUSES = (routing.PACKED, routing.ROW_MAJOR_ONLY)


@dataclass
class WarmupReport:
    keys: list[str] = field(default_factory=list)  # shape keys compiled in this process
    compiled: int = 0    # Inductor compiles (FX graph cache misses)
    cache_hits: int = 0  # Inductor artifacts loaded from the cache
    seconds: float = 0.0

    def summary(self) -> str:
        return (
            f"sglang_rvv: warm-up: {len(self.keys)} shape keys in {self.seconds:.1f} s, "
            f"{self.compiled} Inductor compiles, {self.cache_hits} cache hits"
        )


def inductor_cache_counts() -> tuple[int, int]:
    """(compiles, cache hits) of Inductor's FX graph cache in this process so far."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return inductor["fxgraph_cache_miss"], inductor["fxgraph_cache_hit"]


def format_key(key: routing.RegionalShapeKey) -> str:
    return f"{key.projection} m={key.rows} {key.out_features}x{key.in_features} {key.mode}"


def warm_up(policy: RvvPolicy) -> WarmupReport:
    """Run each compiled route of ``policy``'s model once per bucket; call counters are left as they were."""
    report = WarmupReport()
    if not policy.config.regional_compile:
        return report
    compiles, hits = inductor_cache_counts()
    saved = policy.counters.copy()
    start = time.perf_counter()
    done: set[tuple] = set()
    # no_grad, as SGLang's scheduler and HF generate run: Dynamo guards on grad mode.
    with torch.no_grad():
        for module, route in policy.routes():
            if route.status not in _COMPILED_STATUSES:
                continue
            weight = module.weight
            for rows in routing.buckets_for(route.projection, small_batch=policy.config.small_batch):
                shape = (route.projection, route.status, rows, *weight.shape, weight.dtype)
                if shape not in done:
                    done.add(shape)
                    route(module, weight.new_zeros(rows, weight.shape[1]), weight)
    policy.counters.clear()
    policy.counters.update(saved)
    report.seconds = time.perf_counter() - start
    report.keys = sorted(format_key(key) for key in routing.compiled_keys())
    new_compiles, new_hits = inductor_cache_counts()
    report.compiled, report.cache_hits = new_compiles - compiles, new_hits - hits
    return report
