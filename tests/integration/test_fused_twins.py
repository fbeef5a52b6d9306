"""The fused kernels of the rest of a decode step (RMSNorm, fused residual-add + RMSNorm, SiLU x
mul, the rotary embedding, the decode attention, the residual add, the logits' top-1 and widening,
and SGLang's KV store), as their scalar twins built for this host, against an fp64 reference or
torch's own op on the shapes of the benchmark models, and their refusals. Where they plug into
transformers' modules and SGLang's: tests/integration/test_fused_plugs.py.

The RVV kernels are held to these twins bit for bit under qemu (tests/images/test_rvv_kernels.py).
"""

from __future__ import annotations

import host_kernels
import pytest
import torch
import torch.nn.functional as F

from sglang_rvv import fused
from support import sqnr_db


@pytest.fixture(scope="module")
def native():
    return host_kernels.ops()


_randn = host_kernels.bf16_randn
_bf16 = host_kernels.bf16_zeros


@pytest.mark.parametrize("d", [1, 17, 128, 576, 1024, 1536, 2048])
def test_rmsnorm_is_one_rounding_of_the_fp64_norm(native, d):
    x, weight = _randn(7, d, seed=d), _randn(d, seed=d + 1)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    out = native.rmsnorm(x, weight, 1e-6)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert sqnr_db(out, ref) > 45  # BF16's 8 bits: one rounding is ~50 dB
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
    assert sqnr_db(out, F.silu(gate.double()) * up.double()) > 45


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
    assert sqnr_db(q_out, _rotate_fp64(q, cos, sin)) > 45 and sqnr_db(k_out, _rotate_fp64(k, cos, sin)) > 45
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
    assert sqnr_db(out, _attention_fp64(q, k, v, scale)) > 45
    assert torch.equal(out, native.decode_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale))


def test_decode_attention_keeps_a_nan_and_ignores_nothing(native):
    """A NaN score makes its heads' outputs NaN (as torch's softmax does); -inf scores weigh 0."""
    q, k, v = _randn(1, 4, 1, 16, seed=1), _randn(1, 2, 5, 16, seed=2), _randn(1, 2, 5, 16, seed=3)
    k[0, 0, 2, 0] = float("nan")
    out = native.decode_attention(q, k, v, 0.25)
    assert torch.equal(out.isnan().any(-1), torch.tensor([[[True, True, False, False]]]))
    assert sqnr_db(out[..., 2:, :], _attention_fp64(q, k, v, 0.25)[..., 2:, :]) > 45


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


def test_the_rvv_attention_backends_decode_runs_the_paged_kernel(native, monkeypatch):
    """SGLang's own torch_native decode loop (gather, then torch's sdpa per request) and the RVV
    backend's paged kernel agree within one BF16 rounding; what the kernel does not cover (a
    sliding window) runs SGLang's loop, and so does every call where the kernels do not load."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from sglang_rvv.srt.attention import RvvAttnBackend

    q, k_cache, v_cache, req_to_token, pool, seq_lens = _paged(16, 8, (6, 40), 128, seed=3)
    calls = []
    monkeypatch.setattr(fused.NATIVE, "try_decode_attention_paged",
                        lambda *args: calls.append(1) or native.try_decode_attention_paged(*args))
    backend = object.__new__(RvvAttnBackend)
    backend.kernels = True
    ours, theirs = torch.empty_like(q), torch.empty_like(q)
    backend._run_sdpa_forward_decode(q, ours, k_cache, v_cache, req_to_token, pool, seq_lens, scaling=0.1,
                                     enable_gqa=True)
    TorchNativeAttnBackend._run_sdpa_forward_decode(backend, q, theirs, k_cache, v_cache, req_to_token, pool,
                                                    seq_lens, scaling=0.1, enable_gqa=True)
    assert calls == [1] and sqnr_db(ours, theirs.double()) > 40
    windowed = torch.empty_like(q)
    backend._run_sdpa_forward_decode(q, windowed, k_cache, v_cache, req_to_token, pool, seq_lens, scaling=0.1,
                                     enable_gqa=True, sliding_window_size=4)
    assert calls == [1] and not torch.equal(windowed, ours)
    backend.kernels = False
    stock = torch.empty_like(q)
    backend._run_sdpa_forward_decode(q, stock, k_cache, v_cache, req_to_token, pool, seq_lens, scaling=0.1,
                                     enable_gqa=True)
    assert calls == [1] and torch.equal(stock, theirs)


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
