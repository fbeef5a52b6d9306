"""Compile every shape key a model's projections can hit, before the first request.

Without it a server compiles a (projection, bucket, shape) key the first time
a request lands there, so early requests pay for Inductor. :func:`warm_up`
asks :func:`routing.decide` what each routed projection does at each bucket
and calls each compiled key once (on a zero input of the bucket's row count),
which compiles it, or loads it from the Inductor cache when a warm cache
holds it. The report counts both: on a warm cache ``compiled`` is 0. Keys
that a route table measured on this same stack sends row-major or to the eager
kernel are never compiled nor loaded: on a warm start that is most of them, and
loading each costs a Dynamo trace.

With ``measure_routes`` (the default) it then measures what the route table
(:mod:`sglang_rvv.route_table`) lacks: for each packed key, the compiled
callable is timed against row-major ``F.linear`` and against the eager packed
call on the module's own weights. The table decides, keeps the file up to date,
routes the buckets where packed does not win clearly row-major
(``row_major_measured``), and those where the eager call beat the compiled one
eager (``packed_eager``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from . import packed_state, routing
from .bodies import eager_call
from .policy import RvvPolicy
from .route_table import Choice, Entry, RouteTable

log = logging.getLogger("sglang_rvv")
# Timed rounds (one call per side) per key: up to MAX_ROUNDS while the rounds'
# undisturbed cost (fastest calls) stays under KEY_BUDGET_S, and at least
# MIN_ROUNDS, so one call the scheduler preempted for a few ms cannot decide
# alone, unless one round alone takes the budget: against such calls (a 1B
# model's lm_head at M=16 takes 0.2 s packed) a preemption is small.
MIN_ROUNDS, MAX_ROUNDS = 2, 8
KEY_BUDGET_S = 0.1
MEASURE_PASSES = 2
PROGRESS_SECONDS = 30


@dataclass
class WarmupReport:
    keys: list[str] = field(default_factory=list)  # shape keys compiled in this process
    compiled: int = 0    # Inductor compiles (FX graph cache misses)
    cache_hits: int = 0  # Inductor artifacts loaded from the cache
    seconds: float = 0.0
    # One entry per packed key: projection, bucket, out_features, in_features, layout, group,
    # packed_us, row_major_us, eager_us, route ("packed" | "eager" | "row_major"), source ("measured" | "cache").
    route_table: list[dict] = field(default_factory=list)
    route_table_seconds: float = 0.0  # part of ``seconds`` spent loading or measuring the table
    skipped_row_major: int = 0  # packed keys a cached route table sends row-major: not compiled, not loaded
    skipped_eager: int = 0  # ... and those it sends to the eager kernel
    packed_not_compiled: str | None = None  # why no packed key is compiled (the provider's native ops)

    def summary(self) -> str:
        text = (
            f"sglang_rvv: warm-up: {len(self.keys)} shape keys in {self.seconds:.1f} s, "
            f"{self.compiled} Inductor compiles, {self.cache_hits} cache hits"
        )
        if self.packed_not_compiled:
            text += f" (packed calls not compiled: {self.packed_not_compiled})"
        if self.skipped_row_major or self.skipped_eager:
            text += (f" ({self.skipped_row_major} more keys routed row-major and {self.skipped_eager} eager by the "
                     "cached route table, not loaded)")
        if self.route_table:
            row_major = sum(entry["route"] == Choice.ROW_MAJOR for entry in self.route_table)
            eager = sum(entry["route"] == Choice.EAGER for entry in self.route_table)
            measured = sum(entry["source"] == "measured" for entry in self.route_table)
            text += (
                f"; route table: {row_major} of {len(self.route_table)} buckets row-major, {eager} eager "
                f"({measured} measured, {len(self.route_table) - measured} from the cache, "
                f"{self.route_table_seconds:.1f} s)"
            )
        return text


def inductor_cache_counts() -> tuple[int, int]:
    """(compiles, cache hits) of Inductor's FX graph cache in this process so far."""
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return inductor["fxgraph_cache_miss"], inductor["fxgraph_cache_hit"]


class Progress:
    """One log line per stretch of a long warm-up step: after its first item, then at most every
    PROGRESS_SECONDS, and at its end. A board compiles each key natively, and under qemu a warm-up
    of 30 layers runs for many minutes: a log that stays silent that long looks hung."""

    def __init__(self, what: str, total: int):
        self.what, self.total = what, total
        self.done, self.began = 0, time.perf_counter()
        self.said = -math.inf

    def step(self) -> None:
        self.done += 1
        now = time.perf_counter()
        if self.done == 1 or self.done == self.total or now - self.said >= PROGRESS_SECONDS:
            self.said = now
            log.info("sglang_rvv: warm-up: %d/%d %s, %.0f s", self.done, self.total, self.what, now - self.began)


def format_key(key: routing.RegionalShapeKey) -> str:
    text = f"{key.projection} m={key.rows} {key.out_features}x{key.in_features} {key.mode}"
    return text if key.layout == "bf16" else f"{text} {key.layout} g{key.group}"


def measure_key(key: routing.RegionalShapeKey, modules: Sequence[torch.nn.Module],
                packed_fn: Callable) -> tuple[float, float, float]:
    """(packed µs, row-major µs, eager µs) of one call at ``key``'s bucket on ``modules``' weights.

    ``packed_fn`` is ``key``'s compiled callable; eager is the call the eager packed
    route makes (:func:`bodies.eager_call`). Every side runs the bucket's full row
    count, the work a routed call does. Each gets one untimed call (one-time setup
    such as oneDNN primitive creation), then they alternate, so load from elsewhere
    on the machine hits all alike; the fastest call of each side counts, as such
    load only ever adds time. Timed calls rotate through the weights of every module
    of the shape, so a model larger than the cache streams them as in serving.
    """
    x = modules[0].weight.new_ones(key.rows, key.in_features)
    packed = [packed_state.valid_packed(module, module.weight) for module in modules]
    weights = [module.weight for module in modules]
    eager_fn, tail = eager_call(key.layout, key.out_features, key.in_features)
    sides = (
        lambda i: packed_fn(x, *packed[i % len(packed)], key.out_features),
        lambda i: F.linear(x, weights[i % len(weights)]),
        lambda i: eager_fn(x, *packed[i % len(packed)], *tail),
    )
    for side in sides:
        side(0)
    best = [math.inf] * len(sides)
    for i in range(1, MAX_ROUNDS + 1):
        for index, side in enumerate(sides):
            start = time.perf_counter()
            side(i)
            best[index] = min(best[index], time.perf_counter() - start)
        if sum(best) >= KEY_BUDGET_S or (i >= MIN_ROUNDS and i * sum(best) >= KEY_BUDGET_S):
            break
    return best[0] * 1e6, best[1] * 1e6, best[2] * 1e6


def _compile_every_key(policy: RvvPolicy) -> dict[routing.RegionalShapeKey, list[torch.nn.Module]]:
    """Compile every key the routes of ``policy`` can reach; returns the packed keys, each with its modules.

    A key the context's route table sends row-major is returned too, but neither compiled nor loaded.
    """
    context = policy.context
    groups: dict[tuple, list[tuple[torch.nn.Module, routing.ModuleRoute]]] = {}
    for module, route in policy.routes():
        if route.status in (routing.Status.PACKED, routing.Status.ROW_MAJOR_ONLY):
            weight = module.weight
            groups.setdefault((route.projection, route.status, *weight.shape, weight.dtype, route.record.layout),
                              []).append((module, route))
    packed_keys, calls = {}, []
    for members in groups.values():
        module, route = members[0]
        weight = module.weight
        status, packed = route.current_status(module, weight)
        for rows in routing.buckets_for(route.projection, small_batch=context.config.small_batch):
            x = weight.new_zeros(rows, weight.shape[-1])
            decision = routing.decide(route.projection, rows, status, context.config, context.table,
                                      weight_shape=weight.shape, servable=routing.can_serve(x, weight),
                                      packed_layout=route.record.layout)
            if decision.key is None:  # the gate (small M*N*K), or a buffer gone since the plan
                continue
            if decision.route not in (routing.Route.ROW_MAJOR_MEASURED, routing.Route.PACKED_EAGER):
                operands = packed if decision.key.mode == routing.Mode.EXPLICIT_PACKED else (weight,)
                calls.append((decision.key, x, operands))
            if decision.key.mode == routing.Mode.EXPLICIT_PACKED:
                packed_keys[decision.key] = [m for m, _ in members]
    progress = Progress("keys compiled or loaded from the Inductor cache", len(calls))
    for key, x, operands in calls:
        context.compiled.get(key)(x, *operands, key.out_features)
        progress.step()
    return packed_keys


def _measure(policy: RvvPolicy, packed_keys: dict[routing.RegionalShapeKey, list[torch.nn.Module]],
             keys: list[routing.RegionalShapeKey]) -> list[Entry]:
    """An entry for each of ``keys``, each side its fastest over MEASURE_PASSES passes over them all.

    A burst of other work (a server's other processes starting, on 2 cores) then has to hit
    the same key in every pass, seconds apart, to decide it.
    """
    best: dict[routing.RegionalShapeKey, tuple[float, float]] = {}
    progress = Progress(f"route table timings ({len(keys)} keys x {MEASURE_PASSES} passes: compiled, eager, "
                        "F.linear)", MEASURE_PASSES * len(keys))
    for _ in range(MEASURE_PASSES):
        for key in keys:
            timings = measure_key(key, packed_keys[key], policy.context.compiled.get(key))
            best[key] = tuple(map(min, zip(best.get(key, timings), timings, strict=True)))
            progress.step()
    return [Entry.measured(key.shape, *timings) for key, timings in best.items()]


def _store(table_dir: Path, table: RouteTable) -> None:
    try:
        table.store(table_dir)
    except OSError as error:
        log.warning("sglang_rvv: could not write the route table to %s (%s); the next start measures again",
                    table_dir, error)


def _route_table(policy: RvvPolicy, packed_keys: dict[routing.RegionalShapeKey, list[torch.nn.Module]],
                 table_dir: Path, stored: RouteTable) -> list[dict]:
    """One entry per packed key: from the stored table when it matches this stack, else measured."""
    measured = _measure(policy, packed_keys, [key for key in packed_keys if key.shape not in stored])
    # Entries of other models' shapes stay in the file for them.
    known = stored.updated(measured)
    if measured:
        _store(table_dir, known)
    policy.context.table = known.only(key.shape for key in packed_keys)
    fresh = {entry.shape for entry in measured}
    return [{**entry.to_dict(), "source": "measured" if entry.shape in fresh else "cache"}
            for entry in policy.context.table.entries()]


def warm_up(policy: RvvPolicy, *, table_dir: str | os.PathLike | None = None) -> WarmupReport:
    """Compile each key of ``policy``'s model once, then build the route table.

    ``table_dir`` is where the route table is kept, by default the Inductor
    cache directory. Call counters are left as they are: the warm-up decides
    the way a call does, but makes none.
    """
    report = WarmupReport()
    context = policy.context
    if not context.config.regional_compile:
        return report
    compile_packed = routing.compile_packed()
    if not compile_packed:
        report.packed_not_compiled = (f"provider {routing.chosen()[0].NAME}: each is one native op, called as it is "
                                      "(compiling would only wrap it)")
    compiles, hits = inductor_cache_counts()
    start = time.perf_counter()
    stored = RouteTable()
    # The table holds packed keys only: with none compiled there is nothing to read or measure.
    if context.config.measure_routes and compile_packed:
        if table_dir is None:
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            table_dir = cache_dir()
        stored, rejected = RouteTable.load(table_dir)
        if rejected:
            log.warning("sglang_rvv: route table ignored, measuring again: %s", rejected)
    # A table measured on this very stack routes some keys row-major or eager: those are never
    # called compiled, so they are neither compiled nor loaded (on a warm start most of the keys).
    # Without such a table every key is compiled, so a re-measure never compiles cold.
    context.table = stored
    # no_grad, as SGLang's scheduler and HF generate run: Dynamo guards on grad mode.
    with torch.no_grad():
        packed_keys = _compile_every_key(policy)
        report.skipped_row_major = sum(context.table.sends_row_major(key.shape) for key in packed_keys)
        report.skipped_eager = sum(context.table.sends_eager(key.shape) for key in packed_keys)
        if context.config.measure_routes and packed_keys:
            table_start = time.perf_counter()
            report.route_table = _route_table(policy, packed_keys, Path(table_dir), stored)
            report.route_table_seconds = time.perf_counter() - table_start
    report.seconds = time.perf_counter() - start
    report.keys = sorted(format_key(key) for key in context.compiled.keys())
    new_compiles, new_hits = inductor_cache_counts()
    report.compiled, report.cache_hits = new_compiles - compiles, new_hits - hits
    return report
