"""Write a tiny generated checkpoint: transformers config, seeded weights, local tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on a corpus
shipped with the package, so the same inputs give byte-identical files on
every machine. The directory is written next to its destination and renamed
into place, so a crash never leaves a half-written model.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from . import tiny

TOKENIZER_VOCAB = 2000  # below the tiny models' 2050 rows, so every id has an embedding
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = resources.files("sglang_rvv.data").joinpath("corpus.txt").read_text().splitlines()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        bos_token=None, chat_template=CHAT_TEMPLATE,
    )


def file_hashes(directory: Path) -> dict[str, str]:
    """sha256 of every file below ``directory``, keyed by relative path."""
    hashes = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        hashes[str(path.relative_to(directory))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def write_tiny_checkpoint(out_dir: Path, arch: str = "llama", seed: int = 0, **overrides) -> dict[str, str]:
    """Write the checkpoint to ``out_dir`` (replacing it) and return its file hashes."""
    out_dir = Path(out_dir)
    model = tiny.build_model(arch, seed=seed, **overrides)
    model.generation_config.eos_token_id = 0
    tokenizer = _train_tokenizer()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        for path in staging.iterdir():  # readable by the container's non-root user
            path.chmod(0o644)
        staging.chmod(0o755)
        hashes = file_hashes(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return hashes


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.checkpoint", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--arch", choices=sorted(tiny.ARCHS), default="llama")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    hashes = write_tiny_checkpoint(args.out_dir, args.arch, args.seed)
    print(json.dumps({"path": str(args.out_dir), "arch": args.arch, "seed": args.seed, "sha256": hashes}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
