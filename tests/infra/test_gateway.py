"""The gateway host (Ansible's gateway group): smg running and healthy (its unit active, where
a quadlet unit runs it), listening where configured, and every worker it was configured with
listed healthy by the gateway itself."""

from __future__ import annotations

import json

UNIT = "/etc/containers/systemd/sglang-rvv-gateway.container"


def _container(target) -> dict:
    # The gateway image's label, which its containers carry however they were started (compose or quadlet).
    running = json.loads(target.run_ok("podman ps --format json --filter status=running "
                                       "--filter label=io.sglang-rvv.image=gateway"))
    assert len(running) == 1, f"gateway containers running: {[c['Names'] for c in running]}"
    return running[0]


def _address(target) -> tuple[str, int]:
    bind = target.vars.get("sglang_rvv_gateway_bind", "127.0.0.1")
    return bind, int(target.vars.get("sglang_rvv_gateway_port", 30000))


def test_gateway_is_running_and_healthy(target):
    target.require("gateway")
    container = _container(target)
    if target.host.exists("systemctl") and target.host.file(UNIT).exists:
        assert target.host.service("sglang-rvv-gateway").is_running
    assert target.host.run(f"podman healthcheck run {container['Id']}").rc == 0


def test_gateway_port_is_bound_where_configured(target):
    target.require("gateway")
    bind, port = _address(target)
    assert target.host.socket(f"tcp://{bind}:{port}").is_listening
    if bind == "127.0.0.1":
        assert not target.host.socket(f"tcp://0.0.0.0:{port}").is_listening


def test_every_configured_worker_is_healthy_at_the_gateway(target):
    target.require("gateway")
    env = json.loads(target.run_ok(f"podman inspect --format json {_container(target)['Id']}"))[0]["Config"]["Env"]
    workers = next(e.split("=", 1)[1] for e in env if e.startswith("SGLANG_RVV_GATEWAY_WORKERS="))
    configured = workers.replace(",", " ").split()  # gateway.py takes either separator
    bind, port = _address(target)
    host = "127.0.0.1" if bind in ("0.0.0.0", "127.0.0.1") else bind
    listed = json.loads(target.run_ok(
        f"python3 -c \"import urllib.request as u; print(u.urlopen('http://{host}:{port}/workers').read().decode())\""))
    health = {w["url"]: w["is_healthy"] for w in listed["workers"]}
    assert configured and health == dict.fromkeys(configured, True), f"configured {configured}, gateway lists {health}"
