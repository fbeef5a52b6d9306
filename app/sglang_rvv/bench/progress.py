"""Progress lines on stderr, each with the time since the run began; the steps' durations for meta.json."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class Progress:
    def __init__(self):
        self.began = time.monotonic()
        self.steps: list[dict] = []

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.began:7.1f} s] {message}", file=sys.stderr, flush=True)

    @contextmanager
    def step(self, name: str):
        self.say(f"{name} ...")
        began = time.monotonic()
        yield
        seconds = time.monotonic() - began
        self.steps.append({"step": name, "seconds": round(seconds, 3)})
        self.say(f"{name}: {seconds:.1f} s")
