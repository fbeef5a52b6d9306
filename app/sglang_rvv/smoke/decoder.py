"""The smoke's reference decoder: Llama, Qwen2 and Qwen3 in pure torch, with the module names
and numerics of transformers (RMSNorm, RoPE, grouped-query causal attention, SiLU MLP, lm_head
tied or not), loaded from a checkpoint's ``config.json`` and ``*.safetensors``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..archs import SUPPORTED
from .reader import SmokeError, read_safetensors


@dataclass(frozen=True)
class DecoderConfig:
    """The fields of a transformers ``config.json`` this decoder uses."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before RoPE

    @classmethod
    def from_dict(cls, raw: dict) -> DecoderConfig:
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED:
            raise SmokeError(f"config.json model_type {model_type!r} is not one of {tuple(SUPPORTED)}")
        if raw.get("hidden_act", "silu") != "silu":
            raise SmokeError(f"config.json hidden_act {raw['hidden_act']!r}: only silu is implemented")
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise SmokeError(f"config.json rope type {rope_type!r}: only the default RoPE is implemented")
        if raw.get("use_sliding_window"):
            raise SmokeError("config.json use_sliding_window: sliding-window attention is not implemented")
        heads = raw["num_attention_heads"]
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            model_type=model_type,
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases and no o_proj bias; Llama and Qwen3 follow attention_bias.
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)) if model_type == "llama" else False,
            qk_norm=model_type == "qwen3",
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_cos_sin(config: DecoderConfig, positions: torch.Tensor, dtype: torch.dtype):
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class KVCache:
    """Keys and values per layer, ``[batch, kv_heads, tokens, head_dim]``."""

    def __init__(self, layers: int):
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers

    def length(self, layer: int = 0) -> int:
        """Tokens cached for ``layer`` (before its update in the current forward)."""
        keys = self.keys[layer]
        return 0 if keys is None else keys.shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        if self.keys[layer] is not None:
            k = torch.cat((self.keys[layer], k), dim=2)
            v = torch.cat((self.values[layer], v), dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim
        )
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, cache: KVCache | None):
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, -1, self.head_dim)
        k = self.k_proj(x).view(batch, tokens, -1, self.head_dim)
        v = self.v_proj(x).view(batch, tokens, -1, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        past = 0
        if cache is not None:
            past = cache.length(self.layer)
            k, v = cache.update(self.layer, k, v)
        groups = self.heads // self.kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask = None
        if tokens > 1 and past:  # a chunk after cached tokens: causal with an offset
            mask = torch.ones(tokens, past + tokens, dtype=torch.bool).tril(diagonal=past)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=tokens > 1 and not past, scale=self.head_dim**-0.5
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """``model.embed_tokens``, ``model.layers.N.{self_attn,mlp}.*_proj``, ``model.norm``, ``lm_head``."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``[batch, tokens, vocab]`` of every position of ``input_ids`` ``[batch, tokens]``."""
        x = self.model.embed_tokens(input_ids)
        past = 0 if cache is None else cache.length()
        positions = torch.arange(past, past + input_ids.shape[1])
        cos, sin = rope_cos_sin(self.config, positions, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, cache)
        return self.lm_head(self.model.norm(x))


def load_model(model_dir: Path, dtype: torch.dtype = torch.bfloat16) -> CausalLM:
    """The checkpoint in ``model_dir`` as an eval-mode :class:`CausalLM` in ``dtype``."""
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise SmokeError(f"{config_path} is missing")
    try:
        config = DecoderConfig.from_dict(json.loads(config_path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise SmokeError(f"{config_path}: unusable ({type(exc).__name__}: {exc})") from None
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise SmokeError(f"{model_dir} has no *.safetensors weights")
    state = {}
    for path in files:
        state.update(read_safetensors(path))
    with torch.device("meta"):  # no random init: every parameter comes from the checkpoint
        model = CausalLM(config)
    state = {name: tensor.to(dtype) for name, tensor in state.items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # some writers store the tied copy too
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # assign=True replaced the shared one
        missing = [name for name in missing if name != "lm_head.weight"]
    if missing or unexpected:
        raise SmokeError(
            f"{model_dir}: the weights do not fit a {config.model_type} decoder "
            f"(missing {missing[:4]}, unexpected {unexpected[:4]})"
        )
    return model.eval()
