"""SGLang's real server, under the counting qemu: the launcher that runs in every one of its processes.

Run as a script file inside the riscv64 rootfs (as guest.py is): ``python serving_guest.py
SGLANG_ARGS...`` serves ``sglang.launch_server`` in this process. SGLang starts its scheduler and
detokenizer with multiprocessing's spawn, which re-executes the interpreter; qemu-user passes an
execve to the host kernel unchanged, where the guest's interpreter path means nothing, so the
executable spawn uses is the host wrapper in ``SGLANG_RVV_COUNT_EXECUTABLE``: the counting qemu
again, with a count table of the child's own (serving.py writes it). A spawned child runs this
file's top level too (as ``__mp_main__``), so every process of the server:

* registers itself in ``SGLANG_RVV_COUNT_DIR/<pid>.json`` (the host signals only those);
* on SIGUSR2 writes the next mark (count.c's MARK_FD write) and its ``/proc/self/maps``, with the
  role its main thread's stack names: the scheduler, the detokenizer, or the HTTP server and
  tokenizer manager (this process).

Between two marks a process's table difference is what it ran while one request was served.
Standard library only at the top level: it runs before anything else in every process.
"""

import json
import multiprocessing
import os
import signal
import sys

MARK_FD = 0x434F554E  # == count.c MARK_FD, guest.py MARK_FD
ROLES = (("run_scheduler_process", "scheduler"), ("run_detokenizer_process", "detokenizer"))
MAIN_ROLE = "http"  # the launching process: HTTP server and tokenizer manager
_marks = [0]


def _role(frame) -> str:
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return next((role for function, role in ROLES if function in names), MAIN_ROLE)


def _on_mark(signum, frame):
    _marks[0] += 1
    here = os.path.join(os.environ["SGLANG_RVV_COUNT_DIR"], str(os.getpid()))
    with open("/proc/self/maps") as f:
        maps = f.read()
    with open(f"{here}.maps.partial", "w") as f:
        f.write(maps)
    os.replace(f"{here}.maps.partial", f"{here}.maps")
    try:
        os.write(MARK_FD, b"x" * _marks[0])
    except OSError:  # EBADF: the descriptor is never open; the plugin saw the call
        pass
    # After the mark: the plugin wrote its table inside that write(2), so a host that sees this
    # file's count finds the table complete.
    with open(f"{here}.json.partial", "w") as f:
        json.dump({"pid": os.getpid(), "role": _role(frame), "marks": _marks[0]}, f)
    os.replace(f"{here}.json.partial", f"{here}.json")


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from guest import answer_find_library_from_rootfs  # noqa: E402  (beside this file, in every process)

answer_find_library_from_rootfs()
signal.signal(signal.SIGUSR2, _on_mark)
multiprocessing.set_executable(os.environ["SGLANG_RVV_COUNT_EXECUTABLE"])
with open(os.path.join(os.environ["SGLANG_RVV_COUNT_DIR"], f"{os.getpid()}.json"), "w") as _f:
    json.dump({"pid": os.getpid(), "role": None, "marks": 0}, _f)


if __name__ == "__main__":
    import runpy

    sys.argv = ["sglang.launch_server", *sys.argv[1:]]
    runpy.run_module("sglang.launch_server", run_name="__main__")
