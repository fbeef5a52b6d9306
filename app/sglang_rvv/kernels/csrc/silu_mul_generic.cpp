// Scalar SiLU x mul: the twin of silu_mul_rvv.cpp, bit for bit (vec.h's silu_mul_f32 per
// element), and what runs where the CPU has no V. Built without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void silu_mul_generic(const SiluMulArgs& a, int64_t row_begin, int64_t row_end) {
  silu_mul_rows(a, row_begin, row_end, [&](const uint16_t* g, const uint16_t* u, uint16_t* out) {
    for (int64_t i = 0; i < a.d; ++i) out[i] = f32_to_bf16_rne(silu_mul_f32(bf16_to_f32(g[i]), bf16_to_f32(u[i])));
  });
}

}  // namespace sglang_rvv
