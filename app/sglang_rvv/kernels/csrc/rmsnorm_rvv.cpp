// RVV 1.0 RMSNorm (the residual add fused in); rmsnorm_generic.cpp is its scalar twin (same bits).
//
// VLEN-agnostic and the twin's order: the sum of squares is kNormLanes (16) FP32 fma chains, one
// per lane of a fixed vl = 16 (e32m4 holds 16 lanes from VLEN 128 up), the last short chunk
// tail-undisturbed so the other chains keep their sums; the 16 sums are added in scalar order.
// The scaling pass is elementwise, so it takes whatever vl the hardware gives.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void rmsnorm_rvv(const NormArgs& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint16_t* x = a.x + r * a.ldx;
    uint16_t* residual = a.residual ? a.residual + r * a.ldr : nullptr;
    vfloat32m4_t chains = __riscv_vfmv_v_f_f32m4(0.0f, kNormLanes);
    for (int64_t i = 0; i < a.d; i += kNormLanes) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(min64(kNormLanes, a.d - i)));
      vfloat32m4_t h = bf16_to_f32_m4(x + i, vl);
      if (residual) {
        const vuint16m2_t sum = f32_to_bf16_rne_m4(__riscv_vfadd_vv_f32m4(h, bf16_to_f32_m4(residual + i, vl), vl), vl);
        __riscv_vse16_v_u16m2(residual + i, sum, vl);
        h = bf16_bits_to_f32_m4(sum, vl);
      }
      chains = __riscv_vfmacc_vv_f32m4_tu(chains, h, h, vl);
    }
    float lanes[kNormLanes];
    __riscv_vse32_v_f32m4(lanes, chains, kNormLanes);
    const float inv = rms_inverse(sum_lanes(lanes), a.d, a.eps);
    const uint16_t* h = residual ? residual : x;
    uint16_t* out = a.out + r * a.ldo;
    for (int64_t i = 0; i < a.d;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(a.d - i));
      const vfloat32m4_t scaled = __riscv_vfmul_vf_f32m4(bf16_to_f32_m4(h + i, vl), inv, vl);
      const vfloat32m4_t y = __riscv_vfmul_vv_f32m4(scaled, bf16_to_f32_m4(a.weight + i, vl), vl);
      __riscv_vse16_v_u16m2(out + i, f32_to_bf16_rne_m4(y, vl), vl);
      i += static_cast<int64_t>(vl);
    }
  }
}

}  // namespace sglang_rvv
