// Scalar widening of BF16 rows to FP32: the twin of widen_rvv.cpp (exact: the same bits), and what
// runs where the CPU has no V. Built without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void widen_generic(const WidenArgs& a, int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t i = 0; i < a.d; ++i) a.out[r * a.d + i] = bf16_to_f32(a.x[r * a.ldx + i]);
  }
}

}  // namespace sglang_rvv
