"""The board model's section of the report: ``board-model.json`` (``python -m
sglang_rvv.boardmodel``) as a table and a stacked bar chart per model and layout, each labelled as
modelled from emulated instruction counts, never measured; and a board's own counters of the same
workloads (``board-counters.json``, ``python -m sglang_rvv.boardmodel.counters``, which
``make reproduce`` runs), set beside the model's figures when the run has both.

Reads the JSON only; the model's arithmetic lives in ``sglang_rvv.boardmodel.model``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .markdown import _table
from .stats import fmt, ratio

FILE = "board-model.json"
COUNTERS_FILE = "board-counters.json"
LABEL = "modelled from emulated instruction counts, not measured on a board"
# The report's four groups, from the counter's components.
GROUPS = {"kernel": ("kernel",), "torch ops": ("torch",), "interpreter": ("interpreter",),
          "other": ("libgomp", "libc", "libm", "other")}


def load(run_dir: Path, name: str = FILE) -> dict | None:
    path = run_dir / name
    return json.loads(path.read_text()) if path.is_file() else None


def layout(workload: dict) -> str:
    if not workload["policy"]:
        return "off (F.linear)"
    lm_head = workload.get("lm_head_dtype")
    return f"{workload['weight_dtype']}, lm_head {lm_head}" if lm_head else workload["weight_dtype"]


def grouped(per_component: dict, key: str) -> dict[str, float]:
    return {group: sum(per_component[c][key] for c in members) for group, members in GROUPS.items()}


def grouped_seconds(prediction: dict) -> dict[str, float]:
    """Predicted seconds per group; the kernel group is the kernel or its weight stream, whichever
    the model says bounds it."""
    seconds = prediction["component_seconds"]
    out = {group: sum(seconds[c] for c in members) for group, members in GROUPS.items()}
    out["kernel"] = prediction["kernel_or_stream_seconds"]
    return out


def section(data: dict, chart: Path | None = None, base: Path | None = None) -> str:
    head = ["model", "layout", *(f"{g} (M insns)" for g in GROUPS), "kernel vector loads (M)",
            "kernel load bytes (MB)", "weight bytes (MB)", "predicted ms/token", "predicted tok/s", "bound"]
    rows = []
    for w in data["workloads"]:
        insns = grouped(w["per_token"], "insns")
        p = w["prediction"]
        rows.append([w["workload"]["name"], layout(w["workload"]),
                          *(f"{insns[g] / 1e6:.1f}" for g in GROUPS),
                          f"{w['per_token']['kernel']['vec_loads'] / 1e6:.2f}",
                          f"{w['per_token']['kernel']['vec_load_bytes'] / 1e6:.1f}",
                          f"{w['weight_bytes'] / 1e6:.1f}", f"{p['seconds_per_token'] * 1e3:.0f}",
                          f"{p['tok_per_s']:.2f}", p["bound"]])
    anchors = [f"- published: {a['shape']} {a['weight_dtype']} **{a['tok_per_s']} tok/s**, {a['what']} "
               f"({a['source']}; {a['comparable']})" for a in data["anchors"]]
    constants = [f"- `{name}` = {c['value']:g} {c['unit']}: {c['source']}" for name, c in data["constants"].items()]
    parts = [f"*{LABEL}.* Per decode token ({data['per_token_phase']}), one thread, qemu `{data['tool']['qemu_cpu']}`.",
             _table(head, rows), "Anchors beside the prediction (not fitted):", "\n".join(anchors),
             "Constants:", "\n".join(constants)]
    if data.get("serving"):
        parts.append(serving_section(data["serving"]))
    if data.get("skipped"):
        parts.append("Skipped: " + "; ".join(f"{k}: {v}" for k, v in data["skipped"].items()))
    if chart is not None:
        parts.append(f"![board model]({chart.relative_to(base) if base else chart})")
    return "\n\n".join(parts)


def serving_section(served: dict) -> str:
    """SGLang's real serving loop, per token and per process (boardmodel/serving.py)."""
    head = ["process", *(f"{g} (M insns)" for g in GROUPS), "outside the kernel (M insns)",
            "outside the kernel, idle rate not taken out (M insns)", "modelled ms/token outside the kernel, one core",
            "by thread: outside the kernel (M insns)", "its modelled ms/token"]
    rows = []
    for role, v in served["processes"].items():
        insns = grouped(v["per_token"], "insns")
        working = v.get("thread_outside_kernel_insns")
        rows.append([role, *(f"{insns[g] / 1e6:.2f}" for g in GROUPS), f"{v['outside_kernel_insns'] / 1e6:.2f}",
                     f"{v['outside_kernel_insns_raw'] / 1e6:.2f}", f"{v['rest_seconds'] * 1e3:.1f}",
                     "not counted" if working is None else f"{working / 1e6:.2f}",
                     "not counted" if working is None else f"{v['thread_rest_seconds'] * 1e3:.1f}"])
    return (f"SGLang serving `{served['model']}` (flag on, eager packed route), every process counted: per token, "
            f"the difference between streamed requests of {served['long']} and {served['short']} new tokens, "
            "less each process's idle rate over the extra wall time (a lower bound: a busy process does not "
            "also run its idle loop), and without that (an upper bound: what runs on timers counts with the "
            "seconds a token takes under qemu). The scheduler runs the model's forward, batch building and "
            "sampling; on the board the HTTP server and the detokenizer run on other cores beside it. "
            "By thread (the plugin's threads=1): the main thread's whole count (its idle loop stops while "
            "it works; the scheduler's runs the forward) and the other threads' less their polling, which "
            "goes on: the figure the two bounds enclose.\n\n"
            + _table(head, rows))


def plot(data: dict, path: Path) -> Path:
    """Stacked bars, one per model and layout: predicted ms per token by group."""
    from .charts import plt

    labels = [f"{w['workload']['name']}\n{layout(w['workload'])}" for w in data["workloads"]]
    stacks = [grouped_seconds(w["prediction"]) for w in data["workloads"]]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(labels)), 4.5))
    bottom = [0.0] * len(labels)
    for group in GROUPS:
        values = [s[group] * 1e3 for s in stacks]
        ax.bar(labels, values, bottom=bottom, label=group)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("predicted ms per decode token")
    ax.set_yscale("log" if max(bottom, default=1) > 20 * min(bottom, default=1) else "linear")
    ax.set_title(f"Board model: {LABEL}", fontsize=9)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ratio(a, b) -> str:
    return fmt(ratio(a, b), 2)


def _millions(value) -> str:
    return "not counted" if value is None else fmt(value / 1e6)


def counters_section(measured: dict, modelled: dict | None) -> str:
    """The board's counts per decode token, beside the model's for the same workload label: the
    instructions should agree (the same code, another machine's libraries aside), and the board's
    cycles against the model's are what its IPC assumptions are calibrated from. Nothing is fitted."""
    priced = {w["label"]: w for w in (modelled or {}).get("workloads", [])}
    head = ["model", "layout", "ms/token (clock)", "instructions (M)", "cycles (M)", "IPC",
            "emulated instructions (M)", "board / emulated instructions", "modelled cycles (M)",
            "board / modelled cycles", "modelled IPC"]
    rows = []
    for w in measured["workloads"]:
        step = w["per_token"]
        insns, cycles = step.get("instructions"), step.get("cycles")
        model = priced.get(w["label"])
        emulated = sum(v["insns"] for v in model["per_token"].values()) if model else None
        one_thread = model["prediction"].get("cycles_one_thread") if model else None
        flags = " (multiplexed)" if any(k.endswith("_multiplexed") for k in step) else ""
        rows.append([w["workload"]["name"], layout(w["workload"]), f"{step['seconds'] * 1e3:.1f}",
                     _millions(insns) + flags, _millions(cycles) + flags, _ratio(insns, cycles),
                     _millions(emulated), _ratio(insns, emulated), _millions(one_thread),
                     _ratio(cycles, one_thread), _ratio(emulated, one_thread)])
    parts = [f"*{measured['label']}*, on `{measured['host']}` ({measured['machine']}, isa "
             f"`{measured['isa'] or 'n/a'}`): per decode token ({measured['per_token_phase']}), the workloads "
             "the board model counts under qemu, run natively. The model's columns are its one-thread cycles "
             "(every component's instructions at its IPC, no weight-stream bound), from this run's "
             f"`{FILE}` where it has the same workload.", _table(head, rows)]
    if measured.get("unavailable"):
        parts.append(f"No counts: {measured['unavailable']}.")
    if modelled is None:
        parts.append(f"No `{FILE}` in this run: `make board-model RUN=<this run directory>` adds the model's "
                     "figures for the same workloads (counted under qemu on a development machine).")
    if measured.get("skipped"):
        parts.append("Skipped: " + "; ".join(f"{k}: {v}" for k, v in measured["skipped"].items()))
    return "\n\n".join(parts)


def render(run_dir: Path, out_dir: Path) -> str:
    """The markdown sections (the model's chart in out_dir/plots), or "" when the run has neither
    a board model nor a board's counters."""
    data, measured = load(run_dir), load(run_dir, COUNTERS_FILE)
    out = ""
    if data is not None:
        chart = plot(data, out_dir / "plots" / "board-model.png") if data["workloads"] else None
        out += f"## Board model\n\n{section(data, chart, out_dir)}\n"
    if measured is not None:
        out += f"\n## Board counters\n\n{counters_section(measured, data)}\n"
    return out
