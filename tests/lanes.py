"""`make test`: the whole suite, as two pytest runs at once, balanced by the last run's times.

Run one after the other, the tests take longer than CI's 90 minutes on its two cores. So the
test files are split into two lanes that run at once, each a pytest process. The split is the
longest-first rule on each file's wall time in the last run (its module fixtures, and the image
builds it was first to need, included): the longest file not yet placed goes to the lane with
less time so far. The times come from `.cache/test-lanes/times.json`, which every run of this
script rewrites, or, in a fresh clone, from `tests/lane-times.json`, which `make lane-times`
copies from it. A file neither has timed counts as DEFAULT_SECONDS.

Each lane first builds the images that most files need, one arch each, through the same make
targets the fixtures use: the first lane the host arch's (base, runtime, the tiny model's warm
image, the default model's), the second riscv64's base and runtime (mmdebstrap and pip under
qemu). The two builds take about as long, so no test file waits on the other lane's build, and
a file's time is its own; each prelude's time is kept beside the files' and starts its lane's
total. Its log is .cache/test-lanes/prelude-ARCH.log; a prelude that fails is said, and the
tests that need its images then fail on their own.

The lanes share podman's storage. The build scripts take turns through their build locks
(images/scripts/lib.sh), so an image that both lanes need is built once. The second lane
serves from its own compose project (SGLANG_RVV_PROJECT), so one lane's `make down` leaves the
other lane's appliance alone, and it compiles into its own Inductor cache. Tests that start
an appliance under a fixed compose project name their own (tests/ansible). The second lane's
output goes to a log, which is printed when the first lane is done. The exit status is nonzero
when either lane failed.

    python tests/lanes.py [PYTEST_ARGS...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
# tests/infra runs only against an inventory's hosts (tests/ansible names them), and
# tests/peer_tools needs llama.cpp's whole build, which make test leaves to make peer-test.
NOT_HERE = ("infra", "peer_tools")
STATE = REPO / ".cache" / "test-lanes"
LAST_TIMES = STATE / "times.json"
KEPT_TIMES = TESTS / "lane-times.json"
DEFAULT_SECONDS = 60.0
_MAKE = ("make", "--no-print-directory")
# Each lane's prelude: (its name in the times, the commands).
PRELUDES = (
    ("prelude:host", ((*_MAKE, "image", "MODEL=tiny-llama", "CACHE=warm"), (*_MAKE, "image"))),
    ("prelude:riscv64", ((*_MAKE, "image-runtime", "ARCH=riscv64"),)),
)


def test_files() -> list[str]:
    """Every test file of make test, as a path from the repository's root."""
    return sorted(path.relative_to(REPO).as_posix() for path in TESTS.rglob("test_*.py")
                  if path.relative_to(TESTS).parts[0] not in NOT_HERE)


def load_times() -> tuple[dict[str, float], Path | None]:
    """The per-file times of the last run here, else the kept ones, and where they came from."""
    for path in (LAST_TIMES, KEPT_TIMES):
        if path.is_file():
            return {name: float(seconds) for name, seconds in json.loads(path.read_text()).items()}, path
    return {}, None


def split(files: list[str], times: dict[str, float]) -> tuple[list[list[str]], list[float]]:
    """Two lanes by the longest-first rule, each from its prelude's time; each lane's files longest
    first, and its time."""
    lanes: list[list[str]] = [[], []]
    totals = [times.get(name, 0.0) for name, _ in PRELUDES]
    for name in sorted(files, key=lambda f: (-times.get(f, DEFAULT_SECONDS), f)):
        lane = totals.index(min(totals))
        lanes[lane].append(name)
        totals[lane] += times.get(name, DEFAULT_SECONDS)
    return lanes, totals


def _pytest(times_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", f"--file-times={times_path}", *args]


def _prelude(name: str, commands: tuple[tuple[str, ...], ...], seconds: dict[str, float]) -> None:
    """Build a lane's images; its time goes into ``seconds`` when every build passed."""
    log = STATE / f"{name.replace(':', '-')}.log"
    began = time.monotonic()
    with log.open("w") as out:
        for command in commands:
            done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                print(f"lanes: {name}: `{' '.join(command)}` failed (exit {done.returncode}; log {log}): the tests "
                      "that need its images build them again and fail on their own", flush=True)
                return
    seconds[name] = round(time.monotonic() - began, 1)
    print(f"lanes: {name}: {' and '.join(' '.join(c[2:]) for c in commands)} built in {seconds[name]:.0f} s",
          flush=True)


def _merge_times(previous: dict[str, float], files: list[str], written: list[Path],
                 preludes: dict[str, float]) -> None:
    """The times this run took, over the previous ones, for the files and preludes that still exist."""
    known = {*files, *(name for name, _ in PRELUDES)}
    merged = {name: seconds for name, seconds in previous.items() if name in known}
    merged.update(preludes)
    for path in written:
        if path.is_file():
            merged.update(json.loads(path.read_text()))
    tmp = LAST_TIMES.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
    tmp.replace(LAST_TIMES)


def main(extra: list[str]) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    files = test_files()
    times, source = load_times()
    (first_files, second_files), (first_plan, second_plan) = split(files, times)
    origin = source.relative_to(REPO) if source else f"nowhere (each file counts as {DEFAULT_SECONDS:.0f} s)"
    print(f"lanes: per-file times from {origin}; first lane {len(first_files)} files ({first_plan:.0f} s "
          f"planned), second {len(second_files)} ({second_plan:.0f} s)", flush=True)
    lane_times = [STATE / "times-first.json", STATE / "times-second.json"]
    for path in lane_times:
        path.unlink(missing_ok=True)
    log = STATE / "second.log"
    began = time.monotonic()
    # Its own compose project, and its own Inductor cache beside the first lane's (the Makefile's
    # TORCHINDUCTOR_CACHE_DIR): two processes compiling the same kernels into one cache
    # directory at once have raced here.
    shared = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", REPO / ".cache" / "inductor"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{shared}-lane2", "SGLANG_RVV_PROJECT": "sglang-rvv-lane2"}
    preludes: dict[str, float] = {}
    exits: list[int] = [1, 1]

    def second_lane() -> None:
        _prelude(*PRELUDES[1], preludes)
        with log.open("w") as out:
            exits[1] = subprocess.run(_pytest(lane_times[1], *extra, *second_files), cwd=REPO, env=env, stdout=out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode

    second = threading.Thread(target=second_lane)
    second.start()
    print(f"lanes: the second lane ({', '.join(second_files)}) runs beside this one; its log is {log}", flush=True)
    _prelude(*PRELUDES[0], preludes)
    exits[0] = subprocess.run(_pytest(lane_times[0], *extra, *first_files), cwd=REPO).returncode
    first_seconds = time.monotonic() - began
    print(f"lanes: the first lane is done ({first_seconds:.0f} s, exit {exits[0]}); waiting for the second",
          flush=True)
    second.join()
    second_seconds = time.monotonic() - began
    print(f"\n======== the second lane's log ({log}) ========", flush=True)
    sys.stdout.write(log.read_text())
    _merge_times(times, files, lane_times, preludes)
    print(f"lanes: first {first_seconds:.0f} s (exit {exits[0]}, planned {first_plan:.0f}), "
          f"second {second_seconds:.0f} s (exit {exits[1]}, planned {second_plan:.0f}); "
          f"this run's per-file times are in {LAST_TIMES.relative_to(REPO)} (`make lane-times` keeps them for CI)")
    return 0 if exits == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
