"""The appliance's attention backend for SGLang: torch_native's, with the kernel library's paged
decode and KV row store where the kernels load, and a speculative target-verify pass with a tree
mask.

SGLang's torch_native backend gathers each request's keys from the paged KV cache and runs torch's
sdpa per request, per layer; it stores a layer's K and V rows through the pool's
``set_kv_buffer``, which on a CPU without AMX is two ``index_put_`` calls. Here a decode is one
paged kernel call per layer that reads the cache rows in place (``try_decode_attention_paged``),
and a plain pool's rows are stored by one native copy (``try_store_kv``). Each ``try_`` op refuses
what it does not cover (a sliding window, cross attention, another dtype or index type, a
quantized or paged-by-head pool), and that call runs torch_native's own code.

A target-verify forward (speculative decoding: NGRAM) extends each request by its drafted tokens,
which SGLang's torch_native cannot run (it reads the extend lengths, which a verify batch does not
carry). Each draft sees the committed prefix and, among the drafts, what the tree mask gives it
(its ancestors): on a CPU SGLang passes the mask of the drafts only, [batch, drafts, drafts].

SGLang 0.5.21 chooses some of its own work by the backend's name (``support_triton``: positions and
the request-to-token writes; ``get_last_loc``), and takes every name but torch_native and
intel_amx for a Triton backend, which a CPU lacks. So the backend is registered through SGLang's
attention registry under torch_native's name (:func:`register`, when the policy is installed in a
scheduler process): a flag-on server's ``--attention-backend torch_native`` builds this one, a
flag-off server keeps SGLang's.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool
from torch.nn.functional import scaled_dot_product_attention

from .. import fused

NAME = "torch_native"  # the registry name it serves under (see the module's docstring)
log = logging.getLogger("sglang_rvv")


class RvvAttnBackend(TorchNativeAttnBackend):
    def __init__(self, model_runner):
        super().__init__(model_runner)
        self.kernels, self.kernels_reason = fused.available()
        pool = self.token_to_kv_pool
        # The pools whose set_kv_buffer is a plain row store: every other keeps its own.
        self.plain_pool = (type(pool) is MHATokenToKVPool and not pool.is_quantized_kv_cache
                           and not pool.use_hnd and pool.kv_cache_layout == "nhd" and pool.store_dtype == pool.dtype)
        self.verify = None  # a target-verify forward's (drafts per request, tree mask [bs, n, n])

    def init_forward_metadata(self, forward_batch):
        super().init_forward_metadata(forward_batch)
        self.verify = None
        if forward_batch.forward_mode.is_target_verify():
            spec = forward_batch.spec_info
            n, bs = spec.draft_token_num, forward_batch.batch_size
            mask = spec.custom_mask
            if mask is None or mask.numel() != bs * n * n:
                raise RuntimeError(f"target verify: a tree mask of {bs} x {n} x {n} drafts expected (SGLang's CPU "
                                   f"mask, the drafts' own), got {None if mask is None else tuple(mask.shape)}")
            self.verify = (n, mask.view(bs, n, n).to(torch.bool))

    def _store(self, layer, forward_batch, k, v) -> bool:
        """The layer's K and V rows into the cache by the native row store; False where it does not
        serve (the caller stores through the pool)."""
        if not (self.kernels and self.plain_pool and self.swa_out_cache_loc is None and not layer.is_cross_attention):
            return False
        pool, index = self.token_to_kv_pool, layer.layer_id - self.token_to_kv_pool.start_layer
        return fused.NATIVE.try_store_kv(k, v, pool.k_buffer[index], pool.v_buffer[index],
                                         forward_batch.out_cache_loc)

    def _run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 encoder_lens=None, scaling=None, enable_gqa=False, causal=False, is_cross_attn=False,
                                 sliding_window_size=None):
        if (self.kernels and encoder_lens is None and not causal and not is_cross_attn and sliding_window_size is None
                and fused.NATIVE.try_decode_attention_paged(
                    query, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                    scaling if scaling is not None else query.shape[-1] ** -0.5, output)):  # sdpa's default scale
            return output
        return super()._run_sdpa_forward_decode(query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                                seq_lens, encoder_lens, scaling, enable_gqa, causal, is_cross_attn,
                                                sliding_window_size)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        stored = save_kv_cache and k is not None and v is not None and self._store(layer, forward_batch, k, v)
        return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache and not stored)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        stored = save_kv_cache and k is not None and v is not None and self._store(layer, forward_batch, k, v)
        if self.verify is None:
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache and not stored)
        if save_kv_cache and not stored and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc),
                                                k, v)
        return self._verify(q, layer, forward_batch)

    def _verify(self, q, layer, forward_batch):
        """Each request's drafts over its committed prefix (all visible) and the drafts the tree
        mask gives each one."""
        n, tree = self.verify
        if layer.is_cross_attention or layer.sliding_window_size not in (None, -1):
            raise NotImplementedError("target verify: cross attention and sliding windows are not covered; "
                                      "serve without --speculative-algorithm")
        heads, kv_heads = layer.tp_q_head_num, layer.tp_k_head_num
        q = q.view(-1, heads, layer.qk_head_dim)
        out = q.new_empty((q.shape[0], heads, layer.v_head_dim))
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        table = self.req_to_token_pool.req_to_token
        for b, (pool_index, prefix) in enumerate(zip(forward_batch.req_pool_indices.tolist(),
                                                     forward_batch.seq_lens.tolist(), strict=True)):
            rows = table[pool_index, :prefix + n]
            keys, values = k_cache[rows].transpose(0, 1), v_cache[rows].transpose(0, 1)
            mask = torch.cat((tree.new_ones((n, prefix)), tree[b]), dim=1)
            drafts = q[b * n:(b + 1) * n].transpose(0, 1)
            out[b * n:(b + 1) * n] = scaled_dot_product_attention(
                drafts.unsqueeze(0), keys.to(q.dtype).unsqueeze(0), values.to(q.dtype).unsqueeze(0),
                attn_mask=mask, scale=layer.scaling, enable_gqa=heads != kv_heads).squeeze(0).transpose(0, 1)
        return out.view(-1, heads * layer.v_head_dim)


def _create(runner):
    try:
        return RvvAttnBackend(runner)
    except Exception as error:  # serving never fails because of the policy
        log.warning("sglang_rvv: attention: SGLang's torch_native backend serves (the RVV backend failed: %s: %s)",
                    type(error).__name__, error)
        return TorchNativeAttnBackend(runner)


def register() -> None:
    """Build this backend for torch_native in this process (a scheduler whose policy is on)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if ATTENTION_BACKENDS.get(NAME) is not _create:
        register_attention_backend(NAME)(_create)
        log.info("sglang_rvv: attention: the RVV backend serves %s (%s)", NAME,
                 "the paged decode and KV row store kernels" if fused.available()[0]
                 else f"torch's ops: {fused.available()[1]}")
