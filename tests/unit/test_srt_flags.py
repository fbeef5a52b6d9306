"""The SGLang flags: parsing, the umbrella, overrides and refusals (no server needed)."""

import argparse

import pytest

from sglang_rvv.srt import flags


def _resolve(*argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default=None)
    flags.add_arguments(parser)
    return flags.resolve(parser.parse_args(list(argv)))


def test_off_by_default():
    settings = _resolve()
    assert not settings.active


def test_umbrella_turns_on_the_tested_values():
    settings = _resolve("--enable-cpu-rvv-inductor", "--device", "cpu")
    config = settings.policy_config()
    assert settings.active and settings.enabled_by == "--enable-cpu-rvv-inductor"
    assert (config.packed_weight_mode, config.regional_compile, config.small_batch) == ("explicit", True, True)
    assert config.memory_budget_mib is None


def test_sub_flags_override_the_umbrella():
    settings = _resolve("--enable-cpu-rvv-inductor", "--no-cpu-rvv-small-batch", "--cpu-compile-mode", "off",
                        "--cpu-rvv-memory-budget-mib", "512")
    config = settings.policy_config()
    assert (config.packed_weight_mode, config.regional_compile, config.small_batch) == ("explicit", False, False)
    assert config.memory_budget_mib == 512


def test_a_sub_flag_alone_enables_its_part():
    settings = _resolve("--cpu-rvv-packed-weight-mode", "explicit")
    assert settings.active and settings.compile_mode == "off" and not settings.small_batch
    assert settings.enabled_by == "--cpu-rvv-packed-weight-mode"


@pytest.mark.parametrize("argv,needle", [
    (["--cpu-rvv-memory-budget-mib", "-1"], "argument --cpu-rvv-memory-budget-mib: '-1' must be >= 0"),
    (["--cpu-rvv-memory-budget-mib", "lots"], "'lots' is not a number of MiB"),
    (["--cpu-rvv-packed-weight-mode", "fast"], "argument --cpu-rvv-packed-weight-mode: invalid choice: 'fast'"),
    (["--cpu-compile-mode", "full"], "argument --cpu-compile-mode: invalid choice: 'full'"),
])
def test_bad_values_are_argparse_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _resolve(*argv)
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err


def test_gpu_device_is_refused():
    with pytest.raises(ValueError, match="argument --enable-cpu-rvv-inductor: .* got --device cuda"):
        _resolve("--enable-cpu-rvv-inductor", "--device", "cuda")
