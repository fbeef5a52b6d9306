"""build.yml and deploy.yml against a target that can run the amd64 image: this host
(connection local), with a user's own checkpoint directory (sglang_rvv_model_dir). The build
ships the commit and the checkpoint and runs `make image`; the service comes up healthy and
answers a completion under the directory's name; both playbooks change nothing on a second
run; and the host checks pass for the service."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request

import pytest
import yaml
from ansible_support import BIN, REPO, flat, host_checks_pass, inventory, playbook, recap, succeeded
from image_support import free_port, head_commit, user_checkpoint

from sglang_rvv.bench.results import load_run

TARGET = "deploy-target"
# Its own compose project: the appliances of the tests in the other lane of `make test` run beside it.
PROJECT = "sglang-rvv-deploy"
MODEL_NAME = "Board-Model"


@pytest.fixture(scope="module")
def deploy(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("deploying needs root and rootful podman: run images/scripts/podman-setup.sh")
    work = tmp_path_factory.mktemp("deploy")
    port = free_port()
    variables = {
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "sglang_rvv_src_dir": str(work / "src"),
        "sglang_rvv_model_dir": str(user_checkpoint(work / "controller" / MODEL_NAME, seed=11)),
        "sglang_rvv_model_store_dir": str(work / "models"),
        "sglang_rvv_cache": "cold",  # the warm image of the lock's model is built by the image tests
        # The layout knobs, through the shared variables to the container: int4 at K groups of 64, and
        # lm_head asked down to int4 too (the policy's rule alone keeps it at int8).
        "sglang_rvv_weight_dtype": "int4",
        "sglang_rvv_group_size": "64",
        "sglang_rvv_lm_head_dtype": "int4",
        "sglang_rvv_port": port,
        "sglang_rvv_service_project": PROJECT,
        # This host has podman 4.3 and no systemd as init: compose, from the locked venv.
        "sglang_rvv_service_compose": str(BIN / "podman-compose"),
        "sglang_rvv_infra_checks": ["service"],
    }
    path = inventory(work / "inventory.yml", {TARGET: variables})
    runs = {"build": playbook(path, "build.yml")}
    if runs["build"].returncode == 0:
        runs["build again"] = playbook(path, "build.yml")
        runs["deploy"] = playbook(path, "deploy.yml")
        runs["deploy again"] = playbook(path, "deploy.yml")
    yield path, port, runs, work
    subprocess.run([REPO / "images/scripts/compose.sh", "down"], capture_output=True, timeout=300,
                   env={**os.environ, "PODMAN_COMPOSE": str(BIN / "podman-compose"), "SGLANG_RVV_PROJECT": PROJECT})


def test_build_ships_the_commit_and_builds_the_images(deploy):
    _, _, runs, work = deploy
    succeeded(runs, "build")
    commit = head_commit()
    current = work / "src" / "current"
    assert current.resolve() == work / "src" / commit
    assert (current / "images" / "lock.toml").read_bytes() == (REPO / "images" / "lock.toml").read_bytes()
    assert recap(succeeded(runs, "build again").stdout)[TARGET]["changed"] == 0


def test_the_service_comes_up_healthy_and_answers(deploy):
    _, port, runs, _ = deploy
    out = flat(succeeded(runs, "deploy").stdout)
    assert f"serves on 127.0.0.1:{port} (compose)" in out and "returned 4 tokens" in out
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", headers={"Content-Type": "application/json"},
        data=json.dumps({"prompt": "Hello", "max_tokens": 8, "temperature": 0, "ignore_eos": True}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
        assert json.load(response)["usage"]["completion_tokens"] == 8
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
        assert [model["id"] for model in json.load(response)["data"]] == [MODEL_NAME]
    # The layout knobs reached the policy: every packed projection streams int4, lm_head included.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        rows = [dict(re.findall(r'(\w+)="(\w+)"', labels)) for labels in
                re.findall(r"^sglang_rvv_projection_bytes\{([^}]*)\}", response.read().decode(), re.M)]
    by_projection = {row["projection"]: row["layout"] for row in rows}
    assert by_projection.get("o_proj") == "int4" and by_projection.get("lm_head") in (None, "int4"), rows
    # The service's container is the one publishing the port (the other lane serves its own).
    listed = subprocess.run(["podman", "ps", "--format", "{{.ID}} {{.Ports}}"], capture_output=True, text=True).stdout
    ids = [line.split()[0] for line in listed.splitlines() if f":{port}->" in line]
    assert len(ids) == 1, listed
    inspect = json.loads(subprocess.run(["podman", "inspect", ids[0]], capture_output=True, text=True).stdout)
    assert {"SGLANG_RVV_WEIGHT_DTYPE=int4", "SGLANG_RVV_GROUP_SIZE=64", "SGLANG_RVV_LM_HEAD_DTYPE=int4"} \
        <= set(inspect[0]["Config"]["Env"])


def test_a_second_deploy_changes_nothing(deploy):
    _, _, runs, _ = deploy
    assert recap(succeeded(runs, "deploy again").stdout)[TARGET]["changed"] == 0


def test_host_checks_pass_for_the_service(deploy):
    path, _, runs, _ = deploy
    succeeded(runs, "deploy")
    host_checks_pass(path, 5)


@pytest.fixture(scope="module")
def gateway(deploy):
    """gateway.yml on this host (the gateway group's one host) in front of the deployed board
    and of a board in the inventory that does not serve; run twice."""
    path, port, runs, work = deploy
    succeeded(runs, "deploy")
    board = {**yaml.safe_load(path.read_text())["bpi_f3"]["hosts"][TARGET], "ansible_host": "127.0.0.1"}
    silent = {"ansible_connection": "local", "ansible_host": "127.0.0.1", "sglang_rvv_port": free_port()}
    gateway_port = free_port()
    gateway_host = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3",
                    "sglang_rvv_src_dir": str(work / "gateway-src"), "sglang_rvv_gateway_port": gateway_port,
                    "sglang_rvv_gateway_metrics_port": free_port(),
                    "sglang_rvv_gateway_compose": str(BIN / "podman-compose")}
    fleet = inventory(work / "fleet.yml", {TARGET: board, "silent-board": silent}, {"gateway-host": gateway_host})
    gateway_runs = {"gateway": playbook(fleet, "gateway.yml")}
    if gateway_runs["gateway"].returncode == 0:
        gateway_runs["gateway again"] = playbook(fleet, "gateway.yml")
    yield fleet, gateway_port, gateway_runs, port
    # The role's compose.sh ran in this process's environment, so its gateway is this lane's
    # (SGLANG_RVV_PROJECT's, when set): the same environment takes it down.
    subprocess.run([REPO / "images/scripts/compose.sh", "down"], capture_output=True, timeout=300,
                   env={**os.environ, "PODMAN_COMPOSE": str(BIN / "podman-compose")})


def test_the_gateway_routes_to_the_serving_board_and_leaves_out_the_silent_one(gateway):
    _, gateway_port, runs, port = gateway
    out = flat(succeeded(runs, "gateway").stdout)
    assert "left out, no /health answer seen from gateway-host: silent-board." in out
    assert f"routes (cache_aware) to http://127.0.0.1:{port};" in out and "returned 4 tokens" in out
    request = urllib.request.Request(
        f"http://127.0.0.1:{gateway_port}/v1/completions", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 8, "temperature": 0,
                         "ignore_eos": True}).encode())
    with urllib.request.urlopen(request, timeout=120) as response:
        assert json.load(response)["usage"]["completion_tokens"] == 8
    assert recap(succeeded(runs, "gateway again").stdout)["gateway-host"]["changed"] == 0


def test_host_checks_pass_for_the_gateway(gateway):
    fleet, _, runs, _ = gateway
    succeeded(runs, "gateway")
    host_checks_pass(fleet, 3, group="gateway")


def test_reproduce_measures_one_board_then_the_gateway(gateway, tmp_path):
    """reproduce.yml's fleet play (--limit gateway: the boards' own suite is the emulated board's
    test) measures, from the gateway host, the board alone and then through the gateway, and
    fetches the run to the controller with its report."""
    fleet, _, runs, port = gateway
    succeeded(runs, "gateway")
    result = playbook(fleet, "reproduce.yml", "--limit", "gateway", "-e", f"sglang_rvv_reproduce_results={tmp_path}",
                      "-e", f"sglang_rvv_reproduce_work_dir={tmp_path / 'work'}",
                      "-e", "sglang_rvv_reproduce_fleet_requests=1")
    assert result.returncode == 0, result.stdout[-4000:]
    (run_dir,) = (tmp_path / "gateway-host").iterdir()
    run = load_run(run_dir)
    board = f"http://127.0.0.1:{port}"
    assert run.meta["complete"] and run.meta["settings"]["workers"] == [board]
    assert run.meta["provenance"]["model"]["served_model_name"] == MODEL_NAME
    assert set(run.of("fleet")) == {f"{layout}-c{c}" for layout in ("1-board", "1-board-gateway") for c in (1, 2, 4, 8)}
    for name, record in run.of("fleet").items():
        assert (record["workers"], record["gateway"]) == ([board], name.startswith("1-board-gateway")), name
        assert len(record["requests"]) == record["concurrency"], name  # 1 requested, at least the concurrency
        # 8 tokens each, and no prompt met in the prefix cache (each layout has its own prompts)
        assert all(r["output_tokens"] == 8 and r["cached_tokens"] == 0 for r in record["requests"]), name
    assert re.search(r"^\| 1-board-gateway \| http://127\.0\.0\.1:\d+ \| 8 \| 8 \| [\d.]+ \| [\d.]+ \|",
                     (run_dir / "report.md").read_text(), re.M)


def test_deploy_refuses_a_missing_image_naming_the_fix(deploy, tmp_path):
    path, _, runs, _ = deploy
    succeeded(runs, "build")
    result = playbook(path, "deploy.yml", "-e", "sglang_rvv_model=no-such-model", "-e", "sglang_rvv_model_dir=")
    assert result.returncode == 2
    assert "run build.yml first" in flat(result.stdout)
