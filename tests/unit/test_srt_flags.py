"""The SGLang flags: parsing, the umbrella, overrides and refusals (no server needed)."""

import argparse

import pytest

from sglang_rvv.srt import flags


def _resolve(*argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default=None)
    parser.add_argument("--attention-backend", default=None)  # SGLang's own flags, as the plugin sees them
    parser.add_argument("--enable-torch-compile", action="store_true")
    flags.add_arguments(parser)
    return flags.resolve(parser.parse_args(list(argv)))


def test_off_by_default():
    settings = _resolve()
    assert not settings.active


def test_umbrella_turns_on_the_tested_values():
    settings = _resolve("--enable-cpu-rvv-inductor", "--device", "cpu")
    config = settings.config
    assert settings.active and settings.enabled_by == "--enable-cpu-rvv-inductor"
    assert (config.packed_weight_mode, config.regional_compile, config.small_batch) == ("explicit", True, True)
    assert config.memory_budget_mib is None


def test_sub_flags_override_the_umbrella():
    settings = _resolve("--enable-cpu-rvv-inductor", "--no-cpu-rvv-small-batch", "--cpu-compile-mode", "off",
                        "--cpu-rvv-memory-budget-mib", "512")
    config = settings.config
    assert (config.packed_weight_mode, config.regional_compile, config.small_batch) == ("explicit", False, False)
    assert config.memory_budget_mib == 512


def test_a_sub_flag_alone_enables_its_part():
    settings = _resolve("--cpu-rvv-packed-weight-mode", "explicit")
    assert settings.active and not settings.config.regional_compile and not settings.config.small_batch
    assert settings.enabled_by == "--cpu-rvv-packed-weight-mode"


@pytest.mark.parametrize("argv,needle", [
    (["--cpu-rvv-memory-budget-mib", "-1"], "argument --cpu-rvv-memory-budget-mib: '-1' must be >= 0"),
    (["--cpu-rvv-memory-budget-mib", "lots"], "'lots' is not a number of MiB"),
    (["--cpu-rvv-packed-weight-mode", "fast"], "argument --cpu-rvv-packed-weight-mode: invalid choice: 'fast'"),
    (["--cpu-compile-mode", "full"], "argument --cpu-compile-mode: invalid choice: 'full'"),
    (["--cpu-rvv-weight-dtype", "fp8"],
     "argument --cpu-rvv-weight-dtype: invalid choice: 'fp8' (choose from 'bf16', 'int8', 'int4', 'int4_a8')"),
    (["--cpu-rvv-lm-head-dtype", "int2"], "argument --cpu-rvv-lm-head-dtype: invalid choice: 'int2'"),
    (["--cpu-rvv-group-size", "-32"], "argument --cpu-rvv-group-size: '-32' is not a whole number"),
])
def test_bad_values_are_argparse_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _resolve(*argv)
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err


def test_gpu_device_is_refused():
    with pytest.raises(ValueError, match="argument --enable-cpu-rvv-inductor: .* got --device cuda"):
        _resolve("--enable-cpu-rvv-inductor", "--device", "cuda")


def test_weight_dtype_defaults_to_bf16_so_the_umbrella_contract_holds():
    config = _resolve("--enable-cpu-rvv-inductor").config
    assert (config.weight_dtype, config.group_size, config.lm_head_dtype) == ("bf16", None, None)


def test_the_quantized_knobs_reach_the_one_config():
    settings = _resolve("--enable-cpu-rvv-inductor", "--cpu-rvv-weight-dtype", "int4", "--cpu-rvv-group-size", "64",
                        "--cpu-rvv-lm-head-dtype", "int8")
    config = settings.config
    assert (config.weight_dtype, config.group_size, config.lm_head_dtype) == ("int4", 64, "int8")
    assert vars(settings).keys() == {"config", "report_path", "warmup", "enabled_by"}  # no field repeated
    assert config.lm_head_exact_candidates == 0
    config = _resolve("--enable-cpu-rvv-inductor", "--cpu-rvv-weight-dtype", "int4", "--cpu-rvv-lm-head-dtype",
                      "int4", "--cpu-rvv-lm-head-candidates", "8").config
    assert (config.lm_head_dtype, config.lm_head_exact_candidates) == ("int4", 8)


# The config's own sentence follows the flag's name (the config owns that check and its wording).
@pytest.mark.parametrize("argv,needle", [
    (["--enable-cpu-rvv-inductor", "--cpu-rvv-group-size", "32"], "argument --cpu-rvv-group-size: group_size=32"),
    (["--enable-cpu-rvv-inductor", "--cpu-rvv-weight-dtype", "int4", "--cpu-rvv-group-size", "0"],
     "argument --cpu-rvv-group-size: group_size=0"),
    (["--enable-cpu-rvv-inductor", "--cpu-rvv-weight-dtype", "int8", "--cpu-rvv-group-size", "48"],
     "argument --cpu-rvv-group-size: group_size=48"),
    (["--cpu-rvv-weight-dtype", "int8"], "argument --cpu-rvv-weight-dtype: quantized layouts are packed weights"),
    (["--enable-cpu-rvv-inductor", "--cpu-rvv-packed-weight-mode", "off", "--cpu-rvv-lm-head-dtype", "int8"],
     "argument --cpu-rvv-lm-head-dtype: quantized layouts are packed weights"),
    (["--enable-cpu-rvv-inductor", "--cpu-rvv-lm-head-candidates", "8"],
     "argument --cpu-rvv-lm-head-candidates: lm_head_exact_candidates=8 rescores a quantized lm_head"),
])
def test_bad_combinations_name_the_flag(argv, needle):
    with pytest.raises(ValueError) as error:
        _resolve(*argv)
    assert needle in str(error.value)


def test_sglang_cpu_graph_is_refused_with_a_backend_that_lacks_it():
    argv = ("--enable-cpu-rvv-inductor", "--device", "cpu", "--enable-torch-compile")
    with pytest.raises(ValueError) as error:
        _resolve(*argv, "--attention-backend", "torch_native")
    assert str(error.value).startswith("argument --enable-torch-compile: SGLang's CPU graph needs --attention-backend "
                                       "intel_amx, and with torch_native")
    assert "drop --enable-torch-compile" in str(error.value)
    assert _resolve(*argv, "--attention-backend", "intel_amx").active  # the backend that has it
    assert not _resolve("--device", "cpu", "--enable-torch-compile", "--attention-backend", "torch_native").active
