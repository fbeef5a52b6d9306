"""The fleet step: one appliance against two behind SGLang's gateway (smg), on the same host.

Each layout serves the same prompts at each concurrency level, flag on, through one URL: the
server itself (1 replica, every usable CPU), or the gateway in front of two servers that each
have half of the CPUs (their own ``taskset`` and ``OMP_NUM_THREADS``). On a 2-core machine the
two replicas share the cores one appliance would use, so the numbers show the mechanism, not a
speed-up; on a fleet of boards each replica is a whole board.

smg comes with the development venv (requirements/lock.txt), not with the runtime image: where
it is missing (``make reproduce`` on a board) the step is left out and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from ..server import HOST, SGLangServer, free_port

CONCURRENCY = (1, 2, 4, 8)
# The gateway's default policy (compose/gateway.yaml, the Ansible role), so the step measures
# what a fleet runs.
POLICY = "cache_aware"


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
            with urllib.request.urlopen(self.base_url + "/workers", timeout=5) as response:
                listed = json.load(response)["workers"]
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return False
        healthy = {w["url"] for w in listed if w.get("is_healthy")}
        return healthy == set(self.workers)
