"""The fused kernels of the rest of a decode step (RMSNorm, fused residual-add + RMSNorm, SiLU x
mul, the rotary embedding, the decode attention, the residual add, the logits' top-1 and widening,
and SGLang's KV store), as their scalar twins built for this host, and their plug into transformers' modules and
SGLang's.

The RVV kernels are held to these twins bit for bit under qemu (tests/images/test_rvv_kernels.py);
here the twins meet an fp64 reference on the shapes of the benchmark models, and a transformers
model whose norms and MLPs run them generates the same greedy tokens as the model as built. On x86
the policy never picks them (they are the rvv provider's), so the hook is called directly.
"""

from __future__ import annotations

import sys

import host_kernels
import pytest
import torch
import torch.nn.functional as F

from sglang_rvv import fused, hf_step, tiny
from sglang_rvv.direct_call import DirectCall


@pytest.fixture(scope="module")
def native():
    return host_kernels.ops()


_randn = host_kernels.bf16_randn


def _sqnr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    noise = (out.double() - ref.double()).pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * torch.log10(ref.double().pow(2).sum() / noise).item()


@pytest.mark.parametrize("d", [1, 17, 128, 576, 1024, 1536, 2048])
def test_rmsnorm_is_one_rounding_of_the_fp64_norm(native, d):
    x, weight = _randn(7, d, seed=d), _randn(d, seed=d + 1)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    out = native.rmsnorm(x, weight, 1e-6)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert _sqnr_db(out, ref) > 45  # BF16's 8 bits: one rounding is ~50 dB
    # The row-wise contract: each row alone gives the same bits, and a 4-D view the same as 2-D.
    assert torch.equal(native.rmsnorm(x[3:4], weight, 1e-6), out[3:4])
    assert torch.equal(native.rmsnorm(x.view(1, 7, 1, d), weight, 1e-6).view(7, d), out)


def test_fused_add_rmsnorm_in_place(native):
    x, residual, weight = _randn(3, 1024, seed=1), _randn(3, 1024, seed=2), _randn(1024, seed=3)
    summed = x + residual  # torch's BF16 add: one rounding of the FP32 sum
    native.fused_add_rmsnorm(x, residual, weight, 1e-6)
    assert torch.equal(residual, summed)
    assert torch.equal(x, native.rmsnorm(summed, weight, 1e-6))


@pytest.mark.parametrize("tokens,q_heads,kv_heads,d", [(1, 16, 8, 128), (5, 9, 3, 64), (2, 1, 1, 1)])
def test_qk_rmsnorm_norms_each_head_in_place_as_rmsnorm(native, tokens, q_heads, kv_heads, d):
    """SGLang's QK norm: q and k split from one qkv row per token, each head row normed in place
    by its own weight and eps, the bits of rmsnorm over the rows copied out; v untouched."""
    qkv = _randn(tokens, (q_heads + 2 * kv_heads) * d, seed=tokens * d)
    q, k, v = qkv.split([q_heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q_weight, k_weight = _randn(d, seed=1), _randn(d, seed=2)
    q_want = native.rmsnorm(q.reshape(-1, d), q_weight, 1e-6).view(q.shape)
    k_want = native.rmsnorm(k.reshape(-1, d), k_weight, 1e-5).view(k.shape)
    v_before = v.clone()
    native.qk_rmsnorm(q, k, q_weight, k_weight, 1e-6, 1e-5)
    assert torch.equal(q, q_want) and torch.equal(k, k_want) and torch.equal(v, v_before)


@pytest.mark.parametrize("d", [1, 100, 1536, 3072, 8960])
def test_silu_mul_within_one_rounding(native, d):
    both = _randn(5, 2 * d, seed=d) * 4
    gate, up = both[:, :d], both[:, d:]  # SGLang's halves: rows 2d apart
    out = native.silu_mul(gate, up)
    assert torch.equal(out, native.silu_mul(gate.contiguous(), up.contiguous()))
    assert torch.equal(native.silu_and_mul(both), out)  # the halves of each row, unsliced
    assert _sqnr_db(out, F.silu(gate.double()) * up.double()) > 45


def _rotary_tables(batch, seq, d, seed):
    """transformers' cos and sin [batch, seq, d]: the halves repeated, positions up to 4095."""
    positions = torch.randint(0, 4096, (batch, seq), generator=torch.Generator().manual_seed(seed))
    freqs = positions[..., None].double() / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def _rotate_fp64(x, cos, sin):
    x, cos, sin = x.double(), cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@pytest.mark.parametrize("batch,q_heads,kv_heads,seq,d,table_batch", [
    (1, 16, 8, 1, 128, 1),  # Qwen3-0.6B's decode
    (1, 9, 3, 7, 64, 1),    # SmolLM2's prefill
    (2, 4, 2, 3, 32, 2),    # a batch, a table per row
    (2, 4, 2, 3, 32, 1),    # a batch sharing one table
    (1, 2, 1, 1, 2, 1),     # the smallest head
])
def test_rotary_is_one_rounding_of_the_fp64_rotation(native, batch, q_heads, kv_heads, seq, d, table_batch):
    q = _randn(batch, seq, q_heads, d, seed=d).transpose(1, 2)  # transformers' q: a transpose
    k = _randn(batch, seq, kv_heads, d, seed=d + 1).transpose(1, 2)
    cos, sin = _rotary_tables(table_batch, seq, d, seed=seq)
    q_out, k_out = native.rotary_neox(q, k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == torch.bfloat16
    assert _sqnr_db(q_out, _rotate_fp64(q, cos, sin)) > 45 and _sqnr_db(k_out, _rotate_fp64(k, cos, sin)) > 45
    # Strides never change a bit; only the first half of each table is read (SGLang passes halves).
    contiguous = native.rotary_neox(q.contiguous(), k.contiguous(), cos[..., : d // 2], sin[..., : d // 2])
    assert torch.equal(contiguous[0], q_out) and torch.equal(contiguous[1], k_out)


@pytest.mark.parametrize("tokens,q_heads,kv_heads,d", [(1, 16, 8, 128), (7, 9, 3, 64), (3, 1, 1, 2)])
def test_rotary_at_positions_is_rotary_over_the_gathered_cache_rows(native, tokens, q_heads, kv_heads, d):
    """SGLang's layout: q and k split from one qkv row per token, each rotated by its position's row
    of cos_sin_cache (cos then sin): the bits of rotary_neox over those rows gathered."""
    cache = _randn(4096, d, seed=d)
    qkv = _randn(tokens, (q_heads + 2 * kv_heads) * d, seed=tokens)
    q, k, _ = qkv.split([q_heads * d, kv_heads * d, kv_heads * d], dim=-1)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(d))
    q_out, k_out = native.rotary_neox_at(positions, q, k, cache)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.is_contiguous() and k_out.is_contiguous()
    table = cache.index_select(0, positions).unsqueeze(1)
    q_want, k_want = native.rotary_neox(q.view(tokens, -1, 1, d), k.view(tokens, -1, 1, d), table[..., : d // 2],
                                        table[..., d // 2:])
    assert torch.equal(q_out, q_want.reshape(q.shape)) and torch.equal(k_out, k_want.reshape(k.shape))


def _attention_fp64(q, k, v, scale):
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, dim=1), v.double().repeat_interleave(group, dim=1)
    weights = torch.softmax((q.double() @ k.transpose(-1, -2)) * scale, dim=-1)
    return (weights @ v).transpose(1, 2)  # [batch, 1, q_heads, d], as transformers' sdpa returns it


@pytest.mark.parametrize("batch,q_heads,kv_heads,keys,d", [
    (1, 16, 8, 6, 128),   # Qwen3-0.6B's second decode step
    (1, 16, 8, 300, 128),  # a long context: many vector chunks of keys
    (1, 9, 3, 7, 64),     # SmolLM2
    (2, 4, 2, 5, 32),     # a batch
    (1, 4, 4, 1, 16),     # no GQA, one key
])
def test_decode_attention_is_the_fp64_softmax(native, batch, q_heads, kv_heads, keys, d):
    q = _randn(batch, 1, q_heads, d, seed=keys).transpose(1, 2)  # transformers' q: a transpose
    # k and v as a cache buffer's first `keys` positions: strided rows, the same bits as a copy.
    cache = _randn(2, batch, kv_heads, keys + 3, d, seed=d) * 2
    k, v = cache[0, :, :, :keys], cache[1, :, :, :keys]
    scale = d ** -0.5
    out = native.decode_attention(q, k, v, scale)
    assert out.shape == (batch, 1, q_heads, d) and out.is_contiguous()
    assert _sqnr_db(out, _attention_fp64(q, k, v, scale)) > 45
    assert torch.equal(out, native.decode_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale))


def test_decode_attention_keeps_a_nan_and_ignores_nothing(native):
    """A NaN score makes its heads' outputs NaN (as torch's softmax does); -inf scores weigh 0."""
    q, k, v = _randn(1, 4, 1, 16, seed=1), _randn(1, 2, 5, 16, seed=2), _randn(1, 2, 5, 16, seed=3)
    k[0, 0, 2, 0] = float("nan")
    out = native.decode_attention(q, k, v, 0.25)
    assert torch.equal(out.isnan().any(-1), torch.tensor([[[True, True, False, False]]]))
    assert _sqnr_db(out[..., 2:, :], _attention_fp64(q, k, v, 0.25)[..., 2:, :]) > 45


def _paged(q_heads: int, kv_heads: int, lengths: tuple[int, ...], d: int, seed: int):
    """SGLang's decode over a paged cache: each batch row's keys are rows scattered over a cache
    twice as long, listed in req_to_token at its pool index (rows 1..batch; row 0 unused)."""
    generator = torch.Generator().manual_seed(seed)
    rows, batch = 2 * sum(lengths) + 5, len(lengths)
    k_cache, v_cache = _randn(rows, kv_heads, d, seed=seed + 1) * 2, _randn(rows, kv_heads, d, seed=seed + 2) * 2
    order = torch.randperm(rows, generator=generator).to(torch.int32)
    req_to_token = torch.zeros(batch + 1, max(lengths) + 3, dtype=torch.int32)
    pool = torch.arange(1, batch + 1, dtype=torch.int64)
    taken = 0
    for b, n in enumerate(lengths):
        req_to_token[pool[b], :n] = order[taken:taken + n]
        taken += n
    return _randn(batch, q_heads, d, seed=seed), k_cache, v_cache, req_to_token, pool, torch.tensor(lengths)


@pytest.mark.parametrize("q_heads,kv_heads,lengths,d", [
    (16, 8, (6,), 128),      # Qwen3-0.6B, one request
    (16, 8, (6, 300), 128),  # two requests, one of many vector chunks of keys
    (9, 3, (7, 1, 20), 64),  # SmolLM2's GQA of 3, a request of one key
])
def test_paged_decode_attention_is_the_gathered_one(native, q_heads, kv_heads, lengths, d):
    """Over SGLang's paged cache the kernel gives, without a gather, the same bits as over each
    request's keys gathered (torch_native's k_cache[req_to_token[...]])."""
    q, k_cache, v_cache, req_to_token, pool, seq_lens = _paged(q_heads, kv_heads, lengths, d, seed=d + len(lengths))
    out = torch.full_like(q, float("nan"))
    assert native.try_decode_attention_paged(q, k_cache, v_cache, req_to_token, pool, seq_lens, d ** -0.5, out)
    for b, n in enumerate(lengths):
        rows = req_to_token[pool[b], :n].long()
        k, v = k_cache[rows].transpose(0, 1).unsqueeze(0), v_cache[rows].transpose(0, 1).unsqueeze(0)
        gathered = native.decode_attention(q[b:b + 1].unsqueeze(2), k, v, d ** -0.5)
        assert torch.equal(out[b], gathered.view(q_heads, d)), b
    untouched = torch.full_like(q, float("nan"))  # an int64 table: refused, nothing written
    assert not native.try_decode_attention_paged(q, k_cache, v_cache, req_to_token.long(), pool, seq_lens, 1.0,
                                                 untouched)
    assert untouched.isnan().all()


def test_sglang_torch_native_decode_runs_the_paged_kernel(native, monkeypatch):
    """SGLang's own torch_native decode loop (gather, then torch's sdpa per request) and the hook's
    paged kernel agree within one BF16 rounding; what the kernel does not cover (a sliding window)
    runs SGLang's loop. The hook replaces the method once, however often it is installed."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from sglang_rvv.srt import fused as srt_fused

    sglang_loop = TorchNativeAttnBackend._run_sdpa_forward_decode
    monkeypatch.setattr(TorchNativeAttnBackend, "_run_sdpa_forward_decode", sglang_loop)
    srt_fused._give_paged_decode()
    srt_fused._give_paged_decode()
    hooked = TorchNativeAttnBackend._run_sdpa_forward_decode
    assert hooked.sglang_rvv_original is sglang_loop
    q, k_cache, v_cache, req_to_token, pool, seq_lens = _paged(16, 8, (6, 40), 128, seed=3)
    calls = []
    monkeypatch.setattr(fused.NATIVE, "try_decode_attention_paged",
                        lambda *args: calls.append(1) or native.try_decode_attention_paged(*args))
    backend = object.__new__(TorchNativeAttnBackend)
    ours, theirs = torch.empty_like(q), torch.empty_like(q)
    hooked(backend, q, ours, k_cache, v_cache, req_to_token, pool, seq_lens, scaling=0.1, enable_gqa=True)
    sglang_loop(backend, q, theirs, k_cache, v_cache, req_to_token, pool, seq_lens, scaling=0.1, enable_gqa=True)
    assert calls == [1] and _sqnr_db(ours, theirs.double()) > 40
    windowed = torch.empty_like(q)
    hooked(backend, q, windowed, k_cache, v_cache, req_to_token, pool, seq_lens, scaling=0.1, enable_gqa=True,
           sliding_window_size=4)
    assert calls == [1] and not torch.equal(windowed, ours)


def _paged_call(change: dict):
    args = dict(zip(("q", "k_cache", "v_cache", "req_to_token", "pool", "seq_lens"),
                    _paged(4, 2, (3, 5), 8, seed=1), strict=True))
    args.update(change)
    out = torch.empty_like(args["q"])
    return lambda n: n.decode_attention_paged(*args.values(), 1.0, out)


def _kv_store_call(change: dict):
    """A store_kv call over 20 cache rows of 2 heads x 8, with ``change``'s arguments instead."""
    args = {"k": torch.ones(2, 2, 8, dtype=torch.bfloat16), "v": torch.ones(2, 2, 8, dtype=torch.bfloat16),
            "k_cache": torch.zeros(20, 2, 8, dtype=torch.bfloat16),
            "v_cache": torch.zeros(20, 2, 8, dtype=torch.bfloat16), "loc": torch.tensor([3, 4]), **change}
    return lambda n: n.store_kv(**args)


@pytest.mark.parametrize("call,message", [
    (lambda n: n.rmsnorm(torch.ones(4, 8), torch.ones(8, dtype=torch.bfloat16), 1e-6), "expects a bfloat16 input"),
    (lambda n: n.rmsnorm(torch.ones(4, 8, dtype=torch.bfloat16), torch.ones(6, dtype=torch.bfloat16), 1e-6),
     "whose last dim is 6"),
    (lambda n: n.rmsnorm(torch.ones(4, 8, dtype=torch.bfloat16)[:, ::2], torch.ones(4, dtype=torch.bfloat16), 1e-6),
     "last dim must be contiguous"),
    (lambda n: n.silu_mul(torch.ones(2, 8, dtype=torch.bfloat16), torch.ones(2, 4, dtype=torch.bfloat16)),
     "gate and up of one shape"),
    (lambda n: n.qk_rmsnorm(_bf16(2, 12), _bf16(2, 8), _bf16(8), _bf16(8), 1e-6, 1e-6),
     "expects bfloat16 q and k of whole heads of 8"),
    (lambda n: n.qk_rmsnorm(_bf16(2, 16), _bf16(2, 8), _bf16(8), _bf16(4), 1e-6, 1e-6), "weights of one head_dim"),
    (lambda n: n.qk_rmsnorm(_bf16(2, 16), _bf16(1, 8), _bf16(8), _bf16(8), 1e-6, 1e-6), "of one token count"),
    (lambda n: n.silu_and_mul(_bf16(2, 7)), r"a last dim of gate then up \(even\), got \[2, 7\]"),
    (lambda n: n.rotary_neox_at(torch.tensor([0, 8]), _bf16(2, 16), _bf16(2, 8), _bf16(8, 8)),
     "token 1 is at position 8, outside the cos_sin_cache's 8 rows"),
    (lambda n: n.rotary_neox_at(torch.tensor([0, 1]), _bf16(2, 12), _bf16(2, 8), _bf16(8, 8)),
     r"query and key \[2 tokens, heads \* 8\]"),
    (lambda n: n.rotary_neox_at(torch.tensor([0, 1], dtype=torch.int32), _bf16(2, 16), _bf16(2, 8), _bf16(8, 8)),
     "expects contiguous int64 positions"),
    (lambda n: n.rotary_neox_at(torch.tensor([0]), _bf16(1, 14), _bf16(1, 7), _bf16(8, 7)),
     r"cos_sin_cache \[positions, head_dim\] \(even"),
    (lambda n: n.fused_add_rmsnorm(torch.ones(2, 8, dtype=torch.bfloat16).t(), torch.ones(8, 2, dtype=torch.bfloat16),
                                   torch.ones(2, dtype=torch.bfloat16), 1e-6), "contiguous input and residual"),
    (lambda n: n.rotary_neox(torch.ones(1, 2, 1, 7, dtype=torch.bfloat16), torch.ones(1, 1, 1, 7, dtype=torch.bfloat16),
                             torch.ones(1, 1, 7, dtype=torch.bfloat16), torch.ones(1, 1, 7, dtype=torch.bfloat16)),
     "even head_dim"),
    (lambda n: n.rotary_neox(torch.ones(1, 2, 1, 8, dtype=torch.bfloat16), torch.ones(1, 1, 1, 8, dtype=torch.bfloat16),
                             torch.ones(1, 1, 3, dtype=torch.bfloat16), torch.ones(1, 1, 3, dtype=torch.bfloat16)),
     r"cos of shape \[batch, seq, >= head_dim/2\]"),
    (lambda n: n.decode_attention(torch.ones(1, 3, 1, 8, dtype=torch.bfloat16),
                                  torch.ones(1, 2, 4, 8, dtype=torch.bfloat16),
                                  torch.ones(1, 2, 4, 8, dtype=torch.bfloat16), 1.0), "q_heads a multiple of kv_heads"),
    (lambda n: n.decode_attention(torch.ones(1, 2, 1, 8, dtype=torch.bfloat16), torch.ones(1, 2, 4, 8),
                                  torch.ones(1, 2, 4, 8), 1.0), "expects bfloat16 q, k and v"),
    (_paged_call({"req_to_token": torch.full((3, 8), 40, dtype=torch.int32)}), "key 0 is cache row 40, outside"),
    (_paged_call({"seq_lens": torch.tensor([3, 9])}), "batch row 1 has pool index 2 .of 3. and 9 keys .1 to 8."),
    (_paged_call({"pool": torch.tensor([1, 3])}), "batch row 1 has pool index 3"),
    (_paged_call({"req_to_token": torch.zeros(3, 8, dtype=torch.int64)}), "expects a contiguous int32 req_to_token"),
    (_paged_call({"k_cache": torch.ones(21, 3, 8, dtype=torch.bfloat16)}), "q_heads a multiple of kv_heads"),
    (lambda n: n.top1(torch.ones(2, 8, dtype=torch.float16)), "expects bfloat16 or float32 logits"),
    (lambda n: n.top1(torch.ones(2, 0)), "with a non-empty last dim, got Float \\[2, 0\\]"),
    (lambda n: n.top1(torch.ones(8, 2).t()), "logits's last dim must be contiguous"),
    (lambda n: n.top1(torch.ones(3, 4, 8)[:, :2, :4]), "logits's rows are not evenly spaced"),
    (lambda n: n.widen(torch.ones(2, 8)), "widen expects a bfloat16 logits whose last dim is 8, got Float"),
    (lambda n: n.widen(torch.ones(8, 2, dtype=torch.bfloat16).t()), "logits's last dim must be contiguous"),
    (lambda n: n.residual_add(_bf16(2, 8), torch.ones(2, 8)), "residual_add expects a bfloat16 b whose last dim is 8"),
    (lambda n: n.residual_add(_bf16(2, 8), _bf16(1, 8)), "residual_add expects a and b of one shape, got \\[2, 8\\]"),
    (_kv_store_call({"loc": torch.tensor([3, 40])}), "token 1 has slot 40, outside the cache's 20 rows"),
    (_kv_store_call({"loc": torch.tensor([3, -1])}), "token 1 has slot -1"),
    (_kv_store_call({"loc": torch.tensor([3, 4], dtype=torch.int32)}), "expects contiguous int64 slots"),
    (_kv_store_call({"v": torch.ones(2, 2, 8)}), "of their dtype, 2 slots; got Float"),
    (_kv_store_call({"k": torch.ones(2, 8, 2, dtype=torch.bfloat16).transpose(1, 2)}), "contiguous rows"),
], ids=["dtype", "weight size", "strided", "silu shapes", "qk part head", "qk weights", "qk tokens",
        "silu odd row", "rotary position past",
        "rotary heads", "rotary int32 positions", "rotary odd cache", "in place strided", "odd head", "short table",
        "gqa ratio",
        "float kv", "paged slot", "paged length", "paged pool", "paged int64 table", "paged cache shape",
        "top1 dtype", "top1 empty", "top1 strided", "top1 uneven rows", "widen dtype", "widen strided",
        "add dtype", "add shapes",
        "kv slot past", "kv slot negative", "kv int32 slots", "kv dtype", "kv strided rows"])
def test_bad_calls_raise_one_clear_line(native, call, message):
    with pytest.raises(RuntimeError, match=message):
        call(native)


def test_store_kv_writes_the_rows_index_put_writes(native):
    """Each token's K and V rows land in their slots, as ``cache[loc] = rows`` puts them, from rows
    a token stride apart (a slice of SGLang's fused qkv); the other rows keep their values."""
    k_cache, v_cache = _randn(20, 2, 8, seed=1), _randn(20, 2, 8, seed=2)
    qkv = _randn(3, 3, 2, 8, seed=3)
    k, v, loc = qkv[:, 1], qkv[:, 2], torch.tensor([7, 0, 19])
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k[loc], want_v[loc] = k, v
    native.store_kv(k, v, k_cache, v_cache, loc)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    native.store_kv(k[:0], v[:0], k_cache, v_cache, loc[:0])  # no token: nothing to store
    assert torch.equal(k_cache, want_k)


def test_store_kv_refuses_a_bad_slot_before_writing_any_row(native):
    k_cache, v_cache = torch.zeros(20, 2, 8, dtype=torch.bfloat16), torch.zeros(20, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="token 1 has slot 20"):
        native.store_kv(torch.ones(2, 2, 8, dtype=torch.bfloat16), torch.ones(2, 2, 8, dtype=torch.bfloat16),
                        k_cache, v_cache, torch.tensor([3, 20]))
    assert not k_cache.any() and not v_cache.any()


def _try_calls(make):
    """Each try_ op's call over SGLang-shaped tensors ``make(*shape)`` makes, and the tensors it
    writes: q [2, 2 heads * 64], k [2, 64], norm weights [64], caches [8, 1, 64]."""
    positions, slots = torch.tensor([0, 5]), torch.tensor([1, 6])
    table, pool, lengths = torch.zeros(1, 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), torch.ones(2).long()
    caches, out = (make(8, 1, 64), make(8, 1, 64)), make(2, 2, 64)
    return {
        "try_fused_add_rmsnorm": ((x := make(2, 64), residual := make(2, 64), make(64), 1e-6), (x, residual)),
        "try_qk_rmsnorm": ((q := make(2, 128), k := make(2, 64), make(64), make(64), 1e-6, 1e-6), (q, k)),
        "try_rotary_neox_at": ((positions, make(2, 128), make(2, 64), make(8, 64)), ()),
        "try_decode_attention_paged": ((make(2, 2, 64), *caches, table, pool, lengths, 1.0, out), (out,)),
        "try_store_kv": ((make(2, 1, 64), make(2, 1, 64), *caches, slots), caches),
    }


@pytest.mark.parametrize("op", ["try_fused_add_rmsnorm", "try_qk_rmsnorm", "try_rotary_neox_at",
                                "try_decode_attention_paged", "try_store_kv"])
def test_a_try_op_refuses_tensors_off_the_cpu_or_needing_grad_and_writes_nothing(native, op):
    """SGLang's hooks call the try_ ops in place of a Python check: a call the kernels may not take
    (tensors off the CPU; tensors that need grad, as the ops have no autograd) is refused, nothing
    written, and the hook runs SGLang's code; the same call on plain CPU tensors runs the op."""
    def make(device="cpu", grad=False):
        return lambda *shape: torch.full(shape, 0.5, dtype=torch.bfloat16, device=device, requires_grad=grad)

    assert getattr(native, op)(*_try_calls(make(device="meta"))[op][0]) in (False, [])
    args, written = _try_calls(make(grad=True))[op]
    before = [t.clone() for t in written]
    with torch.enable_grad():
        assert getattr(native, op)(*args) in (False, [])
    assert all(torch.equal(t, b) for t, b in zip(written, before, strict=True))
    with torch.no_grad():
        assert getattr(native, op)(*args) not in (False, [])


def test_a_try_op_still_raises_for_an_index_outside_the_cache(native):
    """A covered call with a slot past the cache is an error, as in store_kv, not a refusal: SGLang's
    own store would write out of bounds or raise as well."""
    k_cache, v_cache = torch.zeros(20, 2, 8, dtype=torch.bfloat16), torch.zeros(20, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="token 1 has slot 20"):
        native.try_store_kv(torch.ones(2, 2, 8, dtype=torch.bfloat16), torch.ones(2, 2, 8, dtype=torch.bfloat16),
                            k_cache, v_cache, torch.tensor([3, 20]))
    assert not k_cache.any() and not v_cache.any()


NAN, INF = float("nan"), float("inf")
# Rows whose top-1 is decided by torch.argmax's rules: the first of equal maxima, the first NaN
# wherever it stands, -0.0 equal to +0.0, infinities, a row of one value.
TOP1_RULES = ([1, 3, 3, 2], [NAN, 1, NAN], [1, NAN, 5, NAN], [-INF, -INF], [-0.0, 0.0, -1], [-1, 0.0, -0.0],
              [INF, INF, 1], [2], [-INF, NAN])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 151936), (3, 1000), (2, 1), (17,), (2, 3, 65)])
def test_top1_is_torch_argmax(native, dtype, shape):
    """Random rows (BF16's 8 bits give a 151,936-logit row tied maxima), each row's max copied to a
    later place, and rows read as a slice of wider ones."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)
    assert torch.equal(native.top1(x), torch.argmax(x, -1))
    x[..., -1] = x.max(-1).values
    assert torch.equal(native.top1(x), torch.argmax(x, -1))
    wide = torch.randn(*shape[:-1], shape[-1] + 7, generator=torch.Generator().manual_seed(1)).to(dtype)
    assert torch.equal(native.top1(wide[..., :shape[-1]]), torch.argmax(wide[..., :shape[-1]], -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("row", TOP1_RULES, ids=str)
def test_top1_follows_argmax_rules(native, dtype, row):
    x = torch.tensor([row], dtype=dtype)
    assert native.top1(x).tolist() == torch.argmax(x, -1).tolist()


@pytest.mark.parametrize("shape", [(1, 151936), (3, 1000), (2, 1), (17,), (2, 3, 65), (0, 8)])
def test_widen_is_torchs_float(native, shape):
    """Random rows widened as torch's .float() widens them, bit for bit, and rows read as a slice
    of wider ones."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).bfloat16()
    got = native.widen(x)
    assert got.dtype is torch.float32 and got.is_contiguous() and torch.equal(got.view(torch.int32),
                                                                                x.float().view(torch.int32))
    wide = torch.randn(*shape[:-1], shape[-1] + 7, generator=torch.Generator().manual_seed(1)).bfloat16()
    assert torch.equal(native.widen(wide[..., :shape[-1]]).view(torch.int32),
                       wide[..., :shape[-1]].float().view(torch.int32))


def test_widen_keeps_every_bf16_bit_pattern(native):
    """All 65,536 BF16 bit patterns (NaN payloads, infinities, subnormals, -0.0), as torch's
    .float() widens them, bit for bit."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).view(256, 256)
    assert torch.equal(native.widen(every).view(torch.int32), every.float().view(torch.int32))


@pytest.mark.parametrize("shape", [(1, 1, 1024), (3, 17), (2, 3, 65), (1,)])
def test_residual_add_is_torchs_bf16_add(native, shape):
    """Random rows, and rows read as slices of wider ones, added as torch adds BF16 (one rounding of
    the FP32 sum), bit for bit but a NaN's: with infinities, a NaN, inf - inf and a sum past BF16's
    range."""
    a, b = _randn(*shape[:-1], shape[-1] + 2, seed=1) * 8, _randn(*shape[:-1], shape[-1] + 3, seed=2) * 8
    a, b = a[..., :shape[-1]], b[..., :shape[-1]]
    flat_a, flat_b = a.reshape(-1, shape[-1]), b.reshape(-1, shape[-1])
    for i, (x, y) in enumerate([(INF, 1.0), (INF, -INF), (NAN, 2.0), (3.0e38, 3.0e38)][:shape[-1]]):
        flat_a[0, i], flat_b[0, i] = x, y
    a, b = flat_a.view(*shape), flat_b.view(*shape)
    got, want = native.residual_add(a, b), a + b
    assert got.is_contiguous() and got.shape == a.shape
    # NaN where torch's is NaN (its vectorised add gives another NaN's bits than its scalar one).
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got.masked_fill(nan, 0).view(torch.int16), want.masked_fill(nan, 0).view(torch.int16))


def test_a_layers_residual_add_takes_the_kernel_only_where_it_covers_the_call(native, monkeypatch):
    added = []
    monkeypatch.setattr(fused, "residual_add", lambda a, b: added.append(tuple(a.shape)) or native.residual_add(a, b))
    a = _randn(2, 8, seed=1)
    assert torch.equal(fused._hf_residual_add(a, a), a + a) and added == [(2, 8)]
    grad = a.clone().requires_grad_()
    scalar = torch.tensor(1.5, dtype=torch.bfloat16)
    # float32, a broadcast, strided, autograd, 0-d
    for x, y in [(a.float(), a.float()), (a, a[:1]), (a.t(), a.t()), (grad, a), (scalar, scalar)]:
        assert torch.equal(fused._hf_residual_add(x, y), x + y)
    assert added == [(2, 8)]
    assert fused._hf_residual_add(grad, a).requires_grad


def test_argmax_takes_the_kernel_only_where_it_covers_the_call(native, monkeypatch):
    ran = []
    monkeypatch.setattr(fused, "top1", lambda x: ran.append(tuple(x.shape)) or native.top1(x))
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(4))
    covered = [((x, -1), {}), ((x,), {"dim": 1}), ((x.bfloat16(),), {"dim": -1})]
    others = [((x, 0), {}), ((x,), {}), ((x, -1, True), {}), ((x.half(), -1), {}), ((x.double(), -1), {}),
              ((x[:, ::2], -1), {})]
    for args, kwargs in covered + others:
        assert torch.equal(fused.argmax(*args, **kwargs), torch.argmax(*args, **kwargs)), (args, kwargs)
    out = torch.empty(3, dtype=torch.long)
    fused.argmax(x, -1, out=out)
    assert torch.equal(out, torch.argmax(x, -1))
    assert ran == [(3, 50)] * len(covered)


def test_hf_greedy_generation_takes_the_top1(native, monkeypatch):
    """The model's own _sample, rebound: each new token is the kernel's top-1, and the tokens are
    the same; transformers' GenerationMixin keeps its code for every other model."""
    from transformers.generation.utils import GenerationMixin

    model = tiny.build_model("llama", seed=0)
    prompt = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(3))
    original = GenerationMixin._sample

    def generate():
        with torch.inference_mode():
            return model.generate(prompt, max_new_tokens=4, do_sample=False, min_new_tokens=4)

    as_built = generate()
    picked = []
    monkeypatch.setattr(fused, "top1", lambda x: picked.append(tuple(x.shape)) or native.top1(x))
    assert fused.install_hf(model)["top1"] == 1
    assert torch.equal(generate(), as_built)
    assert picked == [(1, model.config.vocab_size)] * 4
    assert GenerationMixin._sample is original and original.__globals__["torch"] is torch
    fused.take_back(model)
    picked.clear()
    generate()
    assert picked == []


def test_sglangs_sampler_takes_the_top1_once(monkeypatch):
    """SGLang's Sampler.forward, rebound once per process: its torch.argmax is the kernel's, every
    other name its module's torch, and SGLang's module keeps torch."""
    from sglang.srt.layers.sampler import Sampler

    from sglang_rvv.srt import fused as srt_fused

    original = Sampler.forward
    monkeypatch.setattr(Sampler, "forward", original)  # put back after the test
    assert srt_fused._give_top1() and srt_fused._give_top1()
    hooked = Sampler.forward
    assert hooked.sglang_rvv_original is original and hooked.__code__ is original.__code__
    seen = hooked.__globals__["torch"]
    assert seen.argmax is fused.argmax and seen.float32 is torch.float32 and seen.nn is torch.nn
    assert original.__globals__["torch"] is torch


def test_sglangs_logits_are_widened_by_the_kernel_once(native, monkeypatch):
    """SGLang's LogitsProcessor._copy_logits_to_buffer, hooked once per process: BF16 logits padded
    past the vocabulary come back FP32, cut to it, the same bits as the original's .float(); into a
    graph's buffer too; FP32 logits and a call the kernel does not cover go to the original alone."""
    from types import SimpleNamespace

    from sglang.srt.layers.logits_processor import LogitsProcessor

    from sglang_rvv.srt import fused as srt_fused

    original = LogitsProcessor._copy_logits_to_buffer
    monkeypatch.setattr(LogitsProcessor, "_copy_logits_to_buffer", original)  # put back after the test
    widened = []
    monkeypatch.setattr(fused, "widen", lambda x: widened.append(tuple(x.shape)) or native.widen(x))
    srt_fused._give_widen()
    srt_fused._give_widen()
    hooked = LogitsProcessor._copy_logits_to_buffer
    assert hooked.sglang_rvv_original is original
    processor = SimpleNamespace(vocab_size=1000)
    logits = torch.randn(2, 1024, generator=torch.Generator().manual_seed(5)).bfloat16()
    no_buffer = SimpleNamespace(next_token_logits_buffer=None)
    want = original(processor, logits, no_buffer)
    got = hooked(processor, logits, no_buffer)
    assert got.dtype is torch.float32 and got.shape == (2, 1000) and torch.equal(got, want)
    buffer = torch.empty(2, 1000)
    got = hooked(processor, logits, SimpleNamespace(next_token_logits_buffer=buffer))
    assert got is buffer and torch.equal(buffer, want)
    assert widened == [(2, 1000)] * 2
    for other in (logits.float(), logits.half(), logits[:, ::2]):
        assert torch.equal(hooked(processor, other, no_buffer), original(processor, other, no_buffer))
    assert widened == [(2, 1000)] * 2


def test_sglangs_kv_pool_stores_rows_by_the_op_once(native, monkeypatch):
    """SGLang's MHATokenToKVPool._store_kv_layer, rebound once per process: its _set_kv_buffer_impl
    is the row store where that covers the call, SGLang's own otherwise, and the cache rows are the
    same either way; SGLang's module keeps its function."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache import memory_pool
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from sglang_rvv.srt import fused as srt_fused

    original = MHATokenToKVPool._store_kv_layer
    monkeypatch.setattr(MHATokenToKVPool, "_store_kv_layer", original)  # put back after the test
    stored = []

    def store(*args):
        covered = native.try_store_kv(*args)
        stored.append((tuple(args[0].shape), covered))
        return covered
    monkeypatch.setattr(fused.NATIVE, "try_store_kv", store)
    assert srt_fused._give_kv_store() and srt_fused._give_kv_store()
    hooked = MHATokenToKVPool._store_kv_layer
    assert hooked.sglang_rvv_original is original and hooked.__code__ is original.__code__
    assert original.__globals__["_set_kv_buffer_impl"] is memory_pool._set_kv_buffer_impl

    def pool():
        return SimpleNamespace(kv_cache_layout="nhd", k_buffer=[_randn(20, 2, 8, seed=1)],
                               v_buffer=[_randn(20, 2, 8, seed=2)], row_dim=16, v_row_dim=16,
                               store_dtype=torch.bfloat16, device_module=torch.cpu, size=19, page_size=1,
                               alt_stream=None)
    for k, v, loc in [(_randn(2, 2, 8, seed=3), _randn(2, 2, 8, seed=4), torch.tensor([5, 11])),
                      (_randn(2, 2, 8, seed=3), _randn(2, 2, 8, seed=4), torch.tensor([5, 11], dtype=torch.int32))]:
        ours, theirs = pool(), pool()
        hooked(ours, 0, loc, k, v)
        original(theirs, 0, loc, k, v)
        assert torch.equal(ours.k_buffer[0], theirs.k_buffer[0]) and torch.equal(ours.v_buffer[0], theirs.v_buffer[0])
    assert stored == [((2, 2, 8), True), ((2, 2, 8), False)]  # the int32 slots went to SGLang's own store


def _logits(model, prompt):
    """The logits of the prompt's prefill and of one decode step after it (the decode attention)."""
    with torch.inference_mode():
        out = model(prompt[:, :-1], use_cache=True)
        step = model(prompt[:, -1:], past_key_values=out.past_key_values, use_cache=True)
        return torch.cat([out.logits, step.logits], dim=1)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_hf_modules_get_the_kernels_and_keep_the_logits(native, arch, monkeypatch):
    """The logits agree within the kernels' roundings (a random tiny model's near-tied logits may
    swap a greedy token: the same-tokens check is on the real default model, test_default_model.py).
    Each module's kernel is watched here, so the decode step goes through the modules, not the
    layer's one-frame step (the same kernels: tests/integration/test_hf_step.py)."""
    monkeypatch.setattr(hf_step, "_step", lambda *args: None)
    model = tiny.build_model(arch, seed=0)
    prompt = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(2))
    as_built = _logits(model, prompt)
    attended, added = [], []
    def spy(*args):
        attended.append(tuple(args[0].shape))
        return native.decode_attention(*args)
    monkeypatch.setattr(fused, "decode_attention", spy)
    monkeypatch.setattr(fused, "residual_add", lambda a, b: added.append(tuple(a.shape)) or native.residual_add(a, b))
    modeling = sys.modules[type(model).__module__]
    original_rotary = modeling.apply_rotary_pos_emb
    classes = {name: type(m) for name, m in model.named_modules()}
    given = fused.install_hf(model)
    layers = model.config.num_hidden_layers
    norms = 2 * layers + 1 + (2 * layers if arch == "qwen3" else 0)  # Qwen3 adds q_norm and k_norm
    assert given == {"attention": layers, "rmsnorm": norms, "rotary": layers, "silu_mul": layers, "top1": 1,
                     "kv_cache": layers, "residual_add": layers, "layer_step": layers, "layer_list": 1}
    assert _sqnr_db(_logits(model, prompt), as_built) > 30
    # The prefill's attention (6 queries) is transformers' own; the decode step's runs the kernel.
    heads, d = model.config.num_attention_heads, model.config.head_dim
    assert len(attended) == layers and set(attended) == {(1, heads, 1, d)}
    # Each layer's two residual adds run the kernel, in the prefill (5 tokens) and the decode step.
    hidden = model.config.hidden_size
    assert added == [(1, 5, hidden)] * 2 * layers + [(1, 1, hidden)] * 2 * layers
    # The attention's rotary is rebound in its own copy of the forward: transformers' module keeps its
    # function, so another model in the process runs it unchanged.
    assert modeling.apply_rotary_pos_emb is original_rotary
    other = tiny.build_model(arch, seed=1)
    assert all("forward" not in m.__dict__ for m in other.modules())
    # Each given module is called without nn.Module.__call__ (direct_call), under its class's name;
    # the decoder layers keep transformers' own __call__ (gradient checkpointing's).
    given_modules = [m for m in model.modules() if fused.MARK_ATTR in m.__dict__ and m is not model.model.layers]
    assert given_modules and all(isinstance(m, DirectCall) != (m in model.model.layers) for m in given_modules)
    assert type(model.model.layers) is hf_step.LayerList  # the layer list: its slice kept (test_hf_step.py)
    assert all(type(m).__name__ == classes[n].__name__ for n, m in model.named_modules())
    # Taken back: every module runs its class's forward again, as its own class.
    # (An attention is one module; the model itself was given its greedy sampling.)
    assert sum(fused.take_back(m) for m in model.modules()) == norms + 3 * layers + 2
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert {name: type(m) for name, m in model.named_modules()} == classes


def test_sglang_modules_get_the_kernels_and_skip_module_call(native, monkeypatch):
    """SGLang's RMSNorm and SiluAndMul, given the kernels, are called without nn.Module.__call__
    (direct_call) and give their own forward's result within one rounding; taken back, they are
    their classes again."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm

    from sglang_rvv.srt import fused as srt_fused

    model = torch.nn.Sequential(RMSNorm(256), SiluAndMul()).requires_grad_(False)  # as SGLang loads it
    model[0].weight.data = _randn(256, seed=3)
    x, gate_up = _randn(3, 256, seed=4), _randn(3, 512, seed=5)
    as_built = model[0](x), model[1](gate_up)
    classes = [type(m) for m in model]
    ran = []

    def spy(name):
        op = getattr(fused, name)
        return lambda *args: ran.append(name) or op(*args)

    for name in ("rms_norm", "silu_and_mul"):
        monkeypatch.setattr(fused, name, spy(name))
    assert srt_fused.install_sglang(model) == {"rmsnorm": 1, "silu_mul": 1}
    assert all(isinstance(m, DirectCall) and type(m).__name__ == c.__name__
               for m, c in zip(model, classes, strict=True))
    for got, want in zip((model[0](x), model[1](gate_up)), as_built, strict=True):
        assert _sqnr_db(got, want) > 40
    assert ran == ["rms_norm", "silu_and_mul"]
    assert sum(fused.take_back(m) for m in model) == 2
    assert [type(m) for m in model] == classes


def test_sglang_rotary_takes_the_kernel_at_its_positions(native, monkeypatch):
    """SGLang's RotaryEmbedding (Qwen3-0.6B's head), given the kernels, rotates the query and key
    split from one qkv row by one native call, within one rounding of its own forward_native; a
    rotary of part of the head keeps SGLang's code."""
    from sglang.srt.layers.rotary_embedding import base
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    from sglang_rvv.srt import fused as srt_fused

    monkeypatch.setattr(base, "_is_cpu", True)  # as the appliance imports it (SGLANG_USE_CPU_ENGINE=1)
    ran = []
    monkeypatch.setattr(fused.NATIVE, "try_rotary_neox_at",
                        lambda *args: ran.append(args[0]) or native.try_rotary_neox_at(*args))
    whole, part = (RotaryEmbedding(128, dim, 4096, 1e6, True, torch.bfloat16) for dim in (128, 64))
    qkv = _randn(3, (16 + 2 * 8) * 128, seed=9)
    q, k, _ = qkv.split([16 * 128, 8 * 128, 8 * 128], dim=-1)
    positions = torch.tensor([0, 17, 4095])
    wants = [rope.forward_native(positions, q.clone(), k.clone()) for rope in (whole, part)]
    assert srt_fused.install_sglang(torch.nn.Sequential(whole, part)) == {"rotary": 2}
    for rope, want in zip((whole, part), wants, strict=True):
        got = rope(positions, q, k)
        assert got[0].shape == q.shape and got[1].shape == k.shape
        assert _sqnr_db(got[0], want[0]) > 40 and _sqnr_db(got[1], want[1]) > 40
    assert len(ran) == 1 and ran[0] is positions  # the whole head only
    assert whole(positions.int(), q, k)[0].shape == q.shape and len(ran) == 2  # int32 positions: refused, SGLang's


class _Projection(torch.nn.Module):
    """A projection as SGLang's linear layers return it, ``(output, bias)``: the MLP's children."""

    def __init__(self, out_features: int, in_features: int, seed: int):
        super().__init__()
        self.weight = torch.nn.Parameter(_randn(out_features, in_features, seed=seed), requires_grad=False)

    def forward(self, x, forward_batch=None):
        return F.linear(x, self.weight), None


def test_sglang_model_code_reads_its_children_from_modules(native):
    """SGLang's LlamaMLP.forward (its own source, compiled again) reads its children from
    ``_modules`` (no child name left to look up), gives its class's forward's bits, uses a child
    replaced by ``setattr``, and is taken back."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.models.llama import LlamaMLP

    from sglang_rvv.srt import fused as srt_fused

    mlp = LlamaMLP.__new__(LlamaMLP)  # SGLang's constructor needs its tensor-parallel groups
    torch.nn.Module.__init__(mlp)
    mlp.gate_up_proj, mlp.down_proj, mlp.act_fn = _Projection(128, 32, 1), _Projection(32, 64, 2), SiluAndMul()
    mlp.requires_grad_(False)
    x = _randn(3, 32, seed=3)
    assert srt_fused.install_sglang(mlp) == {"children": 1, "silu_mul": 1}
    given, original = mlp.__dict__["forward"].__func__.__code__, LlamaMLP.forward.__code__
    children = {"gate_up_proj", "act_fn", "down_proj"}
    assert set(given.co_names) == set(original.co_names) - children | {"_modules"}
    assert isinstance(mlp, DirectCall) and type(mlp).__name__ == "LlamaMLP"
    assert torch.equal(mlp(x), LlamaMLP.forward(mlp, x))
    mlp.down_proj = _Projection(32, 64, 4)
    assert torch.equal(mlp(x), LlamaMLP.forward(mlp, x))
    assert fused.take_back(mlp) and type(mlp) is LlamaMLP and "forward" not in mlp.__dict__


def test_sglang_qwen3_attention_norms_q_and_k_in_one_call(native, monkeypatch):
    """SGLang's Qwen3Attention.forward_prepare_native (its own source, compiled again) norms q and
    k in place by one native call instead of apply_qk_norm's copies and two norm calls: the same
    bits as its class's method over the same modules. Norms that are not plain keep apply_qk_norm."""
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import base
    from sglang.srt.models import utils
    from sglang.srt.models.qwen3 import Qwen3Attention

    from sglang_rvv.srt import fused as srt_fused

    monkeypatch.setattr(base, "_is_cpu", True)  # as the appliance imports it (SGLANG_USE_CPU_ENGINE=1)
    attention = Qwen3Attention.__new__(Qwen3Attention)  # SGLang's constructor needs its tensor-parallel groups
    torch.nn.Module.__init__(attention)
    attention.q_size, attention.kv_size, attention.head_dim, attention.alt_stream = 4 * 64, 2 * 64, 64, None
    attention.qkv_proj = _Projection(8 * 64, 96, 1)
    attention.q_norm, attention.k_norm = RMSNorm(64, eps=1e-6), RMSNorm(64, eps=1e-6)
    attention.q_norm.weight.data, attention.k_norm.weight.data = _randn(64, seed=2), _randn(64, seed=3)
    attention.rotary_emb = base.RotaryEmbedding(64, 64, 4096, 1e6, True, torch.bfloat16)
    attention.requires_grad_(False)
    positions, x = torch.tensor([3, 9]), _randn(2, 96, seed=4)
    ran = []
    monkeypatch.setattr(fused.NATIVE, "try_qk_rmsnorm", lambda *args: ran.append("qk") or native.try_qk_rmsnorm(*args))
    given = srt_fused.install_sglang(attention)
    assert given == {"children": 1, "qk_norm": 1, "rmsnorm": 2, "rotary": 1}
    got = attention.forward_prepare_native(positions, x)
    want = Qwen3Attention.forward_prepare_native(attention, positions, x)  # apply_qk_norm, the norms given the kernels
    assert ran == ["qk"] and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    original = utils.apply_qk_norm
    monkeypatch.setattr(utils, "apply_qk_norm", lambda *args: ran.append("sglang") or original(*args))
    attention.k_norm.fp32_residual = True  # not the plain norm: SGLang's apply_qk_norm takes it
    again = attention.forward_prepare_native(positions, x)
    assert ran == ["qk", "sglang"] and all(_sqnr_db(g, w) > 40 for g, w in zip(again, want, strict=True))


def test_a_module_given_two_methods_gets_both_back():
    """An attention's forward and the method it calls, both given: both are taken back, and the
    module is its class again."""
    module = torch.nn.Linear(2, 2)
    cls, forward = type(module), module.forward
    fused.give_forward(module, lambda self, x: "given", attr="forward")
    fused.give_forward(module, lambda self: "prepared", attr="forward_prepare")
    assert module(1) == "given" and module.forward_prepare() == "prepared" and isinstance(module, DirectCall)
    assert fused.take_back(module) and not fused.take_back(module)
    assert type(module) is cls and module.forward == forward and not hasattr(module, "forward_prepare")


def test_a_module_tensor_is_its_parameter_its_buffer_or_its_attribute():
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(torch.ones(2))
    module.register_buffer("table", torch.zeros(3), persistent=False)
    module.plain = torch.full((1,), 7.0)
    assert fused.module_tensor(module, "weight") is module.weight
    assert fused.module_tensor(module, "table") is module.table
    assert fused.module_tensor(module, "plain") is module.plain
    module.weight = torch.nn.Parameter(torch.zeros(2))  # replaced: the live one is read
    assert fused.module_tensor(module, "weight") is module._parameters["weight"]
    with pytest.raises(AttributeError):
        fused.module_tensor(module, "missing")


def test_a_decoder_layer_forward_is_rewritten_only_with_its_residual_adds():
    """The rewritten forward is transformers' own code with its two additions made calls and its
    children read from ``_modules``; a forward that adds in another order keeps its own (the
    refusals of source that is not the code are recompile's, tests/unit/test_recompile.py)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    children = frozenset(("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"))
    rewritten = fused._hf_layer_forward(Qwen3DecoderLayer, children)
    original = Qwen3DecoderLayer.forward.__code__
    assert set(rewritten.__code__.co_names) == set(original.co_names) - children | {"_sglang_rvv_residual_add",
                                                                                     "_modules"}
    assert rewritten.__code__.co_varnames == original.co_varnames
    assert rewritten.__code__.co_filename == original.co_filename

    class OtherOrder(Qwen3DecoderLayer):
        def forward(self, hidden_states, **kwargs):
            residual = hidden_states
            return hidden_states + residual

    assert fused._hf_layer_forward(OtherOrder, children) is None


def test_a_call_the_kernels_do_not_take_runs_the_modules_own_code(native):
    model = tiny.build_model("llama", seed=0)
    fused.install_hf(model)
    norm = model.model.norm
    x = torch.randn(2, 3, model.config.hidden_size)  # float32: not the kernels'
    assert torch.equal(norm(x), type(norm).forward(norm, x))


def test_off_x86_and_a_library_without_the_kernels_fall_back_with_a_reason(native, monkeypatch, caplog):
    fused.available.cache_clear()
    try:
        ok, why = fused.available()
        assert not ok and "provider generic" in why  # x86: the fused kernels are the rvv provider's
        fused.available.cache_clear()
        monkeypatch.setenv(fused.ENV_VAR, "0")
        assert fused.available() == (False, f"turned off by {fused.ENV_VAR}=0")
        # The policy's install then leaves every module as built, and says why.
        model = tiny.build_model("llama", seed=0)
        given, reason = fused.install(model, fused.install_hf, enabled=True)
        assert given == {} and reason == f"turned off by {fused.ENV_VAR}=0"
        assert all(fused.MARK_ATTR not in m.__dict__ for m in model.modules())
    finally:
        fused.available.cache_clear()


def test_a_library_without_the_kernels_warns_once_and_keeps_torchs_ops(native, monkeypatch, caplog):
    """An rvv provider whose library predates an op (here: one it never had) leaves the modules as
    built, with one warning line that names the op and the fix."""
    class OldLibrary:
        NAME = "rvv"

    monkeypatch.setattr(fused, "chosen", lambda: (OldLibrary, "test"))
    monkeypatch.setattr(fused, "NATIVE_OPS", (*fused.NATIVE_OPS, "rope_from_the_future"))
    fused.available.cache_clear()
    try:
        model = tiny.build_model("llama", seed=0)
        with caplog.at_level("WARNING", logger="sglang_rvv"):
            given, reason = fused.install(model, fused.install_hf, enabled=True)
            fused.install(model, fused.install_hf, enabled=True)  # asked again: no second line
        assert given == {} and "sglang_rvv_native::rope_from_the_future" in reason
        assert "build-kernels.sh" in reason
        assert [r.getMessage() for r in caplog.records] == [f"sglang_rvv: {reason}"]
    finally:
        fused.available.cache_clear()


def _bf16(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=torch.bfloat16)


# Shapes the kernels do not cover, by name: each is refused before any kernel runs (a Python check,
# or the library's try_ op, given the native ops), so the module's own torch code takes the call
# (test_a_call_the_kernels_do_not_take_runs_the_modules_own_code).
UNCOVERED = {
    "a norm weight of another size than the hidden": lambda n: fused.servable(_bf16(1, 576), _bf16(575)),
    "an odd rotary head dim": lambda n: fused.rotary_servable(_bf16(1, 2, 1, 63), _bf16(1, 2, 1, 63),
                                                            _bf16(1, 1, 32), _bf16(1, 1, 32)),
    "a rotary table shorter than half the head": lambda n: fused.rotary_servable(
        _bf16(1, 2, 1, 64), _bf16(1, 2, 1, 64), _bf16(1, 1, 31), _bf16(1, 1, 31)),
    "an odd rotary cache (SGLang's layout)": lambda n: n.try_rotary_neox_at(
        torch.zeros(1, dtype=torch.int64), _bf16(1, 2 * 63), _bf16(1, 63), _bf16(8, 63)),
    "SGLang's query of part-heads": lambda n: n.try_rotary_neox_at(
        torch.zeros(1, dtype=torch.int64), _bf16(1, 96), _bf16(1, 64), _bf16(8, 64)),
    "int32 positions": lambda n: n.try_rotary_neox_at(
        torch.zeros(1, dtype=torch.int32), _bf16(1, 128), _bf16(1, 64), _bf16(8, 64)),
    "a GQA ratio that is not whole (3 query heads on 2)": lambda n: fused.attention_servable(
        _bf16(1, 3, 1, 64), _bf16(1, 2, 5, 64), _bf16(1, 2, 5, 64)),
    "keys of another head dim than the query": lambda n: fused.attention_servable(
        _bf16(1, 4, 1, 64), _bf16(1, 2, 5, 32), _bf16(1, 2, 5, 32)),
    "more than one query": lambda n: fused.attention_servable(_bf16(1, 4, 2, 64), _bf16(1, 2, 5, 64),
                                                              _bf16(1, 2, 5, 64)),
    "a paged GQA ratio that is not whole": lambda n: n.try_decode_attention_paged(
        _bf16(1, 3, 64), _bf16(8, 2, 64), _bf16(8, 2, 64), torch.zeros(1, 8, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.int64), 1.0, _bf16(1, 3, 64)),
    "QK norm weights of two head dims": lambda n: n.try_qk_rmsnorm(_bf16(1, 128), _bf16(1, 64), _bf16(64), _bf16(32),
                                                                  1e-6, 1e-6),
    "a residual of another shape": lambda n: n.try_fused_add_rmsnorm(_bf16(2, 64), _bf16(1, 64), _bf16(64), 1e-6),
    "a KV cache of another dtype": lambda n: n.try_store_kv(_bf16(1, 2, 8), _bf16(1, 2, 8), torch.zeros(4, 2, 8),
                                                           torch.zeros(4, 2, 8), torch.zeros(1, dtype=torch.int64)),
}


@pytest.mark.parametrize("case", list(UNCOVERED))
def test_a_shape_the_kernels_do_not_cover_is_refused_before_they_run(native, case):
    assert UNCOVERED[case](native) in (False, [])


def test_the_covered_neighbours_of_those_shapes_are_taken(native):
    """The same checks pass a shape one step away, so the refusals above are the shapes', not the checks'."""
    assert fused.servable(_bf16(1, 576), _bf16(576))
    assert fused.rotary_servable(_bf16(1, 2, 1, 64), _bf16(1, 2, 1, 64), _bf16(1, 1, 32), _bf16(1, 1, 32))
    assert len(native.try_rotary_neox_at(torch.zeros(1, dtype=torch.int64), _bf16(1, 128), _bf16(1, 64),
                                         _bf16(8, 64))) == 2
    assert fused.attention_servable(_bf16(1, 4, 1, 64), _bf16(1, 2, 5, 64), _bf16(1, 2, 5, 64))
    assert native.try_decode_attention_paged(_bf16(1, 4, 64), _bf16(8, 2, 64), _bf16(8, 2, 64),
                                             torch.zeros(1, 8, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                                             torch.ones(1, dtype=torch.int64), 1.0, _bf16(1, 4, 64))
    assert native.try_qk_rmsnorm(_bf16(1, 128), _bf16(1, 64), _bf16(64), _bf16(64), 1e-6, 1e-6)
    assert native.try_fused_add_rmsnorm(_bf16(2, 64), _bf16(2, 64), _bf16(64), 1e-6)
    assert native.try_store_kv(_bf16(1, 2, 8), _bf16(1, 2, 8), _bf16(4, 2, 8), _bf16(4, 2, 8),
                               torch.zeros(1, dtype=torch.int64))
