"""Sample and request statistics (spread, moments, per-request TTFT/TPOT/ITL and tok/s) and the
number helpers the whole report shares (ratio, fmt, threads)."""

from __future__ import annotations

import itertools
import statistics

import numpy as np

from ..threads import span


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


def request_stats(requests: list[dict], wall: float) -> dict:
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


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def threads(count: int | None, cpus: list[int] | None = None) -> str:
    """``4 threads``; with the run's CPU mask (bench/threads.py), ``4 threads on CPUs 0-3`` when it
    was pinned to as many CPUs as threads, ``8 threads on 2 CPUs`` when the mask was smaller."""
    head = "threads n/a" if count is None else f"{count} thread{'s' * (count != 1)}"
    if not cpus or count is None:
        return head
    return f"{head} on CPUs {span(cpus)}" if len(cpus) == count else f"{head} on {len(cpus)} CPUs"
