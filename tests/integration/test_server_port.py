"""SGLangServer's port: one it picked itself and found taken at launch is replaced (another server's
SGLang picks its internal ports at random while it starts, and took one once in CI); one the
caller gave is never replaced, and a taken one is an error naming it."""

from __future__ import annotations

import socket

import pytest

from sglang_rvv.launch.client import ServerError
from sglang_rvv.launch.process import HOST, SGLangServer


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
