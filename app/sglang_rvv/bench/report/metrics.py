"""Every number of the report as one row (:func:`metric_rows`: metrics.csv and the comparison's rows)
and the CSV writer."""

from __future__ import annotations

import csv
from pathlib import Path

from ..hf_generate import layout_mode
from ..results import Run, weight_gbs
from . import summaries
from .targets import targets

CSV_FIELDS = ("run", "section", "name", "mode", "key", "stat", "value", "unit")


def metric_rows(run: Run) -> list[dict]:
    """Every number of the report, one row each (the CSV, and the comparison's rows)."""
    rows = []

    def add(section, name, mode, key, stat, value, unit):
        if value is not None:
            rows.append(dict(run=run.label, section=section, name=name, mode=mode, key=key, stat=stat,
                             value=value, unit=unit))

    for mode, states in summaries.one_batch_summary(run).items():
        for state, metrics in states.items():
            for key, label in summaries.ONE_BATCH_METRICS:
                for stat, value in (metrics[key] or {}).items():
                    if stat != "n":
                        add("one_batch", label, mode, state, stat, value, label.split()[-1])
    for (mode, concurrency), stats in summaries.serving_summary(run).items():
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "decode_tok_s"):
            for stat, value in (stats[key] or {}).items():
                add("serving", key, mode, f"c={concurrency}", stat, value, "tok/s" if key == "decode_tok_s" else "ms")
        for key in ("output_tok_s", "total_tok_s", "wall_s"):
            add("serving", key, mode, f"c={concurrency}", "value", stats[key], "tok/s" if "tok" in key else "s")
    for (layout, concurrency), stats in summaries.fleet_summary(run).items():
        add("fleet", "output_tok_s", layout, f"c={concurrency}", "value", stats["output_tok_s"], "tok/s")
        for stat in ("median", "p99"):
            add("fleet", "ttft_ms", layout, f"c={concurrency}", stat, (stats["ttft_ms"] or {}).get(stat), "ms")
    for mode, states in summaries.start_summary(run).items():
        for state, values in states.items():
            for key in ("ready_s", "ttft_after_start_s", "install_seconds"):
                add("start", key, mode, state, "value", values[key], "s")
    rss = summaries.rss_summary(run)
    add("rss", "predicted packed", "on", "", "value", rss["predicted_mib"], "MiB")
    for name, values in rss["rows"].items():
        for stat in ("off_mib", "on_mib", "increase_mib"):
            add("rss", name, "", "", stat, values[stat], "MiB")
    for key, per_level in summaries.linear_calls(run).items():
        for concurrency, count in per_level.items():
            add("linear_calls", key, "on", f"c={concurrency}", "delta", count, "calls")
    k = summaries.kernel(run)
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
    hf = summaries.hf_generate(run)
    for mode in summaries.MODES if hf else ():
        for key in ("prefill_tok_s", "decode_tok_s"):
            add("hf_generate", key, mode, "", "median", hf[mode][key], "tok/s")
    if hf:
        for key, value in hf["ratio"].items():
            add("hf_generate", key, "on / off", "", "ratio", value, "×")
        add("hf_generate", "outputs equal", "", "", "value", float(hf["outputs_equal"]), "bool")
        for name, v in hf["layouts"].items():
            add("hf_generate", "decode_tok_s", layout_mode(name), "", "median", v["decode_tok_s"], "tok/s")
            add("hf_generate", "decode_tok_s", f"{name} / bf16", "", "ratio", v["vs_bf16"], "×")
    for entry in summaries.route_table(run) or []:
        for stat in ("packed_us", "eager_us", "row_major_us"):
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
