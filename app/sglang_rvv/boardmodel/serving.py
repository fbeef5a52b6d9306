"""SGLang's real serving loop, counted: a server of the riscv64 rootfs under the counting qemu, every
process of it counted, and the per-token cost of each taken from the difference between two
request lengths.

Every process (the HTTP server with the tokenizer manager, the scheduler, the detokenizer) runs
:mod:`.serving_guest` under the counting qemu with a count table of its own (``<pid>.count``). After
a warm-up request the host signals every registered process (SIGUSR2: each writes a mark), serves
a request of ``short`` new tokens, marks again, serves one of ``long``, and marks a third time. For
each process, the difference of two marks is one request's count (fixed cost + tokens x per-token
cost + what its idle loop ran), so

    per token = (count(long request) - count(short request)) / (long - short)

The policy runs its eager packed route (no Inductor compile: the counting qemu cannot run the
rootfs's compiler, since qemu-user hands every execve to the host), as the policy-forward workload
does. The scheduler sleeps when idle (``--sleep-on-idle``), so the time between a request's end
and the next mark adds little; the result keeps both requests' counts beside the per-token figure.
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
from .tool import Tool, ToolError

GUEST = Path(__file__).with_name("serving_guest.py")
PROMPT = "The quick brown fox jumps over the lazy dog. " * 2
ROLES = ("http", "scheduler", "detokenizer")
MARKS = 3
STARTUP_TIMEOUT = 3600.0
REQUEST_TIMEOUT = 1800.0


def wrapper(tool: Tool, root: Path, scratch: Path, python: Path) -> Path:
    """The host executable every process of the server starts through: the counting qemu, with the
    process's own table. ``$$`` is the shell's pid, which exec keeps: the guest's pid."""
    path = scratch / "python-counted"
    path.write_text("#!/bin/sh\n"
                    f"exec '{tool.qemu}' -L '{root}' -cpu '{tool.qemu_cpu}' "
                    f"-plugin '{tool.plugin},out={scratch}/'$$.count '{python}' \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _generate(port: int, new_tokens: int) -> dict:
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
        out = json.load(response)
    got = out["meta_info"]["completion_tokens"]
    if got != new_tokens:
        raise ToolError(f"the counted server generated {got} tokens for a request of {new_tokens}")
    return out


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
                  log=None) -> dict:
    """Serve ``model_dir`` under the counter, flag on (eager packed route); per process role, the
    count of a ``short`` and a ``long`` request and the per-token difference, per component."""
    if not 0 < short < long:
        raise ToolError(f"request lengths {short} and {long}: the second must be longer")
    _clear(scratch)
    executable = wrapper(tool, root, scratch, python or root / rootfs.VENV / "bin" / "python")
    seconds = serve_and_mark(executable, model_dir, scratch, port, (short, long), env, log)
    return {"short": short, "long": long, "emulated_seconds": seconds,
            "processes": _attribute(scratch, short, long)}


def _clear(scratch: Path) -> None:
    scratch.mkdir(parents=True, exist_ok=True)
    for old in scratch.iterdir():
        if old.is_file():
            old.unlink()


def serve_and_mark(executable: Path, model_dir: Path, scratch: Path, port: int, lengths: tuple[int, ...],
                   env: dict | None = None, log=None) -> float:
    """Start the server through ``executable`` (every process of it: :mod:`.serving_guest`), wait
    for /health, serve a warm-up request, mark every process, then per request length serve it and
    mark again; stop the server. Returns the seconds it all took."""
    command = [str(executable), str(GUEST), "--model-path", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), *cpu_server_args(max_total_tokens=256),
               "--enable-cpu-rvv-inductor", "--cpu-compile-mode", "off", "--no-cpu-rvv-warmup",
               "--skip-server-warmup", "--log-level", "warning"]
    server_env = {**environment(), "SGLANG_RVV_COUNT_EXECUTABLE": str(executable),
                  "SGLANG_RVV_COUNT_DIR": str(scratch), "SGLANG_USE_CPU_ENGINE": "1", **(env or {})}
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
            for number, tokens in enumerate(lengths, start=2):
                _generate(port, tokens)
                _mark_all(scratch, number)
                say(f"request of {tokens} tokens counted ({time.monotonic() - began:.0f} s)")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    return round(time.monotonic() - began, 1)


def _wait_healthy(server: subprocess.Popen, port: int, scratch: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = "".join((scratch / "server.log").read_text().splitlines(keepends=True)[-20:])
            raise ToolError(f"the counted server exited with {server.returncode} before it was healthy:\n{tail}")
        try:
            _get(f"http://127.0.0.1:{port}/health", timeout=30)
            return
        except OSError:
            time.sleep(5)
    raise ToolError(f"the counted server was not healthy within {STARTUP_TIMEOUT:.0f} s")


def _attribute(scratch: Path, short: int, long: int) -> dict[str, dict]:
    """Per role: both requests' counts and the per-token difference, by component and library."""
    out = {}
    for pid, info in sorted(_registered(scratch).items()):
        if info["marks"] < MARKS:
            continue
        maps = counts.Maps.parse((scratch / f"{pid}.maps").read_text())
        tables = counts.parse_tables((scratch / f"{pid}.count").read_text(), maps)
        first, second = tables["2"].minus(tables["1"]), tables["3"].minus(tables["2"])
        per_token = {name: {key: (second_v[key] - first_v[key]) / (long - short) for key in counts.FIELDS}
                     for (name, first_v), second_v in zip(first.by_component().items(),
                                                          second.by_component().values(), strict=True)}
        role = info["role"]
        if role in out:
            raise ToolError(f"two processes of the counted server have the role {role}")
        out[role] = {"pid": pid, "short_request": first.by_component(), "long_request": second.by_component(),
                     "per_token": per_token}
    missing = [role for role in ROLES if role not in out]
    if missing:
        raise ToolError(f"no counts of the server's {', '.join(missing)}: its process did not mark")
    return out

