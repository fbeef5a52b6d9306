// The walk the int8 and int4 RVV kernels share (included by int8_rvv.cpp and int4_rvv.cpp only,
// so every copy of it is compiled with V). A layout supplies the inner loop, L::accumulate<R>:
// the fma chain of R rows over a run of K steps within one group, from its weight at a column.
//
// Per block and column pass, a tile of up to 4 rows keeps its group sums s in registers
// (4 e32m4 groups) and walks the K panel's groups in order; at a group's end it folds s into
// the accumulators in the scratch (acc = fma(s, scale, acc), from +0 for the first group); a
// group that runs past the panel leaves s in the scratch for the next panel. The order of every
// fma is the twin's, so the bits are too.
#pragma once

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv::quant_rvv {

constexpr int64_t kRowTile = 4;

// Where a block's group sums and accumulators live in the scratch: rows kBlockN apart.
struct BlockState {
  float* sums;
  float* acc;
};

template <class L, int R>
void tile(const QuantLinearArgs& a, const float* x, int64_t ldx, const uint8_t* wblock, const uint16_t* sblock,
          int64_t k0, int64_t k1, BlockState st, size_t vl) {
  const vfloat32m4_t zero = __riscv_vfmv_v_f_f32m4(0.0f, vl);
  vfloat32m4_t c0 = zero, c1 = zero, c2 = zero, c3 = zero;
  for (int64_t kk = k0; kk < k1;) {
    const int64_t g = kk / a.group, group_begin = g * a.group, group_end = min64(group_begin + a.group, a.k);
    const int64_t end = min64(group_end, k1);
    if (kk == group_begin) {
      c0 = c1 = c2 = c3 = zero;
    } else {
      c0 = __riscv_vle32_v_f32m4(st.sums, vl);
      if constexpr (R > 1) c1 = __riscv_vle32_v_f32m4(st.sums + kBlockN, vl);
      if constexpr (R > 2) c2 = __riscv_vle32_v_f32m4(st.sums + 2 * kBlockN, vl);
      if constexpr (R > 3) c3 = __riscv_vle32_v_f32m4(st.sums + 3 * kBlockN, vl);
    }
    L::template accumulate<R>(x + (kk - k0), ldx, L::at(wblock, kk), end - kk, vl, c0, c1, c2, c3);
    if (end == group_end) {
      const vfloat32m4_t scale = bf16_to_f32_m4(sblock + g * kBlockN, vl);
      const auto fold = [&](vfloat32m4_t s, float* acc) {
        const vfloat32m4_t prev = g == 0 ? zero : __riscv_vle32_v_f32m4(acc, vl);
        __riscv_vse32_v_f32m4(acc, __riscv_vfmacc_vv_f32m4(prev, s, scale, vl), vl);
      };
      fold(c0, st.acc);
      if constexpr (R > 1) fold(c1, st.acc + kBlockN);
      if constexpr (R > 2) fold(c2, st.acc + 2 * kBlockN);
      if constexpr (R > 3) fold(c3, st.acc + 3 * kBlockN);
    } else {
      __riscv_vse32_v_f32m4(st.sums, c0, vl);
      if constexpr (R > 1) __riscv_vse32_v_f32m4(st.sums + kBlockN, c1, vl);
      if constexpr (R > 2) __riscv_vse32_v_f32m4(st.sums + 2 * kBlockN, c2, vl);
      if constexpr (R > 3) __riscv_vse32_v_f32m4(st.sums + 3 * kBlockN, c3, vl);
    }
    kk = end;
  }
}

// K steps [k0, k1) of one block's lanes for all m rows: column passes of vl lanes, 4-row tiles, then
// the 1..3 rows left.
template <class L>
void panel(const QuantLinearArgs& a, const float* x, int64_t ldx, const uint8_t* wblock, const uint16_t* sblock,
           int64_t k0, int64_t k1, BlockState st) {
  for (int64_t j0 = a.lane_begin; j0 < a.lane_end;) {
    const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(a.lane_end - j0));
    const auto at = [&](int64_t r) { return BlockState{st.sums + r * kBlockN + j0, st.acc + r * kBlockN + j0}; };
    int64_t r = 0;
    for (; r + kRowTile <= a.m; r += kRowTile) {
      tile<L, kRowTile>(a, x + r * ldx, ldx, wblock + j0, sblock + j0, k0, k1, at(r), vl);
    }
    switch (a.m - r) {
      case 3: tile<L, 3>(a, x + r * ldx, ldx, wblock + j0, sblock + j0, k0, k1, at(r), vl); break;
      case 2: tile<L, 2>(a, x + r * ldx, ldx, wblock + j0, sblock + j0, k0, k1, at(r), vl); break;
      case 1: tile<L, 1>(a, x + r * ldx, ldx, wblock + j0, sblock + j0, k0, k1, at(r), vl); break;
      default: break;
    }
    j0 += static_cast<int64_t>(vl);
  }
}

// The kernel: walk_blocks (vec.h) with one block's quantized K panel at a time, its group sums
// beside its accumulators in the scratch.
template <class L>
void linear(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, float* scratch) {
  const int64_t groups = (a.k + a.group - 1) / a.group, kp = groups * a.group;
  float* const xf = scratch;
  float* const acc = xf + a.m * kPanelK;
  float* const sums = acc + kGroupBlocks * a.m * kBlockN;
  walk_blocks(a, block_begin, block_end, xf, acc, [&](int64_t b, int64_t k0, int64_t kn, int64_t slot) {
    panel<L>(a, xf, kn, L::block(a.qweight, b, kp), a.scales + b * groups * kBlockN, k0, k0 + kn,
             BlockState{sums + slot, acc + slot});
  });
}

}  // namespace sglang_rvv::quant_rvv
