"""The torch-only policy smoke (``python -m sglang_rvv.smoke``) on generated checkpoints."""

import copy
import json
import platform
import subprocess
import sys

import pytest
import torch

from sglang_rvv import PolicyReport, RvvPolicyConfig, install_rvv_policy, layout
from sglang_rvv.adapters import hf_named_adapter
from sglang_rvv.checkpoint import write_tiny_checkpoint
from sglang_rvv.packed_state import BUFFER
from sglang_rvv.policy import policy_of
from sglang_rvv.smoke import cli, decoder, reader
from sglang_rvv.smoke.comparison import DECODE_STEPS, FLOORS, MIN_SQNR_DB, PROMPTS, compare

# Importing any of these fails in the smoke's subprocess: it must need torch alone.
BLOCKED = ("transformers", "safetensors", "sglang", "tokenizers")


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def checkpoint(request, tmp_path_factory):
    """A tiny generated checkpoint: Llama (untied lm_head) or Qwen3 (tied, q/k norms)."""
    directory = tmp_path_factory.mktemp("smoke") / request.param
    write_tiny_checkpoint(directory, request.param, seed=0)
    return directory


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    code = (
        "import sys\n"
        f"for name in {BLOCKED!r}: sys.modules[name] = None\n"
        "from sglang_rvv.smoke.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)


def test_cli_passes_without_transformers(checkpoint):
    proc = _run_cli(str(checkpoint), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["passed"] and not result["failures"]
    assert result["machine"] == platform.machine() and result["torch"] == torch.__version__
    assert result["tied_lm_head"] is (checkpoint.name == "qwen3")
    assert result["policy"]["adapter"] == "hf_named"
    assert len(result["policy"]["packed"]) == 11 and len(result["policy"]["skipped"]) == 4  # k/v: N=256
    assert set(result["routes"]["packed_eager"]) == {"1", "4", "8", "16"}  # decode, batch 3, prefill 5 and 15
    comparison = result["comparison"]
    # A pick may differ only at a near tie (the smoke's own rule, which `passed` applied): bf16
    # rounding that differs between F.linear and the packed kernel can swap two near-equal logits.
    assert comparison["picks"] == 4 * (DECODE_STEPS + 1)
    assert comparison["equal_picks"] + len(comparison["near_ties"]) == comparison["picks"]
    # strict JSON: bit-identical logits (the eager generic kernel on x86) give the string "inf"
    assert all(db == "inf" or db >= MIN_SQNR_DB for db in comparison["prefill_sqnr_db"].values())


def test_cli_text_report(checkpoint):
    proc = _run_cli(str(checkpoint))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = proc.stdout
    assert report.startswith("sglang_rvv smoke: PASSED")
    assert f"machine {platform.machine()}" in report and f"torch {torch.__version__}" in report
    assert "provider generic" in report and "packed 11" in report and "packed_eager" in report


def test_decoder_is_transformers_bit_for_bit(checkpoint):
    transformers = pytest.importorskip("transformers")
    ours = decoder.load_model(checkpoint)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).eval()
    ids = torch.tensor(PROMPTS)
    cache = decoder.KVCache(ours.config.num_hidden_layers)
    with torch.no_grad():
        prefill = ours(ids, cache)
        step = prefill[:, -1].argmax(-1, keepdim=True)
        decode = ours(step, cache)
        out = theirs(ids, use_cache=True)
        their_decode = theirs(step, past_key_values=out.past_key_values).logits
    assert torch.equal(prefill, out.logits)
    assert torch.equal(decode, their_decode)
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) is (checkpoint.name == "qwen3")


def test_reader_matches_safetensors(checkpoint):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    theirs = safetensors_torch.load_file(checkpoint / "model.safetensors")
    ours = reader.read_safetensors(checkpoint / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name


def test_corrupted_packed_buffer_fails(checkpoint):
    reference = decoder.load_model(checkpoint)
    candidate = copy.deepcopy(reference)
    report = install_rvv_policy(candidate, RvvPolicyConfig(regional_compile=False), adapter=hf_named_adapter())
    assert "lm_head" in report.packed
    # The weight is untouched, so the recorded source still matches: the stale buffer is used.
    candidate.lm_head._buffers[BUFFER].neg_()

    result = compare(reference, candidate)

    assert not result.passed
    assert any(f.startswith("prefill batch 1: logits SQNR") for f in result.failures), result.failures
    assert any("row-major logit gap" in f for f in result.failures), result.failures
    assert policy_of(candidate).counters[("lm_head", "packed_eager", "1")] > 0


def test_policy_failures_need_the_packed_route():
    report = PolicyReport(adapter="hf_named", packed=["lm_head"])
    assert cli.policy_failures(report, {"packed_eager": {"1": 3, "4": 1}}, regional_compile=False) == []
    (failure,) = cli.policy_failures(report, {"packed_eager": {"1": 3}}, regional_compile=False)
    assert "route packed_eager was not taken with bucket(s) 4" in failure
    (failure,) = cli.policy_failures(report, {"packed_eager": {"1": 3, "4": 1}}, regional_compile=True)
    assert "packed_compiled" in failure
    (failure,) = cli.policy_failures(PolicyReport(adapter=None, reason="why"), {}, False)
    assert failure == "the policy was not installed: why"


def test_with_the_rvv_provider_a_compiled_smoke_expects_the_eager_route(monkeypatch):
    """--compile with the rvv provider: its packed calls are native ops, never compiled."""
    monkeypatch.setattr(cli, "compile_packed", lambda: False)
    report = PolicyReport(adapter="hf_named", packed=["lm_head"])
    assert cli.policy_failures(report, {"packed_eager": {"1": 3, "4": 1}}, regional_compile=True) == []


def test_unsupported_model_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral"}))
    assert cli.main([str(tmp_path)]) == 2
    assert "model_type 'mistral' is not one of" in capsys.readouterr().err
    assert cli.main([str(tmp_path / "missing")]) == 2


def test_hf_named_adapter_install_api(checkpoint):
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    report = install_rvv_policy(plain, adapter=hf_named_adapter())
    assert report.adapter is None and report.reason.startswith("adapter 'hf_named' does not fit Sequential")

    model = decoder.load_model(checkpoint)
    assert install_rvv_policy(model, RvvPolicyConfig(regional_compile=False)).adapter is None  # no class match
    config = RvvPolicyConfig(regional_compile=False)
    assert install_rvv_policy(model, config, adapter=hf_named_adapter()).adapter == "hf_named"
    assert install_rvv_policy(model, config, adapter=hf_named_adapter()).adapter == "hf_named"  # equal adapters
    assert install_rvv_policy(model, config).adapter == "hf_named"  # a re-install keeps the adapter
    with pytest.raises(ValueError, match="cannot switch to 'other'"):
        install_rvv_policy(model, config, adapter=hf_named_adapter("other"))


def _dequantized_twin(model: torch.nn.Module, weight_dtype: str, group_size: int) -> torch.nn.Module:
    """``model`` with every projection the policy would pack (both sides >= 1024) replaced by its
    dequantized quantization: the weights a quantized kernel computes with."""
    twin = copy.deepcopy(model)
    quant = layout.QUANTIZED[weight_dtype]
    for module in twin.modules():
        if isinstance(module, torch.nn.Linear) and min(module.weight.shape) >= 1024:
            qweight, scales = layout.quantize_reference(module.weight.data, quant, group_size)
            module.weight.data.copy_(layout.dequantize_reference(qweight, scales, quant, *module.weight.shape))
    return twin


@pytest.mark.parametrize("weight_dtype,group_size", [("int8", 0), ("int4", 128)])
def test_each_quantized_floor_holds_its_layout_and_is_below_bf16s(checkpoint, weight_dtype, group_size):
    # The coarsest group size of each layout (the floors were measured on these checkpoints).
    reference = decoder.load_model(checkpoint)
    twin = _dequantized_twin(reference, weight_dtype, group_size)
    result = compare(reference, twin, floor=FLOORS[weight_dtype])
    assert result.passed, result.failures
    # bf16's floor would call the quantization error a bug: the floors are not interchangeable.
    assert min(*result.prefill_sqnr_db.values(), *result.decode_min_sqnr_db.values()) < MIN_SQNR_DB


def test_a_quantized_smoke_whose_layout_nobody_took_fails_naming_it():
    report = PolicyReport(adapter="hf_named", packed=["lm_head"], skipped={"o_proj": "why"})
    routes = {"packed_eager": {"1": 3, "4": 1}}
    assert cli.policy_failures(report, routes, False, "bf16") == []
    (failure,) = cli.policy_failures(report, routes, False, "int8")
    assert failure.startswith("no projection took the int8 layout") and "--weight-dtype int8" in failure


def test_a_group_size_the_layout_lacks_is_a_usage_error(checkpoint, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([str(checkpoint), "--weight-dtype", "int4", "--group-size", "48"])
    assert exit_info.value.code == 2
    assert "argument --group-size: group_size=48" in capsys.readouterr().err
