// RVV 1.0 rotary embedding; rotary_generic.cpp is its scalar twin (same bits): each pair is
// elementwise (a vfmul, then a vfnmsac or vfmacc, as the twin's product and fma), so any vl
// gives the same result.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void rotary_rvv(const RotaryArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t half = a.d / 2;
  rotary_rows(a, row_begin, row_end, [&](const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* out) {
    for (int64_t i = 0; i < half;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(half - i));
      const vfloat32m4_t x1 = bf16_to_f32_m4(x + i, vl), x2 = bf16_to_f32_m4(x + half + i, vl);
      const vfloat32m4_t c = bf16_to_f32_m4(cos + i, vl), s = bf16_to_f32_m4(sin + i, vl);
      const vfloat32m4_t lo = __riscv_vfnmsac_vv_f32m4(__riscv_vfmul_vv_f32m4(x1, c, vl), x2, s, vl);
      const vfloat32m4_t hi = __riscv_vfmacc_vv_f32m4(__riscv_vfmul_vv_f32m4(x2, c, vl), x1, s, vl);
      __riscv_vse16_v_u16m2(out + i, f32_to_bf16_rne_m4(lo, vl), vl);
      __riscv_vse16_v_u16m2(out + half + i, f32_to_bf16_rne_m4(hi, vl), vl);
      i += static_cast<int64_t>(vl);
    }
  });
}

}  // namespace sglang_rvv
