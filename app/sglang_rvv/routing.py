"""Which kernel serves a Linear call: buckets, the shape gate, shape keys.

Every routed projection call lands in :meth:`ModuleRoute.__call__`. It maps the
flattened row count M to a bucket, checks the gate, and runs either a packed
callable for the bucket (zero-padding M up to the bucket, slicing after) or
row-major ``F.linear``, which also serves the buckets where the warm-up's
measured route table found the packed callable slower (see
:mod:`sglang_rvv.warmup`). Each call is counted by (projection, route, bucket).
"""

from __future__ import annotations

import types
import weakref
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from . import packed_state
from .ops import packed_bf16_linear

if TYPE_CHECKING:
    from .config import RvvPolicyConfig

# Where a routed module keeps its ModuleRoute (in its __dict__: not a submodule, not state).
ROUTE_ATTR = "_sglang_rvv_route"
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
MIN_FEATURES = 1024
MIN_WORK = 1_000_000  # M * N * K below this is not worth a kernel switch
SMALL_BATCH_BUCKETS = (2, 4, 8, 16)
PREFILL_BUCKETS = (16, 32, 64, 128)

PACKED_COMPILED = "packed_compiled"
PACKED_EAGER = "packed_eager"
ROW_MAJOR_COMPILED = "row_major_compiled"  # regional compile with packing off
ROW_MAJOR_GATE = "row_major_gate"
ROW_MAJOR_INVALID = "row_major_invalid"
ROW_MAJOR_BUDGET = "row_major_budget"
ROW_MAJOR_MEASURED = "row_major_measured"  # the measured route table found packed slower here
ROUTES = (
    PACKED_COMPILED, PACKED_EAGER, ROW_MAJOR_COMPILED,
    ROW_MAJOR_GATE, ROW_MAJOR_INVALID, ROW_MAJOR_BUDGET, ROW_MAJOR_MEASURED,
)
NO_BUCKET = "none"

EXPLICIT_PACKED = "explicit_packed"
ROW_MAJOR = "row_major"


def bucket_rows(rows: int, *, small_batch: bool, projection: str) -> int | None:
    """The compiled row count that serves ``rows``, or ``None`` for row-major.

    1 -> 1; with small_batch 2..15 -> 2/4/8/16; 16..128 -> 16/32/64/128 except
    for lm_head (prefill logits are computed for the last token only, so large
    M there is rare and not worth artifacts).
    """
    if rows == 1:
        return 1
    if small_batch and 2 <= rows <= SMALL_BATCH_BUCKETS[-1]:
        return next(b for b in SMALL_BATCH_BUCKETS if rows <= b)
    if projection != "lm_head" and PREFILL_BUCKETS[0] <= rows <= PREFILL_BUCKETS[-1]:
        return next(b for b in PREFILL_BUCKETS if rows <= b)
    return None


def buckets_for(projection: str, *, small_batch: bool) -> tuple[int, ...]:
    """Every bucket :func:`bucket_rows` can map a call of ``projection`` to, ascending."""
    buckets = {1}
    if small_batch:
        buckets.update(SMALL_BATCH_BUCKETS)
    if projection != "lm_head":
        buckets.update(PREFILL_BUCKETS)
    return tuple(sorted(buckets))


def static_gate(projection: str, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """Why a projection can never take the packed route, or ``None`` if it can."""
    if projection not in PROJECTIONS:
        return f"gate: projection {projection!r} is not one of {PROJECTIONS}"
    if weight.device.type != "cpu":
        return f"gate: weight on {weight.device.type}, needs cpu"
    if weight.dtype != torch.bfloat16:
        return f"gate: weight dtype {weight.dtype}, needs torch.bfloat16"
    if weight.dim() != 2:
        return f"gate: weight rank {weight.dim()}, needs 2"
    if bias is not None:
        return "gate: has a bias"
    out_features, in_features = weight.shape
    if out_features < MIN_FEATURES or in_features < MIN_FEATURES:
        return f"gate: [N={out_features}, K={in_features}] below the {MIN_FEATURES} minimum"
    return None


class RegionalShapeKey(NamedTuple):
    dtype: torch.dtype
    device_type: str
    projection: str
    rows: int
    out_features: int
    in_features: int
    mode: str


def _packed_rows(input: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    return packed_bf16_linear(input, packed, out_features)


def _row_major_rows(input: torch.Tensor, weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return F.linear(input, weight)


# Process-wide: a key fully determines the artifact, so models and policies share them.
_COMPILED: dict[RegionalShapeKey, Callable] = {}


def _own_code(template: Callable, name: str) -> Callable:
    """A copy of ``template`` with a code object of its own.

    Dynamo keeps one cache, with its recompile limit, per code object. Sharing
    one across keys would make every call walk all keys' guards, and would hit
    the limit once enough keys (or grad/inference-mode variants) pile up.
    """
    code = template.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, template.__globals__, name, template.__defaults__)


def compiled_callable(key: RegionalShapeKey) -> Callable:
    fn = _COMPILED.get(key)
    if fn is None:
        body = _packed_rows if key.mode == EXPLICIT_PACKED else _row_major_rows
        name = f"rvv_{key.projection}_m{key.rows}_{key.out_features}x{key.in_features}_{key.mode}"
        fn = torch.compile(_own_code(body, name), dynamic=False, fullgraph=True)
        _COMPILED[key] = fn
    return fn


def compiled_keys() -> list[RegionalShapeKey]:
    return list(_COMPILED)


class Counters(Counter):
    """Call counts keyed by (projection, route, bucket label)."""

    def by_route(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (_, route, _), count in self.items():
            totals[route] = totals.get(route, 0) + count
        return totals


# What the policy decided for a module (ModuleRoute.status).
PACKED = "packed"            # owns a packed buffer
BUDGET = "budget"            # eligible, but past the memory budget
GATE = "gate"                # can never take the packed route (static gate)
INVALID = "invalid"          # its buffer went stale while eager_repack was off
ROW_MAJOR_ONLY = "row_major"  # packing off, regional compile on


class RouteContext:
    """What every route of one policy shares, and all a route knows of it: the config, the
    call counters, the shape keys the measured route table sends row-major, and whom to tell
    that a weight changed (``on_stale(module, weight)``, which re-plans the route)."""

    __slots__ = ("config", "counters", "measured_row_major", "on_stale")

    def __init__(self, config: RvvPolicyConfig, on_stale: Callable[[torch.nn.Module, torch.Tensor], None]):
        self.config = config
        self.counters = Counters()
        # Shape-based, so re-plans and repacks keep it; only a new warm-up replaces it.
        self.measured_row_major: set[RegionalShapeKey] = set()
        self.on_stale = on_stale


class ModuleRoute:
    """Per-module routing state; the module owns it, and it owns nothing of the module.

    ``source`` records the weight the plan was made for. A call that sees a
    different weight (replaced, moved, re-typed, bumped in place) has the
    context re-plan it (``on_stale``) before anything else, so no decision
    outlives its weight. The one exception is a memoised row-major call
    (:class:`RowMajorMemo`): it reads only the live weight, and leaves an
    in-place bump to the next call that would use the packed buffer.
    """

    __slots__ = ("context", "projection", "status", "source", "memo")

    def __init__(self, context: RouteContext, projection: str):
        self.context = context
        self.projection = projection
        self.status = GATE  # until the policy's plan says otherwise
        self.source: packed_state.PackedWeightSource | None = None
        self.memo: RowMajorMemo | None = None

    def __call__(self, module, input, weight, bias=None) -> torch.Tensor:
        memo = self.memo
        if memo is not None and not torch.is_grad_enabled() and memo.holds(self, weight):
            counter_key = memo.counter_keys.get((input.shape, input.dtype, input.device))
            if counter_key is not None:
                self.context.counters[counter_key] += 1
                return F.linear(input, weight, bias)
        return self._route(module, input, weight, bias)

    def _route(self, module, input, weight, bias) -> torch.Tensor:
        context = self.context
        if self.source is None or not self.source.matches(weight):
            context.on_stale(module, weight)
        status = self.status
        config = context.config
        in_features = input.shape[-1] if input.dim() else 0
        rows = input.numel() // in_features if in_features else 0
        bucket = bucket_rows(rows, small_batch=config.small_batch, projection=self.projection)
        if (
            status == GATE
            or bucket is None
            or input.device.type != "cpu"
            or input.dtype != torch.bfloat16
            or in_features != weight.shape[-1]
            or rows * weight.numel() < MIN_WORK
            or (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
        ):
            return self._row_major(ROW_MAJOR_GATE, bucket, input, weight, bias)
        if status == BUDGET:
            return self._row_major(ROW_MAJOR_BUDGET, bucket, input, weight, bias)
        if status == ROW_MAJOR_ONLY:
            operand, route, mode = weight, ROW_MAJOR_COMPILED, ROW_MAJOR
        else:
            packed = packed_state.valid_packed(module, weight) if status == PACKED else None
            if packed is None:  # INVALID, or PACKED whose repack did not happen
                return self._row_major(ROW_MAJOR_INVALID, bucket, input, weight, bias)
            operand, mode = packed, EXPLICIT_PACKED
            route = PACKED_COMPILED if config.regional_compile else PACKED_EAGER

        out_features = weight.shape[0]
        if route == PACKED_EAGER:
            fn = _packed_rows
        else:
            key = RegionalShapeKey(input.dtype, "cpu", self.projection, bucket, out_features, in_features, mode)
            if config.measure_routes and key in context.measured_row_major:
                return self._row_major(ROW_MAJOR_MEASURED, bucket, input, weight, bias)
            fn = compiled_callable(key)
        context.counters[(self.projection, route, str(bucket))] += 1
        flat = input.reshape(rows, in_features)
        if bucket != rows:
            flat = F.pad(flat, (0, 0, 0, bucket - rows))
        out = fn(flat, operand, out_features)
        if bucket != rows:
            out = out[:rows]
        return out.reshape(*input.shape[:-1], out_features)

    def _row_major(self, route, bucket, input, weight, bias):
        counter_key = (self.projection, route, NO_BUCKET if bucket is None else str(bucket))
        self.context.counters[counter_key] += 1
        if route in MEMO_ROUTES and bucket is not None and not torch.is_grad_enabled():
            memo = self.memo
            if memo is None or not memo.holds(self, weight):
                memo = self.memo = RowMajorMemo(self, weight)
            memo.counter_keys[(input.shape, input.dtype, input.device)] = counter_key
        return F.linear(input, weight, bias)


# Row-major decisions that depend only on the input's shape, dtype and device and on
# what RowMajorMemo guards; row_major_invalid also depends on the buffer, so it is not kept.
MEMO_ROUTES = frozenset((ROW_MAJOR_GATE, ROW_MAJOR_BUDGET, ROW_MAJOR_MEASURED))


class RowMajorMemo:
    """Row-major decisions of one route, by input (shape, dtype, device).

    The full decision costs ~20 us per call once a large weight has streamed
    through the caches, about 5 % of a row-major 2048x2048 call at M=2..16,
    which is where the route table sends most buckets. A memoised decision is
    reused only while the weight object, the route's plan (source record and
    status), the config and the route table are the very ones it was made with,
    and only without grad (as SGLang and HF generate run). Any re-plan makes a
    new source record, so it starts a new memo. It skips the source check: that
    guards the packed buffer, which F.linear does not read; the next packed
    call still checks it before use.
    """

    __slots__ = ("weight_ref", "source", "status", "config", "measured", "counter_keys")

    def __init__(self, route: ModuleRoute, weight: torch.Tensor):
        self.weight_ref = weakref.ref(weight)  # a replaced weight must not be kept alive
        self.source = route.source
        self.status = route.status
        self.config = route.context.config
        self.measured = route.context.measured_row_major
        self.counter_keys: dict[tuple, tuple[str, str, str]] = {}

    def holds(self, route: ModuleRoute, weight: torch.Tensor) -> bool:
        return (self.weight_ref() is weight and self.source is route.source and self.status == route.status
                and self.config is route.context.config and self.measured is route.context.measured_row_major)
