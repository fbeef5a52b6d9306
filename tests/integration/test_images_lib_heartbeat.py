"""images/scripts/lib.sh heartbeat: a long quiet build step says it is still running, keeps the
command's exit status, and leaves nothing behind that holds the output open."""

from __future__ import annotations

import os
import subprocess
import time

from image_support import REPO

LIB = REPO / "images" / "scripts" / "lib.sh"


def _heartbeat(command: str) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    result = subprocess.run(["bash", "-c", f'source "{LIB}"; heartbeat "the step" {command}'],
                            capture_output=True, text=True, timeout=30,
                            env={**os.environ, "SGLANG_RVV_HEARTBEAT_S": "1"})
    return result, time.monotonic() - began


def test_a_quiet_step_says_it_is_still_running_and_ends_with_it():
    result, seconds = _heartbeat("sleep 3.5")
    assert result.returncode == 0
    notes = [line for line in result.stderr.splitlines() if "the step: still running (" in line]
    assert 2 <= len(notes) <= 4, result.stderr
    assert seconds < 6  # the ticker's sleep did not keep the captured stderr open


def test_the_command_exit_status_and_output_pass_through():
    result, _ = _heartbeat("sh -c 'echo out; exit 3'")
    assert result.returncode == 3 and result.stdout == "out\n" and "still running" not in result.stderr
