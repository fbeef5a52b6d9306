"""Prometheus metrics for ``--enable-metrics``, through SGLang's multiprocess setup.

SGLang points ``PROMETHEUS_MULTIPROC_DIR`` at a shared directory before it
starts the scheduler processes, and its ``/metrics`` endpoint aggregates every
process's files; metrics created here in a scheduler land there. The routing
hot path only bumps an in-process Counter; :meth:`flush` copies the deltas into
Prometheus once per forward batch.
"""

from __future__ import annotations

from ..policy import RvvPolicy

CALLS = "sglang_rvv_linear_calls"  # exposed as sglang_rvv_linear_calls_total
PACKED_BYTES = "sglang_rvv_packed_bytes"
INFO = "sglang_rvv_info"


class MetricsExporter:
    def __init__(self, policy: RvvPolicy, *, provider: str, cache_state: str):
        from prometheus_client import Counter, Gauge  # after SGLang set the multiprocess dir

        self._policy = policy
        self._calls = Counter(CALLS, "Linear calls seen by the sglang-rvv policy, by route",
                              labelnames=["projection", "route", "bucket"])
        self._packed = Gauge(PACKED_BYTES, "Bytes of module-owned packed weights", multiprocess_mode="livesum")
        # An info metric (always 1; the labels are the information). prometheus_client's Info
        # has no multiprocess mode, so it is a gauge (max over the scheduler processes).
        info = Gauge(INFO, "The sglang-rvv policy in this server: kernel provider and Inductor cache state",
                     labelnames=["provider", "cache_state"], multiprocess_mode="max")
        info.labels(provider=provider, cache_state=cache_state).set(1)
        self._sent: dict[tuple[str, str, str], int] = {}
        self.update_packed_bytes()

    def update_packed_bytes(self) -> None:
        self._packed.set(self._policy.packed_bytes())

    def flush(self) -> None:
        for key, count in self._policy.counters.items():
            delta = count - self._sent.get(key, 0)
            if delta:
                projection, route, bucket = key
                self._calls.labels(projection=projection, route=route, bucket=bucket).inc(delta)
                self._sent[key] = count
