"""SGLang's real serving loop, counted: a server of the riscv64 rootfs under the counting qemu, every
process of it counted, and the per-token cost of each taken from the difference between two
request lengths.

Every process (the HTTP server with the tokenizer manager, the scheduler, the detokenizer) runs
:mod:`.serving_guest` under the counting qemu with a count table of its own (``<pid>.count``). After
a warm-up request the host signals every registered process (SIGUSR2: each writes a mark), lets
the server idle for a minute, marks again, serves a streamed request of ``short`` new tokens, marks
again, serves one of ``long``, and marks a fourth time. For each process, the difference of two
marks is one phase's count: a request's is its fixed cost + tokens x per-token cost + what the
process runs on timers meanwhile (watchdog and heartbeat threads, an event loop: under qemu a
token takes seconds), so a token is given two ways (:func:`_attribute`):

    upper bound: (count(long) - count(short)) / (long - short)
    lower bound: the same, less the idle window's rate x (seconds(long) - seconds(short)) / (long - short)

The plugin also counts each thread's instructions (``threads=1``), which settles most of the
range. vCPU 0 is the main thread: in the scheduler it runs the event loop and (one thread) the
model's forward, so its idle polling stops while it works and its whole per-token count is the
token's. The other threads (gloo's TCP loops, ZeroMQ's IO thread, the watchdog) poll on while the
forward runs, so theirs counts less their idle rate over the token's extra wall time, never below
zero. The sum (``thread_estimate``) is the per-token figure the board model prices.

The policy runs its eager packed route (no Inductor compile: the counting qemu cannot run the
rootfs's compiler, since qemu-user hands every execve to the host), as the policy-forward workload
does. The result keeps every phase's counts beside the per-token figures.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
import urllib.request
from pathlib import Path

from ..launch.args import cpu_server_args
from . import counts, rootfs
from .run import environment
from .tool import Tool, ToolError, lock

GUEST = Path(__file__).with_name("serving_guest.py")
PROMPT = "The capital of France is"  # short: a board-sized prefill under the counter takes minutes a token
ROLES = ("http", "scheduler", "detokenizer")
MARKS = 4  # before the idle window, after it, after the short request, after the long one
IDLE_SECONDS = 60.0
STARTUP_TIMEOUT = 3600.0
REQUEST_TIMEOUT = 1800.0
HEALTH_TIMEOUT = 600.0  # SGLang's /health generates a token, which under the counter takes minutes


def wrapper(tool: Tool, root: Path, scratch: Path, python: Path) -> Path:
    """The host executable every process of the server starts through: the counting qemu, with the
    process's own table. ``$$`` is the shell's pid, which exec keeps: the guest's pid."""
    path = scratch / "python-counted"
    path.write_text("#!/bin/sh\n"
                    f"exec '{tool.qemu}' -L '{root}' -cpu '{tool.qemu_cpu}' "
                    f"-plugin '{tool.plugin},threads=1,out={scratch}/'$$.count '{python}' \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _generate(port: int, new_tokens: int) -> None:
    """One streamed request (a chat client's way: every token crosses the detokenizer and goes out
    as its own server-sent event) of exactly ``new_tokens``."""
    body = {"text": PROMPT, "stream": True,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    last = None
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
        for line in response:
            if line.startswith(b"data: {"):
                last = json.loads(line[len(b"data: "):])
    got = last and last["meta_info"]["completion_tokens"]
    if got != new_tokens:
        raise ToolError(f"the counted server generated {got} tokens for a request of {new_tokens}")


def _registered(scratch: Path) -> dict[int, dict]:
    out = {}
    for path in scratch.glob("*.json"):
        if path.stem.isdigit():
            try:
                out[int(path.stem)] = json.loads(path.read_text())
            except json.JSONDecodeError:  # being written
                continue
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _mark_all(scratch: Path, number: int, timeout: float = 600.0) -> None:
    """SIGUSR2 to every registered, live process; wait until each has written mark ``number`` (its
    registration says so only after the plugin wrote the table: serving_guest._on_mark)."""
    pids = [pid for pid in _registered(scratch) if _alive(pid)]
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while True:
        done = [pid for pid, info in _registered(scratch).items() if pid in pids and info["marks"] >= number]
        if len(done) == len(pids):
            return
        if time.monotonic() > deadline:
            raise ToolError(f"mark {number}: {len(pids) - len(done)} of the server's {len(pids)} processes did not "
                            f"answer SIGUSR2 within {timeout:.0f} s")
        time.sleep(1.0)


def count_serving(tool: Tool, root: Path, model_dir: Path, scratch: Path, port: int,
                  short: int = 4, long: int = 12, python: Path | None = None, env: dict | None = None,
                  log=None, extra_args: tuple[str, ...] = ()) -> dict:
    """Serve ``model_dir`` under the counter, flag on (eager packed route; ``extra_args``: more of
    the server's flags, the layout's); per process role, the count of a ``short`` and a ``long``
    request and the per-token difference, per component."""
    if not 0 < short < long:
        raise ToolError(f"request lengths {short} and {long}: the second must be longer")
    _clear(scratch)
    executable = wrapper(tool, root, scratch, python or root / rootfs.VENV / "bin" / "python")
    began = time.monotonic()
    phases = serve_and_mark(executable, model_dir, scratch, port, (short, long), env, log,
                            stack=lock()["arch"]["riscv64"], extra_args=extra_args)
    return {"short": short, "long": long, "emulated_seconds": round(time.monotonic() - began, 1),
            "phase_seconds": phases, "processes": _attribute(scratch, short, long, phases)}


def _clear(scratch: Path) -> None:
    scratch.mkdir(parents=True, exist_ok=True)
    for old in scratch.iterdir():
        if old.is_file():
            old.unlink()


def serve_and_mark(executable: Path, model_dir: Path, scratch: Path, port: int, lengths: tuple[int, ...],
                   env: dict | None = None, log=None, stack: dict | None = None,
                   idle_seconds: float = IDLE_SECONDS, extra_args: tuple[str, ...] = ()) -> dict[str, float]:
    """Start the server through ``executable`` (every process of it: :mod:`.serving_guest`), wait
    for /health, serve a warm-up request, mark every process, then per request length serve it and
    mark again; stop the server. Between the first two marks the server idles ``idle_seconds``.
    Returns each phase's wall seconds (``idle``, ``request1``, ...), between the marks. ``stack`` is what the image's
    stack needs from SGLang, as the entrypoint sets it (images/lock.toml ``[arch.<arch>]``
    ``sglang_env`` and ``sglang_args``)."""
    stack = stack or {}
    command = [str(executable), str(GUEST), "--model-path", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), *cpu_server_args(max_total_tokens=256),
               "--enable-cpu-rvv-inductor", "--cpu-compile-mode", "off", "--no-cpu-rvv-warmup",
               "--skip-server-warmup", "--log-level", "warning",
               # A first forward of a board-sized model runs for minutes under the counter: past
               # the scheduler's watchdog (300 s), which would end the server.
               "--watchdog-timeout", str(int(REQUEST_TIMEOUT * 4)), *stack.get("sglang_args", []),
               *extra_args]
    server_env = {**environment(), **stack.get("sglang_env", {}), "SGLANG_RVV_COUNT_EXECUTABLE": str(executable),
                  "SGLANG_RVV_COUNT_DIR": str(scratch), "SGLANG_USE_CPU_ENGINE": "1",
                  # SGLang's own 20 s: every check failed under the counter, each token aborted unserved.
                  "SGLANG_HEALTH_CHECK_TIMEOUT": str(int(HEALTH_TIMEOUT)), **(env or {})}
    say = log or (lambda text: None)
    began = time.monotonic()
    with open(scratch / "server.log", "w") as log_file:
        server = subprocess.Popen(command, env=server_env, stdin=subprocess.DEVNULL, stdout=log_file,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_healthy(server, port, scratch)
            say(f"the counted server answers /health after {time.monotonic() - began:.0f} s")
            _generate(port, 2)  # the first request's lazy costs stay out of the measured ones
            _mark_all(scratch, 1)
            began_phase = time.monotonic()
            time.sleep(idle_seconds)  # what each process runs per second with nothing to serve
            _mark_all(scratch, 2)
            phases = {"idle": time.monotonic() - began_phase}
            for number, tokens in enumerate(lengths, start=3):
                began_phase = time.monotonic()
                _generate(port, tokens)
                phases[f"request{number - 2}"] = time.monotonic() - began_phase
                _mark_all(scratch, number)
                say(f"request of {tokens} tokens counted ({time.monotonic() - began:.0f} s)")
        finally:
            _stop(server)
    return phases


def _stop(server: subprocess.Popen, timeout: float = 120.0) -> None:
    """SIGTERM to the server's process group (its session), until every process of it is gone;
    SIGKILL to what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    signum = signal.SIGTERM
    while True:
        try:
            os.killpg(server.pid, signum)
        except ProcessLookupError:  # the group is empty
            break
        server.poll()  # reap the leader, so the group can empty
        signum = 0
        if time.monotonic() > deadline:
            signum, deadline = signal.SIGKILL, float("inf")
        time.sleep(0.5)
    server.wait()


def _wait_healthy(server: subprocess.Popen, port: int, scratch: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = "".join((scratch / "server.log").read_text().splitlines(keepends=True)[-20:])
            raise ToolError(f"the counted server exited with {server.returncode} before it was healthy:\n{tail}")
        try:
            _get(f"http://127.0.0.1:{port}/health", timeout=HEALTH_TIMEOUT + 30)
            return
        except OSError:
            time.sleep(5)
    raise ToolError(f"the counted server was not healthy within {STARTUP_TIMEOUT:.0f} s")


def _threads(tables: dict[str, dict[int, int]], phases: dict[str, float], extra_tokens: int) -> dict:
    """Per thread (vCPU): its idle rate and what a token adds; the main thread's count plus the
    others' less their polling, per token. Empty for a table without thread rows."""
    if not all(tables.get(str(n)) for n in range(1, MARKS + 1)):
        return {}
    def delta(vcpu: int, n: int) -> int:
        return tables[str(n + 1)].get(vcpu, 0) - tables[str(n)].get(vcpu, 0)
    seconds_per_token = (phases["request2"] - phases["request1"]) / extra_tokens
    threads = {}
    for vcpu in sorted(set().union(*tables.values())):
        idle = delta(vcpu, 1) / phases["idle"]
        per_token = (delta(vcpu, 3) - delta(vcpu, 2)) / extra_tokens
        threads[vcpu] = {"idle_per_second": idle, "per_token_raw": per_token,
                         "per_token": per_token if vcpu == 0 else max(0.0, per_token - idle * seconds_per_token)}
    return {"threads": threads, "thread_estimate": sum(t["per_token"] for t in threads.values())}


def _attribute(scratch: Path, short: int, long: int, phases: dict[str, float]) -> dict[str, dict]:
    """Per role: the idle window's and both requests' counts, and the per-token cost two ways.
    ``per_token_raw``: the long request's count less the short one's, over the extra tokens; an
    upper bound, since under qemu a token takes seconds and whatever runs on a timer (the
    watchdog and heartbeat threads, the HTTP server's event loop) counts with it. ``per_token``:
    less the idle window's rate over the extra wall time; a lower bound, since a busy process
    does not also run its idle loop (a component can come out below zero)."""
    out = {}
    extra_seconds = phases["request2"] - phases["request1"]
    for pid, info in sorted(_registered(scratch).items()):
        if info["marks"] < MARKS:
            continue
        maps = counts.Maps.parse((scratch / f"{pid}.maps").read_text())
        text = (scratch / f"{pid}.count").read_text()
        tables = counts.parse_tables(text, maps)
        idle, first, second = (tables[str(n + 1)].minus(tables[str(n)]).by_component() for n in (1, 2, 3))
        per_second = {name: {key: v[key] / phases["idle"] for key in counts.FIELDS} for name, v in idle.items()}
        raw = {name: {key: (second[name][key] - first[name][key]) / (long - short) for key in counts.FIELDS}
               for name in idle}
        per_token = {name: {key: raw[name][key] - per_second[name][key] * extra_seconds / (long - short)
                            for key in counts.FIELDS} for name in idle}
        role = info["role"]
        if role in out:
            raise ToolError(f"two processes of the counted server have the role {role}")
        out[role] = {"pid": pid, "idle_per_second": per_second, "short_request": first, "long_request": second,
                     "per_token": per_token, "per_token_raw": raw,
                     **_threads(counts.instructions_by_thread(text), phases, long - short)}
    missing = [role for role in ROLES if role not in out]
    if missing:
        raise ToolError(f"no counts of the server's {', '.join(missing)}: its process did not mark")
    return out
