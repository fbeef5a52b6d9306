"""The container entrypoint and the prewarmed Inductor cache check, without a container."""

import json
import os

import pytest

from sglang_rvv import entrypoint, inductor_cache
from sglang_rvv.entrypoint import EXIT_USAGE, Refusal, plan
from sglang_rvv.host import usable_cpus


@pytest.fixture
def model_dir(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    (model / "model.safetensors").write_bytes(b"")
    (model / "tokenizer.json").write_text("{}")
    return model


@pytest.fixture
def environ(tmp_path, model_dir):
    return {
        "SGLANG_RVV_MODEL_DIR": str(model_dir),
        "HOME": str(tmp_path / "home"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "key"),
        "SGLANG_RVV_WARM_CACHE": str(tmp_path / "warm"),
    }


def _warm_dir(tmp_path, model_dir, **changes):
    warm = tmp_path / "warm"
    (warm / "fxgraph" / "ab").mkdir(parents=True)
    (warm / "fxgraph" / "ab" / "artifact").write_text("compiled")
    bf16 = inductor_cache.layout_of(entrypoint.policy_config({}))
    manifest = {**inductor_cache.running_stack(model_dir, bf16), "shape_keys": ["o_proj m=1 64x64 explicit_packed"]}
    manifest.update(changes)
    (warm / inductor_cache.MANIFEST).write_text(json.dumps(manifest))
    return warm


def test_serve_plan_without_a_warm_cache_is_cold_and_warms_up_at_load(environ, model_dir):
    result = plan([], environ)
    command = result.command
    assert command[1:3] == ["-m", "sglang.launch_server"]
    assert command[command.index("--model-path") + 1] == str(model_dir)
    assert "--enable-cpu-rvv-inductor" in command and "--no-cpu-rvv-warmup" not in command  # warm-up is on
    assert "--enable-metrics" in command  # the route counters on /metrics
    assert command[command.index("--port") + 1] == "30000"
    assert result.env[inductor_cache.STATE_ENV] == "artifact-cold"
    assert int(result.env["OMP_NUM_THREADS"]) == usable_cpus()
    # compose passes OMP_NUM_THREADS="" when the board sets no thread count: same as unset.
    assert int(plan([], {**environ, "OMP_NUM_THREADS": ""}).env["OMP_NUM_THREADS"]) == usable_cpus()
    assert any("no prewarmed cache" in note for note in result.notes)
    assert any("(LlamaForCausalLM)" in note for note in result.notes)


def test_sglangs_warm_up_and_health_wait_follow_the_containers_settings(environ):
    default = plan([], environ)
    assert "--skip-server-warmup" not in default.command
    assert "--watchdog-timeout" not in default.command  # SGLang's own 300 s
    assert "SGLANG_HEALTH_CHECK_TIMEOUT" not in default.env  # SGLang's 20 s is within a 5 s healthcheck's
    emulated = plan([], {**environ, "SGLANG_RVV_SERVER_WARMUP": "0", "SGLANG_RVV_HEALTH_TIMEOUT": "60",
                         "SGLANG_RVV_WATCHDOG_TIMEOUT": "1800"})
    assert "--skip-server-warmup" in emulated.command
    assert emulated.command[emulated.command.index("--watchdog-timeout") + 1] == "1800"
    assert emulated.env["SGLANG_HEALTH_CHECK_TIMEOUT"] == "59"
    # A caller's own SGLang setting wins.
    own = plan([], {**environ, "SGLANG_RVV_HEALTH_TIMEOUT": "60", "SGLANG_HEALTH_CHECK_TIMEOUT": "30"})
    assert own.env["SGLANG_HEALTH_CHECK_TIMEOUT"] == "30"


def test_policy_off_serves_without_the_flag(environ):
    command = plan([], {**environ, "SGLANG_RVV_POLICY": "off", "SGLANG_RVV_WARMUP": "0"}).command
    assert not any(arg.startswith(("--enable-cpu-rvv", "--no-cpu-rvv")) for arg in command), command
    assert "--enable-metrics" in command


def test_the_image_names_the_served_model_unless_the_caller_does(environ):
    result = plan([], {**environ, "SGLANG_RVV_MODEL_NAME": "My-Model"})
    command = result.command
    assert command[command.index("--served-model-name") + 1] == "My-Model"
    assert any(" as My-Model on " in note for note in result.notes)
    mine = plan(["--served-model-name", "other"], {**environ, "SGLANG_RVV_MODEL_NAME": "My-Model"}).command
    assert mine.count("--served-model-name") == 1 and mine[-1] == "other"
    assert "--served-model-name" not in plan([], environ).command


def test_options_are_appended_and_commands_run_instead(environ):
    assert plan(["--log-level", "debug"], environ).command[-2:] == ["--log-level", "debug"]
    assert plan(["bash", "-c", "true"], environ).command == ["bash", "-c", "true"]


def test_a_matching_warm_cache_is_seeded_and_warmed_up_at_load(tmp_path, environ, model_dir):
    _warm_dir(tmp_path, model_dir)
    result = plan([], {**environ, "OMP_NUM_THREADS": "3"})
    assert result.env[inductor_cache.STATE_ENV] == "artifact-warm"
    assert result.env["OMP_NUM_THREADS"] == "3"
    assert "--no-cpu-rvv-warmup" not in result.command
    assert (tmp_path / "cache" / "key" / "fxgraph" / "ab" / "artifact").read_text() == "compiled"
    assert any("artifact-warm" in note and "1 shape keys" in note for note in result.notes)
    assert "--no-cpu-rvv-warmup" in plan([], {**environ, "SGLANG_RVV_WARMUP": "0"}).command


@pytest.mark.parametrize("field", ["torch_version", "cpu_capability", "compiler", "model_config_sha256"])
def test_a_tampered_manifest_is_rejected_with_a_warning_and_nothing_is_copied(tmp_path, environ, model_dir, field):
    _warm_dir(tmp_path, model_dir, **{field: "tampered"})
    result = plan([], environ)
    assert result.env[inductor_cache.STATE_ENV] == "artifact-cold"
    warning = next(note for note in result.notes if note.startswith("warning:"))
    assert "rejected" in warning and f"{field}: cache 'tampered'" in warning
    assert not (tmp_path / "cache" / "key" / "fxgraph").exists()


def test_an_unreadable_manifest_is_rejected_not_fatal(tmp_path, environ, model_dir):
    warm = _warm_dir(tmp_path, model_dir)
    (warm / inductor_cache.MANIFEST).write_text("{not json")
    state = inductor_cache.check(warm, model_dir, inductor_cache.layout_of(entrypoint.policy_config({})))
    assert not state.warm and "unreadable" in state.reason
    assert plan([], environ).env[inductor_cache.STATE_ENV] == "artifact-cold"


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda env, model: env.update(SGLANG_RVV_MODEL_DIR=str(model.parent / "absent")), "does not exist"),
        (lambda env, model: (model / "config.json").write_text("{"), "not valid JSON"),
        (lambda env, model: (model / "config.json").write_text("{}"), "names no 'architectures'"),
        (lambda env, model: (model / "model.safetensors").unlink(), "no *.safetensors"),
        (lambda env, model: (model / "tokenizer.json").unlink(), "no tokenizer"),
        (lambda env, model: env.update(SGLANG_RVV_PORT="70000"), "not a TCP port"),
        (lambda env, model: env.update(SGLANG_RVV_MAX_TOTAL_TOKENS="0"), "positive number"),
        (lambda env, model: env.update(SGLANG_RVV_WARMUP="yes"), "SGLANG_RVV_WARMUP='yes' must be 1"),
        (lambda env, model: env.update(SGLANG_RVV_POLICY="1"), "SGLANG_RVV_POLICY='1' must be on"),
        (lambda env, model: env.update(SGLANG_RVV_SERVER_WARMUP="no"), "SGLANG_RVV_SERVER_WARMUP='no' must be 1"),
        (lambda env, model: env.update(SGLANG_RVV_HEALTH_TIMEOUT="soon"), "SGLANG_RVV_HEALTH_TIMEOUT='soon' must be"),
        (lambda env, model: env.update(SGLANG_RVV_WATCHDOG_TIMEOUT="-1"),
         "SGLANG_RVV_WATCHDOG_TIMEOUT='-1' must be a positive whole number"),
        (lambda env, model: env.update(OMP_NUM_THREADS="all"), "positive thread count"),
        (lambda env, model: env.update(SGLANG_RVV_WEIGHT_DTYPE="fp8"),
         "SGLANG_RVV_WEIGHT_DTYPE='fp8' must be one of bf16, int8, int4"),
        (lambda env, model: env.update(SGLANG_RVV_LM_HEAD_DTYPE="int2"), "SGLANG_RVV_LM_HEAD_DTYPE='int2' must be"),
        (lambda env, model: env.update(SGLANG_RVV_GROUP_SIZE="big"), "SGLANG_RVV_GROUP_SIZE='big' must be a whole"),
        (lambda env, model: env.update(SGLANG_RVV_WEIGHT_DTYPE="int4", SGLANG_RVV_GROUP_SIZE="48"),
         "SGLANG_RVV_GROUP_SIZE with SGLANG_RVV_WEIGHT_DTYPE: "),
        (lambda env, model: env.update(SGLANG_RVV_POLICY="off", SGLANG_RVV_WEIGHT_DTYPE="int8"),
         "unset them with SGLANG_RVV_POLICY=off"),
    ],
)
def test_refusals_are_one_clear_line_and_exit_64(environ, model_dir, monkeypatch, capsys, change, message):
    change(environ, model_dir)
    with pytest.raises(Refusal, match=message.replace("*", r"\*")):
        plan([], environ)
    monkeypatch.setattr(os, "environ", environ)
    assert entrypoint.main([]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sglang-rvv entrypoint: error:") and message in err[0]


def test_an_unwritable_cache_dir_is_refused(tmp_path, environ):
    (tmp_path / "cache").write_text("a file where a directory should be")
    with pytest.raises(Refusal, match="cannot create .*mount a volume"):
        plan([], environ)



def test_the_image_stack_settings_reach_sglang(tmp_path, environ, monkeypatch):
    """riscv64's lock sets USE_LIBUV=0 (Debian's torch has no libuv) and --grammar-backend none;
    a value the caller set wins over the lock's."""
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"sglang_env": {"USE_LIBUV": "0", "SGLANG_X": "lock"},
                                "sglang_args": ["--grammar-backend", "none"]}))
    monkeypatch.setattr(entrypoint, "IMAGE_LOCK", lock)
    result = entrypoint.plan([], {**environ, "SGLANG_X": "caller"})
    assert result.env["USE_LIBUV"] == "0" and result.env["SGLANG_X"] == "caller"
    args = result.command
    assert args[args.index("--grammar-backend") + 1] == "none"
    assert any(note.startswith("stack settings: USE_LIBUV=0 SGLANG_X=caller --grammar-backend none")
               for note in result.notes), result.notes
    monkeypatch.setattr(entrypoint, "IMAGE_LOCK", tmp_path / "absent.json")
    assert entrypoint.stack_settings() == ({}, [])


def test_the_layout_variables_become_the_flags(environ):
    command = plan([], environ).command
    assert command[command.index("--cpu-rvv-weight-dtype") + 1] == "bf16"  # the default, said out loud
    assert "--cpu-rvv-group-size" not in command and "--cpu-rvv-lm-head-dtype" not in command
    # compose passes an unset variable as "": the default, not a refusal.
    assert plan([], {**environ, "SGLANG_RVV_WEIGHT_DTYPE": "", "SGLANG_RVV_GROUP_SIZE": ""}).command == command
    command = plan([], {**environ, "SGLANG_RVV_WEIGHT_DTYPE": "int4", "SGLANG_RVV_GROUP_SIZE": "64",
                        "SGLANG_RVV_LM_HEAD_DTYPE": "int8"}).command
    assert command[command.index("--cpu-rvv-weight-dtype") + 1] == "int4"
    assert command[command.index("--cpu-rvv-group-size") + 1] == "64"
    assert command[command.index("--cpu-rvv-lm-head-dtype") + 1] == "int8"


def test_the_flags_the_entrypoint_writes_parse_back_to_its_config():
    import argparse

    from sglang_rvv.srt import flags

    config = entrypoint.policy_config({"SGLANG_RVV_WEIGHT_DTYPE": "int8", "SGLANG_RVV_GROUP_SIZE": "128"})
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser)
    parsed = flags.resolve(parser.parse_args(["--enable-cpu-rvv-inductor", *flags.layout_flags(config)])).config
    assert inductor_cache.layout_of(parsed) == inductor_cache.layout_of(config) == {
        "weight_dtype": "int8", "group_size": 128, "lm_head_dtype": None}


def test_a_cache_warmed_for_another_layout_is_ignored_naming_why(tmp_path, environ, model_dir):
    _warm_dir(tmp_path, model_dir)  # warmed for bf16
    result = plan([], {**environ, "SGLANG_RVV_WEIGHT_DTYPE": "int8"})
    assert result.env[inductor_cache.STATE_ENV] == "artifact-cold"
    warning = next(note for note in result.notes if note.startswith("warning:"))
    assert "weight_dtype: cache 'bf16', running 'int8'" in warning
    assert not (tmp_path / "cache" / "key" / "fxgraph").exists()  # nothing of it was copied
    assert plan([], environ).env[inductor_cache.STATE_ENV] == "artifact-warm"  # the layout it was warmed for


def test_a_manifest_without_the_layout_is_rejected(tmp_path, environ, model_dir):
    warm = _warm_dir(tmp_path, model_dir)
    manifest = json.loads((warm / inductor_cache.MANIFEST).read_text())
    for name in inductor_cache.LAYOUT_FIELDS:
        del manifest[name]
    (warm / inductor_cache.MANIFEST).write_text(json.dumps({**manifest, "schema": 1}))
    state = inductor_cache.check(warm, model_dir, inductor_cache.layout_of(entrypoint.policy_config({})))
    assert not state.warm and "schema: cache 1, running 2" in state.reason
    assert "weight_dtype: cache None, running 'bf16'" in state.reason
