// RVV 1.0 SiLU x mul; silu_mul_generic.cpp is its scalar twin (same bits): vec.h's exp_f32_m4 is
// exp_f32's operations on vectors, and the rest is elementwise, so any vl gives the same result.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void silu_mul_rvv(const SiluMulArgs& a, int64_t row_begin, int64_t row_end) {
  silu_mul_rows(a, row_begin, row_end, [&](const uint16_t* g, const uint16_t* u, uint16_t* out) {
    for (int64_t i = 0; i < a.d;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(a.d - i));
      const vfloat32m4_t gate = bf16_to_f32_m4(g + i, vl);
      const vfloat32m4_t e = exp_f32_m4(__riscv_vfneg_v_f32m4(gate, vl), vl);
      const vfloat32m4_t silu = __riscv_vfdiv_vv_f32m4(gate, __riscv_vfadd_vf_f32m4(e, 1.0f, vl), vl);
      const vfloat32m4_t y = __riscv_vfmul_vv_f32m4(silu, bf16_to_f32_m4(u + i, vl), vl);
      __riscv_vse16_v_u16m2(out + i, f32_to_bf16_rne_m4(y, vl), vl);
      i += static_cast<int64_t>(vl);
    }
  });
}

}  // namespace sglang_rvv
