"""Compile every shape key a model's projections can hit, before the first request.

Without it a server compiles a (projection, bucket, shape) key the first time
a request lands there, so early requests pay for Inductor. :func:`warm_up`
calls each routed projection once per bucket (a zero input of the bucket's
row count), which compiles each key, or loads it from the Inductor cache when
a warm cache holds it. The report counts both: on a warm cache ``compiled`` is
0. Keys that a route table measured on this same stack sends row-major are
called through ``F.linear`` instead, never compiled nor loaded: on a warm
start that is most of them, and loading each costs a Dynamo trace.

With ``measure_routes`` (the default) it then builds the route table: for each
packed key, the compiled callable is timed against row-major ``F.linear`` on
the module's own weights, and buckets where packed does not win clearly are
routed row-major (``row_major_measured``). Timings belong to one machine, so
the table is kept in the Inductor cache directory with the stack it was
measured on (:func:`sglang_rvv.inductor_cache.read_route_table`) and is only
reloaded where that stack matches; anything else is measured again.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from . import inductor_cache, packed_state, routing
from .policy import RvvPolicy

log = logging.getLogger("sglang_rvv")
# Routes whose calls go through a compiled callable.
_COMPILED_STATUSES = (routing.PACKED, routing.ROW_MAJOR_ONLY)
# Packed keeps a bucket only when at least 15 % faster; anything closer goes to
# F.linear, the framework's own path, which needs no padding. The table is
# measured in one process, at its start, and the generic packed kernel's speed
# varied more than that between processes on the 2-core CI VM (gate_up at M=2,
# identical inputs: 2.8 ms in one process, 4.1 ms in another, F.linear 3.2-3.4
# ms); with a 5 % margin such a near-tie was kept packed at a server start and
# then made that server's M=2 decode steps slower.
PACKED_MARGIN = 0.85
# Timed rounds (one call per side) per key: up to MAX_ROUNDS while the rounds'
# undisturbed cost (fastest calls) stays under KEY_BUDGET_S, and at least
# MIN_ROUNDS, so one call the scheduler preempted for a few ms cannot decide
# alone, unless one round alone takes the budget: against such calls (a 1B
# model's lm_head at M=16 takes 0.2 s packed) a preemption is small.
MIN_ROUNDS, MAX_ROUNDS = 2, 8
KEY_BUDGET_S = 0.1
MEASURE_PASSES = 2
_ID_FIELDS = inductor_cache.ROUTE_TABLE_FIELDS[:4]  # projection, bucket, out_features, in_features


@dataclass
class WarmupReport:
    keys: list[str] = field(default_factory=list)  # shape keys compiled in this process
    compiled: int = 0    # Inductor compiles (FX graph cache misses)
    cache_hits: int = 0  # Inductor artifacts loaded from the cache
    seconds: float = 0.0
    # One entry per packed key: projection, bucket, out_features, in_features,
    # packed_us, row_major_us, route ("packed" | "row_major"), source ("measured" | "cache").
    route_table: list[dict] = field(default_factory=list)
    route_table_seconds: float = 0.0  # part of ``seconds`` spent loading or measuring the table
    skipped_row_major: int = 0  # packed keys a cached route table sends row-major: not compiled, not loaded

    def summary(self) -> str:
        text = (
            f"sglang_rvv: warm-up: {len(self.keys)} shape keys in {self.seconds:.1f} s, "
            f"{self.compiled} Inductor compiles, {self.cache_hits} cache hits"
        )
        if self.skipped_row_major:
            text += f" ({self.skipped_row_major} more keys routed row-major by the cached route table, not loaded)"
        if self.route_table:
            row_major = sum(entry["route"] == "row_major" for entry in self.route_table)
            measured = sum(entry["source"] == "measured" for entry in self.route_table)
            text += (
                f"; route table: {row_major} of {len(self.route_table)} buckets row-major "
                f"({measured} measured, {len(self.route_table) - measured} from the cache, "
                f"{self.route_table_seconds:.1f} s)"
            )
        return text


def inductor_cache_counts() -> tuple[int, int]:
    """(compiles, cache hits) of Inductor's FX graph cache in this process so far."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return inductor["fxgraph_cache_miss"], inductor["fxgraph_cache_hit"]


def format_key(key: routing.RegionalShapeKey) -> str:
    return f"{key.projection} m={key.rows} {key.out_features}x{key.in_features} {key.mode}"


def choose_route(packed_us: float, row_major_us: float) -> str:
    return "packed" if packed_us < row_major_us * PACKED_MARGIN else "row_major"


def measure_key(key: routing.RegionalShapeKey, modules: Sequence[torch.nn.Module]) -> tuple[float, float]:
    """(packed µs, row-major µs) of one call at ``key``'s bucket on ``modules``' weights.

    Both sides run the bucket's full row count, the work a routed call does.
    Each gets one untimed call (one-time setup such as oneDNN primitive
    creation), then they alternate, so load from elsewhere on the machine hits
    both alike; the fastest call of each side counts, as such load only ever
    adds time. Timed calls rotate through the weights of every module of the
    shape, so a model larger than the cache streams them as in serving.
    """
    x = modules[0].weight.new_ones(key.rows, key.in_features)
    packed_fn = routing.compiled_callable(key)
    packed = [packed_state.valid_packed(module, module.weight) for module in modules]
    weights = [module.weight for module in modules]
    sides = (
        lambda i: packed_fn(x, packed[i % len(packed)], key.out_features),
        lambda i: F.linear(x, weights[i % len(weights)]),
    )
    for side in sides:
        side(0)
    best = [math.inf, math.inf]
    for i in range(1, MAX_ROUNDS + 1):
        for index, side in enumerate(sides):
            start = time.perf_counter()
            side(i)
            best[index] = min(best[index], time.perf_counter() - start)
        if sum(best) >= KEY_BUDGET_S or (i >= MIN_ROUNDS and i * sum(best) >= KEY_BUDGET_S):
            break
    return best[0] * 1e6, best[1] * 1e6


def _key_id(key: routing.RegionalShapeKey) -> tuple:
    return key.projection, key.rows, key.out_features, key.in_features


def _entry_id(entry: dict) -> tuple:
    return tuple(entry[name] for name in _ID_FIELDS)


def _compile_every_key(policy: RvvPolicy) -> dict[routing.RegionalShapeKey, list[torch.nn.Module]]:
    """Call every compiled route once per bucket; returns the packed keys hit, each with its modules.

    A key already in ``policy.measured_row_major`` (a cached table routes it row-major) is
    called too, so it is returned, but runs F.linear and is neither compiled nor loaded.
    """
    groups: dict[tuple, list[tuple[torch.nn.Module, routing.ModuleRoute]]] = {}
    for module, route in policy.routes():
        if route.status in _COMPILED_STATUSES:
            weight = module.weight
            groups.setdefault((route.projection, route.status, *weight.shape, weight.dtype), []).append(
                (module, route))
    packed_keys = {}
    for (projection, _status, n, k, dtype), members in groups.items():
        module, route = members[0]
        weight = module.weight
        for rows in routing.buckets_for(projection, small_batch=policy.config.small_batch):
            counted = [(projection, route_name, str(rows))
                       for route_name in (routing.PACKED_COMPILED, routing.ROW_MAJOR_MEASURED)]
            before = sum(policy.counters[c] for c in counted)
            route(module, weight.new_zeros(rows, k), weight)
            # Only a call the gate let through reached a packed key (small M*N*K stays row-major).
            if sum(policy.counters[c] for c in counted) > before:
                key = routing.RegionalShapeKey(dtype, "cpu", projection, rows, n, k, routing.EXPLICIT_PACKED)
                packed_keys[key] = [m for m, _ in members]
    return packed_keys


def _store(table_dir: Path, entries: list[dict]) -> None:
    try:
        inductor_cache.write_route_table(table_dir, entries)
    except OSError as error:
        log.warning("sglang_rvv: could not write the route table to %s (%s); the next start measures again",
                    table_dir, error)


def _stored_row_major(stored: list[dict]) -> set[routing.RegionalShapeKey]:
    """The packed keys a stored table (already checked against this stack) routes row-major."""
    # The gate lets only bfloat16 inputs reach a packed key.
    return {routing.RegionalShapeKey(torch.bfloat16, "cpu", entry["projection"], entry["bucket"], entry["out_features"],
                                     entry["in_features"], routing.EXPLICIT_PACKED)
            for entry in stored if entry["route"] == "row_major"}


def _route_table(
    policy: RvvPolicy, packed_keys: dict[routing.RegionalShapeKey, list[torch.nn.Module]], table_dir: Path,
    stored: list[dict],
) -> list[dict]:
    """One entry per packed key: from the stored table when it matches this stack, else measured."""
    # Entries of other models' shapes stay in the file for them.
    known = {_entry_id(entry): entry for entry in stored}
    missing = [key for key in packed_keys if _key_id(key) not in known]
    # MEASURE_PASSES passes over all missing keys, keeping each side's fastest: a burst of
    # other work (a server's other processes starting, on 2 cores) then has to hit the same
    # key in every pass, seconds apart, to decide it.
    best: dict[routing.RegionalShapeKey, tuple[float, float]] = {}
    for _ in range(MEASURE_PASSES):
        for key in missing:
            timings = measure_key(key, packed_keys[key])
            best[key] = tuple(map(min, zip(best.get(key, timings), timings, strict=True)))
    for key, (packed_us, row_major_us) in best.items():
        # Decided on the rounded numbers, so the stored entry shows its own reason.
        packed_us, row_major_us = round(packed_us, 1), round(row_major_us, 1)
        known[_key_id(key)] = dict(zip(_ID_FIELDS, _key_id(key), strict=True), packed_us=packed_us,
                                   row_major_us=row_major_us, route=choose_route(packed_us, row_major_us))
    table = [{**known[_key_id(key)], "source": "measured" if key in best else "cache"} for key in packed_keys]
    if any(entry["source"] == "measured" for entry in table):
        _store(table_dir, list(known.values()))
    policy.measured_row_major = {
        key for key, entry in zip(packed_keys, table, strict=True) if entry["route"] == "row_major"
    }
    return table


def warm_up(policy: RvvPolicy, *, table_dir: str | os.PathLike | None = None) -> WarmupReport:
    """Run each compiled route of ``policy``'s model once per bucket, then build the route table.

    ``table_dir`` is where the route table is kept, by default the Inductor
    cache directory. Call counters are left as they were.
    """
    report = WarmupReport()
    if not policy.config.regional_compile:
        return report
    compiles, hits = inductor_cache_counts()
    saved = policy.counters.copy()
    start = time.perf_counter()
    stored: list[dict] = []
    if policy.config.measure_routes:
        if table_dir is None:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            table_dir = cache_dir()
        stored, rejected = inductor_cache.read_route_table(table_dir)
        if rejected:
            log.warning("sglang_rvv: route table ignored, measuring again: %s", rejected)
        # The stored times are the measurement; the stored route is only what the margin of the
        # writing version made of them. Decided again here, so a margin change reaches old caches.
        stored = [{**entry, "route": choose_route(entry["packed_us"], entry["row_major_us"])} for entry in stored]
    # A table measured on this very stack routes some keys row-major: those are never called
    # compiled, so they are neither compiled nor loaded (on a warm start most of the keys).
    # Without such a table every key is compiled, so a re-measure never compiles cold.
    policy.measured_row_major = _stored_row_major(stored)
    # no_grad, as SGLang's scheduler and HF generate run: Dynamo guards on grad mode.
    with torch.no_grad():
        packed_keys = _compile_every_key(policy)
        report.skipped_row_major = sum(key in policy.measured_row_major for key in packed_keys)
        if policy.config.measure_routes and packed_keys:
            table_start = time.perf_counter()
            report.route_table = _route_table(policy, packed_keys, Path(table_dir), stored)
            report.route_table_seconds = time.perf_counter() - table_start
    policy.counters.clear()
    policy.counters.update(saved)
    report.seconds = time.perf_counter() - start
    report.keys = sorted(format_key(key) for key in routing.compiled_keys())
    new_compiles, new_hits = inductor_cache_counts()
    report.compiled, report.cache_hits = new_compiles - compiles, new_hits - hits
    return report
