// Scalar RMSNorm (the residual add fused in): the twin of rmsnorm_rvv.cpp, bit for bit, and what
// runs where the CPU has no V. Built without V. The order of every sum is kernels.h's.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void rmsnorm_generic(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint16_t* x = a.x + r * a.ldx;
    uint16_t* residual = a.residual ? a.residual + r * a.ldr : nullptr;
    float lanes[kNormLanes] = {};
    for (int64_t i = 0; i < a.d; ++i) {
      float h = bf16_to_f32(x[i]);
      if (residual) {
        residual[i] = f32_to_bf16_rne(h + bf16_to_f32(residual[i]));
        h = bf16_to_f32(residual[i]);
      }
      lanes[i % kNormLanes] = __builtin_fmaf(h, h, lanes[i % kNormLanes]);
    }
    const float inv = rms_inverse(sum_lanes(lanes), a.d, a.eps);
    const uint16_t* h = residual ? residual : x;
    uint16_t* out = a.out + r * a.ldo;
    for (int64_t i = 0; i < a.d; ++i) out[i] = f32_to_bf16_rne((bf16_to_f32(h[i]) * inv) * bf16_to_f32(a.weight[i]));
  }
}

}  // namespace sglang_rvv
