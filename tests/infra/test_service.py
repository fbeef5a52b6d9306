"""The deployed service: the image the lock describes, of the arch configured and running as that
machine (under qemu-user when emulated), healthy, bound where configured, and serving completions."""

from __future__ import annotations

import json
import shlex


def _container(target) -> dict:
    running = json.loads(target.run_ok("podman ps --format json --filter status=running"))
    image = target.image()
    matches = [c for c in running if c["Image"] == image]
    assert matches, f"no running container of {image}: {[c['Image'] for c in running]}"
    return matches[0]


def test_image_is_present_with_the_lock_labels(target):
    target.require("service")
    image = target.image()
    labels = json.loads(target.run_ok(f"podman image inspect --format json {image}"))[0]["Labels"]
    arch = labels["io.sglang-rvv.arch"]
    assert arch == target.arch(), f"{image} is labelled {arch}, the target serves {target.arch()}"
    expected = target.lock("labels", arch, "runtime")
    for flag in expected.splitlines():  # one --label=KEY=VALUE a line; values may hold spaces (kernels-flags)
        key, _, value = flag.removeprefix("--label=").partition("=")
        if key.startswith("io.sglang-rvv.") and key != "io.sglang-rvv.image":
            assert labels.get(key) == value, f"{image}: label {key}={labels.get(key)!r}, lock says {value!r}"


def test_service_is_active_and_healthy(target):
    target.require("service")
    container = _container(target)
    if target.host.exists("systemctl") and target.host.file("/etc/containers/systemd/sglang-rvv.container").exists:
        assert target.host.service("sglang-rvv").is_running
    assert target.host.run(f"podman healthcheck run {container['Id']}").rc == 0
    port = target.vars.get("sglang_rvv_port", 30000)
    health = target.run_ok(f"python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:{port}/health').status)\"")
    assert health.strip() == "200"


def test_the_container_runs_as_the_images_machine(target):
    target.require("service")
    machine = target.run_ok(f"podman exec {_container(target)['Id']} uname -m").strip()
    assert machine == target.lock("get", f"arch.{target.arch()}.machine")


def test_a_completion_is_served(target):
    target.require("service")
    port = target.vars.get("sglang_rvv_port", 30000)
    request = json.dumps({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    url = f"http://127.0.0.1:{port}/v1/completions"
    script = (f"import json, urllib.request as u; r = u.Request({url!r}, data={request!r}.encode(), "
              "headers={'Content-Type': 'application/json'}); "
              "print(json.load(u.urlopen(r, timeout=600))['usage']['completion_tokens'])")
    assert target.run_ok(f"python3 -c {shlex.quote(script)}").strip() == "4"


def test_port_is_bound_where_configured(target):
    target.require("service")
    bind = target.vars.get("sglang_rvv_bind", "127.0.0.1")
    port = target.vars.get("sglang_rvv_port", 30000)
    assert target.host.socket(f"tcp://{bind}:{port}").is_listening
    if bind == "127.0.0.1":
        assert not target.host.socket(f"tcp://0.0.0.0:{port}").is_listening
