// The kernels of libsglang_rvv_kernels.so: the packed Linear layouts' constants, the arguments and
// every kernel's entry, and the rest of a decode step's (RMSNorm, SiLU x mul, rotary embedding,
// decode attention, the residual add, the logits' top-1 and their widening to FP32).
//
// app/sglang_rvv/layout.py defines the layouts; the constants below mirror it. Every layout
// keeps the block family: a row-major [N, K] weight becomes ceil(N/32) blocks of 32 output
// channels, each block a walk along K of rows holding 32 contiguous lanes, zero past N.
// - bf16 (version 1): [B, K, 32] BF16 bits.
// - int8 (version 1): qweight int8 [B, Kp, 32], scales BF16 [B, Kp/G, 32].
// - int4 (version 1): qweight uint8 [B, Kp/2, 32], byte (b, i, j) = (q[2i] + 8) | (q[2i+1] + 8) << 4;
//   scales as for int8. G is the group size along K (even for int4), Kp = ceil(K/G)*G; columns
//   k >= K hold q = 0, rows n >= N hold q = 0 and scale 0.
//
// Every ISA kernel has a _generic scalar twin with the same signature and the same result bit
// for bit, so tiling, VLEN and thread count never change a result, and the twin is the oracle
// the RVV kernel is tested against. The arithmetic order of each output:
// - bf16: one FP32 fused multiply-add chain over k = 0..K-1 from +0.0f;
// - int8/int4: for each group g in order, s = the FP32 fma chain of x[k] * q[k] from +0.0f over
//   the group's real columns (k < K) in order, then acc = fma(s, scale[g], acc) from acc = +0.0f;
// then one rounding to BF16 (nearest even, every NaN 0x7FC0).
// - int4 with int8 activations (packed_int4_a8_linear: the int4 layout, the activations quantized
//   per call): per row and group g, amax = the largest |x[k]| over the group's real columns (NaN
//   skipped); if the group holds a NaN or an infinity, d = NaN and every xq = 0; else if amax == 0
//   or 127 / amax overflows, d = 0 and every xq = 0; else inv = 127 / amax, d = amax / 127 (FP32
//   divisions) and xq[k] = rne(x[k] * inv), which is within -127..127 (|x * inv| <= 127 plus an
//   ulp). Then s = the exact integer sum of xq[k] * q[k], t = float(s) * d (|s| < 2^24: exact
//   conversion, one rounding), acc = fma(t, scale[g], acc) from acc = +0.0f, groups in order.
#pragma once

#include <stdint.h>

namespace sglang_rvv {

constexpr int64_t kBlockN = 32;            // layout.BLOCK_N
constexpr int64_t kLayoutVersion = 1;      // layout.LAYOUT_VERSION (bf16)
constexpr int64_t kInt8LayoutVersion = 1;  // layout.INT8.version
constexpr int64_t kInt4LayoutVersion = 1;  // layout.INT4.version
constexpr int kInt8Qmax = 127, kInt8Qmin = -128;  // layout.INT8.qmax / qmin
constexpr int kInt4Qmax = 7, kInt4Qmin = -8;      // layout.INT4.qmax / qmin
constexpr int kInt4Offset = 8;                    // a stored nibble is q + 8

// Blocks whose accumulators the RVV kernels keep in their scratch while they walk a K panel
// once for all of them (m > kSmallRows), and the panel's length in K steps.
constexpr int64_t kGroupBlocks = 8;
constexpr int64_t kPanelK = 256;  // even: an int4 panel starts on a byte row
constexpr int64_t kSmallRows = 16;

// How far ahead of the K step it is reading the RVV kernels prefetch the weight stream
// (prefetch.r, Zicbop). One constant, so a result never depends on the environment; the right
// distance for the K1's LPDDR4X is for a measurement on the board.
constexpr int64_t kPrefetchBytes = 1024;

// A call computes lanes [lane_begin, lane_end) of each of its blocks: all 32, or half a block
// when a layer has too few blocks to keep every thread busy (each lane is its own fma chain,
// so a split never changes a bit).
struct LinearArgs {
  const uint16_t* x;       // [m, k] input rows, BF16 bits (the kernels widen them, exactly)
  const uint16_t* packed;  // [ceil(n/32), k, 32] BF16 bits
  uint16_t* out;           // [m, n] BF16 bits
  int64_t m, k, n;
  int64_t lane_begin = 0, lane_end = kBlockN;
};

struct QuantLinearArgs {
  const uint16_t* x;       // [m, k] input rows, BF16 bits
  const uint8_t* qweight;  // int8: [B, kp, 32] int8; int4: [B, kp/2, 32] nibble pairs
  const uint16_t* scales;  // [B, kp/group, 32] BF16 bits
  uint16_t* out;           // [m, n] BF16 bits
  int64_t m, k, n, group;  // kp = ceil(k/group)*group
  int64_t lane_begin = 0, lane_end = kBlockN;
};

// Floats of scratch one call of a linear kernel needs for m rows: the FP32 widening of the
// rows' current K panel, and the accumulators of kGroupBlocks blocks (quantized: and their
// group sums). The weight-only twins need none.
static inline int64_t linear_scratch_floats(int64_t m) { return m * kPanelK + kGroupBlocks * m * kBlockN; }
static inline int64_t quant_scratch_floats(int64_t m) { return m * kPanelK + 2 * kGroupBlocks * m * kBlockN; }
// The int8-activation kernel's scratch: the rows' quantized values (m * kp int8), then per row and
// group d (FP32) and the sum of its xq (int32).
static inline int64_t a8_scratch_floats(int64_t m, int64_t kp, int64_t group) {
  return (m * kp + 3) / 4 + 2 * m * (kp / group);
}

// out[:, 32*b + lane_begin : min(32*b + lane_end, n)] for every block b in [block_begin,
// block_end). Calls on disjoint blocks or lanes write disjoint columns, so they run in parallel.
using LinearKernel = void (*)(const LinearArgs&, int64_t block_begin, int64_t block_end, float* scratch);
using QuantLinearKernel = void (*)(const QuantLinearArgs&, int64_t block_begin, int64_t block_end, float* scratch);

void linear_bf16_32x_generic(const LinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);
void linear_int8_32x_generic(const QuantLinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);
void linear_int4_32x_generic(const QuantLinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);
void linear_int4_a8_32x_generic(const QuantLinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);
#if defined(__riscv)
void linear_bf16_32x_rvv(const LinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);
void linear_int8_32x_rvv(const QuantLinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);
void linear_int4_32x_rvv(const QuantLinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);
void linear_int4_a8_32x_rvv(const QuantLinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);

// VLEN in bits; executes a vector instruction, so only where V is enabled.
int64_t rvv_vlen_bits();
#endif

// The rest of a decode step: RMSNorm (the residual add fused in), SiLU x mul, the rotary
// embedding and the decode attention, over rows of d BF16 values, rows ld* elements apart. Every result is one rounding to BF16 of FP32 arithmetic
// in a fixed order, the same for every VLEN and for the twins:
// - rmsnorm: h = x, or with a residual h = bf16(x + residual) (FP32 add), written back to the
//   residual; ss = the sum of h*h as kNormLanes FP32 fma chains from +0.0f (chain j takes
//   i = j, j + kNormLanes, ... in order), then the chains added 0..kNormLanes-1 in order from +0.0f;
//   inv = 1 / sqrt(ss / d + eps); out = bf16((h * inv) * weight). In place (out == x) is allowed.
// - silu_mul: out = bf16((g / (1 + exp(-g))) * u), exp as exp_f32 in vec.h (a range reduction and
//   a degree-6 polynomial, a few ulp of FP32).
// - rotary (neox style, the whole head rotated): per head row x of d = 2h values, with c = cos[i]
//   and s = sin[i] of its position, out[i] = bf16(fma(-x[i+h], s, x[i] * c)) and
//   out[i+h] = bf16(fma(x[i], s, x[i+h] * c)) for i < h. Only cos[0..h) and sin[0..h) are read:
//   transformers' tables repeat their halves, SGLang's cache holds cos then sin.
// - decode attention (one query per head, over all the keys of its KV head; GQA: query head h
//   reads KV head h / (q_heads / kv_heads)): s_j = the FP32 fma chain of q[i] * k_j[i] over
//   i = 0..d-1 in order from +0.0f, t_j = s_j * scale, m = max_j t_j, p_j = exp_f32(t_j - m),
//   sum = p_0 + p_1 + ... in order from +0.0f, acc[i] = the fma chain of p_j * v_j[i] over j in
//   order from +0.0f, out[i] = bf16(acc[i] / sum).
constexpr int64_t kNormLanes = 16;  // the e32m4 vector length at VLEN 128, so every VLEN has it

struct NormArgs {
  const uint16_t* x;   // [rows, d], rows ldx apart
  uint16_t* residual;  // [rows, d], rows ldr apart, or nullptr (a plain RMSNorm)
  const uint16_t* weight;  // [d]
  uint16_t* out;       // [rows, d], rows ldo apart
  int64_t ldx, ldr, ldo, d;
  float eps;
};

struct SiluMulArgs {
  const uint16_t* gate;  // [rows, d], rows ldg apart
  const uint16_t* up;    // [rows, d], rows ldu apart
  uint16_t* out;         // [rows, d], rows ldo apart
  int64_t ldg, ldu, ldo, d;
};

// transformers' [batch, heads, seq, d] query or key, any strides but a contiguous last dim; a
// row is one (batch, head, position), row r = (b * heads + h) * seq + p. SGLang's [tokens, heads
// * d] is the same with batch = tokens and seq = 1.
struct RotaryArgs {
  const uint16_t* x;    // [batch, heads, seq, d], strides xb, xh, xs
  const uint16_t* cos;  // [batch, seq, >= d/2], strides cb, cs
  const uint16_t* sin;  // as cos, with cos's strides
  uint16_t* out;        // [batch, heads, seq, d], strides ob, oh, os
  int64_t heads, seq, d;
  int64_t xb, xh, xs, cb, cs, ob, oh, os;
  // SGLang's cos_sin_cache, when set: batch row b's cos and sin rows are the cache's row
  // positions[b] (cb apart), not row b; the op has checked every position.
  const int64_t* positions = nullptr;  // [batch]
};

// A decode step's attention: row r = b * q_heads + h is query head h of batch row b.
struct AttentionArgs {
  const uint16_t* q;  // [batch, q_heads, d], strides qb, qh
  const uint16_t* k;  // [batch, kv_heads, keys, d], strides kb, kh, kt
  const uint16_t* v;  // as k, strides vb, vh, vt
  uint16_t* out;      // [batch, q_heads, d], strides ob, oh
  int64_t q_heads, kv_heads, keys, d;
  int64_t qb, qh, kb, kh, kt, vb, vh, vt, ob, oh;
  float scale;
  // SGLang's paged KV cache, when slots is set: k and v are the caches [cache rows, kv_heads, d]
  // (kb = vb = 0), and batch row b attends to its lengths[b] keys, cache rows slots[pool[b] * ls
  // + j] for j in order (`keys` is then the largest length). Key j's arithmetic is the same as at
  // position j of a gathered [batch, kv_heads, keys, d] k and v, so the results are the same bits.
  const int32_t* slots = nullptr;  // SGLang's req_to_token [requests, ls]
  const int64_t* pool = nullptr;   // [batch]: the row of slots of each batch row
  const int64_t* lengths = nullptr;  // [batch]
  int64_t ls = 0;
};

// The logits' top-1 of greedy decoding, torch.argmax over the last dim: per row of n >= 1 values,
// the index of the first NaN if the row holds one, else the first index of the row's maximum
// (-0.0 and +0.0 equal). Exact, so the same index for every VLEN and for the twin.
struct Top1Args {
  const uint16_t* bf16;  // [rows, n] BF16 bits, rows ld apart; or nullptr, and
  const float* f32;      // [rows, n] FP32, rows ld apart
  int64_t* out;          // [rows]
  int64_t ld, n;
};

// The logits as the sampler takes them, torch's .float() of BF16: each value's bits shifted up by
// 16, exact (NaN payloads too), so the same bits for every VLEN and for the twin.
struct WidenArgs {
  const uint16_t* x;  // [rows, d] BF16 bits, rows ldx apart
  float* out;         // [rows, d], contiguous
  int64_t ldx, d;
};

// transformers' residual add, `residual + hidden_states` of BF16 rows: out = bf16(a + b), FP32 add,
// the same bits as torch's and as rmsnorm's fused add.
struct AddArgs {
  const uint16_t* a;  // [rows, d] BF16 bits, rows lda apart
  const uint16_t* b;  // [rows, d] BF16 bits, rows ldb apart
  uint16_t* out;      // [rows, d], contiguous
  int64_t lda, ldb, d;
};

// Rows [row_begin, row_end) of a call; calls on disjoint rows run in parallel.
using NormKernel = void (*)(const NormArgs&, int64_t row_begin, int64_t row_end);
using SiluMulKernel = void (*)(const SiluMulArgs&, int64_t row_begin, int64_t row_end);
using RotaryKernel = void (*)(const RotaryArgs&, int64_t row_begin, int64_t row_end);
// scratch: `keys` floats of the calling thread (a row's scores).
using AttentionKernel = void (*)(const AttentionArgs&, int64_t row_begin, int64_t row_end, float* scratch);
using Top1Kernel = void (*)(const Top1Args&, int64_t row_begin, int64_t row_end);
using WidenKernel = void (*)(const WidenArgs&, int64_t row_begin, int64_t row_end);
using AddKernel = void (*)(const AddArgs&, int64_t row_begin, int64_t row_end);

void rmsnorm_generic(const NormArgs& args, int64_t row_begin, int64_t row_end);
void silu_mul_generic(const SiluMulArgs& args, int64_t row_begin, int64_t row_end);
void rotary_generic(const RotaryArgs& args, int64_t row_begin, int64_t row_end);
void attention_generic(const AttentionArgs& args, int64_t row_begin, int64_t row_end, float* scratch);
void top1_generic(const Top1Args& args, int64_t row_begin, int64_t row_end);
void widen_generic(const WidenArgs& args, int64_t row_begin, int64_t row_end);
void add_generic(const AddArgs& args, int64_t row_begin, int64_t row_end);
#if defined(__riscv)
void rmsnorm_rvv(const NormArgs& args, int64_t row_begin, int64_t row_end);
void silu_mul_rvv(const SiluMulArgs& args, int64_t row_begin, int64_t row_end);
void rotary_rvv(const RotaryArgs& args, int64_t row_begin, int64_t row_end);
void attention_rvv(const AttentionArgs& args, int64_t row_begin, int64_t row_end, float* scratch);
void top1_rvv(const Top1Args& args, int64_t row_begin, int64_t row_end);
void widen_rvv(const WidenArgs& args, int64_t row_begin, int64_t row_end);
void add_rvv(const AddArgs& args, int64_t row_begin, int64_t row_end);
#endif

// packed[b] = weight[32*b : 32*b+32, :] transposed, zero past row n, for b in [block_begin, block_end).
void pack_bf16_32x(const uint16_t* weight, uint16_t* packed, int64_t n, int64_t k, int64_t block_begin,
                   int64_t block_end);

// layout.quantize_reference for blocks [block_begin, block_end) of a finite BF16 [n, k] weight:
// qweight (int8 values, or int4 nibble pairs) and scales in the blocked layout, padding included.
void quantize_int8_32x(const uint16_t* weight, int8_t* qweight, uint16_t* scales, int64_t n, int64_t k,
                       int64_t group, int64_t block_begin, int64_t block_end);
void quantize_int4_32x(const uint16_t* weight, uint8_t* qweight, uint16_t* scales, int64_t n, int64_t k,
                       int64_t group, int64_t block_begin, int64_t block_end);

}  // namespace sglang_rvv
