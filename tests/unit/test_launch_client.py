"""The test-and-bench client of sglang_rvv.launch: what a failing request reports."""

from __future__ import annotations

import socket
import threading

import pytest

from sglang_rvv.launch.client import ServerError
from sglang_rvv.launch.process import SGLangServer


def test_a_dropped_connection_names_the_request_and_quotes_the_server_log(tmp_path):
    """A server that closes the connection without an answer (a crashed scheduler takes its
    HTTP server down this way) must not surface as a bare RemoteDisconnected."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept_and_drop():
        connection, _ = listener.accept()
        # Read the whole request before closing: closing with unread bytes makes the kernel
        # send a reset, which the client sees as ConnectionResetError instead of a clean drop.
        received = b""
        while b"\r\n\r\n" not in received:
            received += connection.recv(65536)
        head, _, body = received.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(body) < length:
            body += connection.recv(65536)
        connection.close()

    thread = threading.Thread(target=accept_and_drop, daemon=True)
    thread.start()
    log = tmp_path / "server.log"
    log.write_text("Scheduler hit an exception: boom\n")
    client = SGLangServer(tmp_path, port=port, log_path=log)
    try:
        with pytest.raises(ServerError) as caught:
            client.post("/update_weights_from_disk", {"model_path": "x"}, timeout=10)
    finally:
        thread.join(10)
        listener.close()
    message = str(caught.value)
    assert "POST /update_weights_from_disk: RemoteDisconnected" in message
    assert "(server not started here)" in message
    assert "Scheduler hit an exception: boom" in message
