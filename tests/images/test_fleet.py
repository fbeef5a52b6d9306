"""A fleet on one host: `make up REPLICAS=2` starts two appliances on their own CPUs and the
gateway (smg, SGLang's router) in front of them on one port; the faults a fleet meets.

Everything is real: the images, podman-compose, the gateway and SGLang. Traffic goes only to
127.0.0.1, every client call has a timeout (CALL_TIMEOUT_S), and every test is bounded in
requests and time. The tests run in file order: the soak first, on a fleet nobody has
disturbed, then a replica is killed and comes back, then the other replica's scheduler process
dies, and the replica that came back must serve everything meanwhile.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from image_support import COMPOSE_PROJECT, REPO, free_port, gateway_workers, run, scrape

from sglang_rvv.checkpoint import write_tiny_checkpoint
from sglang_rvv.launch.client import post_json
from sglang_rvv.launch.process import SGLangServer
from support import PROMPTS, assert_same_greedy, assert_whole_weights, generate_greedy, same_greedy

REPLICAS = 2
# A client call returns within this, answered or failed: the bound every fault test states.
CALL_TIMEOUT_S = 120
# The soak: requests at this concurrency for this long through the gateway (SGLANG_RVV_SOAK_S).
SOAK_CONCURRENCY = 8
SOAK_S = float(os.environ.get("SGLANG_RVV_SOAK_S", "120"))
SOAK_WARMUP_S = 20
# Distinct first words, so that cache-aware routing spreads the requests over the replicas.
WORDS = ["Apples", "Boards", "Cores", "Drums", "Eagles", "Forks", "Grapes", "Harbors"]
# How long a killed replica may take to come back (a restart with a warm Inductor cache).
RECOVERY_S = 300


@pytest.fixture(scope="module")
def fleet(amd64_images, build_logs):
    """make up REPLICAS=2 CACHE=warm on free ports; make down afterwards."""
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "SGLANG_RVV_GATEWAY_METRICS_PORT": str(metrics_port)}
    try:
        run(["make", "up", "MODEL=tiny-llama", f"REPLICAS={REPLICAS}", "CACHE=warm", f"PORT={port}"], timeout=1200,
            log=build_logs / "make-up-fleet.log", env=env)
        yield {"port": port, "metrics": metrics_port, "replicas": [port + i for i in range(1, REPLICAS + 1)]}
    finally:
        run(["make", "down"], timeout=300)


def _replica(index: int) -> str:
    """The container id of replica INDEX (1-based)."""
    label = f"label=io.podman.compose.project={COMPOSE_PROJECT}-replica-{index}"
    out = subprocess.run(["podman", "ps", "-a", "--filter", label, "--format", "{{.ID}}"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert len(out) == 1, f"replica {index}: containers {out}"
    return out[0]


def _inspect(container: str, template: str) -> str:
    return subprocess.run(["podman", "inspect", "--format", template, container], capture_output=True, text=True,
                          check=True).stdout.strip()


def _wait(what: str, check, timeout: float, interval: float = 1.0) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            pytest.fail(f"{what}: not after {timeout:.0f} s", pytrace=False)
        time.sleep(interval)
    return time.monotonic() - began


def _whole(fleet: dict) -> bool:
    """Whether the gateway sees every replica healthy. Under load (make test's other lane emulating
    riscv64) it may have marked one unhealthy for a while, and then routes nothing to it."""
    return list(gateway_workers(fleet["port"]).values()) == [True] * REPLICAS


def _complete(port: int, prompt: str, max_tokens: int) -> dict:
    """One completion; {status, began, seconds, tokens | error}. HTTP errors are outcomes, not raised;
    a connection failure or a timeout is recorded as status 0 with its error."""
    body = json.dumps({"model": "tiny-llama", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    began = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S) as reply:
            outcome = {"status": reply.status, "tokens": json.load(reply)["usage"]["completion_tokens"]}
    except urllib.error.HTTPError as error:
        outcome = {"status": error.code, "error": error.read().decode()[:200]}
    except OSError as error:  # refused, reset, or timed out: the outcomes the gateway must prevent
        outcome = {"status": 0, "error": repr(error)}
    return {**outcome, "began": began, "seconds": time.monotonic() - began}


def _served(port: int) -> float:
    """Requests a replica finished, from SGLang's own metrics."""
    return sum(v for k, v in scrape(port).items() if k.startswith("sglang:e2e_request_latency_seconds_count"))


def _running(port: int) -> float:
    """Requests a replica is decoding now."""
    return sum(v for k, v in scrape(port).items() if k.startswith("sglang:num_running_reqs"))


def _rss_mib(container: str) -> float:
    """The resident memory of every process of a container, from the host's /proc."""
    pids = subprocess.run(["podman", "top", container, "hpid"], capture_output=True, text=True,
                          check=True).stdout.split()[1:]
    total = 0
    for pid in pids:
        try:
            status = open(f"/proc/{pid}/status").read()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total / 1024


@pytest.mark.parametrize("replicas", ["0", "two", "-1"])
def test_a_replica_count_that_is_not_a_whole_number_is_refused_before_anything_starts(replicas):
    result = subprocess.run([REPO / "images/scripts/compose.sh", "up"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "SGLANG_RVV_REPLICAS": replicas,
                                 "PODMAN_COMPOSE": str(Path(sys.executable).with_name("podman-compose"))})
    assert result.returncode == 1
    assert f"SGLANG_RVV_REPLICAS='{replicas}' must be a whole number >= 1 (make up REPLICAS=N)" in result.stderr


def test_the_gateway_fronts_every_replica_each_on_its_own_cpus(fleet):
    urls = {f"http://127.0.0.1:{port}" for port in fleet["replicas"]}
    assert gateway_workers(fleet["port"]) == dict.fromkeys(urls, True)
    cpusets = [_inspect(_replica(i), "{{.HostConfig.CpusetCpus}}") for i in range(1, REPLICAS + 1)]
    cpus = [set(c.split(",")) for c in cpusets]
    assert all(cpus) and not cpus[0] & cpus[1], f"replicas' CPU sets overlap: {cpusets}"
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet['port']}/v1/models", timeout=30) as reply:
        assert [m["id"] for m in json.load(reply)["data"]] == ["tiny-llama"]  # clients see one appliance
    outcome = _complete(fleet["port"], "Hello", 8)
    assert outcome["status"] == 200 and outcome["tokens"] == 8, outcome


def test_a_soak_at_concurrency_8_keeps_memory_flat_and_every_request_counted(fleet):
    containers = [_replica(i) for i in range(1, REPLICAS + 1)]
    packed = [scrape(p)["sglang_rvv_packed_bytes"] for p in fleet["replicas"]]
    served_before = sum(_served(p) for p in fleet["replicas"])
    gateway_before = scrape(fleet["metrics"])
    deadline = time.monotonic() + SOAK_S
    rss_warm: list[float] = []

    def client(worker: int) -> list[dict]:
        outcomes, n = [], 0
        while time.monotonic() < deadline:
            outcomes.append(_complete(fleet["port"], f"Client {worker} asks question {n} of the fleet:", 32))
            n += 1
        return outcomes

    with ThreadPoolExecutor(SOAK_CONCURRENCY) as pool:
        futures = [pool.submit(client, w) for w in range(SOAK_CONCURRENCY)]
        time.sleep(SOAK_WARMUP_S)
        rss_warm = [_rss_mib(c) for c in containers]
        outcomes = [o for f in futures for o in f.result(timeout=SOAK_S + 2 * CALL_TIMEOUT_S)]
    rss_end = [_rss_mib(c) for c in containers]

    failed = [o for o in outcomes if o["status"] != 200]
    print(f"soak: {len(outcomes)} requests in {SOAK_S:.0f} s at concurrency {SOAK_CONCURRENCY}, {len(failed)} failed; "
          f"RSS MiB after warm-up {[round(r) for r in rss_warm]}, at the end {[round(r) for r in rss_end]}; "
          f"slowest {max(o['seconds'] for o in outcomes):.1f} s")
    assert not failed, failed[:5]
    for warm, end in zip(rss_warm, rss_end, strict=True):
        assert abs(end - warm) <= 0.05 * warm, f"RSS moved from {warm:.0f} to {end:.0f} MiB"
    assert [scrape(p)["sglang_rvv_packed_bytes"] for p in fleet["replicas"]] == packed
    served = sum(_served(p) for p in fleet["replicas"]) - served_before
    assert served == len(outcomes), f"the replicas count {served} requests, the clients sent {len(outcomes)}"
    assert all(_served(p) > 0 for p in fleet["replicas"]), "the gateway sent everything to one replica"
    gateway = scrape(fleet["metrics"])
    routed = sum(v - gateway_before.get(k, 0) for k, v in gateway.items() if k.startswith("smg_http_requests_total")
                 and 'path="/v1/completions"' in k)
    print(f"soak: the gateway counts {routed:.0f} completions")


class _Endpoint:
    """A URL with the one method tests/support.py's generate_greedy needs."""

    def __init__(self, port: int):
        self.base_url = f"http://127.0.0.1:{port}"

    def post(self, path: str, body: dict, timeout: float = CALL_TIMEOUT_S) -> dict:
        return post_json(self.base_url + path, body, timeout)


def test_a_rolling_weight_update_under_traffic_serves_whole_old_or_new_weights(fleet, tmp_path):
    """Each replica in turn gets new weights (/update_weights_from_disk) while three clients
    stream greedy requests through the gateway. Every request succeeds; one that ended before the
    first update matches the flag-off server on the old weights, one that began after the second
    matches it on the new weights, and one in between matches one of the two whole (the other
    replica still serves the old weights meanwhile). The image's model is the lock's tiny-llama,
    seed 0, so the old weights are regenerated here bit for bit."""
    old, new = tmp_path / "tiny-llama", tmp_path / "weights-new"
    write_tiny_checkpoint(old, "llama", seed=0)
    write_tiny_checkpoint(new, "llama", seed=5)
    with SGLangServer(old, log_path=tmp_path / "flag-off.log") as off:  # the reference: flag off
        old_ref = {p: generate_greedy(off, p) for p in PROMPTS}
        assert off.post("/update_weights_from_disk", {"model_path": str(new)}, timeout=300)["success"]
        new_ref = {p: generate_greedy(off, p) for p in PROMPTS}
    assert not all(same_greedy(new_ref[p], old_ref[p]) for p in PROMPTS)  # the update shows
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.add(new, arcname=new.name)
    for i in range(1, REPLICAS + 1):  # into each replica's /tmp (the image is read-only)
        subprocess.run(["podman", "exec", "-i", _replica(i), "tar", "-x", "-C", "/tmp", "-f", "-"],
                       input=archive.getvalue(), check=True, timeout=120)
    gateway, replicas = _Endpoint(fleet["port"]), [_Endpoint(p) for p in fleet["replicas"]]
    packed = [scrape(p)["sglang_rvv_packed_bytes"] for p in fleet["replicas"]]
    stop, results, failures = threading.Event(), [], []

    def client(index: int) -> None:
        n = 0
        while not stop.is_set():
            prompt = PROMPTS[(index + n) % len(PROMPTS)]
            began = time.monotonic()
            try:
                results.append((prompt, began, time.monotonic(), generate_greedy(gateway, prompt)))
            except OSError as error:
                failures.append(repr(error))
            n += 1

    updates = []
    with ThreadPoolExecutor(3) as pool:
        clients = [pool.submit(client, i) for i in range(3)]
        time.sleep(3)
        for replica in replicas:
            sent = time.monotonic()
            reply = replica.post("/update_weights_from_disk", {"model_path": f"/tmp/{new.name}"}, timeout=300)
            updates.append((sent, time.monotonic(), reply))
            time.sleep(3)
            if len(updates) == 1:  # replica 1 alone serves the new weights now
                first_new = {p: generate_greedy(replicas[0], p) for p in PROMPTS}
        stop.set()
        for future in clients:
            future.result(timeout=300)
    assert all(reply["success"] for _, _, reply in updates), updates
    assert not failures, failures[:5]
    for prompt in PROMPTS:
        assert_same_greedy(first_new[prompt], new_ref[prompt])
    # From the first update sent to the second answered, either replica may hold either weights.
    n = assert_whole_weights(results, updates[0][0], updates[-1][1], old_ref, new_ref)
    print(f"rolling weight update through the gateway: {n['before']} requests before, {n['during']} during "
          f"({n['old']} on the old weights, {n['new']} on the new), {n['after']} after; "
          f"the updates took {[round(done - sent, 1) for sent, done, _ in updates]} s")
    assert [scrape(p)["sglang_rvv_packed_bytes"] for p in fleet["replicas"]] == packed  # same shapes, repacked


def test_a_killed_replica_fails_no_waiting_request_and_rejoins(fleet):
    containers = {i: _replica(i) for i in range(1, REPLICAS + 1)}
    restarts = {i: int(_inspect(c, "{{.RestartCount}}")) for i, c in containers.items()}

    def busy() -> int | None:
        return next((i for i, port in enumerate(fleet["replicas"], 1) if _running(port) > 0), None)

    def kill_when_busy() -> tuple[float, int, float]:
        # The victim is a replica decoding some of the first four requests (cache-aware routing
        # decides which): the kill then has requests in flight on it, and the last four are still
        # waiting in the client.
        _wait("a replica decodes a request", lambda: busy() is not None, timeout=30, interval=0.1)
        index = busy() or 1
        in_flight = _running(fleet["replicas"][index - 1])
        os.kill(int(_inspect(containers[index], "{{.State.Pid}}")), signal.SIGKILL)  # a crash, not a stop
        return time.monotonic(), index, in_flight

    # The fault starts from a whole fleet.
    _wait("the gateway sees every replica healthy", lambda: _whole(fleet), timeout=RECOVERY_S, interval=1)
    with ThreadPoolExecutor(4) as pool, ThreadPoolExecutor(1) as killer:
        killed = killer.submit(kill_when_busy)
        began = time.monotonic()
        futures = [pool.submit(_complete, fleet["port"], f"{WORDS[n]} is what request {n} asks a fleet about:", 128)
                   for n in range(8)]
        outcomes = [f.result(timeout=CALL_TIMEOUT_S + 30) for f in futures]
        try:
            killed_at, index, in_flight = killed.result()
        except pytest.fail.Exception:  # what the requests got meanwhile says why no replica was seen busy
            print("no replica seen decoding; the requests: " + ", ".join(
                f"{o['status']} from {o['began'] - began:.1f} s for {o['seconds']:.1f} s" for o in outcomes))
            raise
    victim, port = containers[index], fleet["replicas"][index - 1]
    victim_url = f"http://127.0.0.1:{port}"
    waiting = [o for o in outcomes if o["began"] > killed_at]
    print(f"killed replica {index} at {killed_at - began:.1f} s with {in_flight:.0f} requests in flight on it: "
          + ", ".join(f"{o['status']} from {o['began'] - began:.1f} s for {o['seconds']:.1f} s" for o in outcomes))
    assert all(o["status"] == 200 or 400 <= o["status"] < 600 for o in outcomes), \
        [o for o in outcomes if o["status"] == 0]  # answered or a clean HTTP error: no reset, no hang
    assert all(o["seconds"] < CALL_TIMEOUT_S for o in outcomes)
    assert waiting and all(o["status"] == 200 for o in waiting), waiting  # not yet started: the other replica
    unhealthy_after = _wait("the gateway marks the killed replica unhealthy",
                            lambda: not gateway_workers(fleet["port"]).get(victim_url, True), timeout=60)
    back_after = _wait("the killed replica is restarted and healthy at the gateway",
                       lambda: gateway_workers(fleet["port"]).get(victim_url) is True, timeout=RECOVERY_S, interval=3)
    assert int(_inspect(victim, "{{.RestartCount}}")) == restarts[index] + 1  # compose's restart policy
    print(f"gateway saw replica {index} unhealthy {unhealthy_after:.0f} s after the check began, "
          f"healthy again {back_after:.0f} s later")
    # That the gateway routes to it again is proven next: the other replica loses its scheduler,
    # and the rejoined one must serve everything meanwhile.
    fleet["rejoined"] = index


def test_a_dead_scheduler_restarts_its_appliance_while_the_rejoined_replica_serves(fleet):
    rejoined = fleet.get("rejoined", 1)  # the replica the previous test killed and saw come back
    index = next(i for i in range(1, REPLICAS + 1) if i != rejoined)
    victim = _replica(index)

    def schedulers() -> tuple[list[str], str]:
        top = subprocess.run(["podman", "top", victim, "hpid", "args"], capture_output=True, text=True,
                             check=True).stdout
        return [line.split()[0] for line in top.splitlines() if "sglang::scheduler" in line], top

    # A scheduler names itself once its spawned process has imported SGLang. A CI run (under the
    # other lane's load) found this replica with two spawn children not yet named, as a starting
    # appliance has; what it then showed is printed, and the fault waits for a whole fleet.
    named, top = schedulers()
    if len(named) != 1:
        print(f"replica {index} before the fault, restarted {_inspect(victim, '{{.RestartCount}}')} times, "
              f"{_inspect(victim, '{{.State.Health.Status}}')}:\n{top}")
    _wait("the gateway sees every replica healthy and the victim's scheduler runs",
          lambda: _whole(fleet) and len(schedulers()[0]) == 1, timeout=RECOVERY_S, interval=1)
    restarts = int(_inspect(victim, "{{.RestartCount}}"))
    scheduler = schedulers()[0]
    served_before = _served(fleet["replicas"][rejoined - 1])
    began = time.monotonic()
    os.kill(int(scheduler[0]), signal.SIGKILL)
    outcomes = [_complete(fleet["port"], f"While replica {index} is down, question {n}:", 4) for n in range(6)]
    served = _served(fleet["replicas"][rejoined - 1]) - served_before
    _wait(f"replica {index}'s healthcheck fails", lambda: subprocess.run(
        ["podman", "healthcheck", "run", victim], capture_output=True).returncode != 0
        or int(_inspect(victim, "{{.RestartCount}}")) > restarts, timeout=60)
    healthy = _wait(f"replica {index} is restarted and healthy", lambda: int(_inspect(victim, "{{.RestartCount}}"))
                    > restarts and subprocess.run(["podman", "healthcheck", "run", victim],
                                                  capture_output=True).returncode == 0,
                    timeout=RECOVERY_S, interval=3)
    print(f"scheduler of replica {index} killed: healthy again after {time.monotonic() - began:.0f} s "
          f"({healthy:.0f} s of waiting); requests meanwhile: {[o['status'] for o in outcomes]}, "
          f"{served:.0f} of them served by replica {rejoined}")
    assert all(o["status"] == 200 for o in outcomes), outcomes
    assert served == len(outcomes), f"replica {rejoined} served {served} of the {len(outcomes)} requests"
