"""Which kernel serves a Linear call: buckets, the shape gate, the decision, the per-module route.

Every routed projection call lands in :meth:`ModuleRoute.call` (or its C twin, :func:`accelerated`).
It maps the flattened row count M to a bucket and asks :func:`decide` for the route: a
packed callable for the bucket (zero-padding M up to the bucket, slicing
after), or row-major ``F.linear``, which also serves the buckets where the
warm-up's measured route table found the packed callable slower (see
:mod:`sglang_rvv.route_table`). :func:`decide` is pure, so the warm-up asks
it too, for the keys to compile. The caller counts each call by
(projection, route, bucket); what each route runs is :mod:`sglang_rvv.bodies`. A bias
(Qwen2's and DeepSeek-R1-Distill-Qwen's q/k/v) is read live and added in place to the packed
callable's output: one bfloat16 rounding more than F.linear's, and no bias enters a packed
buffer, a shape key or a compiled artifact.
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import types
import weakref
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from . import packed_state
from .bodies import (
    COMPILED,
    CompiledCallables,
    Mode,
    RegionalShapeKey,
    eager_body,
    eager_call,
    eager_entry,
    native_entry,
)
from .kernels import chosen
from .kernels.gate import ShapeGate
from .route_table import RouteTable

if TYPE_CHECKING:
    from .config import RvvPolicyConfig

# Where a routed module keeps its ModuleRoute, its one record (in its __dict__: not a submodule, not state).
ROUTE_ATTR = packed_state.RECORD_ATTR
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
SMALL_BATCH_BUCKETS = (2, 4, 8, 16)
PREFILL_BUCKETS = (16, 32, 64, 128)
NO_BUCKET = "none"  # the bucket label of a call no bucket serves
log = logging.getLogger("sglang_rvv")


class Route(enum.StrEnum):
    """The route a call took: the middle of its counter key, and a Prometheus label."""

    PACKED_COMPILED = "packed_compiled"
    PACKED_EAGER = "packed_eager"
    ROW_MAJOR_COMPILED = "row_major_compiled"  # regional compile with packing off
    ROW_MAJOR_GATE = "row_major_gate"
    ROW_MAJOR_INVALID = "row_major_invalid"
    ROW_MAJOR_BUDGET = "row_major_budget"
    ROW_MAJOR_MEASURED = "row_major_measured"  # the measured route table found packed slower here


class Status(enum.StrEnum):
    """What the policy's plan made of a module's weight (ModuleRoute.status)."""

    PACKED = "packed"            # owns a packed buffer
    BUDGET = "budget"            # eligible, but past the memory budget
    GATE = "gate"                # can never take the packed route (static gate)
    INVALID = "invalid"          # its buffer went stale while eager_repack was off
    ROW_MAJOR_ONLY = "row_major"  # packing off, regional compile on


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


def shape_gate() -> ShapeGate:
    """The chosen provider's thresholds (:mod:`sglang_rvv.kernels.gate`): N and K, and M*N*K per call."""
    return chosen()[0].GATE


def compile_packed() -> bool:
    """Whether the chosen provider's packed calls are compiled where the config asks for regional
    compile (``COMPILE_PACKED``, default yes): the rvv provider's are native ops, called as they are."""
    return getattr(chosen()[0], "COMPILE_PACKED", True)


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
    out_features, in_features = weight.shape
    if bias is not None and not _bias_fits(bias, out_features):
        return (f"gate: bias {bias.dtype} {tuple(bias.shape)} on {bias.device.type}, needs torch.bfloat16 "
                f"({out_features},) on cpu")
    minimum = shape_gate().min_features
    if out_features < minimum or in_features < minimum:
        return f"gate: [N={out_features}, K={in_features}] below the {minimum} minimum"
    return None


class Decision(NamedTuple):
    route: Route
    bucket: int | None
    # The shape key the call reached: the compiled callable's, or for row_major_measured and a
    # measured packed_eager the one the table measured; None for the other row-major routes and
    # for packed_eager without regional compile.
    key: RegionalShapeKey | None


def _bias_fits(bias: torch.Tensor, out_features: int) -> bool:
    return bias.device.type == "cpu" and bias.dtype == torch.bfloat16 and bias.shape == (out_features,)


def can_serve(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether a compiled or packed kernel may serve this call at all: a bfloat16 CPU input
    of the weight's in_features (and a bfloat16 CPU bias of its out_features, or none),
    outside autograd (row-major F.linear keeps autograd working)."""
    return (
        input.device.type == "cpu"
        and input.dtype == torch.bfloat16
        and (input.shape[-1] if input.dim() else 0) == weight.shape[-1]
        and (bias is None or _bias_fits(bias, weight.shape[0]))
        and not (torch.is_grad_enabled() and (input.requires_grad
                                              or weight.requires_grad
                                              or (bias is not None and bias.requires_grad)))
    )


def decide(projection: str, rows: int, status: Status, config: RvvPolicyConfig, table: RouteTable, *,
           weight_shape: tuple[int, ...], servable: bool,
           packed_layout: packed_state.PackedLayout | None = None) -> Decision:
    """The route of a call of ``rows`` rows to a ``projection`` whose weight has ``status``.

    ``status`` is the weight's as of this call: a packed one whose buffer no longer reflects
    the weight is INVALID. ``servable`` is :func:`can_serve` of the call. The shape key is
    bfloat16 and CPU because nothing else passes the gate; a packed key names
    ``packed_layout`` (the layout of the module's buffers; None for bf16).
    """
    bucket = bucket_rows(rows, small_batch=config.small_batch, projection=projection)
    small = rows * math.prod(weight_shape) < shape_gate().min_work
    if status == Status.GATE or bucket is None or not servable or small:
        return Decision(Route.ROW_MAJOR_GATE, bucket, None)
    if status == Status.BUDGET:
        return Decision(Route.ROW_MAJOR_BUDGET, bucket, None)
    if status == Status.INVALID:
        return Decision(Route.ROW_MAJOR_INVALID, bucket, None)
    if status == Status.ROW_MAJOR_ONLY:
        route, mode = Route.ROW_MAJOR_COMPILED, Mode.ROW_MAJOR
    elif config.regional_compile and compile_packed():
        route, mode = Route.PACKED_COMPILED, Mode.EXPLICIT_PACKED
    else:
        return Decision(Route.PACKED_EAGER, bucket, None)
    key = RegionalShapeKey(torch.bfloat16, "cpu", projection, bucket, weight_shape[0], weight_shape[-1], mode)
    if mode == Mode.EXPLICIT_PACKED and packed_layout is not None:
        key = key._replace(layout=packed_layout.name, group=packed_layout.group)
    # The table measures packed keys only: F.linear or the eager kernel where either beat the compiled one.
    if mode == Mode.EXPLICIT_PACKED and config.measure_routes:
        if table.sends_row_major(key.shape):
            return Decision(Route.ROW_MAJOR_MEASURED, bucket, key)
        if table.sends_eager(key.shape):
            return Decision(Route.PACKED_EAGER, bucket, key)
    return Decision(route, bucket, key)


class Counters(Counter):
    """Call counts keyed by (projection, route, bucket label)."""

    def by_route(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for (_, route, _), count in self.items():
            totals[route] = totals.get(route, 0) + count
        return totals


class RouteContext:
    """What every route of one policy shares, and all a route knows of it: the config, the
    call counters, the measured route table, the compiled callables, and whom to tell that
    a weight changed (``on_stale(module, weight)``, which re-plans the route)."""

    __slots__ = ("config", "counters", "table", "compiled", "on_stale")

    def __init__(self, config: RvvPolicyConfig, on_stale: Callable[[torch.nn.Module, torch.Tensor], None],
                 compiled: CompiledCallables = COMPILED):
        self.config = config
        self.counters = Counters()
        # Shape-based, so re-plans and repacks keep it; only a new warm-up replaces it.
        self.table = RouteTable()
        self.compiled = compiled
        self.on_stale = on_stale


class ModuleRoute:
    """Per-module routing state; the module owns it, and it owns nothing of the module.

    It is the module's one record: ``record`` (:class:`packed_state.PackedRecord`) holds the
    weight the plan was made for (``record.source``) and the layout and names of the packed
    buffers. A call that sees a different weight (replaced, moved, re-typed, bumped in
    place) has the context re-plan it (``on_stale``) before anything else, so no decision
    outlives its weight. The one exception is a memoised row-major call
    (:class:`RowMajorMemo`): it reads only the live weight, and leaves an
    in-place bump to the next call that would use the packed buffer.
    """

    __slots__ = ("context", "projection", "status", "record", "memo")

    def __init__(self, context: RouteContext, projection: str):
        self.context = context
        self.projection = projection
        self.status = Status.GATE  # until the policy's plan says otherwise
        self.record = packed_state.PackedRecord()
        self.memo: CallMemo | None = None

    def call(self, module, input, weight, bias=None) -> torch.Tensor:
        """The routed call: ``F.linear(input, weight, bias)``'s result, by the route decided for it.
        It is the class's ``__call__``, or, where the provider has a native entry,
        :func:`accelerated`'s C method stands in front of it."""
        memo, record = self.memo, self.record
        # CallMemo.holds, inline: every projection call of every step runs this.
        if (memo is not None and memo.weight_ref() is weight and memo.source is record.source
                and memo.status == self.status and memo.layout is record.layout
                and memo.config is self.context.config and memo.table is self.context.table
                and not torch.is_grad_enabled()):
            call = memo.calls.get((input.shape, input.dtype, input.is_cpu))
            if call is not None:
                if call.fn is None:
                    self.context.counters[call.counter_key] += 1
                    return F.linear(input, weight, bias)
                if call.plan is not None:
                    # The native entry: the source check against the plan's stamp of the weight,
                    # the buffers by name, the op and the bias; None once the plan no longer holds.
                    out = call.fn(call.plan, input, weight, module._buffers, bias)
                    if out is not None:
                        self.context.counters[call.counter_key] += 1
                        return out
                    return self._route(module, input, weight, bias)
                packed = record.tensors(module, weight)  # the source check, before every use
                if packed is not None:
                    self.context.counters[call.counter_key] += 1
                    if call.direct:
                        out = call.fn(input, *packed, *call.tail)
                    else:
                        out = _run(call.fn, input, packed, call.rows, call.bucket, weight.shape[0])
                    return out if bias is None else out.add_(bias)
        return self._route(module, input, weight, bias)

    __call__ = call

    def _memo(self, weight: torch.Tensor) -> CallMemo:
        memo = self.memo
        if memo is None or not memo.holds(self, weight):
            memo = self.memo = CallMemo(self, weight)
        return memo

    def current_status(self, module: torch.nn.Module,
                       weight: torch.Tensor) -> tuple[Status, tuple[torch.Tensor, ...] | None]:
        """The weight's status as of now, and its packed tensors if it has usable ones.

        A weight that changed since the plan is re-planned first; a packed weight whose
        buffers are gone or stale (a repack that did not happen) counts as INVALID.
        """
        source = self.record.source
        if source is None or not source.matches(weight):
            self.context.on_stale(module, weight)
        if self.status != Status.PACKED:
            return self.status, None
        packed = packed_state.valid_packed(module, weight)
        return (Status.INVALID if packed is None else Status.PACKED), packed

    def _route(self, module, input, weight, bias) -> torch.Tensor:
        context = self.context
        status, packed = self.current_status(module, weight)
        in_features = input.shape[-1] if input.dim() else 0
        rows = input.numel() // in_features if in_features else 0
        packed_layout = self.record.layout
        route, bucket, key = decide(self.projection, rows, status, context.config, context.table,
                                    weight_shape=weight.shape, servable=can_serve(input, weight, bias),
                                    packed_layout=packed_layout)
        counter_key = (self.projection, route, NO_BUCKET if bucket is None else str(bucket))
        context.counters[counter_key] += 1
        # The eager body takes the input as it is when there is no padding to a bucket.
        direct = route == Route.PACKED_EAGER and bucket == rows
        tail, plan = (weight.shape[0],), None
        if direct:
            fn, tail = eager_call(packed_layout.name, weight.shape[0], weight.shape[1])
            operands = packed
            if route in MEMO_ROUTES and not torch.is_grad_enabled():
                # Made here, where the source check has just passed: the plan stamps this weight.
                native = eager_entry(packed_layout.name, weight, self.record.buffers, weight.shape[0],
                                     weight.shape[1])
                if native is not None:
                    entry_fn, plan = native
        elif route == Route.PACKED_EAGER:
            fn, operands = eager_body(packed_layout.name), packed
        elif route in COMPILED_ROUTES:
            fn, operands = context.compiled.get(key), (weight,) if key.mode == Mode.ROW_MAJOR else packed
        else:
            if route in MEMO_ROUTES and bucket is not None and not torch.is_grad_enabled():
                self._memo(weight).remember(input, MemoCall(counter_key, None, bucket, rows, False, ()))
            return F.linear(input, weight, bias)
        if route in MEMO_ROUTES and not torch.is_grad_enabled():
            memo_call = (MemoCall(counter_key, fn, bucket, rows, direct, tail) if plan is None
                         else MemoCall(counter_key, entry_fn, bucket, rows, direct, (), plan))
            self._memo(weight).remember(input, memo_call)
        if direct:
            out = fn(input, *operands, *tail)
        else:
            out = _run(fn, input, operands, rows, bucket, weight.shape[0])
        return out if bias is None else out.add_(bias)


@functools.cache  # the provider, and so its entry, is chosen once per process
def accelerated() -> types.ModuleType | None:
    """The provider's native entry once :class:`ModuleRoute`'s ``__call__`` runs through it, else None.

    The entry's C method (``kernels/csrc/entry/route_call.cpp``) takes a memoised planned packed
    call (:meth:`ModuleRoute.call`'s memo check, the plan's packed call, the counter) without a
    Python frame, and hands everything else to :meth:`ModuleRoute.call`. With the routed Linear's
    C call (:mod:`.adapters`) a projection call went from 30.6 k instructions outside the kernel
    library to 12.9 k under emulation. It reads the slots of the classes below."""
    native = native_entry()
    if native is None:
        return None
    try:
        ModuleRoute.__call__ = native.route_method(
            ModuleRoute, ModuleRoute.call, packed_state.PackedRecord, RouteContext, CallMemo, torch.bfloat16,
            MemoCall._fields.index("counter_key"), MemoCall._fields.index("plan"))
    except (TypeError, ValueError) as exc:
        log.warning("sglang_rvv: routes keep their Python call: %s", exc)
        return None
    return native


def _run(fn: Callable, input: torch.Tensor, operands: tuple[torch.Tensor, ...], rows: int, bucket: int,
         out_features: int) -> torch.Tensor:
    """``fn`` on ``input``'s rows flattened and zero-padded to ``bucket``, sliced back after."""
    flat = input if input.dim() == 2 else input.reshape(rows, input.shape[-1])
    if bucket != rows:
        flat = F.pad(flat, (0, 0, 0, bucket - rows))
    out = fn(flat, *operands, out_features)
    if bucket != rows:
        out = out[:rows]
    return out if input.dim() == 2 else out.reshape(*input.shape[:-1], out_features)


COMPILED_ROUTES = frozenset((Route.PACKED_COMPILED, Route.ROW_MAJOR_COMPILED))
# Decisions that depend only on the input's shape, dtype and CPU-ness and on what CallMemo
# guards. row_major_invalid also depends on the buffer, and row_major_compiled's operand is
# the live weight, so neither is kept.
MEMO_ROUTES = frozenset((Route.PACKED_EAGER, Route.PACKED_COMPILED, Route.ROW_MAJOR_GATE, Route.ROW_MAJOR_BUDGET,
                         Route.ROW_MAJOR_MEASURED))


class MemoCall(NamedTuple):
    """A memoised decision: its counter key, the packed callable (None: row-major F.linear), and
    whether it takes the input as it is (direct: ``fn(input, *packed, *tail)``,
    :func:`bodies.eager_call`) or through :func:`_run`'s flatten and padding. With a ``plan``,
    ``fn`` is the provider's native entry: ``fn(plan, input, weight, buffers, bias)``
    (:func:`bodies.eager_entry`)."""

    counter_key: tuple[str, str, str]
    fn: Callable | None
    bucket: int
    rows: int
    direct: bool
    tail: tuple
    plan: object = None


class CallMemo:
    """The decisions of one route, by input (shape, dtype, on the CPU or not).

    The full decision (the status, the gate, the bucket, the route table) costs ~30 us of
    Python per call on x86: on the board's in-order core that is tens of thousands of
    instructions, paid by every projection of every decode step, and ~5 % of a row-major
    2048x2048 call at M=2..16. A memoised decision is reused only while the weight object,
    the route's plan (source record, status and packed layout), the config and the route
    table are the very ones it was made with, and only without grad (as SGLang and HF
    generate run). Any re-plan makes a new source record, so it starts a new memo.

    A packed call still checks the source against the live weight before every use
    (:meth:`packed_state.PackedRecord.tensors`), and takes the full path when that fails. A
    row-major call skips the check: it guards the packed buffer, which F.linear does not
    read; the next packed call still checks it before use.
    """

    __slots__ = ("weight_ref", "source", "status", "layout", "config", "table", "calls", "last")

    def __init__(self, route: ModuleRoute, weight: torch.Tensor):
        self.weight_ref = weakref.ref(weight)  # a replaced weight must not be kept alive
        self.source = route.record.source
        self.status = route.status
        self.layout = route.record.layout
        self.config = route.context.config
        self.table = route.context.table
        self.calls: dict[tuple, MemoCall] = {}
        # The native entry's (shape, MemoCall) of its last hit in ``calls``, which it checks
        # against the input's sizes before it builds and hashes a key: a module sees the same
        # shape call after call while it decodes. Any write to ``calls`` clears it.
        self.last: tuple | None = None

    def remember(self, input: torch.Tensor, call: MemoCall) -> None:
        self.calls[(input.shape, input.dtype, input.is_cpu)] = call
        self.last = None

    def holds(self, route: ModuleRoute, weight: torch.Tensor) -> bool:
        # ModuleRoute.call runs these same checks inline (its hot path), and so does its C twin
        # (route_call.cpp's memoised): change all three together.
        return (self.weight_ref() is weight and self.source is route.record.source and self.status == route.status
                and self.layout is route.record.layout and self.config is route.context.config
                and self.table is route.context.table)
