// Scalar C++ for the int8 layout: the quantizing pack, and the twin of int8_rvv.cpp's kernel
// (what runs where the CPU has no V, and the oracle the RVV kernel is tested against). Built
// without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void quantize_int8_32x(const uint16_t* weight, int8_t* qweight, uint16_t* scales, int64_t n, int64_t k,
                       int64_t group, int64_t block_begin, int64_t block_end) {
  const int64_t kp = (k + group - 1) / group * group;
  quantize_blocks(weight, scales, n, k, group, kInt8Qmin, kInt8Qmax, block_begin, block_end,
                  [&](int64_t b, int64_t kk, int64_t j, int q) {
                    qweight[(b * kp + kk) * kBlockN + j] = static_cast<int8_t>(q);
                  });
}

// Per row and block: 32 group sums and 32 accumulators on the stack, groups in order.
void linear_int8_32x_generic(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, float* /*scratch*/) {
  const int64_t groups = (a.k + a.group - 1) / a.group, kp = groups * a.group;
  for (int64_t b = block_begin; b < block_end; ++b) {
    const int8_t* w = reinterpret_cast<const int8_t*>(a.qweight) + b * kp * kBlockN;
    const uint16_t* sc = a.scales + b * groups * kBlockN;
    const int64_t lanes_end = min64(a.lane_end, a.n - b * kBlockN);
    for (int64_t r = 0; r < a.m; ++r) {
      const uint16_t* x = a.x + r * a.k;
      float acc[kBlockN] = {};
      for (int64_t g = 0; g < groups; ++g) {
        float s[kBlockN] = {};
        for (int64_t k = g * a.group; k < min64(g * a.group + a.group, a.k); ++k) {
          const float xk = bf16_to_f32(x[k]);
          for (int64_t j = a.lane_begin; j < a.lane_end; ++j) {
            s[j] = __builtin_fmaf(xk, static_cast<float>(w[k * kBlockN + j]), s[j]);
          }
        }
        for (int64_t j = a.lane_begin; j < a.lane_end; ++j) {
          acc[j] = __builtin_fmaf(s[j], bf16_to_f32(sc[g * kBlockN + j]), acc[j]);
        }
      }
      uint16_t* out = a.out + r * a.n + b * kBlockN;
      for (int64_t j = a.lane_begin; j < lanes_end; ++j) out[j] = f32_to_bf16_rne(acc[j]);
    }
  }
}

}  // namespace sglang_rvv
