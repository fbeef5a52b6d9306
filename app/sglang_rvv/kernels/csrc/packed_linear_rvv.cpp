// The RVV 1.0 kernels for the packed BF16 layout. The only file built with -march=rv64gcv;
// packed_linear_generic.cpp is its scalar twin (same results, bit for bit).
//
// VLEN-agnostic: every vector length comes from vsetvl. The 32 FP32 accumulators of one row
// of a block are one e32m4 group: exactly 32 lanes at VLEN 256 (the K1), 16 at VLEN 128 (the
// block then takes two column passes), 64 at VLEN 512 (vl = 32 uses half of it).
//
// Register budget (32 vector registers; an m4 group is 4 of them): a tile of R rows holds R
// accumulator groups, plus the BF16 weight vector (e16m2, 2 registers) and its FP32 widening
// (e32m4, 4). R = 4 takes 4*4 + 2 + 4 = 22 registers: each weight vector is loaded and widened
// once per k for all 4 rows, nothing spills (clang 19 keeps the whole loop in registers), and
// every bucket above 2 rows (4, 8, 16, ..., 128) is a whole number of tiles. R = 6 would still
// fit (30 registers, none to spare) and amortise the widening over more rows, but leaves ragged
// tiles in every bucket; whether that pays on the K1 is for a measurement on the board.

#include <cstring>

#include "bf16.h"
#include "packed_linear.h"

namespace sglang_rvv {
namespace {

// A K panel of one block is kPanelK rows of 64 bytes = 16 KiB: it stays in the K1's 32 KiB L1D
// while every row tile (and, at VLEN 128, the second column pass) reads it again, so the
// weight comes from memory once.
constexpr int64_t kPanelK = 256;

// Up to kSmallRows rows the kernel walks one block at a time: the packed weight streams from
// memory in order, once (decode is bound by memory bandwidth). With more rows it walks
// kGroupBlocks blocks per K panel, so the rows' panel of x (rows * 1 KiB) is read once from L2
// for all of them instead of once per block.
constexpr int64_t kSmallRows = 16;
constexpr int64_t kRowTile = 4;

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// acc[r][0..vl) += sum over k < kn of x[r][k] * w[k][0..vl), for the R rows of one tile, in k
// order (the twin's order). x: the tile's first row at the panel's first k, rows ldx apart;
// w: the block's panel at the tile's first column, rows kBlockN apart; acc: rows kBlockN apart.
template <int R>
void tile_bf16_32x(const float* x, int64_t ldx, const uint16_t* w, int64_t kn, float* acc, size_t vl) {
  static_assert(R >= 1 && R <= kRowTile, "a tile has 1..kRowTile rows");
  vfloat32m4_t c0 = __riscv_vle32_v_f32m4(acc, vl), c1, c2, c3;
  if constexpr (R > 1) c1 = __riscv_vle32_v_f32m4(acc + kBlockN, vl);
  if constexpr (R > 2) c2 = __riscv_vle32_v_f32m4(acc + 2 * kBlockN, vl);
  if constexpr (R > 3) c3 = __riscv_vle32_v_f32m4(acc + 3 * kBlockN, vl);
  for (int64_t k = 0; k < kn; ++k) {
    const vfloat32m4_t wk = bf16_to_f32_m4(w + k * kBlockN, vl);
    c0 = __riscv_vfmacc_vf_f32m4(c0, x[k], wk, vl);
    if constexpr (R > 1) c1 = __riscv_vfmacc_vf_f32m4(c1, x[ldx + k], wk, vl);
    if constexpr (R > 2) c2 = __riscv_vfmacc_vf_f32m4(c2, x[2 * ldx + k], wk, vl);
    if constexpr (R > 3) c3 = __riscv_vfmacc_vf_f32m4(c3, x[3 * ldx + k], wk, vl);
  }
  __riscv_vse32_v_f32m4(acc, c0, vl);
  if constexpr (R > 1) __riscv_vse32_v_f32m4(acc + kBlockN, c1, vl);
  if constexpr (R > 2) __riscv_vse32_v_f32m4(acc + 2 * kBlockN, c2, vl);
  if constexpr (R > 3) __riscv_vse32_v_f32m4(acc + 3 * kBlockN, c3, vl);
}

// One K panel of one block for all m rows: column passes of vl lanes, 4-row tiles, then the
// 1..3 rows left (m = 1 is the GEMV: one accumulator group, the panel read once).
void panel_bf16_32x(const float* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t kn, float* acc) {
  for (int64_t j0 = 0; j0 < kBlockN;) {
    const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(kBlockN - j0));
    int64_t r = 0;
    for (; r + kRowTile <= m; r += kRowTile) {
      tile_bf16_32x<kRowTile>(x + r * ldx, ldx, w + j0, kn, acc + r * kBlockN + j0, vl);
    }
    switch (m - r) {
      case 3: tile_bf16_32x<3>(x + r * ldx, ldx, w + j0, kn, acc + r * kBlockN + j0, vl); break;
      case 2: tile_bf16_32x<2>(x + r * ldx, ldx, w + j0, kn, acc + r * kBlockN + j0, vl); break;
      case 1: tile_bf16_32x<1>(x + r * ldx, ldx, w + j0, kn, acc + r * kBlockN + j0, vl); break;
      default: break;
    }
    j0 += static_cast<int64_t>(vl);
  }
}

// Rounds m rows of accumulators to BF16 and writes their first `cols` columns.
void store_bf16(const float* acc, int64_t m, uint16_t* out, int64_t ldo, int64_t cols) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j0 = 0; j0 < cols;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(cols - j0));
      const vfloat32m4_t v = __riscv_vle32_v_f32m4(acc + r * kBlockN + j0, vl);
      __riscv_vse16_v_u16m2(out + r * ldo + j0, f32_to_bf16_rne_m4(v, vl), vl);
      j0 += static_cast<int64_t>(vl);
    }
  }
}

}  // namespace

void linear_bf16_32x_rvv(const LinearArgs& a, int64_t block_begin, int64_t block_end, float* scratch) {
  const int64_t group = a.m <= kSmallRows ? 1 : kGroupBlocks;
  const int64_t block_floats = a.m * kBlockN;
  for (int64_t g0 = block_begin; g0 < block_end; g0 += group) {
    const int64_t g1 = min64(g0 + group, block_end);
    std::memset(scratch, 0, sizeof(float) * static_cast<size_t>((g1 - g0) * block_floats));
    for (int64_t k0 = 0; k0 < a.k; k0 += kPanelK) {
      const int64_t kn = min64(kPanelK, a.k - k0);
      for (int64_t b = g0; b < g1; ++b) {
        panel_bf16_32x(a.x + k0, a.k, a.m, a.packed + (b * a.k + k0) * kBlockN, kn,
                       scratch + (b - g0) * block_floats);
      }
    }
    for (int64_t b = g0; b < g1; ++b) {
      store_bf16(scratch + (b - g0) * block_floats, a.m, a.out + b * kBlockN, a.n,
                 min64(kBlockN, a.n - b * kBlockN));
    }
  }
}

int64_t rvv_vlen_bits() { return static_cast<int64_t>(__riscv_vsetvlmax_e8m1()) * 8; }

}  // namespace sglang_rvv
