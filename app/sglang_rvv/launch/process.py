"""Launch an SGLang CPU server as a subprocess, for tests, benchmarks and the cache build.

::

    with SGLangServer(model_dir, log_path="server.log") as server:
        reply = server.completion("Hello", max_tokens=8)

The server runs ``python -m sglang.launch_server`` with the CPU defaults of
:func:`~sglang_rvv.launch.args.cpu_server_args` and ``SGLANG_USE_CPU_ENGINE=1`` on
127.0.0.1 only, in a process group of its own; :meth:`SGLangServer.stop` signals that whole
group (SIGTERM, then SIGKILL after a grace period), so no scheduler or detokenizer process
outlives it. The rest of the environment is inherited (a shared ``TORCHINDUCTOR_CACHE_DIR``
included). Its HTTP requests are :class:`~sglang_rvv.launch.client.ServerClient`'s.
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .args import CPU_ENV, DEFAULT_MAX_TOTAL_TOKENS, cpu_server_args
from .client import ServerClient, ServerError

HOST = "127.0.0.1"
DEFAULT_STARTUP_TIMEOUT = 300.0
DEFAULT_STOP_GRACE = 20.0
INHERIT_OUTPUT = "-"  # log_path value: the server writes to this process's stdout/stderr
_PR_SET_PDEATHSIG = 1


# Ports are picked at or above this and below the kernel's ephemeral range.
PORT_FLOOR = 20000
# uvicorn's line when the HTTP port was taken by the time SGLang binds it, which is after the
# model is loaded and warmed up. SGLang's process then stays up without serving (a CI run's
# benchmark replica waited that way until its test timed out): only the log tells.
_BIND_FAILED = re.compile(rb"error while attempting to bind on address \('[^']*', (\d+)\)")
RELAUNCHES = 2  # starts again on another port, for a port it picked itself


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, below the kernel's ephemeral range.

    A server binds its port a minute or more after the port is picked (SGLang binds after loading
    and warming up). A port from the ephemeral range, which is what binding port 0 gives, can be
    the local end of any outgoing connection by then; below it, only a server that picks the
    same port can take it, and the pick is random.
    """
    low = _ephemeral_low()
    if low - PORT_FLOOR >= 1024:
        pick = random.SystemRandom()
        for _ in range(64):
            port = pick.randrange(PORT_FLOOR, low)
            if _port_is_free(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a host whose range starts low
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


class _PortTaken(ServerError):
    """uvicorn found the server's port taken when it came to bind it."""


def _tail(path: Path | None, lines: int = 60) -> str:
    if path is None:
        return "(server output went to this process's stdout/stderr; see above)"
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


def _die_with_parent_hook():
    """A ``preexec_fn`` that has the kernel SIGKILL the server when this process dies.

    SGLang's own children already die with the server (they set the same signal),
    so a crashed test run or benchmark leaves nothing behind. Linux only.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: no dlopen in the child
    parent = os.getpid()

    def hook():
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return hook


class SGLangServer(ServerClient):
    """One ``sglang.launch_server`` process group on 127.0.0.1; a context manager.

    ``extra_args`` are appended to the SGLang command line (they may override the
    defaults: argparse keeps the last value). ``env`` entries override the
    inherited environment. ``log_path`` receives the server's stdout and stderr
    (default: a fresh file in the temp directory; ``"-"``: this process's own).
    ``cpus`` pins the whole process group to those CPUs (``taskset``), and sets
    ``OMP_NUM_THREADS`` to their number unless ``env`` does.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        port: int | None = None,
        extra_args: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS,
        cpus: Sequence[int] = (),
    ):
        self.model_path = str(model_path)
        # A port picked here may be taken by the time the server starts (another server's
        # SGLang picks its internal ports at random while it starts): launch() then picks again.
        self._port_is_ours = port is None
        self.port = port or free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self.startup_timeout = startup_timeout
        self.command = [
            sys.executable, "-m", "sglang.launch_server",
            "--model-path", self.model_path, "--host", HOST, "--port", str(self.port),
            *cpu_server_args(max_total_tokens), *extra_args,
        ]
        self.env = {**os.environ, **CPU_ENV, **(env or {})}
        if cpus:  # taskset execs the server: its pid, and so the process group, stay the server's
            self.command = ["taskset", "--cpu-list", ",".join(map(str, cpus)), *self.command]
            if "OMP_NUM_THREADS" not in (env or {}):
                self.env["OMP_NUM_THREADS"] = str(len(cpus))
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"sglang-server-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path: Path | None = Path(name)
        elif str(log_path) == INHERIT_OUTPUT:
            self.log_path = None
        else:
            self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self._began = 0.0
        self._log_offset, self._log_seen = 0, b""
        self.startup_seconds: float | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> SGLangServer:
        """Start the server and wait until ``GET /health`` answers 200."""
        return self.launch().wait_ready()

    def launch(self) -> SGLangServer:
        """Start the server without waiting (several can then start side by side); from the
        thread that will outlive it: the server dies with the thread that started it."""
        if self.process is not None:
            raise ServerError("server already started")
        if not _port_is_free(self.port):  # else /health could answer from whoever holds it
            if not self._port_is_ours:
                raise ServerError(f"port {self.port} on {HOST} is in use")
            self._move_to(free_port())
        self._began = time.monotonic()
        self._log_seen = b""  # the unread end of the log: this start's lines only
        self._log_offset = self.log_path.stat().st_size if self.log_path and self.log_path.exists() else 0
        if self.log_path is None:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent_hook(),
            )
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.command, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent_hook(),
                )
        return self

    def _move_to(self, port: int) -> None:
        self.command[self.command.index("--port") + 1] = str(port)
        self.port, self.base_url = port, f"http://{HOST}:{port}"

    def wait_ready(self) -> SGLangServer:
        """Wait until a launched server answers ``GET /health`` (stopped, and an error, if it does not).

        A port it picked itself and found taken when the server came to bind it: the server starts
        again on another, up to RELAUNCHES times (startup_seconds is then the last start's).
        """
        try:
            for relaunch in range(RELAUNCHES + 1):
                try:
                    self._wait_healthy(self._began + self.startup_timeout)
                    break
                except _PortTaken as taken:
                    log = f"\nlog {self.log_path}:\n{_tail(self.log_path, 8)}"
                    if not self._port_is_ours:
                        raise ServerError(f"{taken}: pass a free port, or none to have one picked{log}") from None
                    if relaunch == RELAUNCHES:
                        raise ServerError(f"{taken}, and so were the {RELAUNCHES} ports picked before it: "
                                          f"something on this host takes new ports as fast as they are picked{log}"
                                          ) from None
                    self.stop()
                    self.process = None
                    self._move_to(free_port())
                    self.launch()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - self._began
        return self

    def _port_taken(self) -> bool:
        """Whether the log says, since this start, that the server's port was taken when it bound it."""
        if self.log_path is None:
            return False  # its output is this process's: nothing to read
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                new = log.read()
        except OSError:
            return False
        self._log_offset += len(new)
        lines = (self._log_seen + new).split(b"\n")
        self._log_seen = lines.pop()  # a line still being written is read whole next time
        return any(int(m.group(1)) == self.port for line in lines if (m := _BIND_FAILED.search(line)))

    def _wait_healthy(self, deadline: float) -> None:
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerError(
                    f"SGLang server exited with code {code} during startup\n"
                    f"command: {' '.join(self.command)}\nlog {self.log_path}:\n{_tail(self.log_path)}"
                )
            if self._health_ok():
                return
            if self._port_taken():
                raise _PortTaken(f"port {self.port} on {HOST} was taken by another process before the server "
                                 "bound it")
            if time.monotonic() > deadline:
                raise ServerError(
                    f"SGLang server not healthy after {self.startup_timeout:.0f} s\n"
                    f"command: {' '.join(self.command)}\nlog {self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.5)

    def _health_ok(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):  # refused, 503 while warming up, timeout
            return False

    @property
    def pid(self) -> int | None:
        """The server's pid, which is also its process-group id."""
        return self.process.pid if self.process else None

    def live_processes(self) -> list[int]:
        """Pids of the group's live processes (server, scheduler, detokenizer); [] once stopped."""
        return _group_members(self.process.pid) if self.process else []

    def stop(self, grace: float = DEFAULT_STOP_GRACE) -> None:
        """Stop the server and every process of its group. Idempotent.

        SIGTERM goes to the server first, which drains and then takes down its
        scheduler and detokenizer (~5 s). Signalling the whole group at once is no
        faster: the server then reads its children's exit as a crash and sleeps
        before its crash diagnostics. After ``grace`` seconds, or once the server
        is gone, whatever is left of the group gets SIGTERM and then SIGKILL.
        """
        if self.process is None:
            return
        group = self.process.pid
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        if _group_alive(group):
            _signal_group(group, signal.SIGTERM)
            if not _wait_group_gone(group, 3.0):
                _signal_group(group, signal.SIGKILL)
        self.process.wait()
        if not _wait_group_gone(group, 10.0):
            raise ServerError(f"processes of group {group} survived SIGKILL: {_group_members(group)}")

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _failure_context(self) -> str:
        code = self.process.poll() if self.process else None
        state = ("not started here" if self.process is None
                 else "still running" if code is None else f"exited with code {code}")
        return f" (server {state})\nlog {self.log_path}:\n{_tail(self.log_path)}"


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):  # gone, or only zombies reparented elsewhere
        pass


def _group_members(group: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        state, _ppid, pgrp = stat[stat.rfind(")") + 2 :].split()[:3]
        if int(pgrp) == group and state not in "ZXx":
            members.append(int(entry.name))
    return members


def _group_alive(group: int) -> bool:
    if os.path.isdir("/proc"):
        return bool(_group_members(group))
    try:  # no /proc: zombies count as alive here
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_group_gone(group: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _group_alive(group):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
