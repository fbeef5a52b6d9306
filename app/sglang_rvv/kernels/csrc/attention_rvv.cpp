// RVV 1.0 decode attention; attention_generic.cpp is its scalar twin (same bits). Every vector
// lane is one of the twin's chains: the scores take vl keys at once (a strided load of one
// column of k per step i, an indexed one from a paged cache, so each key's chain runs over i in order), the outputs vl columns of
// v at once (each column's chain over j in order); the max is exact in any order and the sum is
// the twin's scalar loop.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void attention_rvv(const AttentionArgs& a, int64_t row_begin, int64_t row_end, float* scratch) {
  const ptrdiff_t k_stride = static_cast<ptrdiff_t>(a.kt * sizeof(uint16_t));
  attention_rows(a, row_begin, row_end, [&](const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                                            int64_t keys, const int32_t* slots) {
    float* const p = scratch;
    for (int64_t j0 = 0; j0 < keys;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(keys - j0));
      vfloat32m4_t s = __riscv_vfmv_v_f_f32m4(0.0f, vl);
      if (slots) {
        // The keys' byte offsets in the cache, once per vl keys: an indexed load then takes
        // element i of each, where the contiguous case takes a strided one.
        const vuint64m8_t at = __riscv_vwmulu_vx_u64m8(
            __riscv_vreinterpret_v_i32m4_u32m4(__riscv_vle32_v_i32m4(slots + j0, vl)),
            static_cast<uint32_t>(k_stride), vl);
        for (int64_t i = 0; i < a.d; ++i) {
          const vuint16m2_t column = __riscv_vluxei64_v_u16m2(k + i, at, vl);
          s = __riscv_vfmacc_vf_f32m4(s, bf16_to_f32(q[i]), bf16_bits_to_f32_m4(column, vl), vl);
        }
      } else {
        for (int64_t i = 0; i < a.d; ++i) {
          const vuint16m2_t column = __riscv_vlse16_v_u16m2(k + j0 * a.kt + i, k_stride, vl);
          s = __riscv_vfmacc_vf_f32m4(s, bf16_to_f32(q[i]), bf16_bits_to_f32_m4(column, vl), vl);
        }
      }
      __riscv_vse32_v_f32m4(p + j0, __riscv_vfmul_vf_f32m4(s, a.scale, vl), vl);
      j0 += static_cast<int64_t>(vl);
    }
    float m = -__builtin_inff();
    for (int64_t j0 = 0; j0 < keys;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(keys - j0));
      const vfloat32m1_t init = __riscv_vfmv_s_f_f32m1(m, 1);
      m = __riscv_vfmv_f_s_f32m1_f32(__riscv_vfredmax_vs_f32m4_f32m1(__riscv_vle32_v_f32m4(p + j0, vl), init, vl));
      j0 += static_cast<int64_t>(vl);
    }
    for (int64_t j0 = 0; j0 < keys;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(keys - j0));
      const vfloat32m4_t t = __riscv_vfsub_vf_f32m4(__riscv_vle32_v_f32m4(p + j0, vl), m, vl);
      const vbool8_t nan = __riscv_vmfne_vv_f32m4_b8(t, t, vl);
      __riscv_vse32_v_f32m4(p + j0, __riscv_vmerge_vvm_f32m4(exp_f32_m4(t, vl), t, nan, vl), vl);
      j0 += static_cast<int64_t>(vl);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < keys; ++j) sum += p[j];
    for (int64_t i0 = 0; i0 < a.d;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(a.d - i0));
      vfloat32m4_t acc = __riscv_vfmv_v_f_f32m4(0.0f, vl);
      for (int64_t j = 0; j < keys; ++j) {
        acc = __riscv_vfmacc_vf_f32m4(acc, p[j], bf16_to_f32_m4(v + key_row(slots, j, a.vt) + i0, vl), vl);
      }
      __riscv_vse16_v_u16m2(out + i0, f32_to_bf16_rne_m4(__riscv_vfdiv_vf_f32m4(acc, sum, vl), vl), vl);
      i0 += static_cast<int64_t>(vl);
    }
  });
}

}  // namespace sglang_rvv
