"""Tiny generated models: deterministic configs and seeded weights, no model hub.

Shapes are chosen for the shape gate: hidden 1024 puts q/o/gate_up/down/lm_head
through it (N, K >= 1024) while the grouped k/v projections (N = 256) stay
row-major, and odd sizes (vocab 2050, intermediate 2080) exercise N that is
not a multiple of 32. All architectures share these projection shapes, so the
compiled artifacts of one serve the others.
"""

from __future__ import annotations

import torch

ARCHS = {
    # arch: (transformers config class, model class, tie_word_embeddings)
    "llama": ("LlamaConfig", "LlamaForCausalLM", False),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", True),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", True),
    # No adapter knows Mistral: the "unknown architecture" case, served row-major.
    "mistral": ("MistralConfig", "MistralForCausalLM", False),
}

TINY_SHAPE = dict(
    hidden_size=1024,
    intermediate_size=2080,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    vocab_size=2050,
    max_position_embeddings=2048,
)

# The projection shapes of the real models, for benchmarks (random weights).
REAL_SHAPES = {
    "llama-3.2-1b": dict(
        arch="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        max_position_embeddings=131072, tie_word_embeddings=True, rope_theta=500000.0,
    ),
    "qwen3-0.6b": dict(
        arch="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=40960, tie_word_embeddings=True, rope_theta=1000000.0,
    ),
}


def build_config(arch: str, **overrides):
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose one of {sorted(ARCHS)}")
    config_cls, _, tied = ARCHS[arch]
    values = dict(TINY_SHAPE, tie_word_embeddings=tied, torch_dtype="bfloat16")
    values.update(overrides)
    return getattr(transformers, config_cls)(**values)


def build_model(arch: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A bfloat16 eval-mode model with weights drawn from ``seed``."""
    import transformers

    config = build_config(arch, **overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, ARCHS[arch][1])(config)
    with torch.no_grad():
        # transformers initialises a Linear's bias (Qwen2's q/k/v) to zero, which would hide a
        # dropped bias; a real Qwen2's are far from zero.
        for name, param in model.named_parameters():
            if name.endswith("proj.bias"):
                param.normal_(0.0, 0.5)
    return model.to(torch.bfloat16).eval()
