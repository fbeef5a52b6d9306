"""Launch an SGLang CPU server as a subprocess, for tests, benchmarks and local serving.

::

    with SGLangServer(model_dir, log_path="server.log") as server:
        reply = server.completion("Hello", max_tokens=8)

The server runs ``python -m sglang.launch_server`` with the CPU defaults of
:func:`cpu_server_args` and ``SGLANG_USE_CPU_ENGINE=1`` on 127.0.0.1 only, in a
process group of its own; :meth:`SGLangServer.stop` signals that whole group
(SIGTERM, then SIGKILL after a grace period), so no scheduler or detokenizer
process outlives it. The rest of the environment is inherited (a shared
``TORCHINDUCTOR_CACHE_DIR`` included). HTTP uses only ``urllib``.

From the command line, a foreground server with the same defaults; arguments
after the model directory that this module does not know go to SGLang::

    python -m sglang_rvv.server MODEL_DIR [--port 30000] [--max-total-tokens 4096] [SGLANG ARGS...]
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import os
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
from typing import Any

HOST = "127.0.0.1"
# The KV cache budget in tokens. SGLang's default sizes it from free memory
# (~14 GB on a 24 GiB machine); a small fixed pool keeps startup and RSS small.
DEFAULT_MAX_TOTAL_TOKENS = 4096
DEFAULT_STARTUP_TIMEOUT = 300.0
DEFAULT_STOP_GRACE = 20.0
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
INHERIT_OUTPUT = "-"  # log_path value: the server writes to this process's stdout/stderr
_PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """The server failed to start, died, or answered a request with an error."""


def cpu_server_args(max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS) -> list[str]:
    """SGLang arguments for bf16 serving on CPU (add ``--model-path``, ``--host``, ``--port``).

    ``--sleep-on-idle``: without it an idle scheduler busy-polls a whole core
    (measured here: ~94 %), which the model's own threads then lose.
    """
    return [
        "--device", "cpu",
        "--dtype", "bfloat16",
        "--attention-backend", "torch_native",
        "--max-total-tokens", str(max_total_tokens),
        "--sleep-on-idle",
    ]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
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


class SGLangServer:
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
            raise ServerError(f"port {self.port} on {HOST} is in use")
        self._began = time.monotonic()
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

    def wait_ready(self) -> SGLangServer:
        """Wait until a launched server answers ``GET /health`` (stopped, and an error, if it does not)."""
        try:
            self._wait_healthy(self._began + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - self._began
        return self

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

    # -- HTTP --------------------------------------------------------------

    def _request(self, path: str, body: Any = None, timeout: float = 120.0) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ServerError(f"{request.get_method()} {path} -> HTTP {exc.code}: {detail}") from exc
        except (ConnectionError, http.client.HTTPException) as exc:
            # A dropped connection says nothing by itself: name whether the server is still
            # up and quote its log, where a crash of the scheduler is explained.
            code = self.process.poll() if self.process else None
            state = ("not started here" if self.process is None
                     else "still running" if code is None else f"exited with code {code}")
            raise ServerError(
                f"{request.get_method()} {path}: {type(exc).__name__}: {exc} (server {state})\n"
                f"log {self.log_path}:\n{_tail(self.log_path)}"
            ) from exc

    def get(self, path: str, timeout: float = 30.0) -> Any:
        """``GET path``; the decoded JSON, or the text if the body is not JSON."""
        raw = self._request(path, timeout=timeout)
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def post(self, path: str, body: Any, timeout: float = 120.0) -> Any:
        """``POST path`` with a JSON body; the decoded JSON reply."""
        return json.loads(self._request(path, body, timeout=timeout))

    def completion(
        self, prompt: str | Sequence, max_tokens: int, temperature: float = 0.0, timeout: float = 120.0, **kw
    ) -> dict:
        """``POST /v1/completions``; extra keywords (``ignore_eos``, ``stop``, ...) go into the body."""
        body = {"model": self.model_path, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": temperature, **kw}
        return self.post("/v1/completions", body, timeout=timeout)


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sglang_rvv.server",
        description="Serve MODEL_DIR with SGLang on CPU (127.0.0.1). Unknown arguments go to SGLang.",
    )
    parser.add_argument("model_dir", help="checkpoint directory (config, weights, tokenizer)")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--max-total-tokens", type=int, default=DEFAULT_MAX_TOTAL_TOKENS)
    parser.add_argument("--startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT)
    parser.add_argument("--log", default=INHERIT_OUTPUT, help="server log file (default: this terminal)")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]

    def terminate(signum, frame):
        raise KeyboardInterrupt

    # Ctrl-C, and SIGTERM from `docker stop` and friends, stop the server. Set explicitly:
    # a shell starts background jobs with SIGINT ignored, which Python would keep.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, terminate)
    server = SGLangServer(
        args.model_dir, port=args.port, extra_args=extra, log_path=args.log,
        startup_timeout=args.startup_timeout, max_total_tokens=args.max_total_tokens,
    )
    try:
        server.start()
        print(
            f"\nsglang_rvv: serving {args.model_dir} at {server.base_url} "
            f"(ready in {server.startup_seconds:.1f} s; Ctrl-C stops)\n"
            f"  curl {server.base_url}/v1/completions -H 'Content-Type: application/json' \\\n"
            f"    -d '{{\"prompt\": \"Hello\", \"max_tokens\": 16, \"temperature\": 0}}'\n",
            flush=True,
        )
        code = server.process.wait()
        print(f"sglang_rvv: server exited with code {code}", file=sys.stderr)
        return code or 1
    except ServerError as exc:
        print(f"sglang_rvv: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nsglang_rvv: stopping", file=sys.stderr)
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
