// The RVV 1.0 kernel for the int4 layout with int8 activations (kernels.h's arithmetic);
// int4_a8_generic.cpp is its scalar twin (same results, bit for bit).
//
// The weight stays 4 bits to the multiply: per pair of K steps one e8m1 load of 32 nibble pairs,
// vand / vsrl, and per row two vwmaccsu.vx (the row's int8 x, signed, times the unsigned nibble
// q + 8) into int16 sums. Every op of that loop is at e8m1, so it needs no vtype switch, where the
// BF16-activation kernel widens each nibble to int16, then to FP32 (vfwcvt) for a vfmacc at LMUL
// 4. Counted under qemu, a Qwen3-0.6B decode step (lm_head int4 too) runs 104.5 M LMUL-weighted
// vector instructions in the kernel library where int4 runs 189.4 M: the board model's kernel
// time drops from 78.8 ms to 45.5 ms, under the weight stream's 74.5 ms.
// The int16 sums take 16 K steps at most (16 * 15 * 127 < 2^15) before vwadd.wv folds them into
// int32; a group's sum then loses 8 * its sum of xq (the nibble's offset), becomes FP32 exactly
// and is scaled as the twin does.
// Rows go in pairs: two rows keep 8 + 8 + 4 vector registers of sums.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {
namespace {

constexpr int64_t kChunk = 16;  // K steps an int16 sum holds (every G is a multiple)

// xq, d and the sum of xq per row and group (kernels.h), columns up to kp (zero past K).
void quantize_rows(const QuantLinearArgs& a, int64_t kp, int64_t groups, int8_t* xq, float* d, int32_t* sums) {
  for (int64_t r = 0; r < a.m; ++r) {
    const uint16_t* x = a.x + r * a.k;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * a.group, end = min64(begin + a.group, a.k);
      vuint16m1_t amax = __riscv_vmv_s_x_u16m1(0, 1);
      long non_finite = 0;
      for (int64_t i = begin; i < end;) {
        const size_t vl = __riscv_vsetvl_e16m2(static_cast<size_t>(end - i));
        const vuint16m2_t bits = __riscv_vle16_v_u16m2(x + i, vl);
        amax = __riscv_vredmaxu_vs_u16m2_u16m1(__riscv_vand_vx_u16m2(bits, 0x7FFF, vl), amax, vl);
        non_finite += __riscv_vcpop_m_b8(__riscv_vmseq_vx_u16m2_b8(__riscv_vand_vx_u16m2(bits, 0x7F80, vl), 0x7F80, vl),
                                         vl);
        i += static_cast<int64_t>(vl);
      }
      const A8Group p = a8_group(__riscv_vmv_x_s_u16m1_u16(amax), non_finite != 0);
      d[r * groups + g] = p.d;
      int8_t* q = xq + r * kp;
      vint32m1_t sum = __riscv_vmv_s_x_i32m1(0, 1);
      for (int64_t i = begin; i < begin + a.group;) {
        const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(begin + a.group - i));
        if (p.inv == 0.0f || i >= end) {
          __riscv_vse8_v_i8m1(q + i, __riscv_vmv_v_x_i8m1(0, vl), vl);
        } else {
          const size_t real = min64(static_cast<int64_t>(vl), end - i);
          // vfcvt.x.f rounds as frm (nearest even, as rintf); |x * inv| <= 127 plus an ulp.
          const vint32m4_t v = __riscv_vfcvt_x_f_v_i32m4(__riscv_vfmul_vf_f32m4(bf16_to_f32_m4(x + i, real), p.inv, real), real);
          sum = __riscv_vredsum_vs_i32m4_i32m1(v, sum, real);
          __riscv_vse8_v_i8m1(q + i, __riscv_vncvt_x_x_w_i8m1(__riscv_vncvt_x_x_w_i16m2(v, real), real), real);
          if (real < vl) __riscv_vse8_v_i8m1(q + i + real, __riscv_vmv_v_x_i8m1(0, vl - real), vl - real);
        }
        i += static_cast<int64_t>(vl);
      }
      sums[r * groups + g] = __riscv_vmv_x_s_i32m1_i32(sum);
    }
  }
}

struct Rows {
  const int8_t* xq;  // row r0's quantized values; the next row kp further
  const float* d;    // row r0's d per group; the next row `groups` further
  const int32_t* sums;
  int64_t kp, groups;
};

// R (1 or 2) rows of one block's lane pass [j0, j0 + vl): every group in order, then the first
// store_vl lanes rounded into out (row r0's, the next row ldo further).
template <int R>
void tile(const QuantLinearArgs& a, const Rows& rows, const uint8_t* wblock, const uint16_t* sblock, uint16_t* out,
          int64_t ldo, size_t vl, size_t store_vl) {
  const vfloat32m4_t fzero = __riscv_vfmv_v_f_f32m4(0.0f, vl);
  vfloat32m4_t acc0 = fzero, acc1 = fzero;
  const int8_t* x0 = rows.xq;
  const int8_t* x1 = rows.xq + rows.kp;
  for (int64_t g = 0; g < rows.groups; ++g) {
    vint32m4_t s0 = __riscv_vmv_v_x_i32m4(0, vl), s1 = s0;
    for (int64_t c = g * a.group; c < (g + 1) * a.group; c += kChunk) {
      vint16m2_t h0 = __riscv_vmv_v_x_i16m2(0, vl), h1 = h0;
      const uint8_t* w = wblock + (c / 2) * kBlockN;
      for (int64_t i = 0; i < kChunk; i += 4) {
        prefetch_r(w + (i / 2) * kBlockN + kPrefetchBytes);
        const vuint8m1_t p0 = __riscv_vle8_v_u8m1(w + (i / 2) * kBlockN, vl);
        const vuint8m1_t p1 = __riscv_vle8_v_u8m1(w + (i / 2 + 1) * kBlockN, vl);
        const vuint8m1_t q0 = __riscv_vand_vx_u8m1(p0, 0xF, vl), q1 = __riscv_vsrl_vx_u8m1(p0, 4, vl);
        const vuint8m1_t q2 = __riscv_vand_vx_u8m1(p1, 0xF, vl), q3 = __riscv_vsrl_vx_u8m1(p1, 4, vl);
        const int64_t k = c + i;
        h0 = __riscv_vwmaccsu_vx_i16m2(h0, x0[k], q0, vl);
        h0 = __riscv_vwmaccsu_vx_i16m2(h0, x0[k + 1], q1, vl);
        h0 = __riscv_vwmaccsu_vx_i16m2(h0, x0[k + 2], q2, vl);
        h0 = __riscv_vwmaccsu_vx_i16m2(h0, x0[k + 3], q3, vl);
        if constexpr (R > 1) {
          h1 = __riscv_vwmaccsu_vx_i16m2(h1, x1[k], q0, vl);
          h1 = __riscv_vwmaccsu_vx_i16m2(h1, x1[k + 1], q1, vl);
          h1 = __riscv_vwmaccsu_vx_i16m2(h1, x1[k + 2], q2, vl);
          h1 = __riscv_vwmaccsu_vx_i16m2(h1, x1[k + 3], q3, vl);
        }
      }
      s0 = __riscv_vwadd_wv_i32m4(s0, h0, vl);
      if constexpr (R > 1) s1 = __riscv_vwadd_wv_i32m4(s1, h1, vl);
    }
    const vfloat32m4_t scale = bf16_to_f32_m4(sblock + g * kBlockN, vl);
    const auto fold = [&](vint32m4_t s, int64_t row, vfloat32m4_t acc) {
      const int64_t at = row * rows.groups + g;
      const vint32m4_t exact = __riscv_vsub_vx_i32m4(s, kInt4Offset * rows.sums[at], vl);
      const vfloat32m4_t t = __riscv_vfmul_vf_f32m4(__riscv_vfcvt_f_x_v_f32m4(exact, vl), rows.d[at], vl);
      return __riscv_vfmacc_vv_f32m4(acc, t, scale, vl);
    };
    acc0 = fold(s0, 0, acc0);
    if constexpr (R > 1) acc1 = fold(s1, 1, acc1);
  }
  __riscv_vse16_v_u16m2(out, f32_to_bf16_rne_m4(acc0, store_vl), store_vl);
  if constexpr (R > 1) __riscv_vse16_v_u16m2(out + ldo, f32_to_bf16_rne_m4(acc1, store_vl), store_vl);
}

}  // namespace

void linear_int4_a8_32x_rvv(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, float* scratch) {
  const int64_t groups = (a.k + a.group - 1) / a.group, kp = groups * a.group;
  auto* const xq = reinterpret_cast<int8_t*>(scratch);
  float* const d = scratch + (a.m * kp + 3) / 4;
  auto* const sums = reinterpret_cast<int32_t*>(d + a.m * groups);
  quantize_rows(a, kp, groups, xq, d, sums);
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint8_t* wblock = a.qweight + b * (kp / 2) * kBlockN;
    const uint16_t* sblock = a.scales + b * groups * kBlockN;
    const int64_t cols_end = min64(a.lane_end, a.n - b * kBlockN);
    for (int64_t j0 = a.lane_begin; j0 < a.lane_end;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(a.lane_end - j0));
      if (j0 < cols_end) {
        const auto store_vl = static_cast<size_t>(min64(static_cast<int64_t>(vl), cols_end - j0));
        uint16_t* out = a.out + b * kBlockN + j0;
        const auto rows = [&](int64_t r) { return Rows{xq + r * kp, d + r * groups, sums + r * groups, kp, groups}; };
        int64_t r = 0;
        for (; r + 2 <= a.m; r += 2) tile<2>(a, rows(r), wblock + j0, sblock + j0, out + r * a.n, a.n, vl, store_vl);
        if (r < a.m) tile<1>(a, rows(r), wblock + j0, sblock + j0, out + r * a.n, a.n, vl, store_vl);
      }
      j0 += static_cast<int64_t>(vl);
    }
  }
}

}  // namespace sglang_rvv
