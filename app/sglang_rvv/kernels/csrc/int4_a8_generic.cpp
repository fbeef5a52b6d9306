// Scalar C++ twin of int4_a8_rvv.cpp: the int4 layout with the activations quantized to int8 per
// row and group (kernels.h's arithmetic), the oracle the RVV kernel is tested against. Built
// without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void linear_int4_a8_32x_generic(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, float* scratch) {
  const int64_t groups = (a.k + a.group - 1) / a.group, kp = groups * a.group;
  auto* const xq = reinterpret_cast<int8_t*>(scratch);
  float* const d = scratch + (a.m * kp + 3) / 4;
  for (int64_t r = 0; r < a.m; ++r) {
    const uint16_t* x = a.x + r * a.k;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t begin = g * a.group, end = min64(begin + a.group, a.k);
      uint16_t amax = 0;
      bool non_finite = false;
      for (int64_t k = begin; k < end; ++k) {
        const uint16_t magnitude = x[k] & 0x7FFFu;
        amax = magnitude > amax ? magnitude : amax;
        non_finite = non_finite || bf16_non_finite(x[k]);
      }
      const A8Group p = a8_group(amax, non_finite);
      d[r * groups + g] = p.d;
      for (int64_t k = begin; k < begin + a.group; ++k) {
        xq[r * kp + k] = static_cast<int8_t>(p.inv != 0.0f && k < end ? __builtin_rintf(bf16_to_f32(x[k]) * p.inv) : 0);
      }
    }
  }
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint8_t* w = a.qweight + b * (kp / 2) * kBlockN;
    const uint16_t* sc = a.scales + b * groups * kBlockN;
    const int64_t lanes_end = min64(a.lane_end, a.n - b * kBlockN);
    for (int64_t r = 0; r < a.m; ++r) {
      float acc[kBlockN] = {};
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = a.lane_begin; j < a.lane_end; ++j) {
          int32_t s = 0;
          for (int64_t k = g * a.group; k < min64(g * a.group + a.group, a.k); ++k) {
            s += xq[r * kp + k] * int4_value(w[(k / 2) * kBlockN + j], k);
          }
          const float t = static_cast<float>(s) * d[r * groups + g];
          acc[j] = __builtin_fmaf(t, bf16_to_f32(sc[g * kBlockN + j]), acc[j]);
        }
      }
      uint16_t* out = a.out + r * a.n + b * kBlockN;
      for (int64_t j = a.lane_begin; j < lanes_end; ++j) out[j] = f32_to_bf16_rne(acc[j]);
    }
  }
}

}  // namespace sglang_rvv
