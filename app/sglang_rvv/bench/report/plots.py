"""The report's plots (plots/*.png); matplotlib is imported only when they are drawn."""

from __future__ import annotations

from pathlib import Path

from ..results import COLD, WARM, Run
from .summaries import MODES, ONE_BATCH_METRICS, one_batch_summary, rss_summary, serving_summary, start_summary


def render_plots(runs: list[Run], out_dir: Path) -> list[Path]:
    from .charts import Panel, bar_chart

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
