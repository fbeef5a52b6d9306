"""A stock SGLang CPU server (no sglang_rvv flags) on the tiny llama, driven over real HTTP."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_rvv.launch.client import ServerError
from sglang_rvv.launch.process import HOST, SGLangServer

MAX_TOKENS = 8


@pytest.fixture(scope="module")
def plain_server(tiny_checkpoints, server_logs):
    """The server, with the port it picked taken before it binds it: SGLang binds its HTTP port only
    after loading, and with the port taken by then it stays up without serving (a CI benchmark
    waited on such a server until its test timed out). The launcher must read uvicorn's refusal
    in the log and start it again on another port (test_a_picked_port_taken_...)."""
    server = SGLangServer(tiny_checkpoints["llama"], log_path=server_logs / "plain-llama.log")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        server.launch()
        server.taken = server.port
        holder.bind((HOST, server.taken))  # after launch()'s own check, before SGLang binds
        holder.listen()
        try:
            server.wait_ready()
            print(f"plain server ready in {server.startup_seconds:.1f} s (log {server.log_path})")
            assert len(server.live_processes()) >= 3  # server, scheduler, detokenizer
            yield server
        finally:
            server.stop()
    assert server.live_processes() == []  # stop() took the whole group down


def test_a_picked_port_taken_before_the_server_binds_it_moves_the_server(plain_server):
    assert plain_server.port != plain_server.taken
    log = plain_server.log_path.read_text()
    assert f"('{HOST}', {plain_server.taken}): address already in use" in log
    assert_full_completion(complete(plain_server, "The quick brown fox"))


def complete(server: SGLangServer, prompt: str) -> dict:
    # Random weights may pick the EOS id early; ignore_eos makes the token count exact.
    return server.completion(prompt, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


def assert_full_completion(reply: dict) -> None:
    assert reply["usage"]["completion_tokens"] == MAX_TOKENS, reply
    (choice,) = reply["choices"]
    assert choice["text"].strip(), reply
    assert choice["finish_reason"] == "length", reply


def test_health_and_model_listing(plain_server):
    models = plain_server.get("/v1/models")
    assert [m["id"] for m in models["data"]] == [plain_server.model_path]


def test_greedy_completion(plain_server):
    began = time.monotonic()
    reply = complete(plain_server, "The quick brown fox")
    text = reply["choices"][0]["text"]
    print(f"completion of {MAX_TOKENS} tokens in {time.monotonic() - began:.3f} s: {text!r}")
    assert_full_completion(reply)
    assert reply["usage"]["prompt_tokens"] > 0
    again = complete(plain_server, "The quick brown fox")
    assert again["choices"][0]["text"] == reply["choices"][0]["text"], "temperature 0 is not deterministic"


def test_concurrent_completions(plain_server):
    prompts = ["Once upon a time", "The weather today is"]
    began = time.monotonic()
    with ThreadPoolExecutor(len(prompts)) as pool:
        replies = list(pool.map(lambda p: complete(plain_server, p), prompts))
    print(f"{len(prompts)} concurrent completions in {time.monotonic() - began:.3f} s")
    for reply in replies:
        assert_full_completion(reply)


def test_startup_failure_reports_log_tail(tmp_path):
    missing = tmp_path / "no-such-model"
    server = SGLangServer(missing, log_path=tmp_path / "fail.log", startup_timeout=120)
    with pytest.raises(ServerError, match="exited with code") as excinfo:
        server.start()
    assert str(missing) in str(excinfo.value)  # the log tail names what went wrong
    assert server.live_processes() == []
