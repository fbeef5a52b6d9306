"""Checks of the native RVV kernels, run by python3 inside the riscv64 base image (no pytest there).

    python3 rvv_kernel_check.py full|numeric|no-vector [I/N]

``full`` and ``numeric`` run under a QEMU_CPU with V (the kernels are the RVV ones). ``full`` checks
every result against an fp64 reference and the generic provider, plus the provider's fallbacks and
torch.compile; ``numeric``, for further VLENs, computes the same results for their digests only
(the host test requires the same bits as ``full``); with ``I/N`` it runs every N-th of the numeric
cases from the I-th, and every other case. ``no-vector`` runs without V: the provider
falls back to generic, and the library, loaded anyway, runs its scalar twins for the same digests.
The host test (tests/images/test_rvv_kernels.py) mounts the app at /src/app (PYTHONPATH) and
points SGLANG_RVV_KERNELS_LIB at the built library. Prints one JSON line per case,
``{"case": NAME, ...}``, with what the case measured; the host test asserts each line, so a
failure names its case and shape. A case that raises prints ``{"case": NAME, "exception": ...}``
and the others still run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LAYOUT_VERSION = 1
GRID_N = (1, 31, 33, 96, 1000)
GRID_K = (1, 17, 64, 333)  # 333: two K panels of the RVV kernel (256 + 77)
GRID_M = (1, 2, 3, 5, 16, 17, 130)
BUCKET_SHAPE = (100, 70)  # N, K: a 4-column tail block
BUCKET_ROWS = range(1, 131)
REALISTIC = (2048, 2048)
REALISTIC_ROWS = (1, 4, 16)
MANY_ROWS = (96, 64, 300)  # N, K, M: past the largest bucket
PACK_SHAPES = ((1, 1), (31, 7), (33, 333), (1000, 64), (2048, 2048))
# The int8/int4 layouts under qemu: a sample (the exhaustive grid, every M in 1..130, runs through
# the host-built twins in tests/integration/test_kernel_twins.py). Each (layout, group size) at
# the bucket shape for the tile paths (M = 1, 3: one ragged tile; 5, 17: past kSmallRows; 130),
# two K panels with a group across the panel edge (K=333), many blocks at M=1, and the
# realistic shape at M=1 for the default of each layout.
QUANT_CONFIGS = (("int8", 32), ("int8", 0), ("int4", 32), ("int4", 64))
QUANT_SHAPES = tuple((*BUCKET_SHAPE, m) for m in (1, 3, 5, 17, 130)) + ((33, 333, 4), (1000, 333, 1))
QUANT_REALISTIC = (("int8", 0), ("int4", 32))
QUANT_EXACT = (33, 70, 2)  # N, K, M: small enough for layout.quantized_linear_reference under qemu
QUANT_PACK_SHAPES = ((100, 70), (33, 300))
# int4 with int8 activations (packed_int4_a8_linear, on the int4 layout): the quantized sample's
# shapes at two group sizes, the realistic shape at the smallest and largest, and the exact
# reference on rows that hold a NaN, an infinity and values too small to scale.
A8_GROUPS = (32, 64)
A8_REALISTIC_GROUPS = (32, 128)
# The rest of a decode step: rows of d values. d around the 16-lane chains (1, 15..17), the head
# dim and hidden sizes of the benchmark models; 5 rows for the row loop. A chunk past VLMAX at
# every VLEN (1000, 3072) takes several vector passes in the elementwise parts.
FUSED_DIMS = (1, 15, 16, 17, 128, 1000, 1024, 3072)
FUSED_ROWS = (1, 5)
# Rotary embeddings as (batch, q heads, kv heads, seq, head dim, cos/sin batch): Qwen3-0.6B's
# decode, SmolLM2's prefill (q a transpose of [1, 7, 9, 64]), a batch with its own table per row,
# the smallest head, and a half (65) past VLMAX at VLEN 128 and 256.
ROTARY_SHAPES = ((1, 16, 8, 1, 128, 1), (1, 9, 3, 7, 64, 1), (2, 4, 2, 3, 32, 2), (1, 2, 1, 1, 2, 1),
                 (1, 3, 1, 2, 130, 1))
# Decode attentions as (batch, q heads, kv heads, keys, head dim): Qwen3-0.6B's second step, a
# context past VLMAX keys at every VLEN, SmolLM2's GQA of 3, a batch, and one key without GQA.
ATTENTION_SHAPES = ((1, 16, 8, 6, 128), (1, 4, 2, 70, 64), (1, 9, 3, 7, 64), (2, 4, 2, 5, 32), (1, 2, 2, 1, 16))
# SGLang's paged decode attentions as (q heads, kv heads, keys of each request, head dim): Qwen3-0.6B
# with two requests, one past VLMAX keys at every VLEN, and SmolLM2's GQA of 3 with a one-key request.
PAGED_SHAPES = ((16, 8, (6, 70), 128), (9, 3, (7, 1), 64))
# The logits' top-1 over three rows of a vocabulary: Qwen3-0.6B's, a tiny model's, and rows short
# of VLMAX at VLEN 512 and past it at every VLEN; each in FP32 and BF16.
TOP1_VOCABULARIES = (151936, 1000, 70, 5)
FUSED_MIN_SQNR_DB = 40.0  # one BF16 rounding of FP32 arithmetic: ~50 dB; exp's few ulp do not show


def linear_case(n: int, k: int, m: int) -> str:
    return f"linear N={n} K={k} M={m}"


def qlinear_case(name: str, group_size: int, n: int, k: int, m: int) -> str:
    return f"qlinear {name} G={group_size} N={n} K={k} M={m}"


def a8linear_case(group_size: int, n: int, k: int, m: int) -> str:
    return f"a8linear G={group_size} N={n} K={k} M={m}"


MODES = ("full", "numeric", "no-vector")
# The cases whose results are compared bit for bit across runs (the host test's
# test_same_bits_in_every_run), and the ones a sampled run shares out.
NUMERIC_PREFIXES = ("linear ", "qlinear ", "a8linear ", "a8 special", "bucket ", "threads", "rounding",
                    "special values", "norm ", "addnorm ", "silu_mul ", "rotary ", "attention ", "paged attention ",
                    "top1 ", "widen ", "residual_add ")
# Run before sglang_rvv.ops loads the real library: a failed dlopen is only possible while no
# library has registered torch.ops.sglang_rvv_native.
BEFORE_OPS = ("load failure",)


def plan(mode: str, share: str = "") -> list[tuple[str, Callable[[], dict]]]:
    """The cases of a run, in order: (name, function returning the measurements); of the numeric
    ones only ``share``'s ("I/N": every N-th from the I-th) when it is given."""
    return _sample(_plan(mode), share)


def _sample(cases: list, share: str) -> list:
    if not share:
        return cases
    start, step = (int(part) for part in share.split("/"))
    if not 0 <= start < step:
        raise ValueError(f"a share is I/N with 0 <= I < N, not {share!r}")
    numeric = [name for name, _ in cases if name.startswith(NUMERIC_PREFIXES)]
    kept = set(numeric[start::step])
    return [(name, check) for name, check in cases if name in kept or not name.startswith(NUMERIC_PREFIXES)]


def _plan(mode: str) -> list[tuple[str, Callable[[], dict]]]:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    cases: list[tuple[str, Callable[[], dict]]] = []
    if mode == "full":
        cases += [("load failure", check_load_failure)]
    cases += [("env", check_env), ("selection", check_selection), ("kernel isa", check_kernel_isa),
              ("forced rvv", check_forced_rvv)]
    if mode == "full":
        cases += [("torch mismatch", check_torch_mismatch), ("second library", check_second_library),
                  ("ops dispatch", check_ops_dispatch), ("compile", check_compile)]
    cases += [(f"pack N={n} K={k}", lambda n=n, k=k: check_pack(n, k)) for n, k in PACK_SHAPES]
    cases += [(linear_case(n, k, m), lambda n=n, k=k, m=m: check_linear(n, k, m))
              for n in GRID_N for k in GRID_K for m in GRID_M]
    cases += [(linear_case(*REALISTIC, m), lambda m=m: check_linear(*REALISTIC, m)) for m in REALISTIC_ROWS]
    cases += [(linear_case(*MANY_ROWS), lambda: check_linear(*MANY_ROWS))]
    cases += [(f"bucket N={BUCKET_SHAPE[0]} K={BUCKET_SHAPE[1]} M={m}", lambda m=m: check_bucket(m))
              for m in BUCKET_ROWS]
    cases += [("threads", check_threads), ("rounding", check_rounding), ("special values", check_special_values)]
    if mode == "full":
        cases += [("layout refusal", check_layout_refusal), ("compile quantized", check_compile_quantized)]
        cases += [(f"qexact {name} G={g}", lambda name=name, g=g: check_qexact(name, g)) for name, g in QUANT_CONFIGS]
    cases += [(f"qpack {name} G={g} N={n} K={k}", lambda name=name, g=g, n=n, k=k: check_qpack(name, g, n, k))
              for name, g in QUANT_CONFIGS for n, k in QUANT_PACK_SHAPES]
    cases += [(qlinear_case(name, g, *shape), lambda name=name, g=g, shape=shape: check_qlinear(name, g, *shape))
              for name, g in QUANT_CONFIGS for shape in QUANT_SHAPES]
    cases += [(qlinear_case(name, g, *REALISTIC, 1), lambda name=name, g=g: check_qlinear(name, g, *REALISTIC, 1))
              for name, g in QUANT_REALISTIC]
    cases += [(a8linear_case(g, *shape), lambda g=g, shape=shape: check_a8linear(g, *shape))
              for g in A8_GROUPS for shape in QUANT_SHAPES]
    cases += [(a8linear_case(g, *REALISTIC, 1), lambda g=g: check_a8linear(g, *REALISTIC, 1))
              for g in A8_REALISTIC_GROUPS]
    cases += [("a8 special rows", check_a8_special_rows)]
    cases += [(f"{kind} d={d} rows={r}", lambda kind=kind, d=d, r=r: FUSED_CHECKS[kind](d, r))
              for kind in FUSED_CHECKS for d in FUSED_DIMS for r in FUSED_ROWS]
    cases += [(f"rotary {'x'.join(map(str, shape))}", lambda shape=shape: check_rotary(*shape))
              for shape in ROTARY_SHAPES]
    cases += [(f"attention {'x'.join(map(str, shape))}", lambda shape=shape: check_attention(*shape))
              for shape in ATTENTION_SHAPES]
    cases += [(f"paged attention {q}x{kv}x{'+'.join(map(str, lengths))}x{d}",
               lambda shape=(q, kv, lengths, d): check_paged_attention(*shape)) for q, kv, lengths, d in PAGED_SHAPES]
    cases += [(f"top1 n={n} {dtype}", lambda n=n, dtype=dtype: check_top1(n, dtype))
              for n in TOP1_VOCABULARIES for dtype in ("float32", "bfloat16")]
    cases += [(f"widen n={n}", lambda n=n: check_widen(n)) for n in TOP1_VOCABULARIES]
    cases += [("widen every bf16", check_widen_every_value)]
    cases += [(f"residual_add d={d}", lambda d=d: check_residual_add(d)) for d in FUSED_DIMS]
    if mode == "full":
        cases += [("fused special values", check_fused_special_values), ("fused hf", check_fused_hf),
                  ("native entry", check_native_entry)]
    cases += [(f"error {name}", lambda name=name: check_error(name)) for name in ERRORS]
    return cases


def _fused_sqnr(out, ref) -> dict:
    return {"sqnr_db": round(sqnr_db(out, ref), 1)} if MODE == "full" else {}


def _rms_reference(h, weight, eps):
    h = h.double()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def check_norm(d: int, rows: int) -> dict:
    x, weight = _randn(rows, d, seed=d * 31 + rows), _randn(d, seed=d)
    out = native().rmsnorm(x, weight, 1e-6)
    return {"shape": list(out.shape), "digest": digest(out), "qk_equal": qk_norm_equal(d, rows),
            **_fused_sqnr(out, _rms_reference(x, weight, 1e-6))}


def qk_norm_equal(d: int, rows: int) -> bool:
    """SGLang's QK norm: qk_rmsnorm in place (its try_ form, as SGLang's hook calls it) over q (2
    heads) and k split from one qkv row per token, the bits of rmsnorm over their head rows copied
    out."""
    qkv = _randn(rows, 4 * d, seed=d * 47 + rows)
    q, k, _ = qkv.split([2 * d, d, d], dim=-1)
    q_weight, k_weight = _randn(d, seed=d + 1), _randn(d, seed=d + 2)
    q_want = native().rmsnorm(q.reshape(-1, d), q_weight, 1e-6).view(q.shape)
    k_want = native().rmsnorm(k.reshape(-1, d), k_weight, 1e-5).view(k.shape)
    covered = native().try_qk_rmsnorm(q, k, q_weight, k_weight, 1e-6, 1e-5)
    return covered and torch.equal(q, q_want) and torch.equal(k, k_want)


def check_addnorm(d: int, rows: int) -> dict:
    """In place (the try_ form, as SGLang's hook calls it): the residual becomes bf16(x + residual)
    exactly (torch's own BF16 add), and x rmsnorm of it, the same bits as the plain kernel's."""
    x, residual, weight = _randn(rows, d, seed=d * 37 + rows), _randn(rows, d, seed=d * 41 + rows), _randn(d, seed=d)
    expected_sum = x + residual
    covered = native().try_fused_add_rmsnorm(x, residual, weight, 1e-5)
    return {"sum_equal": covered and torch.equal(residual, expected_sum),
            "norm_equal": torch.equal(x, native().rmsnorm(expected_sum, weight, 1e-5)),
            "digest": digest(torch.cat([x, residual], dim=-1)),
            **_fused_sqnr(x, _rms_reference(expected_sum, weight, 1e-5))}


def check_silu_mul(d: int, rows: int) -> dict:
    """gate and up as the two halves of one [rows, 2d] tensor (SGLang's layout: strided rows)."""
    both = _randn(rows, 2 * d, seed=d * 43 + rows) * 4
    gate, up = both[:, :d], both[:, d:]
    out = native().silu_mul(gate, up)
    ref = F.silu(gate.double()) * up.double()
    return {"shape": list(out.shape), "same_as_contiguous": torch.equal(out, native().silu_mul(gate.contiguous(),
                                                                                                up.contiguous())),
            "whole_equal": torch.equal(out, native().silu_and_mul(both)),
            "digest": digest(out), **_fused_sqnr(out, ref)}


def check_rotary(batch: int, q_heads: int, kv_heads: int, seq: int, d: int, table_batch: int) -> dict:
    """transformers' layout: q and k transposes of [batch, seq, heads, d], cos and sin [table_batch,
    seq, d] with repeated halves (positions 0..4095)."""
    from sglang_rvv.fused import rotary

    seed = batch * 1009 + q_heads * 101 + seq * 11 + d
    q = _randn(batch, seq, q_heads, d, seed=seed).transpose(1, 2)
    k = _randn(batch, seq, kv_heads, d, seed=seed + 1).transpose(1, 2)
    cos, sin = rotary_tables(table_batch, seq, d, seed)
    q_out, k_out = rotary(q, k, cos, sin)
    again = rotary(q.contiguous(), k.contiguous(), cos, sin)
    result = {"shapes": [list(q_out.shape), list(k_out.shape)],
              "same_as_contiguous": torch.equal(q_out, again[0]) and torch.equal(k_out, again[1]),
              "at_positions_equal": rotary_at_positions_equal(q_heads, kv_heads, batch * seq, d, seed),
              "digest": digest(torch.cat([q_out.flatten(), k_out.flatten()]))}
    if MODE == "full":
        result["sqnr_db"] = round(min(sqnr_db(q_out, rotary_reference(q, cos, sin)),
                                      sqnr_db(k_out, rotary_reference(k, cos, sin))), 1)
    return result


def rotary_at_positions_equal(q_heads: int, kv_heads: int, tokens: int, d: int, seed: int) -> bool:
    """SGLang's layout: rotary_neox_at (its try_ form, as SGLang's hook calls it) over q and k split
    from one qkv row per token and a cos_sin_cache, the bits of rotary_neox over the cache rows
    gathered."""
    cache = _randn(4096, d, seed=seed + 2)
    qkv = _randn(tokens, (q_heads + 2 * kv_heads) * d, seed=seed + 3)
    q, k, _ = qkv.split([q_heads * d, kv_heads * d, kv_heads * d], dim=-1)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(seed))
    q_out, k_out = native().try_rotary_neox_at(positions, q, k, cache)  # [] (refused) fails the case
    table = cache.index_select(0, positions).unsqueeze(1)
    q_want, k_want = native().rotary_neox(q.view(tokens, -1, 1, d), k.view(tokens, -1, 1, d), table[..., : d // 2],
                                          table[..., d // 2:])
    return torch.equal(q_out, q_want.reshape(q.shape)) and torch.equal(k_out, k_want.reshape(k.shape))


def rotary_tables(batch: int, seq: int, d: int, seed: int):
    positions = torch.randint(0, 4096, (batch, seq), generator=torch.Generator().manual_seed(seed))
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = positions[..., None].double() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def rotary_reference(x, cos, sin):
    x, cos, sin = x.double(), cos.double().unsqueeze(1), sin.double().unsqueeze(1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def check_attention(batch: int, q_heads: int, kv_heads: int, keys: int, d: int) -> dict:
    """transformers' layout: q a transpose of [batch, 1, q_heads, d]; k and v the first `keys`
    positions of a longer cache buffer (strided rows)."""
    from sglang_rvv.fused import decode_attention

    seed = batch * 1013 + q_heads * 103 + keys * 13 + d
    q = _randn(batch, 1, q_heads, d, seed=seed).transpose(1, 2)
    cache = _randn(2, batch, kv_heads, keys + 3, d, seed=seed + 1) * 2
    k, v = cache[0, :, :, :keys], cache[1, :, :, :keys]
    out = decode_attention(q, k, v, d ** -0.5)
    result = {"shape": list(out.shape),
              "same_as_contiguous": torch.equal(out, decode_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                                      d ** -0.5)),
              "digest": digest(out)}
    if MODE == "full":
        group = q_heads // kv_heads
        kf, vf = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
        ref = (torch.softmax(q.double() @ kf.transpose(-1, -2) * d ** -0.5, dim=-1) @ vf).transpose(1, 2)
        result["sqnr_db"] = round(sqnr_db(out, ref), 1)
    return result


def check_paged_attention(q_heads: int, kv_heads: int, lengths: tuple[int, ...], d: int) -> dict:
    """SGLang's paged cache: each request's keys are rows scattered over a cache twice as long; the
    result (of the try_ form, as SGLang's hook calls it) is the decode attention over the same rows
    gathered, bit for bit."""
    from sglang_rvv.fused import decode_attention

    seed, batch, rows = q_heads * 101 + d, len(lengths), 2 * sum(lengths) + 5
    k_cache, v_cache = _randn(rows, kv_heads, d, seed=seed + 1) * 2, _randn(rows, kv_heads, d, seed=seed + 2) * 2
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    req_to_token = torch.zeros(batch + 1, max(lengths) + 3, dtype=torch.int32)
    pool = torch.arange(1, batch + 1, dtype=torch.int64)
    for b, n in enumerate(lengths):
        req_to_token[pool[b], :n] = order[sum(lengths[:b]):sum(lengths[:b + 1])]
    q = _randn(batch, q_heads, d, seed=seed)
    out = torch.empty_like(q)
    covered = native().try_decode_attention_paged(q, k_cache, v_cache, req_to_token, pool, torch.tensor(lengths),
                                                  d ** -0.5, out)
    same = []
    for b, n in enumerate(lengths):
        at = req_to_token[pool[b], :n].long()
        k, v = k_cache[at].transpose(0, 1).unsqueeze(0), v_cache[at].transpose(0, 1).unsqueeze(0)
        gathered = decode_attention(q[b:b + 1].unsqueeze(2), k, v, d ** -0.5).view(q_heads, d)
        same.append(covered and torch.equal(out[b], gathered))
    return {"same_as_gathered": same, "digest": digest(out)}


def check_top1(n: int, dtype: str) -> dict:
    """Three rows of a wider tensor (strided), torch.argmax's index: row 0's max copied to its end
    (the first wins), a NaN in row 1 past the first vector pass with +inf after it (the NaN wins),
    row 2 all -inf but -0.0 then +0.0 at its end (equal: the first)."""
    x = (_randn(3, n + 3, seed=n * 7).float() * 4).to(getattr(torch, dtype))[:, :n]
    x[0, -1] = x[0].max()
    x[1, (2 * n) // 3] = float("nan")
    x[1, -1] = float("inf")
    x[2] = float("-inf")
    x[2, -2:] = torch.tensor([-0.0, 0.0])
    got = native().top1(x)
    return {"equal": torch.equal(got, torch.argmax(x, -1)), "digest": digest(got)}


def check_widen(n: int) -> dict:
    """Three rows of a wider tensor (strided) of BF16 logits widened to FP32: torch's .float()'s bits."""
    x = (_randn(3, n + 3, seed=n * 5).float() * 4).bfloat16()[:, :n]
    got = native().widen(x)
    return {"equal": got.is_contiguous() and torch.equal(got.view(torch.int32), x.float().view(torch.int32)),
            "digest": digest(got)}


def check_widen_every_value() -> dict:
    """All 65,536 BF16 bit patterns (NaN payloads, infinities, subnormals, -0.0), as 256 rows."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).view(256, 256)
    got = native().widen(every)
    return {"equal": torch.equal(got.view(torch.int32), every.float().view(torch.int32)), "digest": digest(got)}


def check_residual_add(d: int) -> dict:
    """Five rows of two wider tensors (strided) added, with infinities, a NaN, inf - inf and a sum
    past BF16's largest finite value where the row is long enough: torch's BF16 add's bits (a NaN
    where it has a NaN)."""
    a = (_randn(5, d + 2, seed=d * 3).float() * 8).bfloat16()[:, :d]
    b = (_randn(5, d + 3, seed=d * 3 + 1).float() * 8).bfloat16()[:, :d]
    specials = [(float("inf"), 1.0), (float("inf"), float("-inf")), (float("nan"), 2.0), (3.0e38, 3.0e38)]
    for i, (x, y) in enumerate(specials[:d]):
        a[1, i], b[1, i] = x, y
    got, want = native().residual_add(a, b), a + b
    nan = want.isnan()  # torch's vectorised and scalar adds give NaNs of other bits
    same = torch.equal(got.isnan(), nan) and torch.equal(got.masked_fill(nan, 0).view(torch.int16),
                                                         want.masked_fill(nan, 0).view(torch.int16))
    return {"equal": got.is_contiguous() and same, "digest": digest(got)}


FUSED_CHECKS = {"norm": check_norm, "addnorm": check_addnorm, "silu_mul": check_silu_mul}


def check_fused_special_values() -> dict:
    """NaN and infinities: silu(NaN) is NaN, silu(+inf) = +inf, a norm row holding NaN is all NaN."""
    g = torch.tensor([[float("nan"), float("inf"), 0.0, -0.0, 1.0, -1.0, 100.0, -100.0]], dtype=torch.bfloat16)
    s = native().silu_mul(g, torch.ones_like(g))
    x = _randn(2, 64, seed=5)
    x[0, 3] = float("nan")
    n = native().rmsnorm(x, torch.ones(64, dtype=torch.bfloat16), 1e-6)
    return {"silu": [str(v) for v in s.float().flatten().tolist()], "nan_row_all_nan": bool(n[0].isnan().all()),
            "finite_row_finite": bool(n[1].isfinite().all())}


def check_fused_hf() -> dict:
    """The tiny transformers Llama with the policy: its norms and MLPs get the kernels, and the
    logits of a prompt agree with the same model's with fused_ops off (within their roundings: a
    random tiny model's near-tied logits may swap their argmax, so the tokens are for the twins' test
    on x86, tests/integration/test_fused_twins.py)."""
    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, tiny

    model = tiny.build_model("llama", seed=0)
    prompt = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
    results = {}
    for on in (False, True):
        report = install_rvv_policy(model, RvvPolicyConfig(regional_compile=False, measure_routes=False, fused_ops=on))
        with torch.inference_mode():
            results[on] = (report, model(prompt).logits)
    (off_report, off), (on_report, on) = results[False], results[True]
    return {"fused_ops": on_report.fused_ops, "fused_reason": on_report.fused_reason, "off_fused": off_report.fused_ops,
            "logits_sqnr_db": round(sqnr_db(on, off), 1), **_layer_steps(model, prompt)}


def _layer_steps(model, prompt) -> dict:
    """Three decode steps after the prompt, by the decoder layers' one-frame step (attention_step)
    and by their modules one by one (the step turned off): the same bits, and how many layer calls
    took the step (tests/integration/test_hf_step.py on x86)."""
    from sglang_rvv import hf_step

    original, taken = hf_step._step, []

    def decode(step) -> torch.Tensor:
        hf_step._step = step
        try:
            with torch.inference_mode():
                out = model(prompt, use_cache=True)
                logits = []
                for _ in range(3):
                    out = model(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
                    logits.append(out.logits)
            return torch.cat(logits, dim=1)
        finally:
            hf_step._step = original

    def counting(*args):
        found = original(*args)
        taken.append(found is not None)
        return found

    stepped = decode(counting)
    by_modules = decode(lambda *args: None)
    return {"layer_step_bits_equal": torch.equal(stepped.view(torch.int16), by_modules.view(torch.int16)),
            "layer_steps_taken": sum(taken)}


def check_native_entry() -> dict:
    """The eager route's native entry (libsglang_rvv_entry.so) under the policy on the tiny Llama:
    the routes and the routed Linears are called through its C methods, every packed projection's
    memoised call holds a plan, an o_proj call gives the op's bits,
    and after an in-place update of its weight the entry refuses the plan and the route re-plans,
    giving the op's bits on the updated weight."""
    from sglang_rvv import RvvPolicyConfig, install_rvv_policy, tiny

    model = tiny.build_model("llama", seed=0)
    install_rvv_policy(model, RvvPolicyConfig(regional_compile=False, measure_routes=False, fused_ops=False))
    prompt = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        model(prompt)
        model(prompt)
    calls = [call for module in model.modules() if (route := module.__dict__.get(routing.ROUTE_ATTR)) is not None
             and route.memo is not None for call in route.memo.calls.values() if call.fn is not None]
    o_proj = model.model.layers[0].self_attn.o_proj
    route = o_proj.__dict__[routing.ROUTE_ATTR]
    x = _randn(1, 1, o_proj.in_features, seed=3)
    n = o_proj.out_features

    def op_bits():
        return native().packed_bf16_linear(x, o_proj._buffers[route.record.buffers[0]], n, LAYOUT_VERSION)

    with torch.inference_mode():
        o_proj(x)  # a decode step's shape: its first call plans it
        call = route.memo.calls.get((x.shape, x.dtype, x.is_cpu))
        got = o_proj(x)
        bits_equal = torch.equal(got.view(torch.int16), op_bits().view(torch.int16))
        with torch.no_grad():
            o_proj.weight.mul_(2)  # in place: its version counter moves
        refused = call is not None and call.fn(call.plan, x, o_proj.weight, o_proj._buffers, None) is None
        again = o_proj(x)
        replanned = torch.equal(again.view(torch.int16), op_bits().view(torch.int16)) and not torch.equal(again, got)
    from sglang_rvv import adapters

    c_methods = [type(cls.__dict__.get("__call__")).__name__ for cls in (routing.ModuleRoute, adapters.RoutedLinear)]
    return {"memoised": len(calls), "planned": sum(c.plan is not None for c in calls), "c_methods": c_methods,
            "o_proj_planned": call is not None and call.plan is not None, "bits_equal": bits_equal,
            "stale_refused": refused, "replanned_bits_equal": replanned}


# The modules below are imported by main(), after the log capture is in place.
MODE = ""
torch = F = ops = kernels = generic = rvv = layout = routing = None
WARNINGS: list[str] = []
OPS_IMPORT_WARNINGS: list[str] = []


class _Capture(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            WARNINGS.append(record.getMessage())


def native():
    return torch.ops.sglang_rvv_native


def _randn(*shape: int, seed: int):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _inputs(n: int, k: int, m: int):
    seed = n * 1_000_003 + k * 1009 + m
    return _randn(n, k, seed=seed), _randn(m, k, seed=seed + 1)


def sqnr_db(out, ref) -> float:
    ref = ref.double()
    noise = (out.double() - ref).pow(2).sum().item()
    return 999.0 if noise == 0 else 10 * math.log10(ref.pow(2).sum().item() / noise)


def digest(t) -> str:
    return hashlib.sha256(t.contiguous().view(torch.int16).numpy().tobytes()).hexdigest()[:16]


def check_env() -> dict:
    return {"torch": torch.__version__, "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
            "threads": torch.get_num_threads(), "library": str(rvv.library_path()),
            "kernels_json": json.loads(rvv.library_path().with_name("kernels.json").read_text())}


def check_selection() -> dict:
    return {"provider": ops.PROVIDER_NAME, "reason": ops.PROVIDER_REASON, "warnings": OPS_IMPORT_WARNINGS}


def check_kernel_isa() -> dict:
    return {"isa": native().kernel_isa()}


def check_forced_rvv() -> dict:
    try:
        provider, reason = kernels.choose_provider("rvv")
    except Exception as exc:  # noqa: BLE001 - the host asserts the type
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"provider": provider.NAME, "reason": reason}


def _choose_with_library(directory: Path) -> dict:
    """choose_provider() with SGLANG_RVV_KERNELS_LIB pointing into ``directory``, warnings counted."""
    before = len(WARNINGS)
    previous = os.environ.get(rvv.LIB_ENV)
    os.environ[rvv.LIB_ENV] = str(directory / "libsglang_rvv_kernels.so")
    try:
        provider, reason = kernels.choose_provider()
    finally:
        if previous is None:
            os.environ.pop(rvv.LIB_ENV)
        else:
            os.environ[rvv.LIB_ENV] = previous
    return {"provider": provider.NAME, "reason": reason, "warnings": WARNINGS[before:],
            "running_torch": torch.__version__}


def check_torch_mismatch() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(rvv.library_path(), tmp)
        built = json.loads(rvv.library_path().with_name("kernels.json").read_text())
        built["torch_version"] = "2.99.0+other"
        (Path(tmp) / "kernels.json").write_text(json.dumps(built))
        return {**_choose_with_library(Path(tmp)), "built_torch": built["torch_version"]}


def check_load_failure() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "libsglang_rvv_kernels.so").write_bytes(b"not an ELF file")
        shutil.copy(rvv.library_path().with_name("kernels.json"), tmp)
        return _choose_with_library(Path(tmp))


def check_second_library() -> dict:
    """A copy at another path is refused: registering the namespace twice would abort the interpreter."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(rvv.library_path(), tmp)
        shutil.copy(rvv.library_path().with_name("kernels.json"), tmp)
        return _choose_with_library(Path(tmp))


def check_ops_dispatch() -> dict:
    """The policy's ops go through the native kernels: same bits as the native op, leading dims kept."""
    weight, x = _inputs(70, 40, 30)
    packed = ops.pack_bf16_weight(weight)
    out = ops.packed_bf16_linear(x.reshape(2, 3, 5, 40), packed, 70)
    direct = native().packed_bf16_linear(x, native().pack_bf16_weight(weight, LAYOUT_VERSION), 70, LAYOUT_VERSION)
    return {"pack_equal": torch.equal(packed, layout.pack_reference(weight)), "shape": list(out.shape),
            "bits_equal": torch.equal(out.reshape(30, 70).view(torch.int16), direct.view(torch.int16))}


def check_compile() -> dict:
    """The native ops' fake kernels trace, and Inductor keeps the linear op as an extern call."""
    from torch._inductor.utils import run_and_get_code
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake_packed = native().pack_bf16_weight(torch.empty(100, 64, dtype=torch.bfloat16), LAYOUT_VERSION)
        fake_out = native().packed_bf16_linear(torch.empty(3, 64, dtype=torch.bfloat16), fake_packed, 100,
                                               LAYOUT_VERSION)
    weight, x = _inputs(100, 64, 3)
    packed = ops.pack_bf16_weight(weight)
    compiled = torch.compile(lambda a, p: ops.packed_bf16_linear(a, p, 100), dynamic=False, fullgraph=True)
    out, (code, *_) = run_and_get_code(compiled, x, packed)
    eager = ops.packed_bf16_linear(x, packed, 100)
    return {"fake_shapes": [list(fake_packed.shape), list(fake_out.shape)],
            "extern_call": "torch.ops.sglang_rvv_native.packed_bf16_linear" in code,
            "compiled_bits_equal": torch.equal(out.view(torch.int16), eager.view(torch.int16))}


def check_pack(n: int, k: int) -> dict:
    weight = _randn(n, k, seed=n + k)
    packed = native().pack_bf16_weight(weight, LAYOUT_VERSION)
    return {"shape": list(packed.shape), "equal_reference": torch.equal(packed, layout.pack_reference(weight)),
            "round_trip": torch.equal(layout.unpack_reference(packed, n), weight)}


def check_linear(n: int, k: int, m: int) -> dict:
    weight, x = _inputs(n, k, m)
    packed = native().pack_bf16_weight(weight, LAYOUT_VERSION)
    out = native().packed_bf16_linear(x, packed, n, LAYOUT_VERSION)
    result = {"shape": list(out.shape), "dtype": str(out.dtype), "digest": digest(out)}
    if MODE == "full":
        result["sqnr_db"] = round(sqnr_db(out, F.linear(x.double(), weight.double())), 2)
        result["generic_sqnr_db"] = round(sqnr_db(out, generic.linear(x, packed, n)), 2)
    return result


def check_bucket(m: int) -> dict:
    """The policy's bucket route: zero-pad the rows up to the bucket, call, slice; same bits as unpadded.

    ``full`` goes through the policy's op (provider rvv), the other runs straight to the library
    (without V the provider is generic); the digests must agree all the same.
    """
    n, k = BUCKET_SHAPE
    weight, x = _inputs(n, k, m)
    if MODE == "full":
        packed = ops.pack_bf16_weight(weight)
        out = ops.packed_bf16_linear(x, packed, n)
    else:
        packed = native().pack_bf16_weight(weight, LAYOUT_VERSION)
        out = native().packed_bf16_linear(x, packed, n, LAYOUT_VERSION)
    bucket = routing.bucket_rows(m, small_batch=True, projection="o_proj")
    result = {"bucket": bucket, "digest": digest(out)}
    if MODE != "full":
        return result
    result["sqnr_db"] = round(sqnr_db(out, F.linear(x.double(), weight.double())), 2)
    if bucket is not None:
        sliced = ops.packed_bf16_linear(torch.cat([x, x.new_zeros(bucket - m, k)]), packed, n)[:m]
        result["bucket_bits_equal"] = torch.equal(sliced.view(torch.int16), out.view(torch.int16))
    return result


def check_threads() -> dict:
    """at::parallel_for honours torch.set_num_threads, and the thread count never changes a bit."""
    weight, x = _inputs(1000, 333, 9)
    packed = native().pack_bf16_weight(weight, LAYOUT_VERSION)
    threads = torch.get_num_threads()
    outs = {}
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            outs[count] = native().packed_bf16_linear(x, packed, 1000, LAYOUT_VERSION)
    finally:
        torch.set_num_threads(threads)
    return {"equal": all(torch.equal(o.view(torch.int16), outs[1].view(torch.int16)) for o in outs.values()),
            "digest": digest(outs[1])}


def check_rounding() -> dict:
    """K=2, x=[1, 1]: each output is RNE_bf16(fp32(a + b)), bit for bit torch's own rounding.

    Pairs include exact ties (1 + 2^-8 rounds to even 1; (1 + 2^-7) + 2^-8 rounds up), values
    near the BF16 maximum, and infinities of both signs (inf - inf is NaN, 0x7FC0).
    """
    g = torch.Generator().manual_seed(7)
    a = torch.randn(4000, generator=g).to(torch.bfloat16)
    b = (torch.randn(4000, generator=g) * 2.0 ** torch.randint(-12, 2, (4000,), generator=g)).to(torch.bfloat16)
    special = torch.tensor([[1.0, 2.0**-8], [1.0 + 2.0**-7, 2.0**-8], [-1.0, -(2.0**-8)], [3.3e38, 3.3e38],
                            [float("inf"), float("-inf")], [float("inf"), 1.0], [float("-inf"), -1.0],
                            [float("nan"), 1.0], [0.0, -0.0]]).to(torch.bfloat16)
    weight = torch.cat([torch.stack([a, b], dim=1), special])
    packed = native().pack_bf16_weight(weight, LAYOUT_VERSION)
    out = native().packed_bf16_linear(torch.ones(1, 2, dtype=torch.bfloat16), packed, weight.shape[0], LAYOUT_VERSION)
    expected = (weight[:, 0].float() + weight[:, 1].float()).to(torch.bfloat16).unsqueeze(0)
    mismatch = (out.view(torch.int16) != expected.view(torch.int16)).nonzero().flatten().tolist()
    return {"bits_equal": not mismatch, "mismatched_pairs": [weight[i].float().tolist() for i in mismatch[-5:]],
            "digest": digest(out)}


def check_special_values() -> dict:
    """NaN and infinities in inputs and weights: the same NaN/inf positions as an fp64 reference, NaN = 0x7FC0."""
    weight, x = _inputs(70, 300, 6)
    x[0, 5] = float("nan")
    x[1, 7] = float("inf")
    weight[3, 11] = float("-inf")
    weight[40, 299] = float("nan")
    packed = native().pack_bf16_weight(weight, LAYOUT_VERSION)
    out = native().packed_bf16_linear(x, packed, 70, LAYOUT_VERSION)
    reference = F.linear(x.double(), weight.double())
    finite = reference.isfinite()
    return {"nan_equal": torch.equal(out.isnan(), reference.isnan()),
            "inf_equal": torch.equal(out.isinf(), reference.isinf()) and torch.equal(out[out.isinf()].double(),
                                                                                      reference[out.isinf()]),
            "nan_bits": sorted({hex(v & 0xFFFF) for v in out.view(torch.int16)[out.isnan()].tolist()}),
            "finite_sqnr_db": round(sqnr_db(out[finite], reference[finite]), 2), "digest": digest(out)}


def _quant(name: str):
    return layout.quant_layout(name)


def _qpack(name: str, group_size: int, weight):
    quant = _quant(name)
    group = layout.effective_group_size(quant, group_size, weight.shape[1])
    return getattr(native(), f"pack_{name}_weight")(weight, group, quant.version)


def _qlinear(name: str, x, packed, n: int, k: int):
    return getattr(native(), f"packed_{name}_linear")(x, *packed, n, k, _quant(name).version)


def check_layout_refusal() -> dict:
    return {name: rvv.layout_refusal(name) for name in layout.WEIGHT_DTYPES}


def check_compile_quantized() -> dict:
    """The int8/int4 ops' fake kernels give their shapes; Inductor keeps the int4 linear as an extern call
    (one compile: under qemu each costs minutes, and both layouts' fakes come from one registration)."""
    from torch._inductor.utils import run_and_get_code
    from torch._subclasses.fake_tensor import FakeTensorMode

    result = {}
    for name, group in (("int8", 64), ("int4", 32)):
        with FakeTensorMode():
            fq, fs = getattr(native(), f"pack_{name}_weight")(torch.empty(100, 64, dtype=torch.bfloat16), group, 1)
            fo = getattr(native(), f"packed_{name}_linear")(torch.empty(3, 64, dtype=torch.bfloat16), fq, fs,
                                                            100, 64, 1)
        result[f"{name}_fake_shapes"] = [list(fq.shape), str(fq.dtype), list(fs.shape), list(fo.shape)]
    weight, x = _inputs(100, 64, 3)
    packed = _qpack("int4", 32, weight)
    compiled = torch.compile(lambda a, q, s: _qlinear("int4", a, (q, s), 100, 64), dynamic=False, fullgraph=True)
    out, (code, *_) = run_and_get_code(compiled, x, *packed)
    result["extern_call"] = "torch.ops.sglang_rvv_native.packed_int4_linear" in code
    eager = _qlinear("int4", x, packed, 100, 64)
    result["compiled_bits_equal"] = torch.equal(out.view(torch.int16), eager.view(torch.int16))
    return result


def check_qpack(name: str, group_size: int, n: int, k: int) -> dict:
    weight = _randn(n, k, seed=n + k)
    qweight, scales = _qpack(name, group_size, weight)
    want_q, want_s = layout.quantize_reference(weight, _quant(name), group_size)
    return {"equal_reference": torch.equal(qweight, want_q) and torch.equal(scales.view(torch.int16),
                                                                             want_s.view(torch.int16))}


def check_qexact(name: str, group_size: int) -> dict:
    """Bit for bit layout.quantized_linear_reference (the contract's arithmetic, in exact rationals)."""
    n, k, m = QUANT_EXACT
    weight, x = _inputs(n, k, m)
    packed = _qpack(name, group_size, weight)
    want = layout.quantized_linear_reference(x, *packed, _quant(name), n)
    return {"bits_equal": torch.equal(_qlinear(name, x, packed, n, k).view(torch.int16), want.view(torch.int16))}


def check_qlinear(name: str, group_size: int, n: int, k: int, m: int) -> dict:
    weight, x = _inputs(n, k, m)
    packed = _qpack(name, group_size, weight)
    out = _qlinear(name, x, packed, n, k)
    result = {"shape": list(out.shape), "dtype": str(out.dtype), "digest": digest(out)}
    if MODE == "full":
        dequantized = layout.dequantize_reference(*packed, _quant(name), n, k)
        result["sqnr_db"] = round(sqnr_db(out, x.double() @ dequantized.T), 2)
    return result


def _a8linear(x, packed, n: int, k: int):
    return native().packed_int4_a8_linear(x, *packed, n, k, layout.INT4.version)


def check_a8linear(group_size: int, n: int, k: int, m: int) -> dict:
    weight, x = _inputs(n, k, m)
    packed = _qpack("int4", group_size, weight)
    out = _a8linear(x, packed, n, k)
    result = {"shape": list(out.shape), "dtype": str(out.dtype), "digest": digest(out)}
    if MODE == "full":
        dequantized = layout.dequantize_reference(*packed, layout.INT4, n, k)
        result["sqnr_db"] = round(sqnr_db(out, x.double() @ dequantized.T), 2)
    return result


def check_a8_special_rows() -> dict:
    """Rows with a NaN, an infinity, only values too small to scale (d = 0), and a plain one."""
    n, k, _ = QUANT_EXACT
    weight, x = _inputs(n, k, 4)
    x[0, 5], x[1, 40] = float("nan"), float("-inf")
    x[2] = 1e-38
    packed = _qpack("int4", 32, weight)
    out = _a8linear(x, packed, n, k)
    result = {"digest": digest(out)}
    if MODE == "full":
        want = layout.quantized_linear_a8_reference(x, *packed, n)
        result["bits_equal"] = torch.equal(out.view(torch.int16), want.view(torch.int16))
        result["nan_rows"] = [int(r) for r in out.isnan().all(dim=1).nonzero().flatten()]
        result["zero_row"] = bool((out[2] == 0).all())
    return result


def _bad_calls():
    weight, x = _inputs(64, 32, 2)
    packed = native().pack_bf16_weight(weight, LAYOUT_VERSION)
    n = native()
    int8 = n.pack_int8_weight(weight, 32, 1)
    return {
        # through the policy's ops: layout.check_* answers first, with a LayoutError
        "ops float weight": lambda: ops.pack_bf16_weight(weight.float()),
        "ops layout version": lambda: ops.packed_bf16_linear(x, packed, 64, 7),
        "ops K mismatch": lambda: ops.packed_bf16_linear(_randn(2, 16, seed=1), packed, 64),
        # straight into the library: its TORCH_CHECKs, a RuntimeError, never a crash
        "native float weight": lambda: n.pack_bf16_weight(weight.float(), LAYOUT_VERSION),
        "native 1-D weight": lambda: n.pack_bf16_weight(weight[0], LAYOUT_VERSION),
        "native pack layout version": lambda: n.pack_bf16_weight(weight, 2),
        "native float input": lambda: n.packed_bf16_linear(x.float(), packed, 64, LAYOUT_VERSION),
        "native layout version": lambda: n.packed_bf16_linear(x, packed, 64, 7),
        "native K mismatch": lambda: n.packed_bf16_linear(_randn(2, 16, seed=1), packed, 64, LAYOUT_VERSION),
        "native out_features too large": lambda: n.packed_bf16_linear(x, packed, 65, LAYOUT_VERSION),
        "native out_features too small": lambda: n.packed_bf16_linear(x, packed, 32, LAYOUT_VERSION),
        "native unpacked weight": lambda: n.packed_bf16_linear(x, weight, 64, LAYOUT_VERSION),
        # [..., K] is any rank (check_ops_dispatch); only a 0-d input has no K to read
        "native 0-d input": lambda: n.packed_bf16_linear(x[0, 0], packed, 64, LAYOUT_VERSION),
        "native int8 group 0": lambda: n.pack_int8_weight(weight, 0, 1),
        "native int4 odd group": lambda: n.pack_int4_weight(weight, 31, 1),
        "native int8 float input": lambda: n.packed_int8_linear(x.float(), *int8, 64, 32, 1),
        "native int4 int8 qweight": lambda: n.packed_int4_linear(x, *int8, 64, 32, 1),
        "native int4 layout version": lambda: n.packed_int4_linear(x, *n.pack_int4_weight(weight, 32, 1), 64, 32, 2),
    }


ERRORS = (
    "ops float weight", "ops layout version", "ops K mismatch", "native float weight", "native 1-D weight",
    "native pack layout version", "native float input", "native layout version", "native K mismatch",
    "native out_features too large", "native out_features too small", "native unpacked weight", "native 0-d input",
    "native int8 group 0", "native int4 odd group", "native int8 float input", "native int4 int8 qweight",
    "native int4 layout version",
)


def check_error(name: str) -> dict:
    try:
        _bad_calls()[name]()
    except Exception as exc:  # noqa: BLE001 - the host asserts the type and message
        return {"raised": type(exc).__name__, "message": str(exc).splitlines()[0]}
    return {"raised": None}


def import_ops(mode: str) -> None:
    global ops, routing
    began, before = time.monotonic(), len(WARNINGS)
    from sglang_rvv import ops, routing
    from sglang_rvv.kernels import chosen

    chosen()  # the provider is chosen lazily, at its first use: here, where its warning is captured
    OPS_IMPORT_WARNINGS.extend(WARNINGS[before:])
    if mode == "no-vector":
        # The provider refused the library; load it anyway: without V it must load and run its twins.
        torch.ops.load_library(str(rvv.library_path()))
    print(json.dumps({"case": "import sglang_rvv.ops", "seconds": round(time.monotonic() - began, 1)}), flush=True)


def main(argv: list[str]) -> int:
    global MODE, torch, F, kernels, generic, rvv, layout
    MODE, *share = argv
    cases = plan(MODE, *share)
    logging.getLogger("sglang_rvv").addHandler(_Capture())
    began = time.monotonic()
    import torch
    import torch.nn.functional as F

    from sglang_rvv import kernels, layout
    from sglang_rvv.kernels import generic, rvv

    print(json.dumps({"case": "import torch", "seconds": round(time.monotonic() - began, 1)}), flush=True)
    for name, check in cases:
        if ops is None and name not in BEFORE_OPS:
            import_ops(MODE)
        began = time.monotonic()
        try:
            result = check()
        except Exception as exc:  # noqa: BLE001 - reported per case, the others still run
            result = {"exception": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"case": name, **result, "seconds": round(time.monotonic() - began, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
