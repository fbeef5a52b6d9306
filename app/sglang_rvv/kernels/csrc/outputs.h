// The ops' outputs (outputs.cpp): CPU tensors whose small blocks are reused, not allocated.
#pragma once

#include <ATen/core/Tensor.h>

namespace sglang_rvv {

// A contiguous CPU tensor of `sizes` and `dtype`, uninitialised, as at::empty gives it.
at::Tensor new_output(at::IntArrayRef sizes, at::ScalarType dtype);

}  // namespace sglang_rvv
