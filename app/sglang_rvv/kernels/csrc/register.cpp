// torch.ops.sglang_rvv_native: the schemas, their CPU implementations and the kernel choice.
//
// Python validates every call first (sglang_rvv.layout.check_*); the checks here are the
// second line, so a bad call from anywhere raises a RuntimeError instead of reading out of
// bounds. The kernel is chosen once per process from AT_HWCAP: the RVV kernels where the
// kernel grants V to user space, their scalar twins elsewhere, so loading this library never
// executes a vector instruction on a CPU without V. Built with -march=rv64gc.

#include <sys/auxv.h>

#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "packed_linear.h"

namespace sglang_rvv {
namespace {

using LinearKernel = void (*)(const LinearArgs&, int64_t, int64_t, float*);

struct Isa {
  LinearKernel linear;
  std::string name;
};

const Isa& isa() {
  static const Isa chosen = [] {
    if (getauxval(AT_HWCAP) & (1UL << ('V' - 'A'))) {
      return Isa{linear_bf16_32x_rvv, "rvv vlen=" + std::to_string(rvv_vlen_bits())};
    }
    return Isa{linear_bf16_32x_generic, "generic"};
  }();
  return chosen;
}

const uint16_t* bf16_bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>());
}

uint16_t* bf16_bits_mut(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>()); }

void check_layout_version(int64_t layout_version, const char* op) {
  TORCH_CHECK(layout_version == kLayoutVersion, "sglang_rvv_native::", op, ": packed layout version ",
              layout_version, " is not supported: this kernel library implements version ", kLayoutVersion);
}

at::Tensor pack_bf16_weight(const at::Tensor& weight, int64_t layout_version) {
  check_layout_version(layout_version, "pack_bf16_weight");
  TORCH_CHECK(weight.dim() == 2, "sglang_rvv_native::pack_bf16_weight expects a 2-D [N, K] weight, got shape ",
              weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16,
              "sglang_rvv_native::pack_bf16_weight expects a bfloat16 weight, got ", weight.scalar_type());
  const at::Tensor w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), blocks = (n + kBlockN - 1) / kBlockN;
  at::Tensor packed = at::empty({blocks, k, kBlockN}, w.options());
  const uint16_t* src = bf16_bits(w);
  uint16_t* dst = bf16_bits_mut(packed);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) { pack_bf16_32x(src, dst, n, k, begin, end); });
  return packed;
}

at::Tensor packed_bf16_linear(const at::Tensor& input, const at::Tensor& packed_weight,
                              int64_t n, int64_t layout_version) {
  check_layout_version(layout_version, "packed_bf16_linear");
  TORCH_CHECK(packed_weight.dim() == 3 && packed_weight.size(2) == kBlockN,
              "sglang_rvv_native::packed_bf16_linear expects a packed weight of shape [ceil(N/", kBlockN, "), K, ",
              kBlockN, "], got ", packed_weight.sizes());
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && packed_weight.scalar_type() == at::kBFloat16,
              "sglang_rvv_native::packed_bf16_linear expects bfloat16 input and weight, got input ",
              input.scalar_type(), " and weight ", packed_weight.scalar_type());
  TORCH_CHECK(input.dim() == 2, "sglang_rvv_native::packed_bf16_linear expects a 2-D [M, K] input, got shape ",
              input.sizes());
  const int64_t m = input.size(0), k = packed_weight.size(1), blocks = packed_weight.size(0);
  TORCH_CHECK(input.size(1) == k, "sglang_rvv_native::packed_bf16_linear: input has K=", input.size(1),
              " features but the packed weight was packed with K=", k);
  TORCH_CHECK((blocks - 1) * kBlockN < n && n <= blocks * kBlockN, "sglang_rvv_native::packed_bf16_linear: out_features=",
              n, " does not fit a packed weight of ", blocks, " blocks of ", kBlockN);

  at::Tensor out = at::empty({m, n}, input.options());
  if (m == 0) return out;
  const at::Tensor x = input.to(at::kFloat).contiguous();
  const at::Tensor w = packed_weight.contiguous();
  const LinearArgs args{x.const_data_ptr<float>(), bf16_bits(w), bf16_bits_mut(out), m, k, n};
  const LinearKernel kernel = isa().linear;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(linear_scratch_floats(m)));
    kernel(args, begin, end, scratch.data());
  });
  return out;
}

}  // namespace
}  // namespace sglang_rvv

TORCH_LIBRARY(sglang_rvv_native, m) {
  m.def("pack_bf16_weight(Tensor weight, int layout_version) -> Tensor");
  m.def("packed_bf16_linear(Tensor input, Tensor packed_weight, int out_features, int layout_version) -> Tensor");
  // "rvv vlen=N" or "generic": which kernels the calls above run in this process.
  m.def("kernel_isa() -> str", [] { return sglang_rvv::isa().name; });
}

TORCH_LIBRARY_IMPL(sglang_rvv_native, CPU, m) {
  m.impl("pack_bf16_weight", &sglang_rvv::pack_bf16_weight);
  m.impl("packed_bf16_linear", &sglang_rvv::packed_bf16_linear);
}
