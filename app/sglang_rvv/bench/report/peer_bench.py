"""llama.cpp measured on the board beside the appliance: ``peer-bench.json`` (``make reproduce``'s
peer step: llama-bench's own JSON per build and thread count, see
``sglang_rvv.boardmodel.peer_bench``) as a table of tg and pp tok/s, and the ratios ours /
llama.cpp against the same run's own decode and prefill (the suite's served one-batch, flag on,
and Hugging Face generate per layout). Labelled as measured on the board, unlike the peer
compare's modelled table (:mod:`.peer`).

Our side is the suite's request shape (its prompt length, not 128), at the suite's one thread
count; each ratio row says both thread counts. A quantized layout is set beside the formats of its
width only (int4 beside Q4_*, int8 beside Q8_0); the served path beside every format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..results import WARM, Run
from .board import load
from .markdown import _table
from .stats import fmt, ratio
from .summaries import hf_generate, one_batch_summary

FILE = "peer-bench.json"
SCHEMA = 1
LABEL = "measured on the board: llama-bench and the suite, one board, one run"
SERVED = "served, bf16 packed (one-batch, flag on, warm median)"


class PeerBenchError(ValueError):
    """A peer-bench.json this report cannot read; the message names the file and the fix."""


@dataclass(frozen=True)
class Measured:
    """One engine's decode and prefill tok/s at one setting (None where that test did not run)."""

    engine: str
    path: str
    fmt: str
    threads: int | None
    decode: float | None
    prefill: float | None
    prompt: int | None = None
    cpus: str = ""

    @property
    def bits(self) -> int | None:
        return width(self.fmt)


def width(fmt: str) -> int | None:
    """The weight width a GGUF type or one of our layouts stands for: Q4_0, Q4_K_M, int4, int4_a8
    are 4; Q8_0 and int8 are 8; bf16 and anything else None."""
    found = re.match(r"(?:q|iq|int)(\d)", fmt.lower())
    return int(found.group(1)) if found else None


def peer_rows(data: dict) -> list[Measured]:
    """One row per (build, path, format, threads), from llama-bench's records: tg (n_gen only) and
    pp (n_prompt only) average tok/s."""
    if data.get("schema") != SCHEMA:
        raise PeerBenchError(f"{FILE}: schema {data.get('schema')!r}, this report reads {SCHEMA}: "
                             "re-render it with the sglang-rvv of the run, or run make reproduce again")
    formats = {m["file"]: m["format"] for m in data["models"]}
    rows: dict[tuple, dict] = {}
    for run in data["runs"]:
        for record in run["results"]:
            name = Path(record["model_filename"]).name
            path = run["paths"].get(str(int(record["repack"])), "?")
            key = (run["build"], path, formats.get(name, name), record["n_threads"])
            row = rows.setdefault(key, {"cpus": run["cpus"], "decode": None, "prefill": None, "prompt": None})
            if record["n_gen"] > 0 and record["n_prompt"] == 0:
                row["decode"] = record["avg_ts"]
            elif record["n_prompt"] > 0 and record["n_gen"] == 0:
                row["prefill"], row["prompt"] = record["avg_ts"], record["n_prompt"]
    return [Measured(f"llama.cpp {build}", path, fmt_, threads, **row)
            for (build, path, fmt_, threads), row in rows.items()]


def _threads(record: dict) -> int | None:
    """The suite's thread count: OMP_NUM_THREADS (the env file's), else every usable CPU."""
    prov = record.get("provenance") or {}
    usable = prov.get("usable_cpus")
    return prov.get("omp_num_threads") or (len(usable) if isinstance(usable, list) else usable) or prov.get("cpu_count")


def our_rows(run: Run) -> list[Measured]:
    """The suite's own decode and prefill: served (one-batch, flag on, warm median), and Hugging
    Face generate per quantized layout (median over its repetitions)."""
    out = []
    batches = [r for r in run.of("one_batch").values() if r["mode"] == "on" and r["cache_state"] == WARM]
    served = one_batch_summary(run).get("on", {}).get(WARM)
    if batches and served:
        out.append(Measured("sglang-rvv", SERVED, "bf16", _threads(batches[0]),
                            (served["median_decode_throughput"] or {}).get("median"),
                            (served["prefill_throughput"] or {}).get("median"), batches[0].get("input_len")))
    record = run.of("hf_generate").get("generate")
    summary = hf_generate(run)
    if record and summary:
        for mode, entry in summary.items():
            if isinstance(entry, dict) and mode.startswith("on-") and "decode_tok_s" in entry:
                layout = mode.removeprefix("on-")
                out.append(Measured("sglang-rvv", f"HF generate, {layout} packed", layout, _threads(record),
                                    entry["decode_tok_s"], entry["prefill_tok_s"], record.get("input_len")))
    return out


def ratio_rows(ours: list[Measured], peers: list[Measured]) -> list[dict]:
    """ours / llama.cpp, decode and prefill, for every pair of the same width (the served path
    beside every format)."""
    return [{"ours": o, "peer": p, "decode": ratio(o.decode, p.decode), "prefill": ratio(o.prefill, p.prefill)}
            for o in ours for p in peers if o.path == SERVED or (o.bits is not None and o.bits == p.bits)]


def section(data: dict, run: Run) -> str:
    peers, ours = peer_rows(data), our_rows(run)
    gen, prompt = data.get("gen"), data.get("prompt")
    table = _table(["engine", "path", "format", "threads", "CPUs", f"tg{gen} tok/s", f"pp{prompt} tok/s"],
                   [[p.engine, p.path, p.fmt, p.threads, p.cpus or "any", fmt(p.decode, 2), fmt(p.prefill, 2)]
                    for p in peers])
    parts = [f"*{LABEL}* ({data.get('host', '?')}, shape {data.get('shape', '?')}). llama-bench's averages over its "
             "repetitions:", table]
    pairs = ratio_rows(ours, peers)
    if not pairs:
        parts.append("No ours / llama.cpp ratios: the run has no served one-batch or HF generate result of a "
                     "comparable layout.")
        return "\n\n".join(parts)
    parts += [f"Ours / llama.cpp (ours at the suite's prompt length, llama.cpp's prefill at pp{prompt}):",
              _table(["ours", "ours threads", "ours decode", "ours prefill (prompt)", "llama.cpp", "its threads",
                      "decode ratio", "prefill ratio"],
                     [[r["ours"].path, r["ours"].threads, fmt(r["ours"].decode, 2),
                       f"{fmt(r['ours'].prefill, 2)} ({r['ours'].prompt})",
                       f"{r['peer'].engine} {r['peer'].path} {r['peer'].fmt}", r["peer"].threads,
                       fmt(r["decode"], 2), fmt(r["prefill"], 2)] for r in pairs])]
    return "\n\n".join(parts)


def render(run: Run) -> str:
    """The section, or one line saying why the file cannot be read (the rest of the report stands)."""
    try:
        data = load(run.dir, FILE)
        if data is None:
            return ""
        body = section(data, run)
    except PeerBenchError as error:
        body = f"Not shown: {error}"
    except (ValueError, KeyError, TypeError) as error:
        body = f"Not shown: {FILE} is not llama-bench's runs as make reproduce writes them ({error!r}): run it again"
    return f"\n## llama.cpp on the board\n\n{body}\n"
