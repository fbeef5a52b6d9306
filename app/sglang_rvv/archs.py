"""The model architectures the policy packs, in one table: the adapters detect them, the
plugin hooks their SGLang classes' weight loading, and the smoke test accepts their
checkpoints. (tiny.py generates test checkpoints of these and of one unsupported kind.)

images/scripts/checkpoint.py's MODEL_TYPES is the wider set a user's checkpoint directory may
hold (the others are served row-major); tests/unit/test_archs.py keeps this table inside it."""

# config.json model_type -> the causal LM class, named alike in transformers and in SGLang
# (sglang.srt.models.<model_type>.<class>).
SUPPORTED = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def sglang_classes() -> tuple[str, ...]:
    """The dotted paths of SGLang's classes for every supported architecture."""
    return tuple(f"sglang.srt.models.{arch}.{name}" for arch, name in SUPPORTED.items())
