"""The benchmarks' HTTP client: streamed, timed requests to SGLang's ``/generate``, and prompts.

Standard library only, so the fleet step also runs where only Python is (the gateway image,
with this package's source mounted): requests go to SGLang's native ``/generate`` as token
ids (``input_ids``) with ``stream: true``, so the prompt is exactly the tokens sent, the output
is exactly ``max_new_tokens`` tokens (``ignore_eos``; asserted), and every token's arrival is
timed. A gateway (smg) passes ``/generate`` through to a worker unchanged.
"""

from __future__ import annotations

import json
import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ..launch.client import json_request, post_json

REQUEST_TIMEOUT = 600.0
INPUT_LEN, OUTPUT_LEN = 64, 8  # one request shape for the one-batch, serving and fleet benchmarks
# Plain lower-case syllables: text that every tokenizer splits into ordinary tokens.
_SYLLABLES = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]


def server_prompt_ids(base_url: str, count: int, seed: int = 0, length: int = INPUT_LEN) -> list[list[int]]:
    """``count`` prompts of exactly ``length`` ordinary token ids with distinct first tokens, from
    seeded random words tokenized by the server itself (``/tokenize``), so no local tokenizer or
    model directory is needed. Distinct first tokens keep SGLang's prefix cache from shortening
    a prefill."""
    rng = random.Random(seed)
    texts = [" ".join("".join(rng.choices(_SYLLABLES, k=rng.randint(1, 3))) for _ in range(2 * length))
             for _ in range(count)]
    tokens = post_json(base_url + "/tokenize", {"prompt": texts, "add_special_tokens": False}, timeout=60)["tokens"]
    seen = sorted({token for ids in tokens for token in ids})
    if len(seen) < count or min(map(len, tokens)) < length:
        raise RuntimeError(f"{base_url}/tokenize gave too few tokens for {count} prompts of {length}")
    firsts = rng.sample(seen, count)
    return [[first, *ids[1:length]] for first, ids in zip(firsts, tokens, strict=True)]


def generate(base_url: str, input_ids: list[int], max_new_tokens: int = OUTPUT_LEN) -> dict:
    """One streamed greedy request; send time, each token's arrival (epoch-free monotonic seconds), output."""
    body = {"input_ids": input_ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}
    sent = time.monotonic()
    token_times: list[float] = []
    output_ids: list[int] = []
    meta: dict = {}
    with urllib.request.urlopen(json_request(base_url + "/generate", body), timeout=REQUEST_TIMEOUT) as response:
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
