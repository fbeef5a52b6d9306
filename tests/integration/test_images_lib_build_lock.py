"""images/scripts/lib.sh build_lock: two builds that stage into the same directory take turns (make
test runs two lanes at once); the second says what it waits for, and the lock goes with the
script that held it."""

from __future__ import annotations

import os
import subprocess
import time

from image_support import REPO

LIB = REPO / "images" / "scripts" / "lib.sh"


def _build(build_dir, name: str, seconds: float) -> subprocess.Popen:
    """A script that takes build_lock NAME, appends its start and end times to BUILD_DIR/trace, and exits."""
    script = (f'source "{LIB}"; build_lock {name}; echo "start $(date +%s.%N)" >> "{build_dir}/trace"; '
              f'sleep {seconds}; echo "end $(date +%s.%N)" >> "{build_dir}/trace"')
    return subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "SGLANG_RVV_BUILD_DIR": str(build_dir)})


def test_a_second_build_of_the_same_staging_waits_and_says_so(tmp_path):
    first = _build(tmp_path, "runtime-riscv64", 2)
    time.sleep(0.5)
    second = _build(tmp_path, "runtime-riscv64", 0)
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
    events = [line.split() for line in (tmp_path / "trace").read_text().splitlines()]
    assert [kind for kind, _ in events] == ["start", "end", "start", "end"]  # one after the other
    assert float(events[2][1]) >= float(events[1][1])
    assert f"waiting for another build that holds {tmp_path}/locks/runtime-riscv64.lock" in second.stderr.read()


def test_builds_of_other_stagings_run_at_once(tmp_path):
    builds = [_build(tmp_path, name, 3) for name in ("runtime-amd64", "runtime-riscv64")]
    began = time.monotonic()
    assert [b.wait(timeout=30) for b in builds] == [0, 0]
    assert time.monotonic() - began < 5.5  # one after the other would take 6 s
    assert all("waiting" not in b.stderr.read() for b in builds)
