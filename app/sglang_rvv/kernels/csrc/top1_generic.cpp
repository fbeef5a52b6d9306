// Scalar top-1 of each row: the twin of top1_rvv.cpp (an index: the same result exactly), and what
// runs where the CPU has no V. Built without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

namespace {

template <class Value>
int64_t row_top1(const Value* x, int64_t n) {
  float best = value_f32(x[0]);
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = value_f32(x[i]);
    if (v != v) return i;  // the first NaN wins, as in torch.argmax
    if (v > best) {
      best = v;
      at = i;
    }
  }
  return at;
}

}  // namespace

void top1_generic(const Top1Args& a, int64_t row_begin, int64_t row_end) {
  top1_rows(a, row_begin, row_end, [](const auto* x, int64_t n) { return row_top1(x, n); });
}

}  // namespace sglang_rvv
