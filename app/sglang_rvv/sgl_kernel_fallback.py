"""Pure-torch stand-in for the CPU build of ``sgl_kernel`` (loaded as ``sgl_kernel``).

Only used when no real ``sgl_kernel`` is importable (see ``sglang_rvv_boot``).
SGLang's CPU engine imports these names at import time; the plain serving path
(no speculative decoding, no KV offload) calls only
``assign_req_to_token_pool_cpu``, implemented here. Everything else raises a
NotImplementedError naming the function, so a feature that needs the real
kernels fails loudly instead of computing something wrong.
"""

from __future__ import annotations

import torch

IS_SGLANG_RVV_FALLBACK = True


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = `` the i-th run of ``out_cache_loc``."""
    position = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        if not 0 <= start <= end <= pool_len:
            raise ValueError(f"assign_req_to_token_pool_cpu: slots [{start}, {end}) outside 0..{pool_len}")
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[position : position + length]
        position += length


def _unimplemented(name: str):
    def fail(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by sglang_rvv's pure-torch fallback; this "
            "feature needs the real CPU build of sgl_kernel (install it, or turn the feature off)"
        )

    fail.__name__ = fail.__qualname__ = name
    return fail


# Imported by SGLang's CPU engine at import time, but only called by features
# (speculative decoding, KV cache moves) the plain serving path does not use.
copy_all_layer_kv_cache_cpu = _unimplemented("copy_all_layer_kv_cache_cpu")
assign_extend_cache_locs_cpu = _unimplemented("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = _unimplemented("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _unimplemented("fill_bonus_tokens_cpu")
build_tree_kernel_efficient_cpu = _unimplemented("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _unimplemented("verify_tree_greedy_cpu")


def __getattr__(name: str):
    raise AttributeError(
        f"sgl_kernel.{name}: sglang_rvv's pure-torch sgl_kernel fallback does not provide it; "
        "install the real CPU build of sgl_kernel for this feature"
    )
