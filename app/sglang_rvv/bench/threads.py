"""A microbenchmark at several thread counts: each count in a fresh process of its own, pinned.

Inductor writes torch's thread count into the C++ it generates, and nothing compiled in a
process is compiled again when the count changes, so every count gets its own process. On the
K1 the first four cores are one cluster of four X60s sharing an L2, the next four the other: a
four-thread run pinned to CPUs 0-3 measures one cluster, as llama.cpp's published K1 figures
do, instead of whichever four cores the scheduler picked. A count is pinned to the first
``count`` CPUs of this process's affinity mask; a count larger than the mask runs unpinned (on
every CPU of the mask) and its run says so (``cpus`` is the child's own mask, read back).

Standard library only at import (torch is imported where a run needs it), beside :mod:`.results`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from ..host import affinity


def first_cpus(count: int) -> list[int] | None:
    """The CPUs a ``count``-thread run is pinned to: the first ``count`` of the affinity mask, or
    None when the mask has fewer (the run takes the whole mask)."""
    cpus = affinity()
    return cpus[:count] if count <= len(cpus) else None


def run_each(step: str, argv: list[str], counts: list[int]) -> list[dict]:
    """``python -m sglang_rvv.bench STEP ARGV --threads N --json OUT`` for each count N, one after the
    other, each pinned (:func:`first_cpus`) with ``OMP_NUM_THREADS=N``; the children's JSON
    documents in order. A child that fails ends this process, naming the count."""
    documents = []
    with tempfile.TemporaryDirectory(prefix=f"sglang-rvv-bench-{step}-") as tmp:
        for count in counts:
            out = Path(tmp) / f"threads-{count}.json"
            cpus = first_cpus(count)
            where = f"CPUs {span(cpus)}" if cpus else f"unpinned: the mask has only {len(affinity())} CPUs"
            print(f"# threads={count}, in a process of its own ({where})", flush=True)
            command = [sys.executable, "-m", "sglang_rvv.bench", step, *argv, "--threads", str(count),
                       "--json", str(out)]
            # OMP_NUM_THREADS too, so every OpenMP runtime in the child starts at the count; the mask
            # is set before exec, so every thread the child ever starts inherits it.
            code = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": str(count)},
                                  preexec_fn=partial(os.sched_setaffinity, 0, cpus) if cpus else None).returncode
            if code != 0:
                sys.exit(f"the {step} run at threads={count} failed with exit code {code}")
            documents.append(json.loads(out.read_text()))
    return documents


def runs(step: str, argv: list[str], counts: list[int], here: Callable[[], dict]) -> list[dict]:
    """A step's runs, one per thread count: several counts each in a pinned process of its own
    (:func:`run_each`, whose children run ``step`` with one count), one count in this process
    (``here()``, at that count)."""
    if len(counts) > 1:
        return [run for document in run_each(step, argv, counts) for run in document["runs"]]
    import torch

    torch.set_num_threads(counts[0])
    return [here()]


def this_run() -> dict:
    """What a child records of itself: torch's thread count and its CPU mask (the pin, read back)."""
    import torch

    return {"threads": torch.get_num_threads(), "cpus": affinity()}


def span(cpus: list[int]) -> str:
    """``0-3`` for a contiguous run of CPUs, else the list: how runs and reports name a pin."""
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])
    return ",".join(map(str, cpus))

