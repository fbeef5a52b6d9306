// The helpers every kernel shares: BF16 <-> FP32, the quantized values' widening, and (with V)
// their vector forms, the prefetch hint and the widening of an activation panel.
//
// BF16 <-> FP32 by integer operations. The SpacemiT K1 has no Zfbfmin, Zvfbfmin or Zvfbfwma,
// so a BF16 value widens by a zero-extend and a shift left by 16 (exact), and an FP32 result
// narrows by round-to-nearest-even on its bits. Every NaN becomes 0x7FC0, as in torch's
// c10::BFloat16, so these kernels and torch's own conversion agree bit for bit.
//
// Every function here is static: the header is compiled once with V and once without, and an
// inline function with external linkage would be merged by the linker, so scalar code could end
// up calling the copy compiled with vector instructions. Only compiler headers are included
// (no libc), so the kernels also build freestanding.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#if defined(__riscv_vector)
#include <riscv_vector.h>
#endif

namespace sglang_rvv {

constexpr uint16_t kBf16NaN = 0x7FC0;

static inline float bf16_to_f32(uint16_t bits) {
  const uint32_t widened = static_cast<uint32_t>(bits) << 16;
  float value;
  __builtin_memcpy(&value, &widened, sizeof value);
  return value;
}

static inline uint16_t f32_to_bf16_rne(float value) {
  uint32_t bits;
  __builtin_memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return kBf16NaN;
  // Adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when the
  // dropped half is above one half, or equal to it with an odd kept half.
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// q of column k from the int4 nibble pair holding it (byte row k / 2: even k low, odd k high).
static inline int int4_value(uint8_t pair, int64_t k) { return ((k & 1) ? pair >> 4 : pair & 0xF) - kInt4Offset; }

// An activation group of the int8-activation kernels (kernels.h): d, and inv (0: every xq is 0),
// from the group's largest |x| bits (sign cleared: for finite values the integer order is the
// value order, so the max needs no FP compare) and whether it holds a NaN or an infinity.
struct A8Group {
  float d, inv;
};
static inline A8Group a8_group(uint16_t amax_bits, bool non_finite) {
  if (non_finite) return {__builtin_nanf(""), 0.0f};
  const float amax = bf16_to_f32(amax_bits);
  if (amax == 0.0f) return {0.0f, 0.0f};
  const float inv = 127.0f / amax;
  if (inv > 3.40282347e38f) return {0.0f, 0.0f};  // amax below 127 / FLT_MAX: the group counts as 0
  return {amax / 127.0f, inv};
}
static inline bool bf16_non_finite(uint16_t bits) { return (bits & 0x7F80u) == 0x7F80u; }

// layout.quantize_reference, for blocks [block_begin, block_end) of a finite BF16 [n, k] weight:
// per row and group of `group` columns, scale = bf16(amax / qmax) (FP32 division), s = its
// value, q = 0 if s == 0 else clamp(rne(w / s), qmin, qmax) (FP32 division, ties to even).
// store_q(b, kk, j, q) takes every q of the blocked layout, padding (q = 0) included; scales
// is [ceil(n/32), ceil(k/group), 32], rows past n get scale 0. Scalar: it runs once, at load.
template <class StoreQ>
void quantize_blocks(const uint16_t* weight, uint16_t* scales, int64_t n, int64_t k, int64_t group, int qmin,
                     int qmax, int64_t block_begin, int64_t block_end, StoreQ store_q) {
  const int64_t groups = (k + group - 1) / group;
  for (int64_t b = block_begin; b < block_end; ++b) {
    for (int64_t j = 0; j < kBlockN; ++j) {
      const int64_t row = b * kBlockN + j;
      const uint16_t* w = weight + (row < n ? row : 0) * k;  // rows past n are never read
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t begin = g * group, end = min64(begin + group, k);
        float amax = 0.0f;
        for (int64_t kk = begin; row < n && kk < end; ++kk) {
          const float v = __builtin_fabsf(bf16_to_f32(w[kk]));
          amax = v > amax ? v : amax;
        }
        const uint16_t scale = f32_to_bf16_rne(amax / static_cast<float>(qmax));
        scales[(b * groups + g) * kBlockN + j] = scale;
        const float s = bf16_to_f32(scale);
        for (int64_t kk = begin; kk < begin + group; ++kk) {
          int q = 0;
          if (s != 0.0f && row < n && kk < k) {
            const float r = __builtin_rintf(bf16_to_f32(w[kk]) / s);
            q = r < static_cast<float>(qmin) ? qmin : r > static_cast<float>(qmax) ? qmax : static_cast<int>(r);
          }
          store_q(b, kk, j, q);
        }
      }
    }
  }
}

// The scalar quantized kernel, both layouts' twin: blocks [block_begin, block_end) of a call in
// kernels.h's arithmetic order, per row and block 32 group sums and 32 accumulators on the
// stack, groups in order. A block's qweight is block_bytes long, and q(w, k, j) reads the value
// of column k, lane j from the block starting at w; the layouts differ only there.
template <class Q>
void linear_quant_blocks(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, int64_t block_bytes,
                         Q q) {
  const int64_t groups = (a.k + a.group - 1) / a.group;
  for (int64_t b = block_begin; b < block_end; ++b) {
    const uint8_t* w = a.qweight + b * block_bytes;
    const uint16_t* sc = a.scales + b * groups * kBlockN;
    const int64_t lanes_end = min64(a.lane_end, a.n - b * kBlockN);
    for (int64_t r = 0; r < a.m; ++r) {
      const uint16_t* x = a.x + r * a.k;
      float acc[kBlockN] = {};
      for (int64_t g = 0; g < groups; ++g) {
        float s[kBlockN] = {};
        for (int64_t k = g * a.group; k < min64(g * a.group + a.group, a.k); ++k) {
          const float xk = bf16_to_f32(x[k]);
          for (int64_t j = a.lane_begin; j < a.lane_end; ++j) {
            s[j] = __builtin_fmaf(xk, static_cast<float>(q(w, k, j)), s[j]);
          }
        }
        for (int64_t j = a.lane_begin; j < a.lane_end; ++j) {
          acc[j] = __builtin_fmaf(s[j], bf16_to_f32(sc[g * kBlockN + j]), acc[j]);
        }
      }
      uint16_t* out = a.out + r * a.n + b * kBlockN;
      for (int64_t j = a.lane_begin; j < lanes_end; ++j) out[j] = f32_to_bf16_rne(acc[j]);
    }
  }
}

// exp(x) in FP32 for silu_mul, Cephes' expf: x clamped to [kExpMin, kExpMax] (so 2^n stays a
// normal number; NaN is not propagated here, the caller's numerator carries it), n = rne(x *
// log2 e), r = x - n * ln 2 in two fma steps, p(r) a degree-6 polynomial in fma steps, then
// (1 + r + r*r * p) * 2^n. exp_f32_m4 below is the same operations on vectors.
constexpr float kExpMin = -87.0f, kExpMax = 88.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

static inline float pow2i(int32_t n) {  // 2^n for n in -126..127
  const uint32_t bits = static_cast<uint32_t>(n + 127) << 23;
  float value;
  __builtin_memcpy(&value, &bits, sizeof value);
  return value;
}

static inline float exp_f32(float x) {
  x = __builtin_fminf(__builtin_fmaxf(x, kExpMin), kExpMax);
  const float n = __builtin_rintf(x * kLog2e);
  float r = __builtin_fmaf(n, -kLn2Hi, x);
  r = __builtin_fmaf(n, -kLn2Lo, r);
  float p = kExpP[0];
  for (int i = 1; i < 6; ++i) p = __builtin_fmaf(p, r, kExpP[i]);
  const float y = __builtin_fmaf(p, r * r, r) + 1.0f;
  return y * pow2i(static_cast<int32_t>(n));
}

// silu(g) * u, rounded once: the one formula both silu_mul kernels apply per element.
static inline float silu_mul_f32(float g, float u) { return (g / (1.0f + exp_f32(-g))) * u; }

// row(gate, up, out) for rows [row_begin, row_end) of a silu_mul call: the walk both kernels take.
template <class Row>
static inline void silu_mul_rows(const SiluMulArgs& a, int64_t row_begin, int64_t row_end, Row row) {
  for (int64_t r = row_begin; r < row_end; ++r) row(a.gate + r * a.ldg, a.up + r * a.ldu, a.out + r * a.ldo);
}

// row(x, cos, sin, out) for rows [row_begin, row_end) of a rotary call: the walk both kernels take.
template <class Row>
static inline void rotary_rows(const RotaryArgs& a, int64_t row_begin, int64_t row_end, Row row) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t p = r % a.seq, h = r / a.seq % a.heads, b = r / a.seq / a.heads;
    const int64_t c = (a.positions ? a.positions[b] : b) * a.cb + p * a.cs;
    row(a.x + b * a.xb + h * a.xh + p * a.xs, a.cos + c, a.sin + c, a.out + b * a.ob + h * a.oh + p * a.os);
  }
}

// row(q, k, v, out, keys, slots) for rows [row_begin, row_end) of a decode attention call (k and
// v: the row's KV head; slots: its keys' cache rows, or nullptr when key j is at row j): the walk
// both kernels take.
template <class Row>
static inline void attention_rows(const AttentionArgs& a, int64_t row_begin, int64_t row_end, Row row) {
  const int64_t group = a.q_heads / a.kv_heads;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t b = r / a.q_heads, h = r % a.q_heads, g = h / group;
    const int32_t* slots = a.slots ? a.slots + a.pool[b] * a.ls : nullptr;
    row(a.q + b * a.qb + h * a.qh, a.k + b * a.kb + g * a.kh, a.v + b * a.vb + g * a.vh, a.out + b * a.ob + h * a.oh,
        a.slots ? a.lengths[b] : a.keys, slots);
  }
}

// row(x, n) -> the row's top-1 index, for rows [row_begin, row_end) of a top-1 call over BF16 or
// FP32 rows (x is the row's first value of either type): the walk both kernels take.
template <class Row>
static inline void top1_rows(const Top1Args& a, int64_t row_begin, int64_t row_end, Row row) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    a.out[r] = a.bf16 ? row(a.bf16 + r * a.ld, a.n) : row(a.f32 + r * a.ld, a.n);
  }
}

// A top-1 row's value as FP32: BF16 bits widened (exact), or FP32 as it is.
static inline float value_f32(uint16_t bits) { return bf16_to_f32(bits); }
static inline float value_f32(float value) { return value; }

// Where key j's row starts, in elements from its head's first row.
static inline int64_t key_row(const int32_t* slots, int64_t j, int64_t stride) {
  return (slots ? static_cast<int64_t>(slots[j]) : j) * stride;
}

// The sum of kNormLanes chains, in order from +0.0f (kernels.h's RMSNorm order).
static inline float sum_lanes(const float* lanes) {
  float ss = 0.0f;
  for (int64_t j = 0; j < kNormLanes; ++j) ss += lanes[j];
  return ss;
}

static inline float rms_inverse(float ss, int64_t d, float eps) {
  return 1.0f / __builtin_sqrtf(ss / static_cast<float>(d) + eps);
}

#if defined(__riscv_vector)

// vl BF16 values (e16m2 bits) as FP32 (e32m4): vzext.vf2, then vsll.vi 16.
static inline vfloat32m4_t bf16_bits_to_f32_m4(vuint16m2_t bits, size_t vl) {
  return __riscv_vreinterpret_v_u32m4_f32m4(__riscv_vsll_vx_u32m4(__riscv_vzext_vf2_u32m4(bits, vl), 16, vl));
}

// exp_f32 on vl lanes: the same operations in the same order (vfcvt.x.f rounds as frm, RNE).
static inline vfloat32m4_t exp_f32_m4(vfloat32m4_t x, size_t vl) {
  x = __riscv_vfmin_vf_f32m4(__riscv_vfmax_vf_f32m4(x, kExpMin, vl), kExpMax, vl);
  const vint32m4_t ni = __riscv_vfcvt_x_f_v_i32m4(__riscv_vfmul_vf_f32m4(x, kLog2e, vl), vl);
  const vfloat32m4_t n = __riscv_vfcvt_f_x_v_f32m4(ni, vl);
  vfloat32m4_t r = __riscv_vfmacc_vf_f32m4(x, -kLn2Hi, n, vl);
  r = __riscv_vfmacc_vf_f32m4(r, -kLn2Lo, n, vl);
  vfloat32m4_t p = __riscv_vfmv_v_f_f32m4(kExpP[0], vl);
  for (int i = 1; i < 6; ++i) p = __riscv_vfmadd_vv_f32m4(p, r, __riscv_vfmv_v_f_f32m4(kExpP[i], vl), vl);
  const vfloat32m4_t y = __riscv_vfadd_vf_f32m4(
      __riscv_vfmadd_vv_f32m4(p, __riscv_vfmul_vv_f32m4(r, r, vl), r, vl), 1.0f, vl);
  const vint32m4_t biased = __riscv_vsll_vx_i32m4(__riscv_vadd_vx_i32m4(ni, 127, vl), 23, vl);
  return __riscv_vfmul_vv_f32m4(y, __riscv_vreinterpret_v_i32m4_f32m4(biased), vl);
}

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

// vl int8 values (e8m1) as FP32 (e32m4), exact: vsext.vf2 to int16, then the widening vfwcvt
// (at DLEN 128 that is 12 vector cycles where vsext.vf4 + vfcvt at e32 take 16).
static inline vfloat32m4_t i8_to_f32_m4(vint8m1_t q, size_t vl) {
  return __riscv_vfwcvt_f_x_v_f32m4(__riscv_vsext_vf2_i16m2(q, vl), vl);
}

// The two K steps of vl int4 nibble pairs (e8m1) as int16: low nibble - 8 (the even column), high
// nibble - 8 (the odd one). vwsub.vx widens and removes the offset in one op (a nibble, 0..15, is
// the same as int8 or uint8).
static inline vint16m2_t int4_low(vuint8m1_t pairs, size_t vl) {
  return __riscv_vwsub_vx_i16m2(__riscv_vreinterpret_v_u8m1_i8m1(__riscv_vand_vx_u8m1(pairs, 0xF, vl)), kInt4Offset,
                                vl);
}
static inline vint16m2_t int4_high(vuint8m1_t pairs, size_t vl) {
  return __riscv_vwsub_vx_i16m2(__riscv_vreinterpret_v_u8m1_i8m1(__riscv_vsrl_vx_u8m1(pairs, 4, vl)), kInt4Offset,
                                vl);
}

// vl int16 values (e16m2) as FP32 (e32m4), exact: the widening vfwcvt.
static inline vfloat32m4_t i16_to_f32_m4(vint16m2_t q, size_t vl) { return __riscv_vfwcvt_f_x_v_f32m4(q, vl); }

// c_r += x[r * ldx + i] * w for the R rows of a tile (one vfmacc each): one K step, the weight
// vector loaded and widened once for all R rows. Only the *_rvv.cpp files instantiate it.
template <int R>
static inline void fma_rows(vfloat32m4_t& c0, vfloat32m4_t& c1, vfloat32m4_t& c2, vfloat32m4_t& c3, const float* x,
                            int64_t ldx, int64_t i, vfloat32m4_t w, size_t vl) {
  static_assert(R >= 1 && R <= 4, "a tile has 1..4 rows");
  c0 = __riscv_vfmacc_vf_f32m4(c0, x[i], w, vl);
  if constexpr (R > 1) c1 = __riscv_vfmacc_vf_f32m4(c1, x[ldx + i], w, vl);
  if constexpr (R > 2) c2 = __riscv_vfmacc_vf_f32m4(c2, x[2 * ldx + i], w, vl);
  if constexpr (R > 3) c3 = __riscv_vfmacc_vf_f32m4(c3, x[3 * ldx + i], w, vl);
}

// fma_rows for K steps i and i + 1, their weight vectors widened before either fma: an empty asm
// "writes" both, so the compiler's scheduler cannot sink a widening (e16) between the fmas (e32).
// Each vtype switch is a scalar vsetvli; a widening beside each fma took 12 of them per four int4
// K steps (now 5) and 8 per four int8 steps (now 4).
template <int R>
static inline void fma_rows_pair(vfloat32m4_t& c0, vfloat32m4_t& c1, vfloat32m4_t& c2, vfloat32m4_t& c3,
                                 const float* x, int64_t ldx, int64_t i, vfloat32m4_t w0, vfloat32m4_t w1, size_t vl) {
  __asm__("" : "+vr"(w0), "+vr"(w1));
  fma_rows<R>(c0, c1, c2, c3, x, ldx, i, w0, vl);
  fma_rows<R>(c0, c1, c2, c3, x, ldx, i + 1, w1, vl);
}

// prefetch.r 0(p) (Zicbop): ORI with rd = x0 and imm = 1 is that hint's encoding, written as an
// ORI so any assembler takes it; a core without Zicbop (and qemu) executes it as a no-op.
static inline void prefetch_r(const void* p) { __asm__ volatile("ori x0, %0, 1" : : "r"(p)); }

// dst[r * kn + i] = x[r * ldx + i] as FP32 for m rows and i < kn: the rows' K panel, widened once
// for every block and row tile that reads it (the kernels take BF16 activations).
static inline void widen_bf16_panel(const uint16_t* x, int64_t ldx, int64_t m, int64_t kn, float* dst) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < kn;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(kn - i));
      __riscv_vse32_v_f32m4(dst + r * kn + i, bf16_to_f32_m4(x + r * ldx + i, vl), vl);
      i += static_cast<int64_t>(vl);
    }
  }
}

// Rounds m rows of accumulators (rows kBlockN apart) to BF16 and writes their first `cols` columns.
static inline void store_bf16_rows(const float* acc, int64_t m, uint16_t* out, int64_t ldo, int64_t cols) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j0 = 0; j0 < cols;) {
      const size_t vl = __riscv_vsetvl_e32m4(static_cast<size_t>(cols - j0));
      const vfloat32m4_t v = __riscv_vle32_v_f32m4(acc + r * kBlockN + j0, vl);
      __riscv_vse16_v_u16m2(out + r * ldo + j0, f32_to_bf16_rne_m4(v, vl), vl);
      j0 += static_cast<int64_t>(vl);
    }
  }
}

// The walk every RVV kernel takes over blocks [block_begin, block_end) of a call (LinearArgs or
// QuantLinearArgs): up to kSmallRows rows one block at a time, so the weight streams from memory
// in order, once (decode is bound by memory bandwidth); with more rows kGroupBlocks blocks per K
// panel, so the rows' panel of x (widened into xf) is read once for all of them. panel(b, k0,
// kn, slot) accumulates block b's K steps [k0, k0 + kn) into acc + slot, a block's m * kBlockN
// floats (the first panel, k0 == 0, starts them); then each block's rows are rounded into out.
template <class Args, class Panel>
static inline void walk_blocks(const Args& a, int64_t block_begin, int64_t block_end, float* xf, const float* acc,
                               Panel panel) {
  const int64_t per_pass = a.m <= kSmallRows ? 1 : kGroupBlocks;
  const int64_t block_floats = a.m * kBlockN;
  for (int64_t g0 = block_begin; g0 < block_end; g0 += per_pass) {
    const int64_t g1 = min64(g0 + per_pass, block_end);
    for (int64_t k0 = 0; k0 < a.k; k0 += kPanelK) {
      const int64_t kn = min64(kPanelK, a.k - k0);
      widen_bf16_panel(a.x + k0, a.k, a.m, kn, xf);
      for (int64_t b = g0; b < g1; ++b) panel(b, k0, kn, (b - g0) * block_floats);
    }
    for (int64_t b = g0; b < g1; ++b) {
      store_bf16_rows(acc + (b - g0) * block_floats + a.lane_begin, a.m, a.out + b * kBlockN + a.lane_begin, a.n,
                      min64(a.lane_end, a.n - b * kBlockN) - a.lane_begin);
    }
  }
}

#endif  // __riscv_vector

}  // namespace sglang_rvv
