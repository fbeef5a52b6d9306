"""images/gateway/gateway.py: the gateway container's configuration, refused in one line when bad."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from image_support import REPO

GATEWAY_PY = REPO / "images" / "gateway" / "gateway.py"
WORKERS = "http://10.0.0.21:30000, http://10.0.0.22:30000"


@pytest.fixture
def gateway(monkeypatch):
    for name in ("WORKERS", "HOST", "PORT", "POLICY", "METRICS_PORT", "ARGS"):
        monkeypatch.delenv(f"SGLANG_RVV_GATEWAY_{name}", raising=False)
    spec = importlib.util.spec_from_file_location("gateway", GATEWAY_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_launch_arguments_carry_every_worker_and_the_defaults(gateway, monkeypatch):
    monkeypatch.setenv("SGLANG_RVV_GATEWAY_WORKERS", WORKERS)
    monkeypatch.setenv("SGLANG_RVV_GATEWAY_ARGS", "--log-level warn")
    args = gateway.launch_args()
    assert args[:6] == ["smg", "launch", "--host", "127.0.0.1", "--port", "30000"]
    assert args[args.index("--worker-urls") + 1:args.index("--policy")] == [
        "http://10.0.0.21:30000", "http://10.0.0.22:30000"]
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert args[args.index("--prometheus-port") + 1] == "29000"
    assert args[args.index("--health-check-interval-secs") + 1] == str(gateway.HEALTH_INTERVAL)
    assert args[-2:] == ["--log-level", "warn"]


@pytest.mark.parametrize("env,message", [
    ({}, "SGLANG_RVV_GATEWAY_WORKERS is empty"),
    ({"SGLANG_RVV_GATEWAY_WORKERS": "10.0.0.21:30000"}, "worker URL '10.0.0.21:30000' is not scheme://host:port"),
    ({"SGLANG_RVV_GATEWAY_WORKERS": "http://a:1/v1"}, "worker URL 'http://a:1/v1' is not scheme://host:port"),
    ({"SGLANG_RVV_GATEWAY_WORKERS": "http://a:1 http://a:1"}, "lists a worker twice"),
    ({"SGLANG_RVV_GATEWAY_WORKERS": "http://a:1", "SGLANG_RVV_GATEWAY_POLICY": "fastest"},
     "SGLANG_RVV_GATEWAY_POLICY='fastest': use one of cache_aware"),
    ({"SGLANG_RVV_GATEWAY_WORKERS": "http://a:1", "SGLANG_RVV_GATEWAY_PORT": "70000"},
     "SGLANG_RVV_GATEWAY_PORT='70000' is not a TCP port"),
])
def test_a_bad_configuration_is_refused_in_one_line_before_smg_starts(env, message):
    result = subprocess.run([sys.executable, GATEWAY_PY, "run"], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("gateway: error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1
