"""The fleet step: one server alone, then several behind SGLang's gateway (smg), through one URL each.

Two ways to run it, one measurement (:func:`measure`):

* in the suite (``python -m sglang_rvv.bench suite``), on one host: one server on every usable
  CPU, then two on halves of them (their own ``taskset`` and ``OMP_NUM_THREADS``) behind a
  gateway started here. On a 2-core machine the two replicas share the cores one appliance
  would use, so the numbers show the mechanism, not a speed-up. smg comes with the development
  venv, not with the runtime image: where it is missing the step is left out and says so;
* against a running fleet (``python -m sglang_rvv.bench.fleet --gateway URL``; ``make
  reproduce`` runs it on the gateway host, in the gateway image): the first board the gateway
  lists healthy, alone, then the gateway in front of every healthy board, each a whole board.

This module and what it imports are standard library only, so the second way runs where only
Python is.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import urllib.error
from collections.abc import Sequence
from pathlib import Path

from ..launch.client import get_json
from ..launch.process import HOST, SGLangServer, free_port
from . import client
from .meta import fleet_provenance
from .progress import Progress
from .results import default_run_dir, recording, write_result

CONCURRENCY = (1, 2, 4, 8)
# The gateway's default policy (compose/gateway.yaml, the Ansible role), so the step measures
# what a fleet runs.
POLICY = "cache_aware"
REQUESTS = 4  # measured requests per level (at least the level's concurrency)
COMMAND = "python -m sglang_rvv.bench.fleet"


def smg_command() -> str | None:
    """The smg executable beside this interpreter (the venv's), or on PATH."""
    beside = Path(sys.executable).parent / "smg"
    return str(beside) if beside.is_file() else shutil.which("smg")


def layouts(cpus: Sequence[int]) -> dict[str, list[list[int]]]:
    """name -> the CPU list of each replica: one replica on every CPU, two on halves of them
    (on one CPU, both share it)."""
    half = len(cpus) // 2
    two = [list(cpus[:half]), list(cpus[half:])] if half else [list(cpus), list(cpus)]
    return {"1-replica": [list(cpus)], "2-replicas-gateway": two}


def healthy_workers(gateway_url: str) -> list[str]:
    """The worker URLs the gateway lists healthy (``/workers``), sorted; raises when it does not answer."""
    listed = get_json(gateway_url + "/workers", timeout=5)["workers"]
    return sorted(w["url"] for w in listed if w.get("is_healthy"))


def level_counts(requests: int) -> list[int]:
    """Measured requests at each of CONCURRENCY: ``requests``, and at least the level's concurrency."""
    return [max(requests, concurrency) for concurrency in CONCURRENCY]


def prompt_count(requests: int) -> int:
    """Prompts one layout uses: each level's measured requests and its one warm-up request."""
    return sum(level_counts(requests)) + len(CONCURRENCY)


def measure(run_dir: Path, prov: dict, layout: str, url: str, prompts: list[list[int]], requests: int,
            progress: Progress, **replicas) -> None:
    """One layout through its one URL at each of CONCURRENCY (one unmeasured warm-up request, then
    the level), into ``fleet/<layout>-c<N>.json`` with ``replicas`` (how many, their CPUs or URLs,
    whether a gateway fronts them)."""
    offset = 0
    for concurrency, count in zip(CONCURRENCY, level_counts(requests), strict=True):
        chunk, offset = prompts[offset:offset + 1 + count], offset + 1 + count
        with progress.step(f"fleet {layout}: concurrency {concurrency}, {count} requests"):
            client.generate(url, chunk[0])
            timed, wall = client.run_level(url, chunk[1:], concurrency)
        write_result(run_dir, "fleet", f"{layout}-c{concurrency}", prov, None, layout=layout,
                     concurrency=concurrency, wall_s=wall, requests=timed, **replicas)


class Gateway(SGLangServer):
    """``smg launch`` in front of ``workers`` on 127.0.0.1; healthy once it lists every worker healthy.

    It reuses the server's process-group supervision (start, wait, stop, logs), not its command.
    """

    def __init__(self, workers: Sequence[str], *, log_path: str | os.PathLike | None = None,
                 startup_timeout: float = 120.0):
        super().__init__("smg", log_path=log_path, startup_timeout=startup_timeout)
        smg = smg_command()
        if smg is None:
            raise FileNotFoundError("smg is not installed here (it comes with the development venv)")
        self.workers = list(workers)
        self.command = [smg, "launch", "--host", HOST, "--port", str(self.port), "--worker-urls", *self.workers,
                        "--policy", POLICY, "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
                        "--log-level", "warn"]

    def _health_ok(self) -> bool:
        try:
            return set(healthy_workers(self.base_url)) == set(self.workers)
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False


def run_remote(gateway: str, run_dir: Path, requests: int, seed: int, progress: Progress) -> None:
    """The first healthy board alone, then the gateway in front of every healthy board."""
    try:
        workers = healthy_workers(gateway)
    except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
        sys.exit(f"{gateway}/workers did not answer as a gateway ({error}): start it (make gateway "
                 "INVENTORY=..., or make up REPLICAS=N) and pass its URL")
    if not workers:
        sys.exit(f"the gateway at {gateway} lists no healthy worker: start the boards (make deploy), "
                 "then rerun make gateway")
    prov = fleet_provenance(workers)
    meta = {"suite": COMMAND, "host": prov["host"], "provenance": prov,
            "settings": {"gateway": gateway, "workers": workers, "requests": requests, "seed": seed,
                         "concurrency": list(CONCURRENCY), "input_len": client.INPUT_LEN,
                         "output_len": client.OUTPUT_LEN}}
    with recording(run_dir, meta, progress):
        progress.say(f"run directory {run_dir}: {len(workers)} healthy behind {gateway}")
        # The boards keep serving between layouts (and between runs), so each layout has prompts
        # of its own: none of them is in a prefix cache already.
        count = prompt_count(requests)
        prompts = client.server_prompt_ids(workers[0], 2 * count, seed)
        many = f"{len(workers)}-board{'s' * (len(workers) > 1)}-gateway"
        for i, (layout, url, behind) in enumerate((("1-board", workers[0], workers[:1]), (many, gateway, workers))):
            measure(run_dir, prov, layout, url, prompts[i * count:(i + 1) * count], requests, progress,
                    replicas=len(behind), cpus=None, workers=behind, gateway=url == gateway)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Measure a running fleet: the first board the "
                                     "gateway lists healthy alone, then the gateway in front of every healthy board, "
                                     f"at concurrency {', '.join(map(str, CONCURRENCY))}.")
    parser.add_argument("--gateway", required=True, help="the gateway's URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--out", type=Path, help="run directory (default: results/<host>/<UTC timestamp>)")
    parser.add_argument("--requests", type=int, default=REQUESTS,
                        help=f"measured requests per level, at least its concurrency (default {REQUESTS})")
    parser.add_argument("--seed", type=int, help="of the prompts' random words (default: a new one each run, "
                                                  "recorded, so a rerun meets no prompt the boards have cached)")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error(f"--requests {args.requests}: must be at least 1")
    run_dir = args.out or default_run_dir()
    seed = random.SystemRandom().randrange(2**31) if args.seed is None else args.seed
    run_remote(args.gateway.rstrip("/"), run_dir, args.requests, seed, Progress())
    print(run_dir, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
