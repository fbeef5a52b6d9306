#!/usr/bin/env python3
"""A user's own checkpoint directory: check it, name it by its content, stage it for a build.

    checkpoint.py check DIR         is DIR a checkpoint this appliance can serve? (one line if not)
    checkpoint.py name DIR          the model key its images are tagged with: NAME-DIGEST12
    checkpoint.py stage DIR CTX     copy DIR's files into CTX/model, check the copy, write
                                    CTX/model.json (names and sha256 of every file); prints the key

Standard library only: it runs on the build host before anything is built. What is checked:
config.json parses, with a model_type SGLang serves and a dtype that is BF16 or casts to it
(no quantized checkpoints); every *.safetensors header is readable and every tensor it lists
lies inside the file with the size its dtype and shape give (a truncated file fails here);
with a model.safetensors.index.json, every tensor it maps is in its shard; a tokenizer is
there. The model key is the directory's name (made tag-safe) and the first 12 hex digits of a
digest over every file's name and sha256, so a changed file gives a new key, and so a new image.

Only the directory's top-level, non-hidden files are the checkpoint; other weight formats
(*.bin, *.pth, ...) and subdirectories (a hub repository's original/) are left out and listed.
A refusal is one line on stderr naming the file and the problem, exit status 2; stage then
leaves nothing in CTX.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
from pathlib import Path

# The one .safetensors header parser, shared with the smoke test. The app's package imports
# nothing heavy at its top, and that module is standard library only.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "app"))
from sglang_rvv.safetensors_format import HeaderError, read_header  # noqa: E402

EXIT_REFUSED = 2
# Decoder-only model types SGLang 0.5.21 serves on CPU and this appliance is tested with or
# close to: the policy packs the Linear layers of those in sglang_rvv.archs.SUPPORTED (a subset,
# tests/unit/test_archs.py) and routes the others row-major with a warning.
MODEL_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "phi3", "granite", "olmo", "olmo2", "internlm2", "minicpm", "stablelm", "starcoder2", "exaone",
    "deepseek_v2", "deepseek_v3", "mixtral", "glm4",
})
DTYPES = frozenset({"bfloat16", "float16", "float32"})  # served as BF16 (--dtype bfloat16)
FLOAT_TENSORS = frozenset({"BF16", "F16", "F32"})
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))
OTHER_WEIGHTS = (".bin", ".pth", ".pt", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf")
PROGRESS_BYTES = 256 << 20  # files at least this big say so while they are hashed or copied


class Refused(Exception):
    """One line: the file and what is wrong with it."""


def files(directory: Path) -> tuple[list[Path], list[str]]:
    """(the checkpoint's files, sorted; what is left out)."""
    if not directory.is_dir():
        raise Refused(f"{directory}: not a directory (MODEL_DIR must name a local checkpoint directory)")
    kept, left_out = [], []
    for path in sorted(directory.iterdir()):
        if path.name.startswith("."):
            continue
        if path.is_file() and not path.name.endswith(OTHER_WEIGHTS):
            kept.append(path)
        else:
            left_out.append(path.name + ("/" if path.is_dir() else ""))
    return kept, left_out


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise Refused(f"{path}: missing (a Hugging Face checkpoint has a config.json)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise Refused(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Refused(f"{path}: not a JSON object")
    return data


def check_config(directory: Path) -> str:
    config = _json(directory / "config.json")
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise Refused(f"{directory / 'config.json'}: model_type {model_type!r} is not one this appliance serves "
                      f"({', '.join(sorted(MODEL_TYPES))})")
    dtype = config.get("dtype", config.get("torch_dtype"))
    if dtype is not None and dtype not in DTYPES:
        raise Refused(f"{directory / 'config.json'}: dtype {dtype!r} cannot be served as BF16 "
                      f"(use a {', '.join(sorted(DTYPES))} checkpoint)")
    if "quantization_config" in config:
        method = config["quantization_config"].get("quant_method", "?") if isinstance(
            config["quantization_config"], dict) else "?"
        raise Refused(f"{directory / 'config.json'}: a quantized checkpoint ({method}); this appliance serves "
                      "BF16 weights (use the unquantized checkpoint)")
    return model_type


def safetensors_header(path: Path) -> dict[str, dict]:
    """The tensors a .safetensors file lists, each checked to lie inside the file."""
    try:
        return read_header(path)[0]
    except HeaderError as exc:
        raise Refused(f"{path}: {exc}") from None


def check_weights(directory: Path, names: set[str]) -> tuple[int, int]:
    """(safetensors files, tensors)."""
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    if not shards:
        raise Refused(f"{directory}: no *.safetensors file (convert a .bin/.pth checkpoint to safetensors first)")
    headers = {shard: safetensors_header(directory / shard) for shard in shards}
    for shard, header in headers.items():
        quantized = sorted({info["dtype"] for name, info in header.items()
                            if name.endswith(".weight") and info["dtype"] not in FLOAT_TENSORS})
        if quantized:
            raise Refused(f"{directory / shard}: weights stored as {', '.join(quantized)}; this appliance serves "
                          "BF16 (use the unquantized checkpoint)")
    if "model.safetensors.index.json" in names:
        index = directory / "model.safetensors.index.json"
        weight_map = _json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise Refused(f"{index}: no weight_map")
        for tensor, shard in weight_map.items():
            if shard not in headers:
                raise Refused(f"{index}: tensor {tensor} maps to {shard}, which is missing")
            if tensor not in headers[shard]:
                raise Refused(f"{directory / shard}: tensor {tensor} (listed in {index.name}) is missing")
    return len(shards), sum(len(h) for h in headers.values())


def check_tokenizer(directory: Path, names: set[str]) -> str:
    for group in TOKENIZER_FILES:
        if names.issuperset(group):
            return "+".join(group)
    raise Refused(f"{directory}: no tokenizer ({' or '.join('+'.join(g) for g in TOKENIZER_FILES)})")


def check(directory: Path) -> str:
    """One line describing a servable checkpoint; raises Refused."""
    kept, left_out = files(directory)
    names = {p.name for p in kept}
    model_type = check_config(directory)
    shards, tensors = check_weights(directory, names)
    tokenizer = check_tokenizer(directory, names)
    size = sum(p.stat().st_size for p in kept)
    note = f"; left out: {', '.join(left_out)}" if left_out else ""
    return (f"{directory}: ok: {model_type}, {tensors} tensors in {shards} safetensors file(s), "
            f"{size / 2**30:.2f} GiB, tokenizer {tokenizer}{note}")


def _sha256(path: Path) -> str:
    size = path.stat().st_size
    if size >= PROGRESS_BYTES:
        print(f"checkpoint: hashing {path.name} ({size / 2**30:.2f} GiB)", file=sys.stderr, flush=True)
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digests(directory: Path) -> dict[str, str]:
    return {p.name: _sha256(p) for p in files(directory)[0]}


def served_name(directory: Path) -> str:
    return directory.resolve().name


def model_key(directory: Path, sha256: dict[str, str]) -> str:
    """NAME-DIGEST12: a tag-safe form of the directory's name and a digest of its files."""
    name = re.sub(r"[^a-z0-9._-]+", "-", served_name(directory).lower()).strip(".-_")[:60] or "model"
    digest = hashlib.sha256("".join(f"{n}\t{h}\n" for n, h in sorted(sha256.items())).encode()).hexdigest()
    return f"{name}-{digest[:12]}"


def stage(directory: Path, ctx: Path) -> str:
    """Copy the checkpoint into ctx/model and describe it in ctx/model.json; returns its key.
    What is checked and hashed is the copy, so the image holds exactly what was checked."""
    check(directory)
    target = ctx / "model"
    if target.exists():
        shutil.rmtree(target)
    try:
        target.mkdir(parents=True)
        for path in files(directory)[0]:
            if path.stat().st_size >= PROGRESS_BYTES:
                print(f"checkpoint: copying {path.name}", file=sys.stderr, flush=True)
            shutil.copyfile(path, target / path.name)
        check(target)
        sha256 = digests(target)
        key = model_key(directory, sha256)
        manifest = {"name": served_name(directory), "key": key, "source": "dir", "sha256": sha256}
        (ctx / "model.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        (ctx / "model.json").unlink(missing_ok=True)
        raise
    return key


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("check", "name", "stage") or len(argv) != (3 if argv[0] == "stage" else 2):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return EXIT_REFUSED
    directory = Path(argv[1])
    try:
        if argv[0] == "check":
            print(f"checkpoint {check(directory)}", file=sys.stderr)
        elif argv[0] == "name":
            check(directory)
            print(model_key(directory, digests(directory)))
        else:
            print(stage(directory, Path(argv[2])))
    except Refused as refusal:
        print(f"checkpoint: refused: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
