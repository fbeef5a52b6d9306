// Scalar decode attention: the twin of attention_rvv.cpp, bit for bit (kernels.h's order for every
// score, the softmax and every output), and what runs where the CPU has no V. Built without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void attention_generic(const AttentionArgs& a, int64_t row_begin, int64_t row_end, float* scratch) {
  attention_rows(a, row_begin, row_end, [&](const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                                            int64_t keys, const int32_t* slots) {
    float* const p = scratch;
    float m = -__builtin_inff();
    for (int64_t j = 0; j < keys; ++j) {
      const uint16_t* const kj = k + key_row(slots, j, a.kt);
      float s = 0.0f;
      for (int64_t i = 0; i < a.d; ++i) s = __builtin_fmaf(bf16_to_f32(q[i]), bf16_to_f32(kj[i]), s);
      p[j] = s * a.scale;
      m = __builtin_fmaxf(m, p[j]);  // a NaN score is passed over here (fmax.s, vfredmax), and kept below
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < keys; ++j) {
      const float t = p[j] - m;
      p[j] = t != t ? t : exp_f32(t);
      sum += p[j];
    }
    for (int64_t i = 0; i < a.d; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < keys; ++j) acc = __builtin_fmaf(p[j], bf16_to_f32(v[key_row(slots, j, a.vt) + i]), acc);
      out[i] = f32_to_bf16_rne(acc / sum);
    }
  });
}

}  // namespace sglang_rvv
