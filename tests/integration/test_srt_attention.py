"""The RVV attention backend's target verify (sglang_rvv.srt.attention): each request's drafts over
its committed prefix and the drafts its tree mask gives each one, against SGLang's own torch_native
extend (a chain of drafts is a causal extend) and against attention over each draft's own path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from support import sqnr_db

HEADS, KV_HEADS, D = 4, 2, 16


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _setup(prefixes, n, seed=0):
    """A backend over a paged cache of scattered rows holding each request's prefix and drafts, and
    the verify forward's batch."""
    from sglang_rvv.srt.attention import RvvAttnBackend

    total = sum(prefixes) + n * len(prefixes)
    slots = 2 * total + 3
    rows = torch.randperm(slots, generator=torch.Generator().manual_seed(seed))[:total].to(torch.int32)
    k_cache, v_cache = _randn(slots, KV_HEADS, D, seed=seed + 1), _randn(slots, KV_HEADS, D, seed=seed + 2)
    req_to_token = torch.zeros(len(prefixes) + 1, max(prefixes) + n + 2, dtype=torch.int32)
    taken = 0
    for b, prefix in enumerate(prefixes):
        req_to_token[b + 1, :prefix + n] = rows[taken:taken + prefix + n]
        taken += prefix + n
    backend = object.__new__(RvvAttnBackend)
    backend.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda layer_id: k_cache,
                                               get_value_buffer=lambda layer_id: v_cache)
    backend.req_to_token_pool = SimpleNamespace(req_to_token=req_to_token)
    batch = SimpleNamespace(req_pool_indices=torch.arange(1, len(prefixes) + 1), seq_lens=torch.tensor(prefixes))
    layer = SimpleNamespace(tp_q_head_num=HEADS, tp_k_head_num=KV_HEADS, qk_head_dim=D, v_head_dim=D, layer_id=0,
                            scaling=D ** -0.5, is_cross_attention=False, sliding_window_size=-1)
    q = _randn(len(prefixes) * n, HEADS * D, seed=seed + 3)
    return backend, batch, layer, q, (k_cache, v_cache, req_to_token)


def test_a_chain_of_drafts_is_torch_natives_causal_extend():
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    prefixes, n = (5, 9), 4
    backend, batch, layer, q, (k_cache, v_cache, req_to_token) = _setup(prefixes, n)
    chain = torch.tril(torch.ones(n, n, dtype=torch.bool)).expand(len(prefixes), n, n)
    backend.verify = (n, chain)
    ours = backend._verify(q, layer, batch).view(-1, HEADS, D)
    theirs = torch.empty_like(ours)
    TorchNativeAttnBackend._run_sdpa_forward_extend(
        backend, q.view(-1, HEADS, D), theirs, k_cache, v_cache, req_to_token, batch.req_pool_indices,
        batch.seq_lens + n, batch.seq_lens, torch.full((2,), n), scaling=layer.scaling, enable_gqa=True, causal=True)
    assert sqnr_db(ours, theirs.double()) > 40


def test_each_draft_sees_the_prefix_and_its_own_path_in_the_tree():
    # Drafts 0 -> 1 and 0 -> 2 (siblings), 2 -> 3: draft 3 sees 0, 2 and itself, never 1.
    prefixes, n = (6,), 4
    backend, batch, layer, q, (k_cache, v_cache, req_to_token) = _setup(prefixes, n, seed=7)
    paths = [[0], [0, 1], [0, 2], [0, 2, 3]]
    tree = torch.zeros(1, n, n, dtype=torch.bool)
    for i, path in enumerate(paths):
        tree[0, i, path] = True
    backend.verify = (n, tree)
    ours = backend._verify(q, layer, batch).view(n, HEADS, D)
    rows = req_to_token[1, :6 + n].long()
    for i, path in enumerate(paths):
        seen = torch.cat((rows[:6], rows[6 + torch.tensor(path)]))
        keys, values = k_cache[seen].transpose(0, 1).double(), v_cache[seen].transpose(0, 1).double()
        want = F.scaled_dot_product_attention(q.view(n, HEADS, D)[i:i + 1].transpose(0, 1).double(), keys,
                                              values, scale=layer.scaling, enable_gqa=True).transpose(0, 1)
        assert sqnr_db(ours[i:i + 1], want) > 40, (i, path)
    # Draft 1 is not on draft 3's path: changing its key leaves draft 3 as it was.
    k_cache[rows[6 + 1]] = _randn(KV_HEADS, D, seed=99) * 10
    again = backend._verify(q, layer, batch).view(n, HEADS, D)
    assert torch.equal(again[3], ours[3]) and not torch.equal(again[1], ours[1])


def test_a_mask_of_another_shape_is_refused_by_name():
    from sglang_rvv.srt.attention import RvvAttnBackend

    backend = object.__new__(RvvAttnBackend)
    backend.use_sliding_window_kv_pool = False
    mode = SimpleNamespace(is_target_verify=lambda: True)
    batch = SimpleNamespace(forward_mode=mode, batch_size=2, out_cache_loc=None,
                            spec_info=SimpleNamespace(draft_token_num=4, custom_mask=torch.ones(2 * 4 * 10)))
    with pytest.raises(RuntimeError, match=r"a tree mask of 2 x 4 x 4 drafts expected .* got \(80,\)"):
        backend.init_forward_metadata(batch)
