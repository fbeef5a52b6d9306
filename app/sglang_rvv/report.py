"""The benchmark report: tables, issue-6 and board targets, a CSV and plots from suite run directories.

``sglang-rvv report DIR [DIR...] [--out DIR]`` reads directories written by
``python -m sglang_rvv.bench suite``. For each it writes ``report.md``,
``metrics.csv`` and ``plots/*.png`` into the directory (or into ``--out`` for a
single one) and prints the markdown. With several directories it also compares
them side by side, one column per run (host/timestamp), and prints that instead;
``--out`` then receives the comparison's files.

Every number is computed here from the raw result files, so a report can be
re-rendered (or a new statistic added) without re-running anything.
"""

from __future__ import annotations

import csv
import itertools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bench.hf_generate import summarize as hf_generate_summarize
from .bench.results import COLD, WARM, Run, RunDirError, load_run, m1_gbs, weight_gbs

# The issue-6 targets.
DECODE_RATIO_MIN = 1.10
RSS_TOLERANCE = 0.10
WARM_START_RATIO_MAX = 0.30
BANDWIDTH_FRACTION_MIN = 0.85
# Kernel timings jitter by a few percent between calls; a bucket within this of row-major is "not slower".
SLOWER_TOLERANCE = 0.05
# The board targets (Banana Pi BPI-F3, SpacemiT K1), judged only on a riscv64 run: M=1 weights
# streamed by the packed route at 4 GB/s, about 40 % of the K1's theoretical LPDDR4X peak (32 bit
# at 2666 MT/s; published K1 decoders reach 4-5 GB/s), and decode of the pinned Qwen3-0.6B in
# BF16, against the seed's published 1.02 tok/s.
BOARD_MACHINE = "riscv64"
K1_PEAK_GBS = 10.66
BOARD_M1_GBS_MIN = 4.0
BOARD_MODEL = "qwen3-0.6b"  # matched in the model's name or generated shape, case-insensitively
BOARD_DECODE_TOK_S_MIN = 3.5
SEED_DECODE_TOK_S = 1.02
MODES = {"off": "row-major (flag off)", "on": "packed (flag on)"}
ONE_BATCH_METRICS = (("prefill_throughput", "prefill tok/s"), ("median_decode_throughput", "decode tok/s"),
                     ("overall_throughput", "total tok/s"), ("wall_s", "wall s"), ("peak_rss_mib", "peak RSS MiB"),
                     ("after_load_peak_mib", "peak RSS after load MiB"))
# The target's measure first: the peak from the end of weight loading on, where the policy packs.
RSS_MEASURES = ("one-batch peak RSS after weight loading (warm median)",
                "one-batch peak RSS, whole process (warm median)", "server steady RSS (after the last level)")
CSV_FIELDS = ("run", "section", "name", "mode", "key", "stat", "value", "unit")
MIB = 2**20


# -- statistics ---------------------------------------------------------------

def spread(values: list[float]) -> dict | None:
    """median, min and max (the suite's "median [min-max]"), or None without values."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def moments(values: list[float]) -> dict | None:
    """mean, median and p99 (linear interpolation), or None without values."""
    if not values:
        return None
    return {"mean": statistics.fmean(values), "median": statistics.median(values),
            "p99": float(np.percentile(values, 99))}


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _num(value: float | None) -> str:
    """A number at a precision that suits its size (the comparison mixes µs, tok/s and ratios)."""
    if value is None:
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def _fmt_spread(s: dict | None, digits: int = 1) -> str:
    if s is None:
        return "n/a"
    if s["n"] == 1:
        return _fmt(s["median"], digits)
    return f"{_fmt(s['median'], digits)} [{_fmt(s['min'], digits)}–{_fmt(s['max'], digits)}]"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


# -- summaries of one run -----------------------------------------------------

def one_batch_summary(run: Run) -> dict[str, dict[str, dict[str, dict | None]]]:
    """mode -> cache state -> metric -> spread over that state's processes."""
    out: dict = {}
    for record in run.of("one_batch").values():
        out.setdefault(record["mode"], {}).setdefault(record["cache_state"], []).append(record["result"])
    return {mode: {state: {key: spread([r[key] for r in results if key in r]) for key, _ in ONE_BATCH_METRICS}
                   for state, results in states.items()} for mode, states in out.items()}


def _request_stats(requests: list[dict], wall: float) -> dict:
    ttft = [r["ttft_s"] * 1e3 for r in requests]
    tpot = [(r["latency_s"] - r["ttft_s"]) * 1e3 / (r["output_tokens"] - 1) for r in requests if r["output_tokens"] > 1]
    # Tokens that arrive in one stream chunk share its arrival time (an ITL of 0), as SGLang sent them.
    itl = [(b - a) * 1e3 for r in requests for a, b in itertools.pairwise(r["token_times_s"])]
    decode = [(r["output_tokens"] - 1) / (r["latency_s"] - r["ttft_s"]) for r in requests
              if r["output_tokens"] > 1 and r["latency_s"] > r["ttft_s"]]
    output = sum(r["output_tokens"] for r in requests)
    return {
        "requests": len(requests),
        "output_tokens": sorted({r["output_tokens"] for r in requests}),
        "ttft_ms": moments(ttft), "tpot_ms": moments(tpot), "itl_ms": moments(itl),
        "decode_tok_s": moments(decode),
        "output_tok_s": output / wall if wall else None,
        "total_tok_s": (output + sum(r["prompt_tokens"] for r in requests)) / wall if wall else None,
        "wall_s": wall,
    }


def serving_summary(run: Run) -> dict[tuple[str, int], dict]:
    """(mode, concurrency) -> request statistics of that level."""
    return {(r["mode"], r["concurrency"]): _request_stats(r["requests"], r["wall_s"])
            for r in run.of("serving").values()}


def fleet_summary(run: Run) -> dict[tuple[str, int], dict]:
    """(layout, concurrency) -> request statistics through the layout's one URL, whether a gateway
    fronts it, and its replicas: their CPU lists on one host, their URLs in a fleet of boards."""
    return {(r["layout"], r["concurrency"]): {
        **_request_stats(r["requests"], r["wall_s"]), "gateway": r["gateway"],
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
                      "vs_predicted": _ratio(increase, predicted)}
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
        per_threads.append({"threads": entry["threads"], "bandwidth": entry["bandwidth"], "rows": rows,
                            "m1_gbs": m1_gbs(rows), "m1_projections": sum(r["rows"] == 1 for r in rows)})
    return {**{key: record.get(key) for key in ("provider", "provider_reason", "kernel_isa", "vlen", "isa")},
            "runs": per_threads, "rows": [row for entry in per_threads for row in entry["rows"]]}


def _threads(count: int | None) -> str:
    return "threads n/a" if count is None else f"{count} thread{'s' * (count != 1)}"


def hf_generate(run: Run) -> dict | None:
    """Hugging Face generate: per mode median prefill/decode tok/s, on/off ratios, outputs equal; or None."""
    record = run.of("hf_generate").get("generate")
    return None if record is None else {**hf_generate_summarize(record), "repetitions": record["repetitions"],
                                        "output_ids": {m: r["output_ids"] for m, r in record["modes"].items()}}


def route_table(run: Run) -> list[dict] | None:
    """The warm-up's measured per-bucket route table from a flag-on policy report, if the plugin wrote one."""
    for kind in ("start", "one_batch"):
        for record in sorted(run.of(kind).values(), key=lambda r: r["cache_state"] != WARM):
            table = ((run.policy_report(record) or {}).get("warmup") or {}).get("route_table")
            if table:
                return table
    return None


# -- targets --------------------------------------------------------------------

@dataclass
class Target:
    name: str
    measured: str
    threshold: str
    met: bool | None  # None: the run has no data for it, or it is not judged on this run
    value: float | None = None
    not_judged: str | None = None  # why this run is not judged against it (a board target elsewhere)

    @property
    def verdict(self) -> str:
        if self.not_judged:
            return f"not judged: {self.not_judged}"
        return {True: "met", False: "NOT met", None: "no data"}[self.met]


def _decode_target(one_batch_ratio: float | None, hf: dict | None) -> Target:
    """Both engines must reach the ratio, HF generate with the same ids; a missing one leaves it open."""
    hf_ratio = hf["ratio"]["decode_tok_s"] if hf else None
    parts = ["one-batch " + ("n/a" if one_batch_ratio is None else f"{one_batch_ratio:.2f}×"),
             "HF generate " + ("n/a" if hf_ratio is None else f"{hf_ratio:.2f}×")
             + ("" if hf is None else f", outputs {'equal' if hf['outputs_equal'] else 'DIFFER'}")]
    ratios = [r for r in (one_batch_ratio, hf_ratio) if r is not None]
    failed = any(r < DECODE_RATIO_MIN for r in ratios) or (hf is not None and not hf["outputs_equal"])
    met = False if failed else (True if len(ratios) == 2 else None)
    return Target("decode tok/s, packed / row-major (one-batch warm medians; HF generate medians, equal outputs)",
                  "; ".join(parts), f"≥ {DECODE_RATIO_MIN:.2f}× both, HF outputs equal", met,
                  min(ratios) if ratios else None)


def targets(run: Run) -> list[Target]:
    out = []
    one = one_batch_summary(run)

    def warm(mode, key):
        s = one.get(mode, {}).get(WARM, {}).get(key)
        return s["median"] if s else None

    out.append(_decode_target(_ratio(warm("on", "median_decode_throughput"),
                                      warm("off", "median_decode_throughput")), hf_generate(run)))

    out.append(_rss_target(rss_summary(run)))

    start = start_summary(run).get("on", {})
    cold, warm_start = (start.get(s, {}).get("ttft_after_start_s") for s in (COLD, WARM))
    ratio = _ratio(warm_start, cold)
    out.append(Target(
        "TTFT after server start, artifact-warm / artifact-cold (flag on)",
        "n/a" if ratio is None else f"{ratio:.2f}× ({warm_start:.1f} s vs {cold:.1f} s)",
        f"≤ {WARM_START_RATIO_MAX:.2f}×", None if ratio is None else ratio <= WARM_START_RATIO_MAX, ratio))

    k = kernel(run)
    out.append(_bandwidth_target(k))

    several = k is not None and len(k["runs"]) > 1
    slower = [r for r in k["rows"] if r["policy_us"] > r["linear_us"] * (1 + SLOWER_TOLERANCE)] if k else None
    worst = min(k["rows"], key=lambda r: r["linear_us"] / r["policy_us"]) if k else None
    worst_at = f" at {_threads(worst['threads'])}" if several else ""
    # Not part of the verdict: how far one op's two timings landed apart, so a reader can tell a
    # slower cell from this run's noise. Runs before it was measured lack it.
    again = [abs(r["linear_us"] / r["linear_again_us"] - 1) for r in k["rows"] if "linear_again_us" in r] if k else []
    out.append(Target(
        "policy call never slower than row-major F.linear, per bucket (kernel)",
        "n/a" if worst is None else
        f"{len(slower)} of {len(k['rows'])} (projection, M{', threads' if several else ''}) slower; "
        f"worst {worst['projection']} M={worst['rows']}{worst_at}: "
        f"{worst['linear_us'] / worst['policy_us']:.2f}× row-major speed"
        + (f"; F.linear against itself in the same rounds: up to {max(again):.0%} apart, "
           f"{sum(a > SLOWER_TOLERANCE for a in again)} cells beyond {SLOWER_TOLERANCE:.0%}" if again else ""),
        f"0 slower by > {SLOWER_TOLERANCE:.0%}", None if slower is None else not slower,
        None if slower is None else float(len(slower))))

    out += [_board_bandwidth_target(run, k), _board_decode_target(run, warm("on", "median_decode_throughput"),
                                                                   warm("off", "median_decode_throughput"))]
    return out


def _bandwidth_target(k: dict | None) -> Target:
    """Judged at every thread count against the read bandwidth at that count; the lowest fraction counts."""
    judged = []
    for entry in k["runs"] if k else ():
        limit = entry["m1_gbs"]["read"] or entry["bandwidth"]["read_gbs"]
        fraction = _ratio(entry["m1_gbs"]["compiled"], limit)
        if fraction is not None:
            judged.append((fraction, limit, entry))
    name, threshold = "M=1 packed weight bandwidth / measured read bandwidth", f"≥ {BANDWIDTH_FRACTION_MIN:.0%}"
    if not judged:
        return Target(name, "n/a", threshold, None)
    fraction, limit, entry = min(judged, key=lambda j: j[0])
    at = f", {_threads(entry['threads'])}" if len(k["runs"]) > 1 else ""
    measured = (f"{fraction:.0%} ({entry['m1_gbs']['compiled']:.1f} of {limit:.1f} GB/s read "
                f"{'of the same weights in the same rounds' if entry['m1_gbs']['read'] else 'over 1 GiB'}, "
                f"{entry['m1_projections']} projections{at})"
                + "".join(f"; {_threads(other['threads'])}: {f:.0%}" for f, _, other in judged if other is not entry))
    return Target(name, measured, threshold, fraction >= BANDWIDTH_FRACTION_MIN, fraction)


def _off_the_board(run: Run) -> str | None:
    """Why a board target is not judged on this run, or None on a riscv64 machine."""
    machine = run.meta.get("provenance", {}).get("machine")
    return None if machine == BOARD_MACHINE else "needs a BPI-F3"


def _board_bandwidth_target(run: Run, k: dict | None) -> Target:
    """The packed route's M=1 GB/s at its best thread count, the others quoted beside it."""
    name = "BPI-F3: M=1 weights streamed by the packed route, best thread count (kernel)"
    threshold = (f"≥ {BOARD_M1_GBS_MIN:.1f} GB/s ({BOARD_M1_GBS_MIN / K1_PEAK_GBS:.1%} of the K1's "
                 f"{K1_PEAK_GBS} GB/s peak)")
    off = _off_the_board(run)
    gbs = {e["threads"]: e["m1_gbs"]["compiled"] for e in k["runs"] if e["m1_gbs"]["compiled"] is not None} \
        if k and not off else {}
    if not gbs:
        return Target(name, "n/a", threshold, None, not_judged=off)
    best = max(gbs, key=gbs.get)
    measured = (f"{gbs[best]:.2f} GB/s at {_threads(best)}"
                + "".join(f"; {_threads(t)}: {v:.2f} GB/s" for t, v in gbs.items() if t != best)
                + f" (provider {k['provider']}, {k['kernel_isa'] or 'no native kernels'})")
    return Target(name, measured, threshold, gbs[best] >= BOARD_M1_GBS_MIN, gbs[best])


def _board_decode_target(run: Run, on: float | None, off: float | None) -> Target:
    """One-batch decode, packed (warm median), of the board's model: another model's run is not judged."""
    name = "BPI-F3: Qwen3-0.6B BF16 decode tok/s, packed (one-batch warm median)"
    threshold = f"≥ {BOARD_DECODE_TOK_S_MIN:.1f} tok/s (the seed's published run: {SEED_DECODE_TOK_S:.2f})"
    model = run.meta.get("provenance", {}).get("model", {})
    names = [model.get("name_or_path") or "", model.get("generated_shape") or ""]
    off_board = _off_the_board(run)
    if off_board is None and not any(BOARD_MODEL in n.lower() for n in names):
        off_board = (f"the target is for Qwen3-0.6B, this run's model is "
                     f"{names[0] or names[1] or Path(model.get('path', '?')).name}")
    if off_board or on is None:
        return Target(name, "n/a", threshold, None, not_judged=off_board)
    measured = f"{on:.2f} tok/s (row-major {_fmt(off, 2)} tok/s)"
    return Target(name, measured, threshold, on >= BOARD_DECODE_TOK_S_MIN, on)


# -- CSV rows -------------------------------------------------------------------

def metric_rows(run: Run) -> list[dict]:
    """Every number of the report, one row each (the CSV, and the comparison's rows)."""
    rows = []

    def add(section, name, mode, key, stat, value, unit):
        if value is not None:
            rows.append(dict(run=run.label, section=section, name=name, mode=mode, key=key, stat=stat,
                             value=value, unit=unit))

    for mode, states in one_batch_summary(run).items():
        for state, metrics in states.items():
            for key, label in ONE_BATCH_METRICS:
                for stat, value in (metrics[key] or {}).items():
                    if stat != "n":
                        add("one_batch", label, mode, state, stat, value, label.split()[-1])
    for (mode, concurrency), stats in serving_summary(run).items():
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "decode_tok_s"):
            for stat, value in (stats[key] or {}).items():
                add("serving", key, mode, f"c={concurrency}", stat, value, "tok/s" if key == "decode_tok_s" else "ms")
        for key in ("output_tok_s", "total_tok_s", "wall_s"):
            add("serving", key, mode, f"c={concurrency}", "value", stats[key], "tok/s" if "tok" in key else "s")
    for (layout, concurrency), stats in fleet_summary(run).items():
        add("fleet", "output_tok_s", layout, f"c={concurrency}", "value", stats["output_tok_s"], "tok/s")
        for stat in ("median", "p99"):
            add("fleet", "ttft_ms", layout, f"c={concurrency}", stat, (stats["ttft_ms"] or {}).get(stat), "ms")
    for mode, states in start_summary(run).items():
        for state, values in states.items():
            for key in ("ready_s", "ttft_after_start_s", "install_seconds"):
                add("start", key, mode, state, "value", values[key], "s")
    rss = rss_summary(run)
    add("rss", "predicted packed", "on", "", "value", rss["predicted_mib"], "MiB")
    for name, values in rss["rows"].items():
        for stat in ("off_mib", "on_mib", "increase_mib"):
            add("rss", name, "", "", stat, values[stat], "MiB")
    for key, per_level in linear_calls(run).items():
        for concurrency, count in per_level.items():
            add("linear_calls", key, "on", f"c={concurrency}", "delta", count, "calls")
    k = kernel(run)
    for row in k["rows"] if k else ():
        key = f"M={row['rows']} threads={row['threads']}"
        for stat in ("linear_us", "compiled_us", "eager_us", "policy_us", "linear_again_us"):
            add("kernel", row["projection"], "", key, stat, row.get(stat), "us")
        for variant in ("linear", "compiled"):
            add("kernel", row["projection"], "", key, f"{variant}_gbs", weight_gbs(row, variant), "GB/s")
    for entry in k["runs"] if k else ():
        key = f"threads={entry['threads']}"
        for stat, value in entry["bandwidth"].items():
            add("kernel", "memory bandwidth", "", key, stat, value, "GB/s")
        for name, value in entry["m1_gbs"].items():
            add("kernel", "M=1 weight bandwidth", name, key, "gbs", value, "GB/s")
    hf = hf_generate(run)
    for mode in MODES if hf else ():
        for key in ("prefill_tok_s", "decode_tok_s"):
            add("hf_generate", key, mode, "", "median", hf[mode][key], "tok/s")
    if hf:
        for key, value in hf["ratio"].items():
            add("hf_generate", key, "on / off", "", "ratio", value, "×")
        add("hf_generate", "outputs equal", "", "", "value", float(hf["outputs_equal"]), "bool")
    for entry in route_table(run) or []:
        for stat in ("packed_us", "row_major_us"):
            add("route_table", entry["projection"], entry.get("route", ""), f"bucket={entry['bucket']}", stat,
                entry.get(stat), "us")
    for target in targets(run):
        add("targets", target.name, "", target.verdict, "value", target.value, "")
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


# -- markdown ---------------------------------------------------------------------

def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _header(run: Run) -> str:
    p = run.meta.get("provenance", {})
    source, model = p.get("source", {}), p.get("model", {})
    commit = source.get("commit")
    dirty = " (dirty)" if source.get("dirty") else ""
    commit = f"{commit[:12]}{dirty}" if commit else f"app {source.get('app_version')}"
    settings = run.meta.get("settings", {})
    loads = [r["load_average"][0] for kind in run.results.values() for r in kind.values() if r.get("load_average")]
    load = f"{min(loads):.1f}–{max(loads):.1f}" if loads else "n/a"
    lines = [
        f"- run: `{run.dir}` ({run.label}), {run.meta.get('seconds', 'n/a')} s"
        + ("" if run.meta.get("complete") else f", **incomplete**: {run.meta.get('error', 'interrupted')}"),
        f"- source: {commit}; image: {p.get('image_id') or 'none'}; locks: "
        + (", ".join(f"{Path(k).name} {v[:12]}" for k, v in p.get("lock_sha256", {}).items()) or "none"),
        f"- model: `{model.get('path')}` ({model.get('name_or_path') or Path(model.get('path', '?')).name}, "
        f"revision {model.get('revision') or 'unknown'}"
        + (f", random weights with {model['generated_shape']}'s shapes" if model.get("generated_shape") else "") + ")",
        f"- machine: {p.get('cpu_model')} ({p.get('machine')}), {p.get('cpu_count')} cores "
        f"({p.get('usable_cpus')} usable), OMP_NUM_THREADS={p.get('omp_num_threads')}",
        f"- stack: torch {p.get('torch')}, sglang {p.get('sglang')}, python {p.get('python')}, "
        f"sglang-rvv {p.get('app_version')}",
        _kernel_facts_line(kernel(run)),
        f"- load average (1 min) while results were written: {load} (the suite's own processes account for "
        f"about {p.get('omp_num_threads') or p.get('usable_cpus')}; more means other work competed for the CPUs)",
        f"- settings: batch 1, input {settings.get('input_len')}, output {settings.get('output_len')}, BF16, TP 1, "
        f"torch_native; {settings.get('runs')} artifact-warm one-batch runs per mode, "
        f"{settings.get('requests')} measured requests per concurrency level {settings.get('concurrency')}",
    ]
    if p.get("workers"):  # a fleet run (python -m sglang_rvv.bench.fleet): the servers are the boards
        lines[3:] = [
            f"- fleet: the gateway {settings.get('gateway')} in front of {', '.join(p['workers'])}, which run "
            f"sglang {p.get('sglang')}; the measuring client ran on the gateway host: {p.get('cpu_model')} "
            f"({p.get('machine')}), python {p.get('python')}",
            f"- settings: input {settings.get('input_len')}, output {settings.get('output_len')} tokens, "
            f"{settings.get('requests')} measured requests per concurrency level {settings.get('concurrency')} "
            f"(at least the level's concurrency), prompts seed {settings.get('seed')}",
        ]
    return "\n".join(lines)


def _kernel_facts_line(k: dict | None) -> str:
    if k is None:
        return "- kernels: no kernel step in this run (flag-on policy reports name their provider)"
    return (f"- kernels (kernel step): provider {k['provider']}"
            + (f" ({k['provider_reason']})" if k["provider_reason"] else "")
            + f"; native kernels {k['kernel_isa'] or 'not loaded'}, VLEN {k['vlen'] or 'n/a'}; "
            f"/proc/cpuinfo isa {k['isa'] or 'n/a'}; {', '.join(_threads(e['threads']) for e in k['runs'])}")


def _targets_md(run: Run) -> str:
    return _table(["target", "measured", "threshold", "verdict"],
                  [[t.name, t.measured, t.threshold, f"**{t.verdict}**"] for t in targets(run)])


def _one_batch_md(run: Run) -> str:
    summary = one_batch_summary(run)
    if not summary:
        return "_no one-batch results_"
    rows = []
    for mode in MODES:
        for state in (COLD, WARM):
            metrics = summary.get(mode, {}).get(state)
            if metrics:
                n = max((m or {}).get("n", 0) for m in metrics.values())
                rows.append([MODES[mode], state, n, *[_fmt_spread(metrics[key], 0 if key.endswith("_mib") else 1)
                                                        for key, _ in ONE_BATCH_METRICS]])
    on, off = summary.get("on", {}).get(WARM), summary.get("off", {}).get(WARM)
    if on and off:
        ratios = [_ratio((on[k] or {}).get("median"), (off[k] or {}).get("median")) for k, _ in ONE_BATCH_METRICS[:3]]
        rows.append(["on / off", WARM, "", *[f"{r:.2f}×" if r else "n/a" for r in ratios], "", ""])
    return ("Warm cells: median [min–max] over fresh processes.\n\n"
            + _table(["mode", "cache", "runs", *[label for _, label in ONE_BATCH_METRICS]], rows))


def _serving_md(run: Run) -> str:
    summary = serving_summary(run)
    if not summary:
        return "_no serving results_"
    rows = []
    for (mode, concurrency), s in sorted(summary.items(), key=lambda kv: (list(MODES).index(kv[0][0]), kv[0][1])):
        cells = [MODES[mode], concurrency, s["requests"], "/".join(map(str, s["output_tokens"]))]
        for key in ("ttft_ms", "tpot_ms", "itl_ms"):
            m = s[key] or {}
            cells.append(" / ".join(_fmt(m.get(stat), 0) for stat in ("mean", "median", "p99")))
        d = s["decode_tok_s"] or {}
        cells += [_fmt(d.get("median")), _fmt(s["output_tok_s"], 2), _fmt(s["total_tok_s"]), _fmt(s["wall_s"])]
        rows.append(cells)
    return ("Artifact-warm server; TTFT, TPOT and ITL as mean / median / p99 in ms; decode tok/s is the median "
            "request's (output tokens − 1) / (latency − TTFT); aggregate tok/s over the level's wall time.\n\n"
            + _table(["mode", "concurrency", "requests", "output tokens", "TTFT ms", "TPOT ms", "ITL ms",
                      "decode tok/s per request", "aggregate output tok/s", "aggregate total tok/s", "wall s"], rows))


def _fleet_md(run: Run) -> str:
    summary = fleet_summary(run)
    if not summary:
        reason = run.meta.get("left_out", {}).get("fleet")
        return f"_left out: {reason}_" if reason else "_no fleet results_"
    single = {c: s["output_tok_s"] for (_, c), s in summary.items() if not s["gateway"]}
    rows = []
    for (layout, concurrency), s in sorted(summary.items()):
        ttft = s["ttft_ms"] or {}
        rows.append([layout, " / ".join(s["replicas"]), concurrency, s["requests"],
                     _fmt(s["output_tok_s"], 2), _fmt(_ratio(s["output_tok_s"], single.get(concurrency)), 2),
                     _fmt(ttft.get("median"), 0), _fmt(ttft.get("p99"), 0), _fmt(s["wall_s"])])
    return ("Each layout serves through one URL: one server alone, or SGLang's gateway (smg, cache-aware) in "
            "front of several. A replica is a board (its URL), or, in the suite's fleet step, a server on the "
            "CPUs listed, flag on: where the host has fewer cores than a fleet has boards, the replicas share "
            "them, and the numbers show the mechanism, not a speed-up.\n\n"
            + _table(["layout", "replicas (CPUs or URL)", "concurrency", "requests", "aggregate output tok/s",
                      "vs 1 replica", "TTFT median ms", "TTFT p99 ms", "wall s"], rows))


def _start_md(run: Run) -> str:
    summary = start_summary(run)
    if not summary:
        return "_no start results_"
    rows = []
    for mode in MODES:
        states = summary.get(mode, {})
        for state in (COLD, WARM):
            if state in states:
                s, w = states[state], states[state]["warmup"]
                warmup = f"{len(w['keys'])} keys, {w['compiled']} compiled, {w['cache_hits']} cache hits, " \
                         f"{w['seconds']:.1f} s" if w else "none"
                rows.append([MODES[mode], state, _fmt(s["ready_s"]), _fmt(s["ttft_after_start_s"]),
                             "none" if mode == "off" else _fmt(s["install_seconds"]), warmup])
        if COLD in states and WARM in states:
            ratio = _ratio(states[WARM]["ttft_after_start_s"], states[COLD]["ttft_after_start_s"])
            rows.append([MODES[mode], "warm / cold", "", f"{ratio:.2f}×", "", ""])
    return ("Process start to healthy (`ready`) and to the first streamed token of the first request. Flag on, "
            "the server packs the weights (`install s`, cache or not), then at load (`--cpu-rvv-warmup`) compiles "
            "every shape key (cold) or loads from the Inductor cache the keys its cached route table keeps "
            "packed (warm).\n\n"
            + _table(["mode", "cache", "ready s", "TTFT after start s", "install s", "warm-up at load"], rows))


def _rss_target(rss: dict) -> Target:
    """Judged on the peak after weight loading; a run from before that measure on the whole-process peak,
    named as such. The other measures are quoted beside it: they explain a miss."""
    rows = rss["rows"]
    judged = next((name for name in RSS_MEASURES[:2] if rows[name]["vs_predicted"] is not None), None)
    deviation = None if judged is None else rows[judged]["vs_predicted"] - 1
    if judged is None:
        measured = "n/a"
    else:
        also = [f"{name.split(' (')[0].removeprefix('one-batch ')} {v['increase_mib']:+,.0f} MiB "
                f"({v['vs_predicted'] - 1:+.0%})" for name, v in rows.items()
                if name != judged and v["vs_predicted"] is not None]
        measured = (f"{'' if judged == RSS_MEASURES[0] else 'whole process (no after-load peak in this run): '}"
                    f"{rows[judged]['increase_mib']:+,.0f} MiB vs {rss['predicted_mib']:,.0f} MiB predicted "
                    f"({deviation:+.0%})" + "".join(f"; {a}" for a in also))
    return Target("peak RSS increase on vs off after weight loading, vs predicted packed bytes", measured,
                  f"within ±{RSS_TOLERANCE:.0%}", None if deviation is None else abs(deviation) <= RSS_TOLERANCE,
                  deviation)


def _rss_md(run: Run) -> str:
    rss = rss_summary(run)
    rows = [[name, _fmt(v["off_mib"], 0), _fmt(v["on_mib"], 0), _fmt(v["increase_mib"], 0),
             _fmt(rss["predicted_mib"], 0), "n/a" if v["vs_predicted"] is None else f"{v['vs_predicted']:.2f}×"]
            for name, v in rss["rows"].items()]
    return ("Predicted: the policy report's `packed_bytes`. The policy packs after SGLang has loaded the weights, "
            "so its cost shows in the peak from there on (the kernel's high-water mark is reset at the end of "
            "loading): that is the target's measure. The whole-process peak also holds the loader's transient "
            "(file pages beside the tensors), which the packed copy may fit under; the server's steady RSS "
            "(process tree, after the last level) shows the packed copy itself.\n\n"
            + _table(["measure", "off MiB", "on MiB", "increase MiB", "predicted MiB", "increase / predicted"], rows))


def _calls_md(run: Run) -> str:
    calls = linear_calls(run)
    if not calls:
        return "_no policy counters (flag-on server with --enable-metrics)_"
    served = levels(run)
    rows = [[*key.split("/"), *[_fmt(v.get(c), 0) if v.get(c) is not None else "" for c in served]]
            for key, v in calls.items()]
    return ("`sglang_rvv_linear_calls_total` deltas over each level's measured requests (flag on).\n\n"
            + _table(["projection", "route", "bucket", *[f"c={c}" for c in served]], rows))


def _kernel_md(run: Run) -> str:
    k = kernel(run)
    if k is None:
        return "_no kernel results_"
    # Cells in the order they ran, each at every thread count side by side (sorted is stable).
    order = {cell: i for i, cell in enumerate(dict.fromkeys((r["projection"], r["rows"]) for r in k["rows"]))}
    ordered = sorted(k["rows"], key=lambda r: order[r["projection"], r["rows"]])
    rows = [[r["projection"], f"{r['n']}x{r['k']}", r["rows"], _fmt(r["threads"], 0),
             *[_fmt(r.get(c), 0) for c in ("linear_us", "compiled_us", "eager_us", "policy_us", "linear_again_us")],
             f"{r['linear_us'] / r['policy_us']:.2f}",
             f"{r['linear_us'] / r['linear_again_us']:.2f}" if "linear_again_us" in r else "n/a",
             ",".join(r.get("policy_routes", []))] for r in ordered]
    notes = []
    for entry in k["runs"]:
        bw, m1 = entry["bandwidth"], entry["m1_gbs"]
        notes.append(f"- {_threads(entry['threads'])}: memory bandwidth read {bw['read_gbs']:.1f} GB/s, copy "
                     f"{bw['copy_gbs']:.1f} GB/s. M=1 across {entry['m1_projections']} projections: packed compiled "
                     f"{_fmt(m1['compiled'])} GB/s, row-major {_fmt(m1['linear'])} GB/s"
                     + (f", a plain read of the same weights in the same rounds {_fmt(m1['read'])} GB/s"
                        if m1["read"] else "") + ".")
    return (f"Provider {k['provider']}.\n\n" + "\n".join(notes) + "\n\n"
            "GB/s of weights streamed: the BF16 weight's N·K·2 bytes over the time per call, each thread "
            "count side by side (decode reads every weight once per token, so this bounds tok/s).\n\n"
            + _gbs_table(k) + "\n\n"
            "`F.linear again` is the same F.linear timed after the policy call in each round: its ratio to "
            "the first is this run's noise floor for the cell.\n\n"
            + _table(["projection", "N x K", "M", "threads", "F.linear µs", "packed compiled µs", "packed eager µs",
                      "policy µs", "F.linear again µs", "F.linear / policy", "F.linear / again", "policy routes"],
                     rows))


def _gbs_table(k: dict) -> str:
    """One row per (projection, M), packed and F.linear GB/s per thread count; then M=1 over every projection."""
    threads = [entry["threads"] for entry in k["runs"]]
    cells: dict[tuple, dict] = {}
    for row in k["rows"]:
        cells.setdefault((row["projection"], f"{row['n']}x{row['k']}", row["rows"]), {})[row["threads"]] = row
    variants = (("compiled", "packed"), ("linear", "F.linear"))
    rows = [[*cell, *[_fmt(weight_gbs(by_threads[t], variant), 2) if t in by_threads else "" for t in threads
                      for variant, _ in variants]] for cell, by_threads in cells.items()]
    if any(entry["m1_projections"] for entry in k["runs"]):
        rows.append(["M=1, all projections", "", 1, *[_fmt(entry["m1_gbs"][variant], 2) for entry in k["runs"]
                                                       for variant, _ in variants]])
    return _table(["projection", "N x K", "M", *[f"{label} GB/s, {_threads(t)}" for t in threads
                                                  for _, label in variants]], rows)


def _hf_generate_md(run: Run) -> str:
    hf = hf_generate(run)
    if hf is None:
        return "_no Hugging Face generate results_"
    rows = [[MODES[mode], hf[mode]["n"], _fmt(hf[mode]["prefill_tok_s"]), _fmt(hf[mode]["decode_tok_s"]),
             " ".join(map(str, hf["output_ids"].get(mode, [])))] for mode in MODES]
    ratio = hf["ratio"]
    rows.append(["on / off", "", *[f"{r:.2f}×" if r else "n/a" for r in (ratio["prefill_tok_s"],
                                                                        ratio["decode_tok_s"])], ""])
    return ("One process, one model: row-major, then the policy installed and warmed up. Prefill tok/s: input "
            "tokens / a one-token generate; decode tok/s: (new tokens − 1) / (full generate − that); medians over "
            f"the repetitions, each mode after one untimed generate. Outputs equal: "
            f"**{'yes' if hf['outputs_equal'] else 'no'}**.\n\n"
            + _table(["mode", "repetitions", "prefill tok/s", "decode tok/s", "generated ids"], rows))


def _route_table_md(run: Run) -> str:
    table = route_table(run)
    if not table:
        return "_no measured route table in the policy reports (`warmup.route_table`)_"
    rows = [[e.get("projection"), e.get("bucket"), f"{e.get('out_features')}x{e.get('in_features')}",
             _fmt(e.get("packed_us"), 0), _fmt(e.get("row_major_us"), 0), e.get("route"), e.get("source", "")]
            for e in table]
    return _table(["projection", "bucket", "N x K", "packed µs", "row-major µs", "route", "source"], rows)


SECTIONS = (("Targets (issue 6 and the BPI-F3)", _targets_md), ("One-batch", _one_batch_md),
            ("Serving, concurrency 1 vs 2", _serving_md), ("Hugging Face generate", _hf_generate_md),
            ("Server start, cold vs warm cache", _start_md), ("RSS vs predicted packed bytes", _rss_md),
            ("Measured route table", _route_table_md), ("Bucket hits", _calls_md),
            ("Kernel (Linear microbenchmark)", _kernel_md),
            ("Fleet: 1 replica vs several behind the gateway", _fleet_md))


def render_run(run: Run, plots: list[Path] = (), base: Path | None = None) -> str:
    parts = [f"# sglang-rvv benchmark: {run.label}", _header(run)]
    for title, render in SECTIONS:
        parts += [f"## {title}", render(run)]
    if plots:
        parts += ["## Plots", "\n".join(f"![{p.stem}]({p.relative_to(base) if base else p})" for p in plots)]
    return "\n\n".join(parts) + "\n"


COMPARISON_TITLES = {"one_batch": "One-batch", "serving": "Serving", "hf_generate": "Hugging Face generate",
                     "start": "Server start", "rss": "RSS", "linear_calls": "Bucket hits", "kernel": "Kernel",
                     "route_table": "Measured route table", "fleet": "Fleet (1 replica vs several behind the gateway)"}


def render_comparison(runs: list[Run], plots: list[Path] = (), base: Path | None = None) -> str:
    """Side by side: one column per run, one row per metric (every row of the CSVs, by section)."""
    labels = [run.label for run in runs]
    parts = [f"# sglang-rvv benchmark comparison: {len(runs)} runs", "\n".join(
        f"- {run.label}: `{run.dir}`, model `{Path(run.meta['provenance']['model']['path']).name}`, "
        f"commit {(run.meta['provenance']['source'].get('commit') or 'n/a')[:12]}" for run in runs)]
    parts += ["## Targets (issue 6 and the BPI-F3)", _table(["target", *labels], [
        [per_run[0].name, *[f"{t.measured} — **{t.verdict}**" for t in per_run]]
        for per_run in zip(*(targets(run) for run in runs), strict=True)])]
    values: dict[str, dict[tuple, dict[str, float]]] = {}
    for run in runs:
        for row in metric_rows(run):
            if row["section"] != "targets":
                key = (row["name"], row["mode"], row["key"], row["stat"], row["unit"])
                values.setdefault(row["section"], {}).setdefault(key, {})[run.label] = row["value"]
    for section, rows in values.items():
        table = [[*key[:4], key[4], *[_num(cells.get(label)) for label in labels]] for key, cells in rows.items()]
        parts += [f"## {COMPARISON_TITLES[section]}", _table(["name", "mode", "key", "stat", "unit", *labels], table)]
    if plots:
        parts += ["## Plots", "\n".join(f"![{p.stem}]({p.relative_to(base) if base else p})" for p in plots)]
    return "\n\n".join(parts) + "\n"


# -- plots ------------------------------------------------------------------------

def render_plots(runs: list[Run], out_dir: Path) -> list[Path]:
    from .plots import Panel, bar_chart

    several = len(runs) > 1
    labels = [run.label for run in runs]
    paths = []
    one = [one_batch_summary(run) for run in runs]
    if any(one):
        panels = []
        for key, label in ONE_BATCH_METRICS[:3]:
            cells = {mode: [(s.get(mode, {}).get(WARM, {}) or {}).get(key) for s in one] for mode in MODES}
            panels.append(Panel(label, "tok/s", labels if several else ["artifact-warm"],
                                {MODES[m]: [c["median"] if c else None for c in v] for m, v in cells.items()},
                                {MODES[m]: [(c["min"], c["max"]) if c else None for c in v] for m, v in cells.items()}))
        paths.append(bar_chart(out_dir / "tok_s.png", "One-batch tok/s, row-major vs packed", panels))
    serving = [serving_summary(run) for run in runs]
    if any(serving):
        keys = sorted({(label, c) for label, s in zip(labels, serving, strict=True) for (_, c) in s})
        categories = [f"{label}\nc={c}" if several else f"c={c}" for label, c in keys]
        panels = []
        for metric, title in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            series = {}
            for mode in MODES:
                series[MODES[mode]] = [((serving[labels.index(label)].get((mode, c)) or {}).get(metric) or {})
                                       .get("median") for label, c in keys]
            panels.append(Panel(f"{title} (median)", "ms", categories, series))
        paths.append(bar_chart(out_dir / "serving_latency.png", "Serving latency at concurrency 1 vs 2", panels))
    starts = [start_summary(run) for run in runs]
    if any(starts):
        categories = [f"{label}\n{MODES[m]}" if several else MODES[m] for label in labels for m in MODES]
        series = {state: [(s.get(m, {}).get(state) or {}).get("ttft_after_start_s") for s in starts for m in MODES]
                  for state in (COLD, WARM)}
        paths.append(bar_chart(out_dir / "start.png", "Server start to first token, cold vs warm Inductor cache",
                               [Panel("TTFT after start", "s", categories, series)]))
    rss = [rss_summary(run) for run in runs]
    if any(r["predicted_mib"] is not None for r in rss):
        series = {name: [r["rows"][name]["increase_mib"] for r in rss] for name in rss[0]["rows"]}
        series["predicted packed bytes"] = [r["predicted_mib"] for r in rss]
        paths.append(bar_chart(out_dir / "rss.png", "RSS increase, flag on vs off, vs predicted",
                               [Panel("RSS increase", "MiB", labels if several else ["on − off"], series)]))
    return paths


# -- command ----------------------------------------------------------------------

def write_report(runs: list[Run], out_dir: Path) -> str:
    """report.md, metrics.csv and plots/ in ``out_dir``; returns the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = render_plots(runs, out_dir / "plots")
    write_csv(out_dir / "metrics.csv", [row for run in runs for row in metric_rows(run)])
    markdown = render_run(runs[0], plots, out_dir) if len(runs) == 1 else render_comparison(runs, plots, out_dir)
    (out_dir / "report.md").write_text(markdown)
    return markdown


def add_arguments(parser) -> None:
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run directories (results/<host>/<UTC ts>)")
    parser.add_argument("--out", type=Path, help="write the report files here instead of into the run directory "
                                                 "(with several DIRs: the comparison's files)")


def run(args) -> int:
    try:
        runs = [load_run(d) for d in args.dirs]
    except RunDirError as error:
        print(f"sglang-rvv report: error: {error}", file=sys.stderr)
        return 2
    if len(runs) == 1:
        markdown = write_report(runs, args.out or runs[0].dir)
        print(f"sglang-rvv report: wrote {args.out or runs[0].dir}/report.md", file=sys.stderr)
    else:
        for one in runs:
            write_report([one], one.dir)
        markdown = render_comparison(runs) if args.out is None else write_report(runs, args.out)
        print(f"sglang-rvv report: wrote report.md into each of {len(runs)} run directories"
              + (f" and the comparison into {args.out}" if args.out else ""), file=sys.stderr)
    print(markdown, end="")
    return 0
