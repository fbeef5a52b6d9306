"""SGLangServer's port: one it picked itself and found taken at launch is replaced (another server's
SGLang picks its internal ports at random while it starts, and took one once in CI); one the
caller gave is never replaced, and a taken one is an error naming it, at launch or when the server
comes to bind it. Picked ports lie below the kernel's ephemeral range."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from sglang_rvv.launch.client import ServerError
from sglang_rvv.launch.process import HOST, PORT_FLOOR, SGLangServer, free_port


@pytest.fixture
def holder():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        yield sock


def test_a_port_it_picked_and_finds_taken_is_replaced(tmp_path, holder):
    server = SGLangServer(tmp_path, log_path=tmp_path / "server.log")
    picked = server.port
    holder.bind((HOST, picked))
    holder.listen()
    try:
        server.launch()
        assert server.port != picked and server.base_url == f"http://{HOST}:{server.port}"
        assert server.command[server.command.index("--port") + 1] == str(server.port)
    finally:
        server.stop()


def test_a_port_the_caller_gave_and_is_taken_is_an_error(tmp_path, holder):
    holder.bind((HOST, 0))
    holder.listen()
    port = holder.getsockname()[1]
    server = SGLangServer(tmp_path, port=port, log_path=tmp_path / "server.log")
    with pytest.raises(ServerError, match=f"port {port} on {HOST} is in use"):
        server.launch()
    assert server.process is None


def test_a_picked_port_lies_below_the_ephemeral_range_and_is_free():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(20):
        port = free_port()
        assert PORT_FLOOR <= port < low  # never the local end of an outgoing connection
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, port))


class _Refused(SGLangServer):
    """A process that logs uvicorn's refusal of its port and then stays up, as SGLang 0.5.21 did."""

    def __init__(self, tmp_path, port):
        super().__init__(tmp_path, port=port, log_path=tmp_path / "server.log", startup_timeout=60)
        line = (f"ERROR:    [Errno 98] error while attempting to bind on address ('{HOST}', {port}): "
                "address already in use")
        self.command = [sys.executable, "-c", f"print({line!r}, flush=True); import time; time.sleep(600)"]


def test_a_given_port_taken_when_the_server_binds_it_is_an_error_naming_it(tmp_path):
    server = _Refused(tmp_path, free_port())
    began = time.monotonic()
    with pytest.raises(ServerError, match=f"port {server.port} on {HOST} was taken by another process before "
                       "the server bound it.*pass a free port, or none to have one picked"):
        server.start()
    assert time.monotonic() - began < 30  # read in the log, not waited out
    assert server.live_processes() == []
