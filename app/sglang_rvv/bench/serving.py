"""Serving measurements against a real SGLang server: streamed requests, levels, start, counters.

Requests go to SGLang's native ``/generate`` as token ids (``input_ids``) with
``stream: true``, so the prompt is exactly ``INPUT_LEN`` tokens, the output is
exactly ``OUTPUT_LEN`` tokens (``ignore_eos``; asserted), and every token's
arrival is timed. Each request has its own seeded random prompt with a distinct
first token, so SGLang's prefix cache never shortens a prefill.
"""

from __future__ import annotations

import json
import random
import re
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from ..server import SGLangServer
from .one_batch import INPUT_LEN, OUTPUT_LEN

REQUEST_TIMEOUT = 600.0
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


def generate(base_url: str, input_ids: list[int], max_new_tokens: int = OUTPUT_LEN) -> dict:
    """One streamed greedy request; send time, each token's arrival (epoch-free monotonic seconds), output."""
    body = {"input_ids": input_ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}
    request = urllib.request.Request(base_url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    sent = time.monotonic()
    token_times: list[float] = []
    output_ids: list[int] = []
    meta: dict = {}
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            now = time.monotonic()
            chunk = json.loads(line[len("data:"):])
            new = chunk["output_ids"][len(output_ids):]  # cumulative in SGLang's stream
            token_times.extend([now] * len(new))
            output_ids.extend(new)
            meta = chunk["meta_info"]
    if len(output_ids) != max_new_tokens or meta.get("completion_tokens") != max_new_tokens:
        raise RuntimeError(f"asked for exactly {max_new_tokens} tokens (ignore_eos), got {len(output_ids)} "
                           f"(completion_tokens {meta.get('completion_tokens')}, finish {meta.get('finish_reason')})")
    if meta.get("prompt_tokens") != len(input_ids):
        raise RuntimeError(f"sent {len(input_ids)} prompt tokens, the server counted {meta.get('prompt_tokens')}")
    return {"sent": sent, "token_times": token_times, "output_ids": output_ids,
            "prompt_tokens": meta["prompt_tokens"], "cached_tokens": meta.get("cached_tokens")}


def timings(request: dict, origin: float) -> dict:
    """A request's times relative to ``origin`` and its own send time (what the result file keeps)."""
    sent, times = request["sent"], request["token_times"]
    return {
        "sent_s": sent - origin,
        "ttft_s": times[0] - sent,
        "latency_s": times[-1] - sent,
        "token_times_s": [t - sent for t in times],
        "output_ids": request["output_ids"],
        "output_tokens": len(request["output_ids"]),
        "prompt_tokens": request["prompt_tokens"],
        "cached_tokens": request["cached_tokens"],
    }


def run_level(base_url: str, prompts: list[list[int]], concurrency: int) -> tuple[list[dict], float]:
    """``prompts`` with at most ``concurrency`` in flight; each request's timings and the level's wall time."""
    origin = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda ids: generate(base_url, ids), prompts))
    wall = time.monotonic() - origin
    pairs = enumerate(zip(done, prompts, strict=True))
    return [dict(timings(r, origin), index=i, prompt_ids=p) for i, (r, p) in pairs], wall


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


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """A process's peak RSS (VmHWM), or None where the kernel does not report it."""
    status = Path(f"/proc/{pid}/status").read_text()
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), None)


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
