// RVV 1.0 residual add of BF16 rows, out = bf16(a + b) (FP32 add, one rounding): transformers'
// `residual + hidden_states`, the same bits as torch's BF16 add and as the residual add that
// rmsnorm_rvv.cpp fuses into its norm. add_generic.cpp is its scalar twin.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void add_rvv(const AddArgs& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint16_t* x = a.a + r * a.lda;
    const uint16_t* y = a.b + r * a.ldb;
    uint16_t* out = a.out + r * a.d;
    for (int64_t i = 0; i < a.d;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(a.d - i));
      const vfloat32m4_t sum = __riscv_vfadd_vv_f32m4(bf16_to_f32_m4(x + i, vl), bf16_to_f32_m4(y + i, vl), vl);
      __riscv_vse16_v_u16m2(out + i, f32_to_bf16_rne_m4(sum, vl), vl);
      i += static_cast<int64_t>(vl);
    }
  }
}

}  // namespace sglang_rvv
