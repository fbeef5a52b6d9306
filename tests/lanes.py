"""`make test`: the whole suite, as two pytest runs at once.

Run one after the other, the tests took more than CI's 90 minutes on its two cores. The
second lane holds the files whose time goes to qemu-user and the riscv64 and arm64 base images
(the emulated boards, the board model's counts, the riscv64 appliances, the arm64 gateway); the
first lane runs every other file beside them, the benchmark suite's end-to-end test and the RVV
kernels under qemu included. In a clean clone on this machine kind with the base images built
(ec6e3a5), the first lane took 3250 s and the second 3455 s, test_deploy_riscv64.py (the default
model served and asked the capital question under qemu) 1466 s of it; test_rvv_kernels.py (254 s)
then moved to the first lane, as a cold machine adds the riscv64 and arm64 bases (mmdebstrap
under qemu) to the second. On a cold machine (empty podman storage, 43da1b4) the first lane took
4060 s and the second 4141 s: 4342 s for .ci/run, of CI's 90 minutes and the 75 it aims at.

The lanes share podman's storage. The build scripts take turns through their build locks
(images/scripts/lib.sh), so an image that both lanes need is built once. The second lane
serves from its own compose project (SGLANG_RVV_PROJECT), so one lane's `make down` leaves the
other lane's appliance alone, and it compiles into its own Inductor cache. Its output goes
to a log, which is printed when the first lane is done. The exit status is nonzero when
either lane failed.

    python tests/lanes.py [PYTEST_ARGS...]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECOND = ("tests/ansible/test_emulated_board.py", "tests/images/test_board_model.py", "tests/images/test_riscv64.py",
          "tests/ansible/test_deploy_riscv64.py", "tests/images/test_gateway_arm64.py")
# Not in make test yet (tests/peer's docstring says why): make peer-test runs it.
NOT_YET = ("tests/peer",)
LOG = REPO / ".cache" / "test-lanes" / "second.log"


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def main(extra: list[str]) -> int:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    # Its own compose project, and its own Inductor cache beside the first lane's (the Makefile's
    # TORCHINDUCTOR_CACHE_DIR): two processes compiling the same kernels into one cache
    # directory at once have raced here.
    shared = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", REPO / ".cache" / "inductor"))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{shared}-lane2", "SGLANG_RVV_PROJECT": "sglang-rvv-lane2"}
    with LOG.open("w") as log:
        second = subprocess.Popen(_pytest(*extra, *SECOND), cwd=REPO, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        print(f"lanes: the second lane ({', '.join(SECOND)}) runs beside this one; its log is {LOG}", flush=True)
        first = subprocess.run(_pytest(*extra, *(f"--ignore={path}" for path in (*SECOND, *NOT_YET)), "tests"),
                               cwd=REPO)
        first_seconds = time.monotonic() - began
        print(f"lanes: the first lane is done ({first_seconds:.0f} s, exit {first.returncode}); "
              "waiting for the second", flush=True)
        second.wait()
    second_seconds = time.monotonic() - began
    print(f"\n======== the second lane's log ({LOG}) ========", flush=True)
    sys.stdout.write(LOG.read_text())
    print(f"lanes: first {first_seconds:.0f} s (exit {first.returncode}), second {second_seconds:.0f} s "
          f"(exit {second.returncode})")
    return 0 if first.returncode == second.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
