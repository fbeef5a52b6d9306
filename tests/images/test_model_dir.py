"""A user's own checkpoint directory: `make image MODEL_DIR=DIR` / `make up MODEL_DIR=DIR`.

A generated checkpoint in a temporary directory (its own seed, so not the lock's weights) is
built into a model image and served by compose; the official openai client asks for
completions and chat (streamed and not) by the directory's name; bad requests get a 4xx
and the service keeps answering. A changed file gives a new image tag, and each bad
directory is refused in one line with no image and no staged copy left behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from image_support import HOST_ARCH, REPO, compose_report, free_port, lock_get, run, scrape, user_checkpoint

from sglang_rvv import layout

CHECKPOINT = REPO / "images" / "scripts" / "checkpoint.py"
NAME = "My-Tiny-Model"  # served as-is; tagged as my-tiny-model-<digest12>


def _key(directory: Path) -> str:
    return subprocess.run([sys.executable, CHECKPOINT, "name", directory], check=True, capture_output=True,
                          text=True).stdout.strip()


def _image(key: str) -> str:
    return f"localhost/sglang-rvv:{lock_get('app.version')}-{key}-{HOST_ARCH}"


def _image_exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image]).returncode == 0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return user_checkpoint(tmp_path_factory.mktemp("user") / NAME, seed=7)


@pytest.fixture(scope="module")
def served(amd64_images, checkpoint, build_logs):
    """make up MODEL_DIR=... on a free port; make down afterwards."""
    port = free_port()
    try:
        run(["make", "up", f"MODEL_DIR={checkpoint}", f"PORT={port}"], timeout=900, log=build_logs / "make-up-dir.log")
        yield port
    finally:
        run(["make", "down"], timeout=300)


def _post(port: int, path: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_image_is_named_and_labelled_by_the_directory_content(served, checkpoint):
    labels = json.loads(subprocess.run(["podman", "image", "inspect", "--format", "{{json .Labels}}",
                                        _image(_key(checkpoint))], check=True, capture_output=True,
                                       text=True).stdout)
    sha256 = json.loads(labels["io.sglang-rvv.model-sha256"])
    assert sorted(sha256) == sorted(p.name for p in checkpoint.iterdir())
    assert labels["io.sglang-rvv.model-name"] == NAME
    assert labels["io.sglang-rvv.model-revision"] == f"dir:{_key(checkpoint)[-12:]}"


def test_the_openai_client_gets_completions_and_chat_by_the_directory_name(served):
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{served}/v1", api_key="none", timeout=120, max_retries=0)
    assert [m.id for m in client.models.list().data] == [NAME]
    completion = client.completions.create(model=NAME, prompt="Hello", max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert completion.usage.completion_tokens == 8 and completion.choices[0].text
    messages = [{"role": "user", "content": "Hello"}]
    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 8 and chat.choices[0].message.role == "assistant"
    streamed = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0,
                                              stream=True, extra_body={"ignore_eos": True})
    pieces = [chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices]
    # Greedy: the streamed answer is the same text, in more than one piece.
    assert "".join(pieces) == chat.choices[0].message.content and len([p for p in pieces if p]) > 1


def _predicted_packed_bytes(config: dict) -> int:
    """Packed bytes of a Llama whose every projection passes the gate, as SGLang builds it: q/k/v
    and gate/up fused, and the lm_head's rows padded to a multiple of 64 (its vocab padding)."""
    hidden, inter, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    qkv = (heads + 2 * config["num_key_value_heads"]) * head_dim
    per_layer = [(qkv, hidden), (heads * head_dim, hidden), (2 * inter, hidden), (hidden, inter)]
    shapes = per_layer * config["num_hidden_layers"] + [(-(-config["vocab_size"] // 64) * 64, hidden)]
    return sum(layout.packed_bytes(n, k) for n, k in shapes)


def test_metrics_show_the_fast_path_where_the_appliance_runs(served, checkpoint):
    def linear_calls(samples):
        return sum(v for k, v in samples.items() if k.startswith("sglang_rvv_linear_calls_total{"))

    before = scrape(served)
    status, _ = _post(served, "/v1/completions", json.dumps({"model": NAME, "prompt": "Hello", "max_tokens": 4,
                                                             "ignore_eos": True}).encode())
    assert status == 200
    after = scrape(served)
    assert linear_calls(after) > linear_calls(before)  # the policy saw this request's Linear calls
    # The gauge is the policy's packed bytes: every eligible projection of the tiny Llama (SGLang
    # fuses q/k/v and gate/up), the same figure the report gives.
    report = compose_report(HOST_ARCH)
    config = json.loads((checkpoint / "config.json").read_text())
    assert after["sglang_rvv_packed_bytes"] == report["packed_bytes"] == _predicted_packed_bytes(config)
    assert after['sglang_rvv_info{cache_state="artifact-cold",provider="generic"}'] == 1.0  # cold image, x86
    assert any(k.startswith("sglang:prompt_tokens_total") for k in after)  # SGLang's own metrics too


@pytest.mark.parametrize("what,body,message", [
    ("malformed JSON", b'{"prompt": "Hello", "max_tokens": ', ""),
    ("an unknown model", json.dumps({"model": "no-such-model", "prompt": "Hello", "max_tokens": 4}).encode(),
     "The model 'no-such-model' does not exist"),
    ("a prompt longer than the context", json.dumps({"model": NAME, "prompt": "Hello " * 3000,
                                                      "max_tokens": 4}).encode(), "context"),
    ("max_tokens beyond the context", json.dumps({"model": NAME, "prompt": "Hello",
                                                   "max_tokens": 100000}).encode(), ""),
])
def test_bad_requests_get_a_4xx_with_a_message_and_the_service_keeps_answering(served, what, body, message):
    status, text = _post(served, "/v1/completions", body)
    assert 400 <= status < 500, f"{what}: HTTP {status}: {text[:300]}"
    assert message.lower() in text.lower() and len(text) > 20, f"{what}: {text[:300]}"
    status, text = _post(served, "/v1/completions", json.dumps({"model": NAME, "prompt": "Hello",
                                                                "max_tokens": 4}).encode())
    assert status == 200 and json.loads(text)["usage"]["completion_tokens"] > 0


def test_a_changed_file_builds_a_new_image_and_keeps_the_old(served, checkpoint, tmp_path, build_logs):
    changed = tmp_path / NAME
    shutil.copytree(checkpoint, changed)
    config = json.loads((changed / "generation_config.json").read_text())
    (changed / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.5}))
    old, new = _key(checkpoint), _key(changed)
    assert old != new and old.rsplit("-", 1)[0] == new.rsplit("-", 1)[0] == NAME.lower()
    run(["make", "image", f"MODEL_DIR={changed}"], timeout=900, log=build_logs / "make-image-changed-dir.log")
    assert _image_exists(_image(new)) and _image_exists(_image(old))
    again = run(["make", "image", f"MODEL_DIR={changed}"], timeout=900)
    assert f"{_image(new)} is up to date" in again.stdout + again.stderr
    subprocess.run(["podman", "rmi", _image(new)], capture_output=True)


def _no_config(d: Path) -> None:
    (d / "config.json").unlink()


def _truncated(d: Path) -> None:
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate((d / "model.safetensors").stat().st_size - 4096)


def _no_tokenizer(d: Path) -> None:
    (d / "tokenizer.json").unlink()


def _unknown_dtype(d: Path) -> None:
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "dtype": "int4"}))


@pytest.mark.parametrize("spoil,message", [
    (_no_config, "config.json: missing (a Hugging Face checkpoint has a config.json)"),
    (_truncated, "model.safetensors: truncated: tensor"),
    (_no_tokenizer, ": no tokenizer (tokenizer.json or tokenizer.model or vocab.json+merges.txt)"),
    (_unknown_dtype, "config.json: dtype 'int4' cannot be served as BF16"),
])
def test_a_bad_directory_is_refused_in_one_line_and_nothing_is_built(checkpoint, tmp_path, spoil, message):
    bad = tmp_path / "bad-model"
    shutil.copytree(checkpoint, bad)
    spoil(bad)
    before = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"], check=True,
                            capture_output=True, text=True).stdout.split()
    result = subprocess.run(["make", "image", f"MODEL_DIR={bad}"], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode != 0
    refusals = [line for line in result.stderr.splitlines() if line.startswith("checkpoint: refused: ")]
    assert len(refusals) == 1 and message in refusals[0], result.stderr[-2000:]
    assert str(bad) in refusals[0]
    after = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"], check=True,
                           capture_output=True, text=True).stdout.split()
    assert sorted(after) == sorted(before)
    assert not list((REPO / ".cache" / "images").glob("model-context-bad-model-*"))
