"""Serving measurements against a real SGLang server started here: prompts from the model's
tokenizer, start to first token, the policy's counters, memory.

The requests themselves are :mod:`sglang_rvv.bench.client`'s. Each request has its own
seeded random prompt with a distinct first token, so SGLang's prefix cache never shortens a
prefill.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import psutil

from ..host import peak_rss_bytes
from ..launch.process import SGLangServer
from .client import INPUT_LEN, generate, timings

_CALLS = re.compile(r'^sglang_rvv_linear_calls_total\{(.*)\} ([0-9.e+]+)$')


def prompt_ids(model_dir: Path, count: int, seed: int = 0, length: int = INPUT_LEN) -> list[list[int]]:
    """``count`` prompts of ``length`` ordinary token ids of the model's tokenizer, distinct first tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    special = set(tokenizer.all_special_ids)
    ordinary = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(seed)
    firsts = rng.sample(ordinary, count)
    return [[first, *rng.choices(ordinary, k=length - 1)] for first in firsts]


def linear_calls(server: SGLangServer) -> dict[str, float]:
    """``sglang_rvv_linear_calls_total`` by ``projection/route/bucket`` (empty with the flag off)."""
    found = {}
    for line in server.get("/metrics").splitlines():
        match = _CALLS.match(line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            found[f"{labels['projection']}/{labels['route']}/{labels['bucket']}"] = float(match.group(2))
    return found


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in sorted(after) if after[key] != before.get(key, 0.0)}


def tree_memory(pid: int) -> dict:
    """RSS of a server's process tree now and each process's peak (VmHWM), in MiB."""
    root = psutil.Process(pid)
    processes = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            rss = process.memory_info().rss
            hwm = peak_rss_bytes(process.pid)
            name = " ".join(process.cmdline()[:3]) or process.name()
        except (psutil.Error, OSError):  # exited meanwhile
            continue
        hwm = rss if hwm is None else hwm
        processes[f"{process.pid} {name}"] = {"rss_mib": rss / 2**20, "peak_mib": hwm / 2**20}
    return {"rss_mib": sum(p["rss_mib"] for p in processes.values()),
            "peak_mib": sum(p["peak_mib"] for p in processes.values()), "processes": processes}


def start_to_first_token(server: SGLangServer, prompt: list[int]) -> dict:
    """Start ``server`` and send ``prompt`` as soon as it is healthy: process start to first token."""
    began = time.monotonic()
    server.start()
    request = generate(server.base_url, prompt)
    return dict(timings(request, began), ready_s=server.startup_seconds,
                ttft_after_start_s=request["token_times"][0] - began, prompt_ids=prompt)
