// RVV 1.0 top-1 of each row; top1_generic.cpp is its scalar twin (an index: the same result exactly).
//
// One pass over the row, vl values at a time (any VLEN): a NaN in the chunk ends the row at the
// first one (torch.argmax's rule, the twin's); otherwise the chunk's max, reduced together with the
// best so far, replaces it only when strictly larger, at the chunk's first lane equal to it. So
// the first of equal maxima wins, as in the twin (-0.0 and +0.0 compare equal in both; vfredmax
// may return +0.0 for a -0.0 best, which is not larger, so the earlier index stays).

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

namespace {

// The rows' values as FP32 (e32m4): BF16 bits widened exactly, or FP32 as they are.
vfloat32m4_t load_f32_m4(const uint16_t* p, size_t vl) { return bf16_to_f32_m4(p, vl); }
vfloat32m4_t load_f32_m4(const float* p, size_t vl) { return __riscv_vle32_v_f32m4(p, vl); }

template <class Value>
int64_t row_top1(const Value* x, int64_t n) {
  float best = value_f32(x[0]);
  int64_t at = 0;
  for (int64_t i = 0; i < n;) {
    const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(n - i));
    const vfloat32m4_t v = load_f32_m4(x + i, vl);
    const long nan = __riscv_vfirst_m_b8(__riscv_vmfne_vv_f32m4_b8(v, v, vl), vl);
    if (nan >= 0) return i + nan;
    const float m = __riscv_vfmv_f_s_f32m1_f32(
        __riscv_vfredmax_vs_f32m4_f32m1(v, __riscv_vfmv_s_f_f32m1(best, 1), vl));
    if (m > best) {
      best = m;
      at = i + __riscv_vfirst_m_b8(__riscv_vmfeq_vf_f32m4_b8(v, m, vl), vl);
    }
    i += static_cast<int64_t>(vl);
  }
  return at;
}

}  // namespace

void top1_rvv(const Top1Args& a, int64_t row_begin, int64_t row_end) {
  top1_rows(a, row_begin, row_end, [](const auto* x, int64_t n) { return row_top1(x, n); });
}

}  // namespace sglang_rvv
