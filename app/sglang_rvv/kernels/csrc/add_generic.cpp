// Scalar residual add of BF16 rows: the twin of add_rvv.cpp, bit for bit, and what runs where the
// CPU has no V. Built without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void add_generic(const AddArgs& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t i = 0; i < a.d; ++i) {
      a.out[r * a.d + i] = f32_to_bf16_rne(bf16_to_f32(a.a[r * a.lda + i]) + bf16_to_f32(a.b[r * a.ldb + i]));
    }
  }
}

}  // namespace sglang_rvv
