"""Policy smoke test that needs nothing but torch: ``python -m sglang_rvv.smoke MODEL_DIR``.

It builds a small pure-torch decoder (Llama, Qwen2 or Qwen3 layout: RMSNorm,
RoPE, grouped-query causal attention, SiLU MLP, lm_head tied or not) from the
checkpoint's ``config.json`` and ``*.safetensors``, with the module names of
transformers, twice. One copy gets the RVV policy (pack, install), the other
stays row-major, and both run side by side:

* prefill of a short prompt, batch 1 and batch 3: logits SQNR >= 35 dB;
* greedy decode (batch 1: M=1; batch 3: M=3, bucket 4, zero-padded and sliced),
  both copies fed the row-major copy's picks: the same next tokens (a different
  pick passes only as a near tie, see ``TIE_TOLERANCE``) and every step's logits
  SQNR >= 35 dB;
* the packed route was taken (at M=1 and in bucket 4 among others).

No transformers, SGLang or safetensors package is needed, so it runs where the
only torch is a distribution's (Debian's python3-torch on riscv64, under qemu
too). Exit status: 0 passed, 1 mismatch (the report names it), 2 unusable
model directory or arguments. ``--compile`` turns regional compile on (one
Inductor compilation per projection and bucket: slow, especially emulated).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import RvvPolicyConfig, install_rvv_policy
from .adapters import hf_named_adapter
from .archs import SUPPORTED
from .ops import PROVIDER_NAME
from .policy import PolicyReport, policy_of

MIN_SQNR_DB = 35.0  # bf16 keeps 8 bits of mantissa; one rounding of the output alone costs ~48 dB
# A greedy pick that differs from the row-major one passes only when the row-major
# logits of the two tokens are this close, relative to the row's largest magnitude
# (a few bf16 ulps: rounding the activations differently can swap exact ties).
TIE_TOLERANCE = 2.0**-6
PROMPTS = ((3, 141, 59, 26, 535), (17, 902, 4, 1311, 77), (250, 8, 1999, 640, 12))
DECODE_STEPS = 4

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}


class SmokeError(Exception):
    """The model directory cannot be smoke-tested (missing files, unsupported config)."""


# -- checkpoint ---------------------------------------------------------------

def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one ``.safetensors`` file (little-endian u64 header size, JSON header, data)."""
    data = bytearray(path.stat().st_size)  # writable: torch.frombuffer warns on read-only buffers
    with open(path, "rb") as f:
        if f.readinto(data) != len(data):
            raise SmokeError(f"{path}: short read")
    if len(data) < 8:
        raise SmokeError(f"{path}: not a safetensors file ({len(data)} bytes)")
    (header_size,) = struct.unpack_from("<Q", data, 0)
    if 8 + header_size > len(data):
        raise SmokeError(f"{path}: header size {header_size} exceeds the file")
    try:
        header = json.loads(bytes(data[8 : 8 + header_size]))
    except ValueError as exc:
        raise SmokeError(f"{path}: unreadable safetensors header ({exc})") from None
    start_of_data = 8 + header_size
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            kind, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SmokeError(f"{path}: malformed header entry for {name}: {entry!r}") from None
        dtype = _DTYPES.get(kind)
        if dtype is None:
            raise SmokeError(f"{path}: {name} has dtype {kind}, not one of {sorted(_DTYPES)}")
        numel = math.prod(shape)
        if end - begin != numel * dtype.itemsize or start_of_data + end > len(data):
            raise SmokeError(f"{path}: {name} {kind}{list(shape)} does not match its byte range")
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            # clone(): own, aligned memory, so the file's buffer can go
            view = torch.frombuffer(data, dtype=dtype, count=numel, offset=start_of_data + begin)
            tensors[name] = view.reshape(shape).clone()
    return tensors


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


# -- the decoder (names and numerics as in transformers' Llama/Qwen2/Qwen3) -----

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


# -- comparison ---------------------------------------------------------------

def sqnr_db(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """Signal-to-quantisation-noise ratio of ``actual`` against ``reference``, in dB."""
    reference = reference.double()
    noise = (actual.double() - reference).norm()
    if noise == 0:
        return float("inf")
    return float(20 * torch.log10(reference.norm() / noise))


@dataclass
class Comparison:
    """Packed copy against row-major copy: what matched and what did not."""

    prefill_sqnr_db: dict[str, float] = field(default_factory=dict)
    decode_min_sqnr_db: dict[str, float] = field(default_factory=dict)
    decode_steps: int = 0
    picks: int = 0
    equal_picks: int = 0
    near_ties: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def _check_sqnr(result: Comparison, what: str, actual, reference, min_db: float) -> float:
    db = sqnr_db(actual.float(), reference.float())
    if not db >= min_db:  # also catches NaN
        result.failures.append(f"{what}: logits SQNR {db:.1f} dB < {min_db:.0f} dB against row-major")
    return db


def _check_picks(result: Comparison, what: str, reference: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
    """Compare greedy picks row by row; returns the row-major picks."""
    reference, candidate = reference.float(), candidate.float()
    ref_picks, cand_picks = reference.argmax(-1), candidate.argmax(-1)
    for row, (want, got) in enumerate(zip(ref_picks.tolist(), cand_picks.tolist(), strict=True)):
        result.picks += 1
        if want == got:
            result.equal_picks += 1
            continue
        gap = float(reference[row, want] - reference[row, got])
        allowed = TIE_TOLERANCE * float(reference[row].abs().max())
        text = f"{what} row {row}: token {got}, row-major {want} (row-major logit gap {gap:.4f}"
        if gap <= allowed:
            result.near_ties.append(f"{text} <= near-tie tolerance {allowed:.4f})")
        else:
            result.failures.append(f"{text} > near-tie tolerance {allowed:.4f})")
    return ref_picks


def compare(
    reference: nn.Module,
    candidate: nn.Module,
    prompts: Sequence[Sequence[int]] = PROMPTS,
    steps: int = DECODE_STEPS,
    min_sqnr_db: float = MIN_SQNR_DB,
) -> Comparison:
    """Run both models side by side: prefill, then ``steps`` greedy decode steps.

    Batch 1 (``prompts[0]``) and the batch of all prompts (equal lengths). Both
    copies are fed the row-major picks, so one near tie cannot derail the rest.
    """
    result = Comparison(decode_steps=steps)
    vocab = reference.config.vocab_size
    layers = reference.config.num_hidden_layers
    for batch in ([prompts[0]], list(prompts)):
        label = f"batch {len(batch)}"
        ids = torch.tensor(batch) % vocab
        ref_cache, cand_cache = KVCache(layers), KVCache(layers)
        with torch.no_grad():
            ref_logits, cand_logits = reference(ids, ref_cache), candidate(ids, cand_cache)
            result.prefill_sqnr_db[label] = _check_sqnr(
                result, f"prefill {label}", cand_logits, ref_logits, min_sqnr_db
            )
            worst = math.inf
            for step in range(steps + 1):
                picks = _check_picks(result, f"{label} pick {step}", ref_logits[:, -1], cand_logits[:, -1])
                if step == steps:
                    break
                ref_logits, cand_logits = reference(picks[:, None], ref_cache), candidate(picks[:, None], cand_cache)
                worst = min(worst, _check_sqnr(
                    result, f"decode {label} step {step + 1}", cand_logits, ref_logits, min_sqnr_db
                ))
            result.decode_min_sqnr_db[label] = worst
    return result


# -- the smoke ------------------------------------------------------------------

@dataclass
class SmokeResult:
    model_dir: str
    model_type: str
    layers: int
    tied_lm_head: bool
    machine: str
    python: str
    torch: str
    provider: str
    regional_compile: bool
    policy: dict
    routes: dict[str, dict[str, int]]  # route -> {bucket: calls}
    comparison: dict
    seconds: dict[str, float]
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self, **kwargs) -> str:
        """Strict JSON: an infinite SQNR (bit-identical logits) becomes the string "inf"."""
        return json.dumps(_finite({**asdict(self), "passed": self.passed}), allow_nan=False, **kwargs)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _routes(model: nn.Module) -> dict[str, dict[str, int]]:
    routes: dict[str, dict[str, int]] = {}
    policy = policy_of(model)
    if policy is not None:
        for (_, route, bucket), count in policy.counters.items():
            buckets = routes.setdefault(route, {})
            buckets[bucket] = buckets.get(bucket, 0) + count
    return routes


def policy_failures(report: PolicyReport, routes: dict[str, dict[str, int]], regional_compile: bool) -> list[str]:
    """What the install and the routes hit must show for the smoke to mean anything."""
    if report.adapter is None:
        return [f"the policy was not installed: {report.reason}"]
    if not report.packed:
        return [f"nothing was packed: {sorted(set(report.skipped.values()))}"]
    route = "packed_compiled" if regional_compile else "packed_eager"
    hit = routes.get(route, {})
    missing = [bucket for bucket in ("1", "4") if not hit.get(bucket)]
    if missing:
        return [f"route {route} was not taken with bucket(s) {', '.join(missing)} (routes hit: {routes})"]
    return []


def run_smoke(model_dir: Path, regional_compile: bool = False) -> SmokeResult:
    """Load ``model_dir`` twice, install the policy on one copy, compare with the other."""
    seconds = {}
    start = time.perf_counter()
    reference = load_model(model_dir)
    candidate = copy.deepcopy(reference)
    seconds["load"] = time.perf_counter() - start

    start = time.perf_counter()
    report = install_rvv_policy(
        candidate, RvvPolicyConfig(regional_compile=regional_compile), adapter=hf_named_adapter()
    )
    seconds["install"] = time.perf_counter() - start

    start = time.perf_counter()
    comparison = compare(reference, candidate)
    seconds["compare"] = time.perf_counter() - start

    routes = _routes(candidate)
    config = reference.config
    return SmokeResult(
        model_dir=str(model_dir), model_type=config.model_type, layers=config.num_hidden_layers,
        tied_lm_head=config.tie_word_embeddings, machine=platform.machine(),
        python=platform.python_version(), torch=torch.__version__, provider=PROVIDER_NAME,
        regional_compile=regional_compile, policy=asdict(report), routes=routes,
        comparison={**asdict(comparison), "passed": comparison.passed}, seconds=seconds,
        failures=policy_failures(report, routes, regional_compile) + comparison.failures,
    )


def format_report(result: SmokeResult) -> str:
    policy, comparison = result.policy, result.comparison
    reasons: dict[str, int] = {}
    for reason in policy["skipped"].values():
        reasons[reason] = reasons.get(reason, 0) + 1
    skipped = "; ".join(f"{n}x {reason}" for reason, n in sorted(reasons.items()))
    routes = ", ".join(
        f"{route} {sum(buckets.values())} (buckets {', '.join(sorted(buckets, key=_bucket_order))})"
        for route, buckets in sorted(result.routes.items())
    )
    prefill = ", ".join(f"{db:.1f} dB ({label})" for label, db in comparison["prefill_sqnr_db"].items())
    decode = ", ".join(f"{db:.1f} dB ({label})" for label, db in comparison["decode_min_sqnr_db"].items())
    lines = [
        f"sglang_rvv smoke: {'PASSED' if result.passed else 'FAILED'}",
        f"  model     {result.model_dir}: {result.model_type}, {result.layers} layers, "
        f"lm_head {'tied' if result.tied_lm_head else 'untied'}",
        f"  platform  machine {result.machine}, Python {result.python}, torch {result.torch}, "
        f"provider {result.provider}",
        f"  policy    adapter {policy['adapter']}, packed {len(policy['packed'])} "
        f"({policy['packed_bytes'] / 2**20:.1f} MiB), skipped {len(policy['skipped'])}"
        f"{f' ({skipped})' if skipped else ''}, regional_compile {'on' if result.regional_compile else 'off'}",
        f"  routes    {routes or 'none'}",
        f"  prefill   logits SQNR {prefill or 'n/a'} (min {MIN_SQNR_DB:.0f} dB)",
        f"  decode    {comparison['equal_picks']}/{comparison['picks']} greedy picks equal "
        f"({len(comparison['near_ties'])} near ties), {comparison['decode_steps']} steps at M=1 and M=3 "
        f"(bucket 4); min step SQNR {decode or 'n/a'}",
        "  seconds   " + ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items()),
    ]
    lines += [f"  near tie  {tie}" for tie in comparison["near_ties"]]
    lines += [f"  FAILURE   {failure}" for failure in result.failures]
    return "\n".join(lines)


def _bucket_order(bucket: str) -> tuple[int, str]:
    return (int(bucket), "") if bucket.isdigit() else (1 << 30, bucket)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_rvv.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path, help="checkpoint directory: config.json + *.safetensors")
    parser.add_argument("--compile", action="store_true", help="regional compile on (slow: Inductor per key)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON instead of text")
    args = parser.parse_args(argv)
    try:
        result = run_smoke(args.model_dir, regional_compile=args.compile)
    except SmokeError as exc:
        print(f"sglang_rvv smoke: error: {exc}", file=sys.stderr)
        return 2
    print(result.to_json(indent=1) if args.json else format_report(result))
    if not result.passed:
        print(f"sglang_rvv smoke: FAILED: {result.failures[0]}"
              f"{f' (and {len(result.failures) - 1} more)' if len(result.failures) > 1 else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
