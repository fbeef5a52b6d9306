// The RVV 1.0 kernel for the int4 layout (qweight uint8 [B, Kp/2, 32]: byte (b, i, j) holds
// columns 2i (low nibble) and 2i+1 (high), each q + 8; BF16 scales [B, Kp/G, 32]);
// int4_generic.cpp is its scalar twin (same results, bit for bit). The walk over blocks, groups
// and row tiles is quant_rvv.h's; this file supplies the inner loop.
//
// One e8m1 load of 32 nibble pairs serves two K steps for 32 lanes: vand / vsrl at e8, vwsub.vx
// of 8 to int16 (two registers each), then vfwcvt to FP32 (exact), one vfmacc per row.
// K is unrolled by four (two loads, issued first; one prefetch per 64-byte line). Group starts
// are even columns (G is even), so a run always starts on a low nibble.

#include "kernels.h"
#include "quant_rvv.h"
#include "vec.h"

namespace sglang_rvv {
namespace {

struct Int4 {
  static const uint8_t* block(const uint8_t* qweight, int64_t b, int64_t kp) {
    return qweight + b * (kp / 2) * kBlockN;
  }
  static const uint8_t* at(const uint8_t* wblock, int64_t k) { return wblock + (k / 2) * kBlockN; }

  template <int R>
  static void accumulate(const float* x, int64_t ldx, const uint8_t* w, int64_t n, size_t vl, vfloat32m4_t& c0,
                         vfloat32m4_t& c1, vfloat32m4_t& c2, vfloat32m4_t& c3) {
    const auto pairs = [&](int64_t i) { return __riscv_vle8_v_u8m1(w + (i / 2) * kBlockN, vl); };
    const auto step = [&](int64_t i, vint16m2_t q) { fma_rows<R>(c0, c1, c2, c3, x, ldx, i, i16_to_f32_m4(q, vl), vl); };
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      prefetch_r(w + (i / 2) * kBlockN + kPrefetchBytes);
      const vuint8m1_t p0 = pairs(i), p1 = pairs(i + 2);
      // All four unpacks first (e8), then two widenings (e16) before their two fmas (e32), twice:
      // five vtypes per four K steps (fma_rows_pair).
      const vint16m2_t q0 = int4_low(p0, vl), q1 = int4_high(p0, vl), q2 = int4_low(p1, vl), q3 = int4_high(p1, vl);
      fma_rows_pair<R>(c0, c1, c2, c3, x, ldx, i, i16_to_f32_m4(q0, vl), i16_to_f32_m4(q1, vl), vl);
      fma_rows_pair<R>(c0, c1, c2, c3, x, ldx, i + 2, i16_to_f32_m4(q2, vl), i16_to_f32_m4(q3, vl), vl);
    }
    for (; i + 2 <= n; i += 2) {
      const vuint8m1_t p = pairs(i);
      step(i, int4_low(p, vl));
      step(i + 1, int4_high(p, vl));
    }
    if (i < n) step(i, int4_low(pairs(i), vl));
  }
};

}  // namespace

void linear_int4_32x_rvv(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, float* scratch) {
  quant_rvv::linear<Int4>(a, block_begin, block_end, scratch);
}

}  // namespace sglang_rvv
