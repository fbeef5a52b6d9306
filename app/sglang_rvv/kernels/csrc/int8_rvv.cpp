// The RVV 1.0 kernel for the int8 layout (qweight int8 [B, Kp, 32], BF16 scales [B, Kp/G, 32]);
// int8_generic.cpp is its scalar twin (same results, bit for bit). The walk over blocks, groups
// and row tiles is quant_rvv.h's; this file supplies the inner loop.
//
// Per K step and row tile: one e8m1 load of 32 int8 lanes (32 bytes: half the bytes of BF16),
// vsext.vf2 + vfwcvt to FP32 (exact), one vfmacc per row. K is unrolled by four so the loads
// issue first, and each two widenings come before their two fmas (fma_rows_pair: four vtypes per
// four K steps, not eight; unrolled by two, the asm cost a vmv.v.v of the sums at LMUL 4 per two
// steps); one prefetch per 64-byte line. Registers with 4 rows: 16 for the sums, 4 for the
// loaded rows, 2 for an int16 row and 8 for two widened ones (2 spare).

#include "kernels.h"
#include "quant_rvv.h"
#include "vec.h"

namespace sglang_rvv {
namespace {

struct Int8 {
  static const uint8_t* block(const uint8_t* qweight, int64_t b, int64_t kp) { return qweight + b * kp * kBlockN; }
  static const uint8_t* at(const uint8_t* wblock, int64_t k) { return wblock + k * kBlockN; }

  template <int R>
  static void accumulate(const float* x, int64_t ldx, const uint8_t* w, int64_t n, size_t vl, vfloat32m4_t& c0,
                         vfloat32m4_t& c1, vfloat32m4_t& c2, vfloat32m4_t& c3) {
    const auto row = [&](int64_t i) {
      return __riscv_vle8_v_i8m1(reinterpret_cast<const int8_t*>(w + i * kBlockN), vl);
    };
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      prefetch_r(w + i * kBlockN + kPrefetchBytes);
      prefetch_r(w + (i + 2) * kBlockN + kPrefetchBytes);
      const vint8m1_t q0 = row(i), q1 = row(i + 1), q2 = row(i + 2), q3 = row(i + 3);
      fma_rows_pair<R>(c0, c1, c2, c3, x, ldx, i, i8_to_f32_m4(q0, vl), i8_to_f32_m4(q1, vl), vl);
      fma_rows_pair<R>(c0, c1, c2, c3, x, ldx, i + 2, i8_to_f32_m4(q2, vl), i8_to_f32_m4(q3, vl), vl);
    }
    for (; i + 2 <= n; i += 2) {
      prefetch_r(w + i * kBlockN + kPrefetchBytes);
      const vint8m1_t q0 = row(i), q1 = row(i + 1);
      fma_rows<R>(c0, c1, c2, c3, x, ldx, i, i8_to_f32_m4(q0, vl), vl);
      fma_rows<R>(c0, c1, c2, c3, x, ldx, i + 1, i8_to_f32_m4(q1, vl), vl);
    }
    if (i < n) fma_rows<R>(c0, c1, c2, c3, x, ldx, i, i8_to_f32_m4(row(i), vl), vl);
  }
};

}  // namespace

void linear_int8_32x_rvv(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, float* scratch) {
  quant_rvv::linear<Int8>(a, block_begin, block_end, scratch);
}

}  // namespace sglang_rvv
