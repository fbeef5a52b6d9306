"""``--enable-cpu-rvv-inductor`` in a real SGLang server (started here, on 127.0.0.1).

For each tiny model a flag-off and a flag-on server answer the same greedy
requests; the tokens must agree, except at a bf16 near-tie, where the flag-on
pick must be within support.TIE_TOLERANCE nats of the flag-off server's best logprob.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang_rvv.bench.serving import linear_calls
from sglang_rvv.checkpoint import write_tiny_checkpoint
from sglang_rvv.launch.client import ServerError
from sglang_rvv.launch.process import HOST, SGLangServer
from support import PROMPTS, assert_same_greedy, assert_whole_weights, generate_greedy, same_greedy

FLAG = ["--enable-cpu-rvv-inductor"]
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
# A generation long enough to still be decoding when the next request of a test arrives: the tiny
# model decodes at 10-100 tok/s here, depending on the load.
LONG = 256


def _stream(server: SGLangServer, prompt: str, tokens: int, decoding: threading.Event) -> dict:
    """A streaming greedy /generate on its own connection; sets ``decoding`` at the first chunk.

    Returns the last chunk (its ``meta_info`` has the final token count and finish reason).
    """
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}
    connection = http.client.HTTPConnection(HOST, server.port, timeout=300)
    try:
        connection.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200, response.read()
        last = None
        for line in response:  # server-sent events: b"data: {...}" lines, then b"data: [DONE]"
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                last = json.loads(line[len(b"data: "):])
                decoding.set()
        return last
    finally:
        connection.close()


def _start_long_stream(pool: ThreadPoolExecutor, server: SGLangServer, prompt: str):
    """Start a LONG-token streaming generation; its future, once tokens flow."""
    decoding = threading.Event()
    stream = pool.submit(_stream, server, prompt, LONG, decoding)
    while not decoding.wait(0.2):
        if stream.done():
            pytest.fail(f"the stream ended before it decoded: {stream.result()}")
    return stream


def _metrics(server: SGLangServer) -> dict[tuple[str, str, str], float]:
    """The policy's call counters by (projection, route, bucket), parsed as the benchmark suite does."""
    return {tuple(key.split("/")): count for key, count in linear_calls(server).items()}


def _pair(checkpoint, logs, name, tmp_path, extra_on=()):
    report = tmp_path / f"{name}-report.json"
    off = SGLangServer(checkpoint, log_path=logs / f"{name}-off.log")
    on = SGLangServer(checkpoint, log_path=logs / f"{name}-on.log", extra_args=[
        *FLAG, "--enable-metrics", "--cpu-rvv-report-path", str(report), *extra_on])
    return off, on, report


@pytest.fixture(scope="module")
def llama(tiny_checkpoints, server_logs, tmp_path_factory):
    off, on, report = _pair(tiny_checkpoints["llama"], server_logs, "llama", tmp_path_factory.mktemp("llama"))
    with off, on:
        yield off, on, report


def test_flag_on_matches_flag_off_and_reports(llama):
    off, on, report_path = llama
    for prompt in PROMPTS:
        assert_same_greedy(generate_greedy(on, prompt), generate_greedy(off, prompt))
    report = json.loads(report_path.read_text())
    # The settings resolved in the launcher arrived in the scheduler process.
    config = report["settings"]["config"]
    assert (config["regional_compile"], config["packed_weight_mode"], config["small_batch"]) == (True, "explicit", True)
    assert config["weight_dtype"] == "bf16"
    assert report["adapter"] == "sglang" and report["tied_lm_head"] is False
    assert report["packed"][-1] == "lm_head" and len(report["packed"]) == 9
    assert report["skipped"] == {}
    log = (on.log_path).read_text()
    assert "sglang_rvv: adapter=sglang provider=generic packed=9" in log
    assert "sglang_rvv" not in off.log_path.read_text().replace("sglang_rvv_boot", "")


def test_two_concurrent_requests_use_the_m2_bucket_as_the_route_table_says(llama):
    _, on, report_path = llama
    # The warm-up (on by default) measured every bucket; M=2 goes where it was faster.
    table = {(entry["projection"], entry["bucket"]): entry["route"]
             for entry in json.loads(report_path.read_text())["warmup"]["route_table"]}
    before = _metrics(on)
    results = []
    # Both requests leave together and are long enough to decode side by side: the tiny model
    # decodes over 100 tok/s here, and the prompts' prefixes are cached from the test before,
    # so with 24 tokens one request could finish before the other's prefill (seen once in CI).
    barrier = threading.Barrier(2)
    tokens = 128

    def ask(prompt):
        barrier.wait()
        results.append(on.completion(prompt, max_tokens=tokens, ignore_eos=True))

    threads = [threading.Thread(target=ask, args=(p,)) for p in PROMPTS[:2]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["usage"]["completion_tokens"] for r in results] == [tokens, tokens]
    after = _metrics(on)
    for projection in PROJECTIONS:
        route = {"packed": "packed_compiled", "eager": "packed_eager", "row_major": "row_major_measured"}[
            table[(projection, 2)]]
        key = (projection, route, "2")
        assert after.get(key, 0) > before.get(key, 0), (key, table, after)
    assert not any(route in ("row_major_gate", "row_major_invalid", "row_major_budget") for (_, route, _) in after)
    assert 'sglang_rvv_packed_bytes' in on.get("/metrics")


def test_weight_update_is_followed(llama, tmp_path):
    off, on, report_path = llama
    second = tmp_path / "llama-seed1"
    write_tiny_checkpoint(second, "llama", seed=1)
    before = [generate_greedy(on, p) for p in PROMPTS]
    for server in (on, off):
        reply = server.post("/update_weights_from_disk", {"model_path": str(second)})
        assert reply["success"], reply
    after_on = [generate_greedy(on, p) for p in PROMPTS]
    after_off = [generate_greedy(off, p) for p in PROMPTS]
    assert [[t for t, _, _ in s] for s in after_on] != [[t for t, _, _ in s] for s in before]
    for got, want in zip(after_on, after_off, strict=True):
        assert_same_greedy(got, want)
    assert "weights updated; packed buffers rebuilt" in on.log_path.read_text()
    assert not any(route == "row_major_invalid" for (_, route, _) in _metrics(on))


def _samples(server: SGLangServer, *prefixes: str) -> dict[str, float]:
    """The samples on /metrics whose names start with one of ``prefixes``: sample (with its labels) -> value."""
    return {name: float(value) for name, _, value in
            (line.rpartition(" ") for line in server.get("/metrics").splitlines()) if name.startswith(prefixes)}


def _byte_gauges(server: SGLangServer) -> dict[str, float]:
    """The policy's byte gauges on /metrics."""
    return _samples(server, "sglang_rvv_packed_bytes", "sglang_rvv_projection_bytes")


def _bf16_weight(server: SGLangServer) -> dict[str, float]:
    """The modules /metrics names as serving their BF16 weight under a quantized layout (value 1)."""
    return {name: value for name, value in _samples(server, "sglang_rvv_bf16_weight{").items() if value}


def test_an_int4_lm_head_rescored_from_bf16_serves_the_bf16_heads_picks(llama, tiny_checkpoints, server_logs,
                                                                         tmp_path):
    # Every logit rescored (K = the vocabulary): the int4 lm_head's route must hand SGLang the BF16
    # head's logits, so the picks are the flag-off server's (exact_pick; unit tests hold K < V).
    off, _, _ = llama
    # The weight-update tests before this one leave the shared flag-off server on other weights.
    assert off.post("/update_weights_from_disk", {"model_path": str(tiny_checkpoints["llama"])})["success"]
    vocab = json.loads((Path(tiny_checkpoints["llama"]) / "config.json").read_text())["vocab_size"]
    report_path = tmp_path / "report.json"
    server = SGLangServer(tiny_checkpoints["llama"], log_path=server_logs / "llama-int4-head-rescored.log",
                          extra_args=[*FLAG, "--cpu-rvv-lm-head-dtype", "int4", "--cpu-rvv-lm-head-candidates",
                                      str(vocab), "--no-cpu-rvv-warmup", "--cpu-rvv-report-path", str(report_path)])
    with server:
        for prompt in PROMPTS:
            assert_same_greedy(generate_greedy(server, prompt), generate_greedy(off, prompt))
    report = json.loads(report_path.read_text())
    assert report["layouts"]["lm_head"] == "int4" and report["settings"]["config"]["lm_head_exact_candidates"] == vocab


def test_the_byte_gauges_follow_a_weight_update_that_changes_the_packed_set(tiny_checkpoints, server_logs,
                                                                             tmp_path):
    # int8 cannot quantize a weight that is not finite: after the update, layer 0's o_proj falls
    # back to bf16 (the next wider layout), so the packed bytes grow. The gauges used to keep their
    # value from the start.
    from safetensors.torch import load_file, save_file

    second = tmp_path / "llama-inf"
    write_tiny_checkpoint(second, "llama")
    weights = load_file(second / "model.safetensors")
    weights["model.layers.0.self_attn.o_proj.weight"][0, 0] = float("inf")
    save_file(weights, second / "model.safetensors", metadata={"format": "pt"})
    # No request is served, so nothing needs compiling: no load-time warm-up, no SGLang warm-up request.
    server = SGLangServer(tiny_checkpoints["llama"], log_path=server_logs / "llama-int8-gauges.log",
                          extra_args=[*FLAG, "--cpu-rvv-weight-dtype", "int8", "--enable-metrics",
                                      "--no-cpu-rvv-warmup", "--skip-server-warmup"])
    with server:
        before, bf16_before = _byte_gauges(server), _bf16_weight(server)
        reply = server.post("/update_weights_from_disk", {"model_path": str(second)})
        assert reply["success"], reply
        after = _byte_gauges(server)  # no request in between: the update itself refreshes them
        bf16_after = _bf16_weight(server)
    bf16, int8 = (f'sglang_rvv_projection_bytes{{layout="{name}",projection="o_proj"}}' for name in ("bf16", "int8"))
    assert before.get(bf16, 0) == 0 and before[int8] > 0, before  # both layers' o_proj in int8
    assert after[bf16] == 1024 * 1024 * 2 and after[int8] == before[int8] / 2, after  # one layer fell back
    assert after["sglang_rvv_packed_bytes"] - before["sglang_rvv_packed_bytes"] == after[bf16] - before[int8] / 2
    packed = sum(v for k, v in after.items() if k.startswith("sglang_rvv_projection_bytes") and "row_major" not in k)
    assert packed == after["sglang_rvv_packed_bytes"]
    # The fallen-back o_proj is named as serving its BF16 weight though int8 was asked.
    assert bf16_before == {} and bf16_after == {'sglang_rvv_bf16_weight{module="model.layers.0.self_attn.o_proj"}': 1}


def test_weight_update_during_a_generation_waits_for_it(llama, tmp_path):
    # SGLang holds a disk update until the streams in flight have ended, then sends it at once,
    # while the scheduler may still hold the request it has just finished: the update must wait
    # for that too (it used to fail its cache flush and take the server down), then succeed.
    _, on, _ = llama
    weights = tmp_path / "llama-seed1"
    write_tiny_checkpoint(weights, "llama", seed=1)
    with ThreadPoolExecutor(1) as pool:
        stream = _start_long_stream(pool, on, PROMPTS[0])
        reply = on.post("/update_weights_from_disk", {"model_path": str(weights)}, timeout=300)
        last = stream.result(timeout=300)
    assert reply["success"], reply
    assert last["meta_info"]["completion_tokens"] == LONG
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert on.completion("Hello", max_tokens=4)["usage"]["completion_tokens"] == 4


def test_weight_update_refused_while_paused_with_a_generation_in_flight(llama, tmp_path):
    # Paused in place, the scheduler keeps the request and cannot flush its cache: the update is
    # refused with a clean error before any weight changes, and serving goes on afterwards.
    _, on, _ = llama
    weights = tmp_path / "llama-seed2"  # unlike any weights the server had: a change would show
    write_tiny_checkpoint(weights, "llama", seed=2)
    before = generate_greedy(on, PROMPTS[2])
    with ThreadPoolExecutor(1) as pool:
        stream = _start_long_stream(pool, on, PROMPTS[1])
        on.post("/pause_generation", {"mode": "in_place"})
        try:
            with pytest.raises(ServerError, match="HTTP 400") as refused:
                on.post("/update_weights_from_disk", {"model_path": str(weights)}, timeout=300)
        finally:
            on.post("/continue_generation", {})
        last = stream.result(timeout=300)
    assert "Weights not updated: the engine is paused with requests in flight" in str(refused.value)
    assert last["meta_info"]["completion_tokens"] == LONG
    assert_same_greedy(generate_greedy(on, PROMPTS[2]), before)


def test_weight_update_under_traffic_never_serves_the_old_packed_weights(llama, tmp_path):
    # Three clients stream greedy requests while /update_weights_from_disk swaps the flag-on
    # server's weights. A request that began after the update returned must match the flag-off
    # server on the new weights (no packed buffer of the old ones survives), one that ended
    # before it was sent the old weights, and one that overlapped it one of the two whole.
    off, on, _ = llama
    old, new = tmp_path / "llama-seed3", tmp_path / "llama-seed4"
    write_tiny_checkpoint(old, "llama", seed=3)
    write_tiny_checkpoint(new, "llama", seed=4)
    for server in (on, off):
        assert server.post("/update_weights_from_disk", {"model_path": str(old)}, timeout=300)["success"]
    old_ref = {p: generate_greedy(off, p) for p in PROMPTS}
    stop, results = threading.Event(), []

    def client(index: int) -> None:
        n = 0
        while not stop.is_set():
            prompt = PROMPTS[(index + n) % len(PROMPTS)]
            began = time.monotonic()
            steps = generate_greedy(on, prompt)
            results.append((prompt, began, time.monotonic(), steps))
            n += 1

    with ThreadPoolExecutor(3) as pool:
        clients = [pool.submit(client, i) for i in range(3)]
        time.sleep(3)
        sent = time.monotonic()
        reply = on.post("/update_weights_from_disk", {"model_path": str(new)}, timeout=300)
        done = time.monotonic()
        time.sleep(3)
        stop.set()
        for future in clients:
            future.result(timeout=300)
    assert reply["success"], reply
    assert off.post("/update_weights_from_disk", {"model_path": str(new)}, timeout=300)["success"]
    new_ref = {p: generate_greedy(off, p) for p in PROMPTS}
    assert not all(same_greedy(new_ref[p], old_ref[p]) for p in PROMPTS)  # the update shows
    n = assert_whole_weights(results, sent, done, old_ref, new_ref)
    print(f"weight update under traffic: {n['before']} requests before, {n['during']} during "
          f"({n['old']} on the old weights, {n['new']} on the new), {n['after']} after; "
          f"the update took {done - sent:.1f} s")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_tied_models(arch, tiny_checkpoints, server_logs, tmp_path):
    off, on, report_path = _pair(tiny_checkpoints[arch], server_logs, arch, tmp_path)
    with off, on:
        for prompt in PROMPTS[:2]:
            assert_same_greedy(generate_greedy(on, prompt), generate_greedy(off, prompt))
        report = json.loads(report_path.read_text())
        assert report["tied_lm_head"] is True and "lm_head" in report["packed"]
        # Qwen2's qkv_proj has a bias: packed too, the bias added to the kernel's output
        assert report["skipped"] == {}
        assert {f"model.layers.{i}.self_attn.qkv_proj" for i in range(2)} <= set(report["packed"])


def test_unknown_architecture_serves_row_major(tiny_checkpoints, server_logs, tmp_path):
    report_path = tmp_path / "report.json"
    server = SGLangServer(tiny_checkpoints["mistral"], log_path=server_logs / "mistral.log",
                          extra_args=[*FLAG, "--cpu-rvv-report-path", str(report_path)])
    with server:
        assert server.completion("Hello", max_tokens=4)["usage"]["completion_tokens"] >= 1
    warnings = [line for line in server.log_path.read_text().splitlines() if "no adapter for" in line]
    assert len(warnings) == 1 and "MistralForCausalLM" in warnings[0]
    assert json.loads(report_path.read_text())["adapter"] is None


LAUNCH_SERVER = [sys.executable, "-m", "sglang.launch_server"]
SGLANG_SERVE = [str(Path(sys.executable).with_name("sglang")), "serve"]


@pytest.mark.parametrize("entrypoint,argv,needle", [
    (LAUNCH_SERVER, ["--cpu-rvv-memory-budget-mib", "-1"],
     "argument --cpu-rvv-memory-budget-mib: '-1' must be >= 0"),
    (LAUNCH_SERVER, ["--cpu-rvv-packed-weight-mode", "fast"],
     "argument --cpu-rvv-packed-weight-mode: invalid choice"),
    (SGLANG_SERVE, ["--enable-cpu-rvv-inductor", "--device", "cuda"],
     "argument --enable-cpu-rvv-inductor: the RVV policy"),
    (LAUNCH_SERVER, ["--enable-cpu-rvv-inductor", "--device", "cpu", "--attention-backend", "torch_native",
                     "--enable-torch-compile"],
     "argument --enable-torch-compile: SGLang's CPU graph needs --attention-backend intel_amx"),
])
def test_bad_flag_values_exit_with_the_message(entrypoint, argv, needle, tiny_checkpoints):
    result = subprocess.run(
        [*entrypoint, "--model-path", str(tiny_checkpoints["llama"]), *argv],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert needle in result.stderr
