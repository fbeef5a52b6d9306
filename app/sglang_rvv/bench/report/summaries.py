"""Summaries of one run, one per kind of result: one-batch, serving, fleet, start, RSS vs predicted,
linear calls, the kernel microbenchmark, HF generate and the measured route table."""

from __future__ import annotations

from ...budget import MIB
from ..hf_generate import summarize as hf_generate_summarize
from ..layouts import packed_call_us
from ..results import WARM, Run, m1_gbs
from .stats import ratio, request_stats, spread

MODES = {"off": "row-major (flag off)", "on": "packed (flag on)"}
ONE_BATCH_METRICS = (("prefill_throughput", "prefill tok/s"), ("median_decode_throughput", "decode tok/s"),
                     ("overall_throughput", "total tok/s"), ("wall_s", "wall s"), ("peak_rss_mib", "peak RSS MiB"),
                     ("after_load_peak_mib", "peak RSS after load MiB"))
# The target's measure first: the peak from the end of weight loading on, where the policy packs.
RSS_MEASURES = ("one-batch peak RSS after weight loading (warm median)",
                "one-batch peak RSS, whole process (warm median)", "server steady RSS (after the last level)")


def mode_label(mode: str) -> str:
    """A mode's label: MODES's, or a quantized layout's (``on-int8``: "packed int8 (flag on)")."""
    return MODES.get(mode) or f"packed {mode.removeprefix('on-')} (flag on)"


def one_batch_summary(run: Run) -> dict[str, dict[str, dict[str, dict | None]]]:
    """mode -> cache state -> metric -> spread over that state's processes."""
    out: dict = {}
    for record in run.of("one_batch").values():
        out.setdefault(record["mode"], {}).setdefault(record["cache_state"], []).append(record["result"])
    return {mode: {state: {key: spread([r[key] for r in results if key in r]) for key, _ in ONE_BATCH_METRICS}
                   for state, results in states.items()} for mode, states in out.items()}


def serving_summary(run: Run) -> dict[tuple[str, int], dict]:
    """(mode, concurrency) -> request statistics of that level."""
    return {(r["mode"], r["concurrency"]): request_stats(r["requests"], r["wall_s"])
            for r in run.of("serving").values()}


def fleet_summary(run: Run) -> dict[tuple[str, int], dict]:
    """(layout, concurrency) -> request statistics through the layout's one URL, whether a gateway
    fronts it, and its replicas: their CPU lists on one host, their URLs in a fleet of boards."""
    return {(r["layout"], r["concurrency"]): {
        **request_stats(r["requests"], r["wall_s"]), "gateway": r["gateway"],
        "replicas": r.get("workers") or [",".join(map(str, cpus)) for cpus in r["cpus"]]}
        for r in run.of("fleet").values()}


def start_summary(run: Run) -> dict[str, dict[str, dict]]:
    """mode -> cache state -> {ready_s, ttft_after_start_s, install_seconds and warmup (the policy
    report's, flag on; ``None`` otherwise, and install_seconds in runs from before it was recorded)}."""
    out: dict = {}
    for record in run.of("start").values():
        report = run.policy_report(record) or {}
        out.setdefault(record["mode"], {})[record["cache_state"]] = {
            "ready_s": record["ready_s"], "ttft_after_start_s": record["ttft_after_start_s"],
            "install_seconds": report.get("install_seconds"), "warmup": report.get("warmup")}
    return out


def predicted_packed_bytes(run: Run) -> int | None:
    """packed_bytes from the first flag-on policy report (every flag-on process packs the same)."""
    for kind in ("one_batch", "start"):
        for record in run.of(kind).values():
            report = run.policy_report(record)
            if report is not None:
                return report.get("packed_bytes")
    return None


def rss_summary(run: Run) -> dict:
    """RSS increase flag on vs off: one-batch peaks after loading and in all (warm medians) and the serving
    steady state, vs predicted. Runs before the after-load peak existed have ``None`` there."""
    one = one_batch_summary(run)

    def peak(mode, key):
        s = one.get(mode, {}).get(WARM, {}).get(key)
        return s["median"] if s else None

    last = max(levels(run), default=None)
    steady = {r["mode"]: r["memory"]["rss_mib"] for r in run.of("serving").values() if r["concurrency"] == last}
    packed = predicted_packed_bytes(run)
    predicted = packed / MIB if packed is not None else None
    rows = {}
    measured = [(peak(mode, "after_load_peak_mib"), peak(mode, "peak_rss_mib"), steady.get(mode)) for mode in MODES]
    for name, off, on in zip(RSS_MEASURES, *measured, strict=True):
        increase = on - off if on is not None and off is not None else None
        rows[name] = {"off_mib": off, "on_mib": on, "increase_mib": increase,
                      "vs_predicted": ratio(increase, predicted)}
    return {"predicted_mib": predicted, "rows": rows}


def levels(run: Run) -> list[int]:
    """The concurrency levels the run served."""
    return sorted({r["concurrency"] for r in run.of("serving").values()})


def linear_calls(run: Run) -> dict[str, dict[int, float]]:
    """flag on: ``projection/route/bucket`` -> concurrency -> calls during that level's measured requests."""
    out: dict = {}
    for record in run.of("serving").values():
        if record["mode"] == "on":
            for key, count in record.get("linear_calls", {}).items():
                out.setdefault(key, {})[record["concurrency"]] = count
    return dict(sorted(out.items(), key=lambda kv: _bucket_sort(kv[0])))


def _bucket_sort(key: str):
    projection, route, bucket = key.split("/")
    return projection, route, int(bucket) if bucket.isdigit() else 10**9


def kernel(run: Run) -> dict | None:
    """The linear microbenchmark: its kernel facts (provider, reason, native ISA, VLEN, cpuinfo isa) and
    one entry of ``runs`` per thread count, each with its rows, bandwidth and M=1 aggregate (as
    bench/linear.py prints it); ``rows`` holds every run's rows, each with its thread count.

    A record from before ``--threads`` is one run at the suite's one thread count (OMP_NUM_THREADS
    in its provenance), without the facts other than the provider.
    """
    record = run.of("kernel").get("linear")
    if record is None:
        return None
    runs = record.get("runs") or [{"threads": record["provenance"].get("omp_num_threads"),
                                   "bandwidth": record["bandwidth"], "results": record["results"]}]
    per_threads = []
    for entry in runs:
        rows = [{**row, "threads": entry["threads"]} for row in entry["results"]]
        per_threads.append({"threads": entry["threads"], "cpus": entry.get("cpus"), "bandwidth": entry["bandwidth"],
                            "rows": rows, "m1_gbs": m1_gbs(rows), "m1_projections": sum(r["rows"] == 1 for r in rows)})
    return {**{key: record.get(key) for key in ("provider", "provider_reason", "kernel_isa", "vlen", "isa")},
            "runs": per_threads, "rows": [row for entry in per_threads for row in entry["rows"]]}


def hf_generate(run: Run) -> dict | None:
    """Hugging Face generate: per mode median prefill/decode tok/s, on/off ratios, outputs equal; or None."""
    record = run.of("hf_generate").get("generate")
    return None if record is None else {**hf_generate_summarize(record), "repetitions": record["repetitions"],
                                        "output_ids": {m: r["output_ids"] for m, r in record["modes"].items()}}


def layouts(run: Run) -> dict | None:
    """The layouts step, per thread count it ran at (``runs``, each with its CPU mask when pinned):
    its rows, and per layout the M=1 aggregate over the projections (bytes per token, GB/s, the
    time ratios to bf16 packed and to F.linear, the fraction of the same-rounds read) or the reason
    it is not available; None without the step. A record from before ``--threads`` is one run."""
    record = run.of("layouts").get("linear")
    if record is None:
        return None
    runs = record.get("runs") or [{"threads": record.get("threads"), "results": record["results"]}]
    return {"provider": record.get("provider"),
            "runs": [{**entry, "layouts": _per_layout(entry["results"])} for entry in runs]}


def _per_layout(results: list[dict]) -> dict:
    per_layout = {}
    for name in dict.fromkeys(r["weight_dtype"] for r in results):
        rows = [r for r in results if r["weight_dtype"] == name and r["rows"] == 1]
        missing = sorted({r["not_available"] for r in rows if "not_available" in r})
        if missing or not rows:
            per_layout[name] = {"not_available": "; ".join(missing) or "no M=1 cell"}
            continue
        total = sum(r["bytes_per_call"] for r in rows)
        packed_s = sum(map(packed_call_us, rows)) / 1e6
        base = [b for b in results if b["weight_dtype"] == "bf16" and b["rows"] == 1 and "packed_us" in b]
        per_layout[name] = {
            "bytes_per_token": total, "projections": len(rows), "packed_gbs": total / packed_s / 1e9,
            "read_gbs": total / (sum(r["read_us"] for r in rows) / 1e6) / 1e9,
            "vs_linear": sum(r["linear_us"] for r in rows) / 1e6 / packed_s,
            "vs_bf16_packed": sum(map(packed_call_us, base)) / 1e6 / packed_s if len(base) == len(rows) else None,
        }
        per_layout[name]["of_read"] = per_layout[name]["packed_gbs"] / per_layout[name]["read_gbs"]
    return per_layout


def route_table(run: Run) -> list[dict] | None:
    """The warm-up's measured per-bucket route table from a flag-on policy report, if the plugin wrote one."""
    for kind in ("start", "one_batch"):
        for record in sorted(run.of(kind).values(), key=lambda r: r["cache_state"] != WARM):
            table = ((run.policy_report(record) or {}).get("warmup") or {}).get("route_table")
            if table:
                return table
    return None
