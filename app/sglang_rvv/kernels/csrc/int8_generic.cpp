// Scalar C++ for the int8 layout: the quantizing pack, and the twin of int8_rvv.cpp's kernel
// (what runs where the CPU has no V, and the oracle the RVV kernel is tested against). Built
// without V.

#include "kernels.h"
#include "vec.h"

namespace sglang_rvv {

void quantize_int8_32x(const uint16_t* weight, int8_t* qweight, uint16_t* scales, int64_t n, int64_t k,
                       int64_t group, int64_t block_begin, int64_t block_end) {
  const int64_t kp = (k + group - 1) / group * group;
  quantize_blocks(weight, scales, n, k, group, kInt8Qmin, kInt8Qmax, block_begin, block_end,
                  [&](int64_t b, int64_t kk, int64_t j, int q) {
                    qweight[(b * kp + kk) * kBlockN + j] = static_cast<int8_t>(q);
                  });
}

// A block: kp rows of 32 int8 values.
void linear_int8_32x_generic(const QuantLinearArgs& a, int64_t block_begin, int64_t block_end, float* /*scratch*/) {
  const int64_t kp = (a.k + a.group - 1) / a.group * a.group;
  linear_quant_blocks(a, block_begin, block_end, kp * kBlockN, [](const uint8_t* w, int64_t k, int64_t j) {
    return static_cast<int>(static_cast<int8_t>(w[k * kBlockN + j]));
  });
}

}  // namespace sglang_rvv
