"""The peer's model files: GGUF files of the board model's shapes, from the very seeded random BF16
weights the appliance's counts run (``tiny.build_model(arch, seed, **shape)``), quantized by the
host's ``llama-quantize`` (peer/build.sh host) to any type it knows.

A BF16 GGUF is written once per shape, then each format from it; every file is written beside its
place and renamed into it, with a ``.json`` of its inputs, so a file whose inputs differ is made
again and a cut-short one is never taken. The tokenizer is ``no_vocab`` (llama.cpp's dummy tokens,
``ARCH.vocab_size`` of them): the counts feed token ids, as the appliance's guest does.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from . import peer_build
from .tool import ToolError

WRITER_VERSION = 1  # bump when the tensors or metadata written here change
# The architectures written here (llama.cpp names them as transformers does), with their RMSNorm eps.
_RMS_EPS = {"llama": 1e-5, "qwen2": 1e-6, "qwen3": 1e-6}
# HF parameter name (under model.layers.N.) -> GGUF tensor name (under blk.N.), as llama.cpp's
# convert_hf_to_gguf.py names them.
_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_TOP_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}


def gguf_dir() -> Path:
    return peer_build.peer_dir() / "gguf"


def _llama_permute(weight, heads: int):
    """llama.cpp's rotary pairs are adjacent, HF Llama's are half a head apart: the converter
    reorders q and k rows (convert_hf_to_gguf.py LlamaModel.permute)."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _rope_theta(config) -> float:
    # transformers 5 keeps it in rope_parameters; a config given rope_theta keeps it there too.
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta") or config.rope_theta)


def gguf_name(hf_name: str) -> str | None:
    if hf_name in _TOP_TENSORS:
        return _TOP_TENSORS[hf_name]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    if match and match.group(2) in _LAYER_TENSORS:
        return f"blk.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}"
    return None


# The unquantized types, written here from the seeded BF16 weights (F16 rounds each to nearest
# even, as llama-quantize does); every other type is llama-quantize's, from the BF16 file.
WRITTEN = {"BF16": "MOSTLY_BF16", "F16": "MOSTLY_F16"}


def write_float(shape: dict, seed: int, fmt: str, out: Path) -> None:
    """The seeded model of ``shape`` as a GGUF of ``fmt`` (BF16 or F16; norms in F32, as the
    converter writes them)."""
    import gguf
    import numpy as np
    import torch

    from .. import tiny

    arch = shape["arch"]
    if arch not in _RMS_EPS:
        raise ToolError(f"no GGUF writer for architecture {arch!r}: choose a shape of {sorted(_RMS_EPS)}")
    overrides = {k: v for k, v in shape.items() if k != "arch"}
    model = tiny.build_model(arch, seed=seed, **overrides)
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(f"sglang-rvv peer {arch} seed {seed}")
    writer.add_context_length(shape["max_position_embeddings"])
    writer.add_embedding_length(shape["hidden_size"])
    writer.add_feed_forward_length(shape["intermediate_size"])
    writer.add_block_count(shape["num_hidden_layers"])
    writer.add_head_count(shape["num_attention_heads"])
    writer.add_head_count_kv(shape["num_key_value_heads"])
    writer.add_key_length(shape["head_dim"])
    writer.add_value_length(shape["head_dim"])
    writer.add_rope_dimension_count(shape["head_dim"])
    writer.add_rope_freq_base(_rope_theta(model.config))
    writer.add_layer_norm_rms_eps(_RMS_EPS[arch])
    writer.add_vocab_size(shape["vocab_size"])
    writer.add_file_type(getattr(gguf.LlamaFileType, WRITTEN[fmt]))
    writer.add_tokenizer_model("no_vocab")
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    tied = model.config.tie_word_embeddings
    for name, param in model.state_dict().items():
        target = gguf_name(name)
        if target is None:
            raise ToolError(f"{arch}: no GGUF name for the parameter {name}")
        if tied and target == "output.weight":
            continue
        value = param.detach()
        if arch == "llama" and target.endswith(("attn_q.weight", "attn_k.weight")):
            value = _llama_permute(value, heads if target.endswith("attn_q.weight") else kv_heads)
        if value.dim() == 1 or target.endswith(".bias"):
            writer.add_tensor(target, value.float().numpy())
        elif fmt == "F16":
            writer.add_tensor(target, value.to(torch.float16).numpy())
        else:
            bits = value.contiguous().view(torch.int16).numpy().view(np.uint16)
            writer.add_tensor(target, bits, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize_types(host: Path) -> set[str]:
    """The types the host llama-quantize knows, read from its own usage text."""
    result = subprocess.run([str(host / "bin" / "llama-quantize"), "--help"], capture_output=True, text=True)
    types = set(re.findall(r"^\s+\d+\s+or\s+(\S+)\s+:", result.stdout + result.stderr, re.M))
    if not types:
        raise ToolError(f"{host}/bin/llama-quantize printed no list of types: rebuild it (peer/build.sh host)")
    return types


def _inputs(shape_name: str, shape: dict, seed: int, fmt: str, host_json: dict | None) -> dict:
    import torch

    inputs = {"shape_name": shape_name, "shape": shape, "seed": seed, "format": fmt, "torch": torch.__version__,
              "writer": WRITER_VERSION}
    if host_json is not None:
        inputs["llama_quantize"] = {k: host_json[k] for k in ("sdist_sha256", "compiler_version")}
    return inputs


def _fresh(path: Path, inputs: dict) -> bool:
    sidecar = path.with_suffix(".json")
    return path.is_file() and sidecar.is_file() and json.loads(sidecar.read_text()) == inputs


def _publish(tmp: Path, path: Path, inputs: dict) -> None:
    path.with_suffix(".json").unlink(missing_ok=True)
    tmp.replace(path)
    path.with_suffix(".json").write_text(json.dumps(inputs, indent=1, sort_keys=True) + "\n")


def model_file(shape_name: str, shape: dict, fmt: str, seed: int = 0, log=None) -> Path:
    """The GGUF file of ``shape`` in ``fmt`` (a llama-quantize type, or BF16 or F16), made if
    missing. BF16 and F16 need no llama-quantize (make test's peer count runs F16)."""
    log = log or (lambda text: print(f"peer: {text}", file=sys.stderr, flush=True))
    out = gguf_dir()
    out.mkdir(parents=True, exist_ok=True)
    # An unquantized type is written here; any other is quantized from the BF16 file.
    written = fmt.upper() if fmt.upper() in WRITTEN else "BF16"
    source = out / f"{shape_name}-{written}.gguf"
    source_inputs = _inputs(shape_name, shape, seed, written, None)
    if not _fresh(source, source_inputs):
        log(f"writing {source.name} (seed {seed}, {written})")
        tmp = source.with_suffix(".gguf.tmp")
        write_float(shape, seed, written, tmp)
        _publish(tmp, source, source_inputs)
    if fmt.upper() in WRITTEN:
        return source
    bf16 = source
    host = peer_build.require("host")
    known = quantize_types(host.path)
    if fmt not in known:
        raise ToolError(f"unknown format {fmt!r}: llama-quantize knows {', '.join(sorted(known))}")
    path = out / f"{shape_name}-{fmt}.gguf"
    inputs = _inputs(shape_name, shape, seed, fmt, host.manifest)
    if not _fresh(path, inputs):
        log(f"llama-quantize {bf16.name} -> {path.name}")
        tmp = path.with_suffix(".gguf.tmp")
        result = subprocess.run([str(host.path / "bin" / "llama-quantize"), str(bf16), str(tmp), fmt],
                                capture_output=True, text=True)
        if result.returncode or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise ToolError(f"llama-quantize {bf16.name} to {fmt} failed (exit {result.returncode}): {last}")
        _publish(tmp, path, inputs)
    return path


def bytes_per_token(path: Path) -> dict:
    """What a decode token reads of the model's weights: every tensor of every layer and the output
    matrix (the token embedding where they are tied); the one embedding row is left out, as the
    appliance's count leaves it (model.weight_bytes_bf16). From the file's own tensor sizes, so
    each quantization's real bytes (Q4_K_M mixes types) are counted."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    layers = sum(int(t.n_bytes) for name, t in tensors.items() if name.startswith("blk."))
    output = tensors.get("output.weight", tensors.get("token_embd.weight"))
    if output is None:
        raise ToolError(f"{path} has neither output.weight nor token_embd.weight: not a model llama.cpp runs")
    return {"bytes_per_token": layers + int(output.n_bytes), "layer_bytes": layers,
            "output_bytes": int(output.n_bytes), "output_type": output.tensor_type.name,
            "file_bytes": path.stat().st_size}

