"""``make up WEIGHT_DTYPE=...`` reaches the container: make's environment for compose.sh,
the compose file podman-compose renders with it, and the entrypoint's flags from that
(no image is built or started)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from image_support import REPO

from sglang_rvv.entrypoint import plan

PODMAN_COMPOSE = Path(sys.executable).with_name("podman-compose")


def _make_up_env(*assignments: str) -> dict[str, str]:
    """The variables ``make up`` passes to compose.sh (read from make's dry run)."""
    out = subprocess.run(["make", "-n", "up", *assignments], cwd=REPO, capture_output=True, text=True, check=True)
    line = next(line for line in out.stdout.splitlines() if "compose.sh up" in line)
    words = shlex.split(line)
    return dict(word.split("=", 1) for word in words[:words.index(next(w for w in words if "=" not in w))])


def _rendered_environment(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([str(PODMAN_COMPOSE), "-f", str(REPO / "compose" / "compose.yaml"), "config"],
                         cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=120)
    return {key: str(value) for key, value in yaml.safe_load(out.stdout)["services"]["sglang"]["environment"].items()}


@pytest.fixture
def container_env(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (model / "model.safetensors").write_bytes(b"")
    (model / "tokenizer.json").write_text("{}")
    return {"SGLANG_RVV_MODEL_DIR": str(model), "HOME": str(tmp_path / "home"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"), "SGLANG_RVV_WARM_CACHE": str(tmp_path / "warm")}


@pytest.mark.parametrize("assignments,flags", [
    ((), ["--cpu-rvv-weight-dtype", "bf16"]),
    (("WEIGHT_DTYPE=int8",), ["--cpu-rvv-weight-dtype", "int8"]),
    (("WEIGHT_DTYPE=int4", "GROUP_SIZE=64", "LM_HEAD_DTYPE=int8"),
     ["--cpu-rvv-weight-dtype", "int4", "--cpu-rvv-group-size", "64", "--cpu-rvv-lm-head-dtype", "int8"]),
])
def test_make_up_weight_dtype_reaches_the_servers_flags(assignments, flags, container_env):
    rendered = _rendered_environment(_make_up_env(*assignments))
    command = plan([], {**container_env, **rendered}).command
    start = command.index("--cpu-rvv-weight-dtype")
    assert command[start:start + len(flags)] == flags
