// BF16 <-> FP32 by integer operations. The SpacemiT K1 has no Zfbfmin, Zvfbfmin or Zvfbfwma,
// so a BF16 value widens by a zero-extend and a shift left by 16 (exact), and an FP32 result
// narrows by round-to-nearest-even on its bits. Every NaN becomes 0x7FC0, as in torch's
// c10::BFloat16, so these kernels and torch's own conversion agree bit for bit.
//
// Every function here is static: the header is compiled once with V and once without, and an
// inline function with external linkage would be merged by the linker, so scalar code could end
// up calling the copy compiled with vector instructions.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__riscv_vector)
#include <riscv_vector.h>
#endif

namespace sglang_rvv {

constexpr uint16_t kBf16NaN = 0x7FC0;

static inline float bf16_to_f32(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &widened, sizeof value);
  return value;
}

static inline uint16_t f32_to_bf16_rne(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return kBf16NaN;
  // Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the
  // dropped half is above one half, or equal to it with an odd kept half.
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

#if defined(__riscv_vector)

// vl BF16 values at p as FP32 (e32m4; the source is e16m2): vzext.vf2, then vsll.vi 16.
static inline vfloat32m4_t bf16_to_f32_m4(const uint16_t* p, size_t vl) {
  const vuint32m4_t widened = __riscv_vzext_vf2_u32m4(__riscv_vle16_v_u16m2(p, vl), vl);
  return __riscv_vreinterpret_v_u32m4_f32m4(__riscv_vsll_vx_u32m4(widened, 16, vl));
}

// The same rounding as f32_to_bf16_rne, vl lanes at a time: add 0x7FFF + lsb, narrowing shift
// right by 16, NaN lanes replaced by 0x7FC0.
static inline vuint16m2_t f32_to_bf16_rne_m4(vfloat32m4_t value, size_t vl) {
  const vuint32m4_t bits = __riscv_vreinterpret_v_f32m4_u32m4(value);
  const vuint32m4_t lsb = __riscv_vand_vx_u32m4(__riscv_vsrl_vx_u32m4(bits, 16, vl), 1, vl);
  const vuint32m4_t rounded = __riscv_vadd_vv_u32m4(bits, __riscv_vadd_vx_u32m4(lsb, 0x7FFF, vl), vl);
  const vuint16m2_t narrowed = __riscv_vnsrl_wx_u16m2(rounded, 16, vl);
  const vbool8_t nan = __riscv_vmfne_vv_f32m4_b8(value, value, vl);
  return __riscv_vmerge_vxm_u16m2(narrowed, kBf16NaN, nan, vl);
}

#endif  // __riscv_vector

}  // namespace sglang_rvv
