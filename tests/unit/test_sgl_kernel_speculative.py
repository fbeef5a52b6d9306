"""The pure-torch stand-ins of sgl_kernel's CPU speculative ops (sglang_rvv/sgl_kernel_fallback.py),
each against what SGLang's own kernel of the name does (its CUDA or Triton source, sglang 0.5.21)
on a tree small enough to work out by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import sglang_rvv

FALLBACK = Path(sglang_rvv.__file__).resolve().parent / "sgl_kernel_fallback.py"


@pytest.fixture(scope="module")
def ops():
    # Loaded under its own name: the test process may hold SGLang's import of sgl_kernel.
    spec = importlib.util.spec_from_file_location("sgl_kernel_standin", FALLBACK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("sgl_kernel_standin.speculative", None)


# Drafts of one request: 0 is the root (the last verified token), 1 and 2 its children, 3 a
# child of 2. Row t: the drafts t sees (its ancestors and itself).
TREE = [[1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 0, 1, 1]]


def _links(ops, masks, verified):
    bs, n = len(masks), len(masks[0])
    positions = torch.full((bs * n,), -9, dtype=torch.int64)
    index, nxt, sibling = (torch.full((bs, n), -9, dtype=torch.int64) for _ in range(3))
    ops.reconstruct_indices_from_tree_mask(torch.tensor(masks, dtype=torch.bool).flatten(), torch.tensor(verified),
                                           positions, index, nxt, sibling, bs, n)
    return positions, index, nxt, sibling


def test_the_tree_masks_links_and_positions(ops):
    positions, index, nxt, sibling = _links(ops, [TREE, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]],
                                            [10, 3])
    assert positions.tolist() == [10, 11, 11, 12, 3, 4, 5, 6]  # the verified length + the depth
    assert index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert nxt.tolist() == [[1, -1, 3, -1], [1, 2, 3, -1]]  # the first child
    assert sibling.tolist() == [[-1, 2, -1, -1], [-1, -1, -1, -1]]  # 2 follows its sibling 1


def test_the_import_of_sglangs_ngram_worker_finds_it(ops):
    assert sys.modules["sgl_kernel_standin.speculative"].reconstruct_indices_from_tree_mask \
        is ops.reconstruct_indices_from_tree_mask


@pytest.mark.parametrize("target, accepted, path, predicts", [
    # The target picks 7 after the root (draft 2's token), then 8 after draft 2 (draft 3's), then 5.
    ([7, 0, 8, 5], 2, [0, 2, 3], {0: 7, 2: 8, 3: 5}),
    # 6 is draft 1's token: accepted; after draft 1 (a leaf) the target's pick is the bonus.
    ([6, 4, 0, 0], 1, [0, 1], {0: 6, 1: 4}),
    # 9 is no child's: nothing accepted, the root's pick is the bonus.
    ([9, 0, 0, 0], 0, [0], {0: 9}),
])
def test_greedy_verification_follows_the_targets_picks_down_the_tree(ops, target, accepted, path, predicts):
    _, index, nxt, sibling = _links(ops, [TREE], [10])
    candidates = torch.tensor([[3, 6, 7, 8]])  # draft 0 holds the verified token
    got = torch.full((4,), -1, dtype=torch.int32)
    accept_index = torch.full((1, 4), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    ops.verify_tree_greedy_cpu(got, accept_index, accept_num, candidates, index, nxt, sibling, torch.tensor([target]))
    assert accept_num.tolist() == [accepted]
    assert accept_index[0, :accepted + 1].tolist() == path and (accept_index[0, accepted + 1:] == -1).all()
    assert {i: v for i, v in enumerate(got.tolist()) if v != -1} == predicts


def test_the_accepted_drafts_cache_slots_and_bonus_tokens(ops):
    accept_index = torch.tensor([[0, 2, 3, -1], [4, -1, -1, -1]], dtype=torch.int32)
    out = torch.full((8,), -1, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(accept_index, torch.arange(100, 108), out)
    assert out.tolist() == [100, 102, 103, 104, -1, -1, -1, -1]
    bonus = torch.zeros(2, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(torch.tensor([[7, 8, 5, 0], [9, 0, 0, 0]]), torch.tensor([3, 1]), bonus, 4)
    assert bonus.tolist() == [5, 9]


def test_extend_cache_slots_are_read_from_each_requests_row(ops):
    req_to_token = torch.arange(40, dtype=torch.int32).view(4, 10)
    out = torch.empty(5, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(torch.tensor([2, 0]), req_to_token, torch.tensor([3, 7]), torch.tensor([6, 9]),
                                     out, 10)
    assert out.tolist() == [23, 24, 25, 7, 8]
    with pytest.raises(ValueError, match=r"slots \[7, 11\) outside 0..10"):
        ops.assign_extend_cache_locs_cpu(torch.tensor([0]), req_to_token, torch.tensor([7]), torch.tensor([11]),
                                         out, 10)


def test_kv_rows_are_copied_in_every_buffer_all_read_before_any_written(ops):
    buffers = [torch.arange(24, dtype=torch.int16).view(6, 4).clone(), torch.arange(100, 112, dtype=torch.int16)
               .view(6, 2).clone()]
    want = [b.clone() for b in buffers]
    for b in want:  # rows 1 -> 2 and 2 -> 3 at once: 3 gets row 2's old content
        b[[2, 3]] = b[[1, 2]].clone()
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([2, 3]), torch.tensor([1, 2]))
    assert all(torch.equal(b, w) for b, w in zip(buffers, want, strict=True))
