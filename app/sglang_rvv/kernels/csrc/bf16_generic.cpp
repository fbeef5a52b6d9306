// Scalar C++ for the packed BF16 layout: the packing itself, and the twin of bf16_rvv.cpp's
// kernel (what runs where the CPU has no V, and the oracle the RVV kernel is tested against).
// Built without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void pack_bf16_32x(const uint16_t* weight, uint16_t* packed, int64_t n, int64_t k, int64_t block_begin,
                   int64_t block_end) {
  for (int64_t b = block_begin; b < block_end; ++b) {
    uint16_t* dst = packed + b * k * kBlockN;
    // k outer: the 32 source rows' current cache lines serve the next 31 values of k too.
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t j = 0; j < kBlockN; ++j) {
        const int64_t row = b * kBlockN + j;
        dst[kk * kBlockN + j] = row < n ? weight[row * k + kk] : 0;
      }
    }
  }
}

// The scratch is for the ISA kernels; one row's 32 accumulators fit on the stack here.
void linear_bf16_32x_generic(const LinearArgs& a, int64_t block_begin, int64_t block_end, float* /*scratch*/) {
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint16_t* w = a.packed + b * a.k * kBlockN;
    const int64_t lanes_end = min64(a.lane_end, a.n - b * kBlockN);
    for (int64_t r = 0; r < a.m; ++r) {
      const uint16_t* x = a.x + r * a.k;
      float acc[kBlockN] = {};
      for (int64_t k = 0; k < a.k; ++k) {
        const float xk = bf16_to_f32(x[k]);
        for (int64_t j = a.lane_begin; j < a.lane_end; ++j) {
          acc[j] = __builtin_fmaf(xk, bf16_to_f32(w[k * kBlockN + j]), acc[j]);
        }
      }
      uint16_t* out = a.out + r * a.n + b * kBlockN;
      for (int64_t j = a.lane_begin; j < lanes_end; ++j) out[j] = f32_to_bf16_rne(acc[j]);
    }
  }
}

}  // namespace sglang_rvv
