"""Pure-torch stand-in for the CPU build of ``sgl_kernel`` (loaded as ``sgl_kernel``).

Only used when no real ``sgl_kernel`` is importable (see ``sglang_rvv_boot``).
SGLang's CPU engine imports these names at import time. The plain serving path
calls only ``assign_req_to_token_pool_cpu``; NGRAM speculative decoding calls
``reconstruct_indices_from_tree_mask`` (as ``sgl_kernel.speculative``'s),
``assign_extend_cache_locs_cpu``, ``verify_tree_greedy_cpu``,
``fill_accept_out_cache_loc_cpu``, ``fill_bonus_tokens_cpu`` and
``copy_all_layer_kv_cache_cpu`` (its KV pool's start-up copy, and moves). Each follows
SGLang's own kernel of the name (its CUDA or Triton source in sglang 0.5.21's
``sglang/kernels``), over the small per-batch index tensors those kernels take.
Everything else raises a NotImplementedError naming the function, so a feature
that needs the real kernels (EAGLE's tree build) fails loudly
instead of computing something wrong.
"""

from __future__ import annotations

import ctypes
import sys
import types

import torch

IS_SGLANG_RVV_FALLBACK = True


def _runs(name: str, req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor,
          pool_len: int):
    """Each request's (pool row, its slots' start and end, where its run starts in the flat list)."""
    position = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        if not 0 <= start <= end <= pool_len:
            raise ValueError(f"{name}: slots [{start}, {end}) outside 0..{pool_len}")
        yield row, start, end, position
        position += end - start


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = `` the i-th run of ``out_cache_loc``."""
    runs = _runs("assign_req_to_token_pool_cpu", req_pool_indices, start_offset, end_offset, pool_len)
    for row, start, end, position in runs:
        req_to_token[row, start:end] = out_cache_loc[position : position + end - start]


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The i-th run of ``out_cache_loc`` ``= req_to_token[req_pool_indices[i], start[i]:end[i]]``."""
    runs = _runs("assign_extend_cache_locs_cpu", req_pool_indices, start_offset, end_offset, pool_len)
    for row, start, end, position in runs:
        out_cache_loc[position : position + end - start] = req_to_token[row, start:end]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """The cache slots of the accepted drafts (``accept_index`` != -1), in order, at the front."""
    kept = accept_index.reshape(-1)
    kept = kept[kept != -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept]


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """Each request's last accepted token (its accept length counts the bonus token)."""
    rows = torch.arange(accept_lens.numel(), device=accept_lens.device)
    bonus_tokens.copy_(accept_tokens.reshape(-1)[rows * accept_stride + accept_lens.long() - 1])


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy verification of each request's draft tree: from the root, follow the child whose
    draft token is the target's pick after the last accepted one (siblings in order), up to
    ``accept_index``'s width; ``predicts`` gets the target's pick at every accepted position."""
    batch, drafts = candidates.shape
    spec = accept_index.shape[1]
    index, nxt, sibling = retrive_index.tolist(), retrive_next_token.tolist(), retrive_next_sibling.tolist()
    tokens, target = candidates.tolist(), target_predict.reshape(-1).tolist()
    for b in range(batch):
        last = index[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, spec):
            cur = nxt[b][cur]
            while cur != -1 and tokens[b][cur] != target[last]:
                cur = sibling[b][cur]
            if cur == -1:
                break
            predicts[last] = target[last]
            accepted += 1
            accept_index[b, accepted] = index[b][cur]
            last = index[b][cur]
        accept_token_num[b] = accepted
        predicts[last] = target[last]


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """From each request's draft tree mask (row t: the drafts t sees, its ancestors and itself):
    each draft's position (the verified length + its depth), its first child and its next sibling."""
    n = draft_token_num
    masks = tree_mask.reshape(-1)[: batch_size * n * n].view(batch_size, n, n).tolist()
    for b, (mask, verified) in enumerate(zip(masks, verified_seq_len.tolist(), strict=False)):
        for t in range(n):
            ancestors = [i for i in range(t) if mask[t][i]]
            parent = ancestors[-1] if ancestors else -1
            retrive_index[b, t] = b * n + t
            positions[b * n + t] = verified + len(ancestors)
            retrive_next_token[b, t] = next((i for i in range(t + 1, n) if mask[i][t]), -1)
            retrive_next_sibling[b, t] = -1 if parent == -1 else next(
                (i for i in range(t + 1, n) if mask[i][parent] and not any(mask[i][parent + 1 : i])), -1)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """In every KV buffer (its address and row bytes), row ``src_loc[i]`` copied to row
    ``tgt_loc[i]``: all the rows read before any is written, as SGLang's tiled copy loads then stores."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist(), strict=True))
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        rows = [ctypes.string_at(base + src * stride, stride) for _, src in pairs]
        for (tgt, _), row in zip(pairs, rows, strict=True):
            ctypes.memmove(base + tgt * stride, row, stride)


# ``from sgl_kernel.speculative import reconstruct_indices_from_tree_mask`` (SGLang's NGRAM worker
# on a CPU): the import system finds the submodule here, though this module is no package.
speculative = types.ModuleType(f"{__name__}.speculative")
speculative.reconstruct_indices_from_tree_mask = reconstruct_indices_from_tree_mask
sys.modules[speculative.__name__] = speculative


def _unimplemented(name: str):
    def fail(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by sglang_rvv's pure-torch fallback; this "
            "feature needs the real CPU build of sgl_kernel (install it, or turn the feature off)"
        )

    fail.__name__ = fail.__qualname__ = name
    return fail


# Imported by SGLang's CPU engine at import time, but only called by features
# (EAGLE's tree build) the appliance does not serve.
build_tree_kernel_efficient_cpu = _unimplemented("build_tree_kernel_efficient_cpu")


def __getattr__(name: str):
    raise AttributeError(
        f"sgl_kernel.{name}: sglang_rvv's pure-torch sgl_kernel fallback does not provide it; "
        "install the real CPU build of sgl_kernel for this feature"
    )
