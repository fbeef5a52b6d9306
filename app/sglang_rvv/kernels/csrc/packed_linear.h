// The packed BF16 Linear kernels of libsglang_rvv_kernels.so.
//
// app/sglang_rvv/layout.py defines the layout; the constants below mirror it. A row-major
// [N, K] weight is stored as [ceil(N/32), K, 32]: for each block of 32 output channels, K
// rows of 32 contiguous BF16 values, zero-padded past N.
//
// Every ISA kernel has a _generic scalar twin with the same signature and the same result
// bit for bit: each output is the FP32 fused multiply-add chain over k = 0..K-1 starting
// from +0.0f, rounded once to BF16 (nearest even). So tiling, VLEN and thread count never
// change a result, and the twin is the oracle the RVV kernel is tested against.
#pragma once

#include <cstdint>

namespace sglang_rvv {

constexpr int64_t kBlockN = 32;        // layout.BLOCK_N
constexpr int64_t kLayoutVersion = 1;  // layout.LAYOUT_VERSION

// Blocks whose accumulators the RVV kernel keeps in its scratch while it walks K once for
// all of them (see linear_bf16_32x_rvv).
constexpr int64_t kGroupBlocks = 8;

struct LinearArgs {
  const float* x;          // [m, k] input rows, widened to FP32 (exact)
  const uint16_t* packed;  // [ceil(n/32), k, 32] BF16 bits
  uint16_t* out;           // [m, n] BF16 bits
  int64_t m, k, n;
};

// Floats of scratch one call of a linear kernel needs for m rows.
static inline int64_t linear_scratch_floats(int64_t m) { return kGroupBlocks * m * kBlockN; }

// out[:, 32*b : min(32*b+32, n)] for every block b in [block_begin, block_end). Calls on
// disjoint block ranges write disjoint columns, so they run in parallel.
void linear_bf16_32x_rvv(const LinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);
void linear_bf16_32x_generic(const LinearArgs& args, int64_t block_begin, int64_t block_end, float* scratch);

// VLEN in bits; executes a vector instruction, so only where V is enabled.
int64_t rvv_vlen_bits();

// packed[b] = weight[32*b : 32*b+32, :] transposed, zero past row n, for b in [block_begin, block_end).
void pack_bf16_32x(const uint16_t* weight, uint16_t* packed, int64_t n, int64_t k, int64_t block_begin,
                   int64_t block_end);

}  // namespace sglang_rvv
