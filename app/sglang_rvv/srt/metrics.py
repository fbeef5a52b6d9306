"""Prometheus metrics for ``--enable-metrics``, through SGLang's multiprocess setup.

SGLang points ``PROMETHEUS_MULTIPROC_DIR`` at a shared directory before it
starts the scheduler processes, and its ``/metrics`` endpoint aggregates every
process's files; metrics created here in a scheduler land there. The routing
hot path only bumps an in-process Counter; :meth:`MetricsExporter.flush` copies
the deltas into Prometheus once per forward batch.

The byte gauges follow the policy: every install, repack or weight update ends
in a new :class:`~sglang_rvv.policy.PolicyReport`, and the exporter refreshes
them when it sees one (at the next flush, and at once after a weight update).
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import asdict

import torch

from ..policy import RvvPolicy
from ..routing import Status

CALLS = "sglang_rvv_linear_calls"  # exposed as sglang_rvv_linear_calls_total
PACKED_BYTES = "sglang_rvv_packed_bytes"
PROJECTION_BYTES = "sglang_rvv_projection_bytes"
INFO = "sglang_rvv_info"
BF16_WEIGHT = "sglang_rvv_bf16_weight"
ROW_MAJOR = "row_major"  # the layout label of a projection that streams its framework weight
MIB = 1024 * 1024
# The exporter of each policy in this process, so a weight-update hook that only sees the model
# can refresh the gauges.
_EXPORTERS: weakref.WeakKeyDictionary[RvvPolicy, MetricsExporter] = weakref.WeakKeyDictionary()


def packed_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The policy's packed tensors of ``module`` (scales included): its non-persistent buffers."""
    return [buffer for name, buffer in module._buffers.items()
            if buffer is not None and name in module._non_persistent_buffers_set]


def streamed_bytes(policy: RvvPolicy, model: torch.nn.Module) -> dict[tuple[str, str], int]:
    """Bytes each projection kind streams per decode token, by layout: a packed projection its
    packed tensors (in the layout the report names for it), any other its framework weight
    (layout ``row_major``)."""
    report = policy.report
    # A report that names no per-module layouts is the bf16-only policy's.
    layouts = asdict(report).get("layouts") or dict.fromkeys(report.packed, "bf16")
    layout_of = {id(model.get_submodule(name)): layout for name, layout in layouts.items()}
    totals: Counter[tuple[str, str]] = Counter()
    for module, route in policy.routes():
        if route.status == Status.PACKED:
            size = sum(t.numel() * t.element_size() for t in packed_tensors(module))
            totals[route.projection, layout_of[id(module)]] += size
        else:
            totals[route.projection, ROW_MAJOR] += module.weight.numel() * module.weight.element_size()
    return dict(totals)


def bytes_line(policy: RvvPolicy, model: torch.nn.Module) -> str:
    """One log line: each projection's layout and MiB per token, and the total."""
    rows = streamed_bytes(policy, model)
    parts = ", ".join(f"{projection} {layout} {size / MIB:.2f}" for (projection, layout), size in rows.items())
    return f"sglang_rvv: MiB streamed per decode token: {parts}; total {sum(rows.values()) / MIB:.2f}"


class MetricsExporter:
    def __init__(self, policy: RvvPolicy, model: torch.nn.Module, *, provider: str, cache_state: str):
        from prometheus_client import Counter, Gauge  # after SGLang set the multiprocess dir

        self._policy = policy
        self._model = weakref.ref(model)  # the policy's model: the runner owns it
        self._calls = Counter(CALLS, "Linear calls seen by the sglang-rvv policy, by route",
                              labelnames=["projection", "route", "bucket"])
        self._packed = Gauge(PACKED_BYTES, "Bytes of module-owned packed weights (scales included)",
                             multiprocess_mode="livesum")
        self._projection_bytes = Gauge(
            PROJECTION_BYTES, "Bytes each projection kind streams per decode token, by layout "
            f"({ROW_MAJOR}: the framework's weight)", labelnames=["projection", "layout"],
            multiprocess_mode="livesum")
        # An info metric (always 1; the labels are the information). prometheus_client's Info
        # has no multiprocess mode, so it is a gauge (max over the scheduler processes).
        info = Gauge(INFO, "The sglang-rvv policy in this server: kernel provider and Inductor cache state",
                     labelnames=["provider", "cache_state"], multiprocess_mode="max")
        info.labels(provider=provider, cache_state=cache_state).set(1)
        self._bf16_weight = Gauge(
            BF16_WEIGHT, "1 for each module whose quantized layout is served with its BF16 weight (the policy "
            "report's bf16_weight: the shape gate, the budget, a layout fallback)", labelnames=["module"],
            multiprocess_mode="max")
        self._bf16_modules: set[str] = set()
        self._sent: dict[tuple[str, str, str], int] = {}
        self._report = None  # the policy report the byte gauges show
        self._labels: set[tuple[str, str]] = set()
        self.refresh()
        _EXPORTERS[policy] = self

    @staticmethod
    def of(policy: RvvPolicy) -> MetricsExporter | None:
        return _EXPORTERS.get(policy)

    def refresh(self) -> None:
        """Set the byte gauges from the policy's buffers as they are now."""
        self._report = self._policy.report
        self._packed.set(self._policy.packed_bytes())
        rows = streamed_bytes(self._policy, self._model())
        # A multiprocess gauge keeps a label set once written: zero the ones that are gone.
        for projection, layout in self._labels - rows.keys():
            self._projection_bytes.labels(projection=projection, layout=layout).set(0)
        for (projection, layout), size in rows.items():
            self._projection_bytes.labels(projection=projection, layout=layout).set(size)
        self._labels |= rows.keys()
        modules = set(self._report.bf16_weight)
        for module in self._bf16_modules - modules:
            self._bf16_weight.labels(module=module).set(0)
        for module in modules:
            self._bf16_weight.labels(module=module).set(1)
        self._bf16_modules |= modules

    def flush(self) -> None:
        if self._policy.report is not self._report:  # re-planned since the last refresh
            self.refresh()
        for key, count in self._policy.counters.items():
            delta = count - self._sent.get(key, 0)
            if delta:
                projection, route, bucket = key
                self._calls.labels(projection=projection, route=route, bucket=bucket).inc(delta)
                self._sent[key] = count
