// The RVV 1.0 kernel for the packed BF16 layout. Built with -march=rv64gcv (as every *_rvv.cpp,
// and nothing else); bf16_generic.cpp is its scalar twin (same results, bit for bit).
//
// VLEN-agnostic: every vector length comes from vsetvl. The 32 FP32 accumulators of one row
// of a block are one e32m4 group: exactly 32 lanes at VLEN 256 (the K1), 16 at VLEN 128 (the
// block then takes two column passes), 64 at VLEN 512 (vl = 32 uses half of it).
//
// Register budget (32 vector registers; an m4 group is 4 of them): a tile of R rows holds R
// accumulator groups, plus two BF16 weight rows (e16m2, 2 registers each: K is unrolled by two
// so both loads issue before the arithmetic that needs them, which an in-order X60 cannot
// reorder) and one FP32 widening (e32m4, 4). R = 4 takes 16 + 4 + 4 = 24 registers; each weight
// vector is loaded and widened once per k for all 4 rows, and every bucket above 2 rows
// (4, 8, 16, ..., 128) is a whole number of tiles.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {
namespace {

constexpr int64_t kRowTile = 4;
constexpr int64_t kPrefetchRows = kPrefetchBytes / (kBlockN * 2);  // BF16 rows of 64 bytes

// acc[r][0..vl) = (fresh ? +0 : acc[r]) + sum over k < kn of x[r][k] * w[k][0..vl), for the R
// rows of one tile, one fma per k in k order (the twin's order). x: the tile's first row of
// the FP32 panel, rows ldx apart; w: the block's panel at the tile's first column, rows
// kBlockN apart; acc: rows kBlockN apart.
template <int R>
void tile_bf16_32x(const float* x, int64_t ldx, const uint16_t* w, int64_t kn, float* acc, bool fresh, size_t vl) {
  static_assert(R >= 1 && R <= kRowTile, "a tile has 1..kRowTile rows");
  vfloat32m4_t c0, c1, c2, c3;
  if (fresh) {
    c0 = c1 = c2 = c3 = __riscv_vfmv_v_f_f32m4(0.0f, vl);
  } else {
    c0 = __riscv_vle32_v_f32m4(acc, vl);
    if constexpr (R > 1) c1 = __riscv_vle32_v_f32m4(acc + kBlockN, vl);
    if constexpr (R > 2) c2 = __riscv_vle32_v_f32m4(acc + 2 * kBlockN, vl);
    if constexpr (R > 3) c3 = __riscv_vle32_v_f32m4(acc + 3 * kBlockN, vl);
  }
  const auto step = [&](vfloat32m4_t wk, int64_t k) { fma_rows<R>(c0, c1, c2, c3, x, ldx, k, wk, vl); };
  int64_t k = 0;
  for (; k + 2 <= kn; k += 2) {
    prefetch_r(w + (k + kPrefetchRows) * kBlockN);
    prefetch_r(w + (k + 1 + kPrefetchRows) * kBlockN);
    const vuint16m2_t r0 = __riscv_vle16_v_u16m2(w + k * kBlockN, vl);
    const vuint16m2_t r1 = __riscv_vle16_v_u16m2(w + (k + 1) * kBlockN, vl);
    step(__riscv_vreinterpret_v_u32m4_f32m4(__riscv_vsll_vx_u32m4(__riscv_vzext_vf2_u32m4(r0, vl), 16, vl)), k);
    step(__riscv_vreinterpret_v_u32m4_f32m4(__riscv_vsll_vx_u32m4(__riscv_vzext_vf2_u32m4(r1, vl), 16, vl)), k + 1);
  }
  if (k < kn) step(bf16_to_f32_m4(w + k * kBlockN, vl), k);
  __riscv_vse32_v_f32m4(acc, c0, vl);
  if constexpr (R > 1) __riscv_vse32_v_f32m4(acc + kBlockN, c1, vl);
  if constexpr (R > 2) __riscv_vse32_v_f32m4(acc + 2 * kBlockN, c2, vl);
  if constexpr (R > 3) __riscv_vse32_v_f32m4(acc + 3 * kBlockN, c3, vl);
}

// One K panel of one block's lanes for all m rows: column passes of vl lanes, 4-row tiles, then the
// 1..3 rows left (m = 1 is the GEMV: one accumulator group, the panel read once).
void panel_bf16_32x(const LinearArgs& a, const float* x, int64_t ldx, const uint16_t* w, int64_t kn, float* acc,
                    bool fresh) {
  const int64_t m = a.m;
  for (int64_t j0 = a.lane_begin; j0 < a.lane_end;) {
    const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(a.lane_end - j0));
    int64_t r = 0;
    for (; r + kRowTile <= m; r += kRowTile) {
      tile_bf16_32x<kRowTile>(x + r * ldx, ldx, w + j0, kn, acc + r * kBlockN + j0, fresh, vl);
    }
    switch (m - r) {
      case 3: tile_bf16_32x<3>(x + r * ldx, ldx, w + j0, kn, acc + r * kBlockN + j0, fresh, vl); break;
      case 2: tile_bf16_32x<2>(x + r * ldx, ldx, w + j0, kn, acc + r * kBlockN + j0, fresh, vl); break;
      case 1: tile_bf16_32x<1>(x + r * ldx, ldx, w + j0, kn, acc + r * kBlockN + j0, fresh, vl); break;
      default: break;
    }
    j0 += static_cast<int64_t>(vl);
  }
}

}  // namespace

// walk_blocks (vec.h) with one block's BF16 K panel at a time. A K panel of one block is kPanelK
// rows of 64 bytes = 16 KiB: it stays in the K1's 32 KiB L1D while every row tile (and, at VLEN
// 128, the second column pass) reads it again. The first panel starts the accumulators from +0,
// so the scratch needs no clearing.
void linear_bf16_32x_rvv(const LinearArgs& a, int64_t block_begin, int64_t block_end, float* scratch) {
  float* const xf = scratch;
  float* const acc = scratch + a.m * kPanelK;
  walk_blocks(a, block_begin, block_end, xf, acc, [&](int64_t b, int64_t k0, int64_t kn, int64_t slot) {
    panel_bf16_32x(a, xf, kn, a.packed + (b * a.k + k0) * kBlockN, kn, acc + slot, k0 == 0);
  });
}

int64_t rvv_vlen_bits() { return static_cast<int64_t>(__riscv_vsetvlmax_e8m1()) * 8; }

}  // namespace sglang_rvv
