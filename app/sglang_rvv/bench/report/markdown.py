"""The markdown: one run's report.md (its header and one section per kind) and the side-by-side
comparison of several runs."""

from __future__ import annotations

from pathlib import Path

from ..hf_generate import agreement, layout_mode
from ..results import COLD, WARM, Run, weight_gbs
from .metrics import metric_rows
from .stats import fmt, ratio, threads
from .summaries import (
    MODES,
    ONE_BATCH_METRICS,
    fleet_summary,
    hf_generate,
    kernel,
    layouts,
    levels,
    linear_calls,
    mode_label,
    one_batch_summary,
    route_table,
    rss_summary,
    serving_summary,
    start_summary,
)
from .targets import targets


def _num(value: float | None) -> str:
    """A number at a precision that suits its size (the comparison mixes µs, tok/s and ratios)."""
    if value is None:
        return ""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def _fmt_spread(s: dict | None, digits: int = 1) -> str:
    if s is None:
        return "n/a"
    if s["n"] == 1:
        return fmt(s["median"], digits)
    return f"{fmt(s['median'], digits)} [{fmt(s['min'], digits)}–{fmt(s['max'], digits)}]"


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
            f"/proc/cpuinfo isa {k['isa'] or 'n/a'}; {', '.join(threads(e['threads'], e['cpus']) for e in k['runs'])}")


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
        ratios = [ratio((on[k] or {}).get("median"), (off[k] or {}).get("median")) for k, _ in ONE_BATCH_METRICS[:3]]
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
            cells.append(" / ".join(fmt(m.get(stat), 0) for stat in ("mean", "median", "p99")))
        d = s["decode_tok_s"] or {}
        cells += [fmt(d.get("median")), fmt(s["output_tok_s"], 2), fmt(s["total_tok_s"]), fmt(s["wall_s"])]
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
                     fmt(s["output_tok_s"], 2), fmt(ratio(s["output_tok_s"], single.get(concurrency)), 2),
                     fmt(ttft.get("median"), 0), fmt(ttft.get("p99"), 0), fmt(s["wall_s"])])
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
                rows.append([MODES[mode], state, fmt(s["ready_s"]), fmt(s["ttft_after_start_s"]),
                             "none" if mode == "off" else fmt(s["install_seconds"]), warmup])
        if COLD in states and WARM in states:
            warm_cold = ratio(states[WARM]["ttft_after_start_s"], states[COLD]["ttft_after_start_s"])
            rows.append([MODES[mode], "warm / cold", "", f"{warm_cold:.2f}×", "", ""])
    return ("Process start to healthy (`ready`) and to the first streamed token of the first request. Flag on, "
            "the server packs the weights (`install s`, cache or not), then at load (`--cpu-rvv-warmup`) compiles "
            "every shape key (cold) or loads from the Inductor cache the keys its cached route table keeps "
            "packed (warm).\n\n"
            + _table(["mode", "cache", "ready s", "TTFT after start s", "install s", "warm-up at load"], rows))


def _rss_md(run: Run) -> str:
    rss = rss_summary(run)
    rows = [[name, fmt(v["off_mib"], 0), fmt(v["on_mib"], 0), fmt(v["increase_mib"], 0),
             fmt(rss["predicted_mib"], 0), "n/a" if v["vs_predicted"] is None else f"{v['vs_predicted']:.2f}×"]
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
    rows = [[*key.split("/"), *[fmt(v.get(c), 0) if v.get(c) is not None else "" for c in served]]
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
    rows = [[r["projection"], f"{r['n']}x{r['k']}", r["rows"], fmt(r["threads"], 0),
             *[fmt(r.get(c), 0) for c in ("linear_us", "compiled_us", "eager_us", "policy_us", "linear_again_us")],
             f"{r['linear_us'] / r['policy_us']:.2f}",
             f"{r['linear_us'] / r['linear_again_us']:.2f}" if "linear_again_us" in r else "n/a",
             ",".join(r.get("policy_routes", []))] for r in ordered]
    notes = []
    for entry in k["runs"]:
        bw, m1 = entry["bandwidth"], entry["m1_gbs"]
        notes.append(f"- {threads(entry['threads'], entry['cpus'])}: memory bandwidth read {bw['read_gbs']:.1f} GB/s, "
                     f"copy {bw['copy_gbs']:.1f} GB/s. M=1 across {entry['m1_projections']} projections: packed "
                     f"compiled {fmt(m1['compiled'])} GB/s, row-major {fmt(m1['linear'])} GB/s"
                     + (f", a plain read of the same weights in the same rounds {fmt(m1['read'])} GB/s"
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
    counts = [entry["threads"] for entry in k["runs"]]
    cells: dict[tuple, dict] = {}
    for row in k["rows"]:
        cells.setdefault((row["projection"], f"{row['n']}x{row['k']}", row["rows"]), {})[row["threads"]] = row
    variants = (("compiled", "packed"), ("linear", "F.linear"))
    rows = [[*cell, *[fmt(weight_gbs(by_threads[t], variant), 2) if t in by_threads else "" for t in counts
                      for variant, _ in variants]] for cell, by_threads in cells.items()]
    if any(entry["m1_projections"] for entry in k["runs"]):
        rows.append(["M=1, all projections", "", 1, *[fmt(entry["m1_gbs"][variant], 2) for entry in k["runs"]
                                                       for variant, _ in variants]])
    return _table(["projection", "N x K", "M", *[f"{label} GB/s, {threads(t)}" for t in counts
                                                  for _, label in variants]], rows)


def _hf_generate_md(run: Run) -> str:
    hf = hf_generate(run)
    if hf is None:
        return "_no Hugging Face generate results_"
    modes = [*MODES, *(layout_mode(name) for name in hf["layouts"])]
    rows = [[mode_label(mode), hf[mode]["n"], fmt(hf[mode]["prefill_tok_s"]), fmt(hf[mode]["decode_tok_s"]),
             " ".join(map(str, hf["output_ids"].get(mode, [])))] for mode in modes]
    ratio = hf["ratio"]
    rows.append(["on / off", "", *[f"{r:.2f}×" if r else "n/a" for r in (ratio["prefill_tok_s"],
                                                                        ratio["decode_tok_s"])], ""])
    for name, v in hf["layouts"].items():
        fell_back = f"; fell back: {len(v['fell_back'])} projections" if v["fell_back"] else ""
        rows.append([f"{name} / bf16 packed", "", "", f"{v['vs_bf16']:.2f}×" if v["vs_bf16"] else "n/a",
                     f"{v['leading_ids_equal']} of {v['ids']} leading ids as row-major{fell_back}"])
    return ("One process, one model: row-major, then the policy installed and warmed up, bf16 and then each "
            "quantized layout in turn (the same BF16 weights quantized at install). Prefill tok/s: input "
            "tokens / a one-token generate; decode tok/s: (new tokens − 1) / (full generate − that); medians over "
            f"the repetitions, each mode after one untimed generate. Row-major and bf16 packed outputs: "
            f"**{agreement(hf['outputs_equal'], hf.get('first_difference'))[1]}**.\n\n"
            + _table(["mode", "repetitions", "prefill tok/s", "decode tok/s", "generated ids"], rows))


def _layouts_md(run: Run) -> str:
    from ..layouts import format_table

    lay = layouts(run)
    if lay is None:
        return "_no layouts step in this run_"
    head = (f"Provider {lay['provider']}. Per layout at M=1, over the projections measured: the bytes they stream "
            "per decode token (the packed tensors, scales included), the GB/s that makes, and the time ratios to "
            "bf16 packed and to F.linear in the same rounds.")
    sections = []
    for entry in lay["runs"]:
        rows = []
        for name, v in entry["layouts"].items():
            if "not_available" in v:
                rows.append([name, f"not available: {v['not_available']}", "", "", "", "", ""])
                continue
            rows.append([name, f"{v['bytes_per_token'] / 2**20:,.1f}", v["projections"], fmt(v["packed_gbs"]),
                         fmt(v["vs_bf16_packed"], 2), fmt(v["vs_linear"], 2), f"{v['of_read']:.0%}"])
        sections.append(f"At {threads(entry['threads'], entry.get('cpus'))}:\n\n"
                        + _table(["layout", "MiB per token", "projections", "M=1 GB/s", "vs bf16 packed",
                                  "vs F.linear", "of same-rounds read"], rows)
                        + "\n\nEvery cell:\n\n" + format_table(entry["results"]))
    return head + "\n\n" + "\n\n".join(sections)


def _route_table_md(run: Run) -> str:
    table = route_table(run)
    if not table:
        return "_no measured route table in the policy reports (`warmup.route_table`)_"
    rows = [[e.get("projection"), e.get("bucket"), f"{e.get('out_features')}x{e.get('in_features')}",
             fmt(e.get("packed_us"), 0), fmt(e.get("eager_us"), 0), fmt(e.get("row_major_us"), 0), e.get("route"),
             e.get("source", "")] for e in table]
    return _table(["projection", "bucket", "N x K", "packed (compiled) µs", "packed eager µs", "row-major µs",
                   "route", "source"], rows)


SECTIONS = (("Targets (the policy's and the BPI-F3's)", _targets_md), ("One-batch", _one_batch_md),
            ("Serving, concurrency 1 vs 2", _serving_md), ("Hugging Face generate", _hf_generate_md),
            ("Server start, cold vs warm cache", _start_md), ("RSS vs predicted packed bytes", _rss_md),
            ("Measured route table", _route_table_md), ("Bucket hits", _calls_md),
            ("Kernel (Linear microbenchmark)", _kernel_md),
            ("Weight layouts (Linear microbenchmark per layout)", _layouts_md),
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
    parts += ["## Targets (the policy's and the BPI-F3's)", _table(["target", *labels], [
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
