// Scalar C++ for the int4 layout: the quantizing pack, and the twin of int4_rvv.cpp's kernel
// (what runs where the CPU has no V, and the oracle the RVV kernel is tested against). Built
// without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void quantize_int4_32x(const uint16_t* weight, uint8_t* qweight, uint16_t* scales, int64_t n, int64_t k,
                       int64_t group, int64_t block_begin, int64_t block_end) {
  const int64_t kp = (k + group - 1) / group * group;
  // quantize_blocks visits column 2i before 2i+1 (group starts are even): the low nibble is
  // written first, the high one ORed in.
  quantize_blocks(weight, scales, n, k, group, kInt4Qmin, kInt4Qmax, block_begin, block_end,
                  [&](int64_t b, int64_t kk, int64_t j, int q) {
                    uint8_t& pair = qweight[(b * (kp / 2) + kk / 2) * kBlockN + j];
                    const auto nibble = static_cast<uint8_t>(q + kInt4Offset);
                    pair = (kk & 1) ? static_cast<uint8_t>(pair | nibble << 4) : nibble;
                  });
}

// A block: kp / 2 rows of 32 nibble pairs (two K steps a byte).
void linear_int4_32x_generic(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, float* /*scratch*/) {
  const int64_t kp = (a.k + a.group - 1) / a.group * a.group;
  linear_quant_blocks(a, block_begin, block_end, kp / 2 * kBlockN, [](const uint8_t* w, int64_t k, int64_t j) {
    return int4_value(w[(k / 2) * kBlockN + j], k);
  });
}

}  // namespace sglang_rvv
