// RVV 1.0 widening of BF16 rows to FP32; widen_generic.cpp is its scalar twin (exact: the same
// bits). The linear kernels' panel widening (vec.h) is the same pass, over the call's rows.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void widen_rvv(const WidenArgs& a, int64_t row_begin, int64_t row_end) {
  widen_bf16_panel(a.x + row_begin * a.ldx, a.ldx, row_end - row_begin, a.d, a.out + row_begin * a.d);
}

}  // namespace sglang_rvv
