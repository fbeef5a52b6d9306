"""The run directory: its layout, its schema, and the only code that writes or reads it.

::

    results/<host>/<UTC timestamp>/
        meta.json                      schema, provenance, arguments, step timings, complete
        one_batch/<mode>-<cache>[-N].json   one sglang.benchmark.one_batch process each
        start/<mode>-<cache>.json      server start to first token of the first request
        serving/<mode>-c<N>.json       one concurrency level: every request's timings
        kernel/linear.json             the Linear microbenchmark (bench/linear.py --json): the kernel
                                       facts, then one entry of ``runs`` per thread count
        layouts/linear.json            the same per weight layout (bench/layouts.py --json): per
                                       thread count, one row per (projection, layout, M), or its
                                       ``not_available`` reason
        hf_generate/generate.json      Hugging Face generate, both modes: raw times, output ids
        fleet/<layout>-c<N>.json       one concurrency level through one URL (a server, or the
                                       gateway in front of two): its CPU split, every request's timings
        policy/<name>.json             the plugin's policy report of each flag-on process
        logs/<name>.log                each process's output

Every result file is ``{"schema", "kind", "name", "cache_state", "provenance",
"load_average", ...}``; ``provenance`` is meta.json's, so a file read alone still
says what produced it, and ``load_average`` (1, 5, 15 min, when it was written)
tells whether other work competed for the CPUs.
The suite writes the files, the report reads them; a directory written by another
schema version is refused with a message rather than misread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ..jsonfile import write_json

SCHEMA = 1
META = "meta.json"
KINDS = ("one_batch", "start", "serving", "kernel", "layouts", "hf_generate", "fleet")
COLD, WARM = "artifact-cold", "artifact-warm"
SUITE_COMMAND = "python -m sglang_rvv.bench suite"


class RunDirError(Exception):
    """A directory that is not a readable run of this schema; the message names the fix."""


def default_run_dir(root: Path = Path("results")) -> Path:
    return root / platform.node() / utc_stamp()


def write_meta(run_dir: Path, meta: dict) -> Path:
    return write_json(run_dir / META, {"schema": SCHEMA, **meta})


def utc_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


@contextmanager
def recording(run_dir: Path, meta: dict, progress) -> Iterator[dict]:
    """meta.json written before the steps (``complete`` false) and again after them, with
    ``complete`` or the error, the duration, and the steps ``progress`` timed meanwhile; so a
    run that died says so instead of looking short."""
    meta.update(started_utc=utc_stamp(), complete=False)
    write_meta(run_dir, meta)
    began, first_step = time.monotonic(), len(progress.steps)
    try:
        yield meta
        meta["complete"] = True
    except BaseException as error:
        meta["error"] = f"{type(error).__name__}: {error}"[:4000]
        raise
    finally:
        meta.update(finished_utc=utc_stamp(), seconds=round(time.monotonic() - began, 1),
                    steps=progress.steps[first_step:])
        write_meta(run_dir, meta)


def write_result(run_dir: Path, kind: str, name: str, provenance: dict, cache_state: str | None,
                 **payload) -> Path:
    if kind not in KINDS:
        raise ValueError(f"unknown result kind {kind!r}; one of {KINDS}")
    record = {"schema": SCHEMA, "kind": kind, "name": name, "cache_state": cache_state,
              "provenance": provenance, "load_average": os.getloadavg(), **payload}
    return write_json(run_dir / kind / f"{name}.json", record)


def policy_report_path(run_dir: Path, name: str) -> Path:
    return run_dir / "policy" / f"{name}.json"


def log_path(run_dir: Path, name: str) -> Path:
    return run_dir / "logs" / f"{name}.log"


@dataclass
class Run:
    """One run directory, loaded."""

    dir: Path
    meta: dict
    results: dict[str, dict[str, dict]] = field(default_factory=dict)  # kind -> name -> record

    @property
    def label(self) -> str:
        return f"{self.meta.get('host', '?')}/{self.meta.get('started_utc', self.dir.name)}"

    def of(self, kind: str) -> dict[str, dict]:
        return self.results.get(kind, {})

    def policy_report(self, record: dict) -> dict | None:
        """The plugin's report a result points to, or None (flag off, or the process died first)."""
        relative = record.get("policy_report")
        path = self.dir / relative if relative else None
        if path is None or not path.is_file():
            return None
        return json.loads(path.read_text())


def _read(path: Path, run_dir: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise RunDirError(f"{run_dir}: {path.name} is unreadable ({error}); re-run `{SUITE_COMMAND}`") from None
    if not isinstance(value, dict):
        raise RunDirError(f"{run_dir}: {path.name} is not a JSON object; re-run `{SUITE_COMMAND}`")
    return value


def load_run(run_dir: str | os.PathLike) -> Run:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such directory; pass a run directory written by `{SUITE_COMMAND}` "
                          "(results/<host>/<UTC timestamp>)")
    if not (run_dir / META).is_file():
        # results/ or results/<host> holds runs below it: name one.
        below = sorted(p.parent for pattern in (f"*/{META}", f"*/*/{META}") for p in run_dir.glob(pattern))
        hint = f" (it holds {len(below)} run{'s' * (len(below) > 1)} below it, e.g. {below[-1]})" if below else ""
        raise RunDirError(f"{run_dir}: no {META}, so not a benchmark run{hint}; pass the results/<host>/<UTC "
                          f"timestamp> directory that `{SUITE_COMMAND}` printed")
    meta = _read(run_dir / META, run_dir)
    if meta.get("schema") != SCHEMA:
        raise RunDirError(f"{run_dir}: {META} has schema {meta.get('schema')!r}, this sglang-rvv reads schema "
                          f"{SCHEMA}; report it with the sglang-rvv version that wrote it, or re-run `{SUITE_COMMAND}`")
    run = Run(run_dir, meta)
    for kind in KINDS:
        for path in sorted((run_dir / kind).glob("*.json")):
            record = _read(path, run_dir)
            if record.get("schema") != SCHEMA:
                raise RunDirError(f"{run_dir}: {kind}/{path.name} has schema {record.get('schema')!r}, not "
                                  f"{SCHEMA}; re-run `{SUITE_COMMAND}`")
            run.results.setdefault(kind, {})[record.get("name", path.stem)] = record
    return run


def thread_counts(text: str) -> list[int]:
    """A comma-separated list of thread counts (``4,8``), for argparse: positive and distinct."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a comma-separated list of integers") from None
    if any(count < 1 for count in counts) or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: thread counts must be positive and distinct")
    return counts


def weight_gbs(row: dict, variant: str) -> float | None:
    """GB/s of weights streamed by one kernel cell's variant: the BF16 weight's bytes per call's time."""
    us = row.get(f"{variant}_us")
    return row["n"] * row["k"] * 2 / us / 1e3 if us else None


def m1_gbs(rows: list[dict]) -> dict[str, float | None]:
    """GB/s at M=1 across a kernel run's projections: weight bytes over the summed µs per variant.

    ``read`` (a plain read of the same weights in the same rounds) is ``None`` for runs
    recorded before the kernel step timed it; every value is ``None`` without M=1 rows.
    """
    decode = [r for r in rows if r["rows"] == 1]
    total = sum(r["n"] * r["k"] * 2 for r in decode)
    return {name: total / (sum(r[f"{name}_us"] for r in decode) / 1e6) / 1e9
            if decode and all(f"{name}_us" in r for r in decode) else None
            for name in ("linear", "compiled", "read")}

