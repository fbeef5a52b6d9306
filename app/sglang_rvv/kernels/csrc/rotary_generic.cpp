// Scalar rotary embedding: the twin of rotary_rvv.cpp, bit for bit (kernels.h's formula per
// pair), and what runs where the CPU has no V. Built without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void rotary_generic(const RotaryArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t half = a.d / 2;
  rotary_rows(a, row_begin, row_end, [&](const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* out) {
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = bf16_to_f32(x[i]), x2 = bf16_to_f32(x[i + half]);
      const float c = bf16_to_f32(cos[i]), s = bf16_to_f32(sin[i]);
      out[i] = f32_to_bf16_rne(__builtin_fmaf(-x2, s, x1 * c));
      out[i + half] = f32_to_bf16_rne(__builtin_fmaf(x1, s, x2 * c));
    }
  });
}

}  // namespace sglang_rvv
