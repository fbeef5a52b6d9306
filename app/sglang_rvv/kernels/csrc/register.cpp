// torch.ops.sglang_rvv_native: the schemas, their CPU implementations and the kernel choice.
//
// Python validates every call first (sglang_rvv.layout.check_*); the checks here are the
// second line, so a bad call from anywhere raises a RuntimeError instead of reading out of
// bounds. The try_ ops are the exception: SGLang's hooks call them unchecked, and they refuse
// (return false) a call their op does not cover instead of raising. The kernels are chosen once
// per process: on riscv64 the RVV kernels where AT_HWCAP says the Linux kernel grants V to user
// space, their scalar twins elsewhere, so loading this library never executes a vector
// instruction on a CPU without V. Off riscv64 (the host build
// of the twins for the fast tests) the RVV kernels are not compiled in and AT_HWCAP's bits mean
// something else, so the twins are the only choice. Built without V.
//
// Per call the entry point allocates at most the output (outputs.cpp reuses small ones): the
// kernels read the BF16 activations as they are (no FP32 copy) and keep their scratch in a buffer
// of the calling thread that grows to the largest call and is then reused.

#include <sys/auxv.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "kernels.h"
#include "outputs.h"

namespace sglang_rvv {
namespace {

struct Isa {
  LinearKernel bf16;
  QuantLinearKernel int8, int4, int4_a8;
  NormKernel rmsnorm;
  SiluMulKernel silu_mul;
  RotaryKernel rotary;
  AttentionKernel attention;
  Top1Kernel top1;
  WidenKernel widen;
  AddKernel add;
  std::string name;
};

const Isa& isa() {
  static const Isa chosen = [] {
#if defined(__riscv)
    if (getauxval(AT_HWCAP) & (1UL << ('V' - 'A'))) {
      return Isa{linear_bf16_32x_rvv, linear_int8_32x_rvv, linear_int4_32x_rvv, linear_int4_a8_32x_rvv, rmsnorm_rvv,
                 silu_mul_rvv,
                 rotary_rvv, attention_rvv, top1_rvv, widen_rvv, add_rvv, "rvv vlen=" + std::to_string(rvv_vlen_bits())};
    }
#endif
    return Isa{linear_bf16_32x_generic, linear_int8_32x_generic, linear_int4_32x_generic,
               linear_int4_a8_32x_generic, rmsnorm_generic,
               silu_mul_generic, rotary_generic, attention_generic, top1_generic, widen_generic, add_generic,
               "generic"};
  }();
  return chosen;
}

// The calling thread's scratch, at least `floats` long. at::parallel_for runs on a fixed pool,
// so after the first calls of the largest batch this never allocates again.
float* thread_scratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(floats)) buffer.resize(static_cast<size_t>(floats));
  return buffer.data();
}

// Runs kernel(args, block_begin, block_end) over every block on torch's threads. With fewer than
// two blocks per thread (a narrow layer: 6 blocks on 8 threads leaves 2 idle) the work items are
// half blocks, 16 lanes each, and a thread that gets both halves of a block runs it whole; a
// half that is all padding (past n) is skipped. Lanes are independent fma chains: same bits.
template <class Args, class Kernel>
void for_blocks(const Args& args, int64_t blocks, const Kernel& kernel) {
  constexpr int64_t kHalf = kBlockN / 2;
  if (blocks >= 2 * at::get_num_threads()) {
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
    return;
  }
  at::parallel_for(0, 2 * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end;) {
      const int64_t block = item / 2;
      Args part = args;
      const bool whole = item % 2 == 0 && item + 1 < end;
      part.lane_begin = whole ? 0 : (item % 2) * kHalf;
      part.lane_end = whole ? kBlockN : part.lane_begin + kHalf;
      if (block * kBlockN + part.lane_begin < args.n) kernel(part, block, block + 1);
      item += whole ? 2 : 1;
    }
  });
}

const uint16_t* bf16_bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>());
}

uint16_t* bf16_bits_mut(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>()); }

void check_layout_version(int64_t layout_version, int64_t supported, const char* op) {
  TORCH_CHECK(layout_version == supported, "sglang_rvv_native::", op, ": packed layout version ", layout_version,
              " is not supported: this kernel library implements version ", supported);
}

void check_bf16_weight(const at::Tensor& weight, const char* op) {
  TORCH_CHECK(weight.dim() == 2, "sglang_rvv_native::", op, " expects a 2-D [N, K] weight, got shape ",
              weight.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16, "sglang_rvv_native::", op, " expects a bfloat16 weight, got ",
              weight.scalar_type());
}

void check_input(const at::Tensor& input, int64_t k, const char* op) {
  TORCH_CHECK(input.scalar_type() == at::kBFloat16, "sglang_rvv_native::", op, " expects a bfloat16 input, got ",
              input.scalar_type());
  TORCH_CHECK(input.dim() >= 1, "sglang_rvv_native::", op, " expects an [..., K] input, got a 0-d tensor");
  TORCH_CHECK(input.size(-1) == k, "sglang_rvv_native::", op, ": input has K=", input.size(-1),
              " features but the packed weight was packed with K=", k);
}

// An [..., K] input's rows (its leading dims, flattened) and its [..., n] output's shape, as
// F.linear takes and gives them: the caller needs no reshape on either side (on the board each
// Python-side reshape costs about what the call's own entry does).
int64_t input_rows(const at::Tensor& input) {
  int64_t m = 1;
  for (int64_t dim = 0; dim + 1 < input.dim(); ++dim) m *= input.size(dim);
  return m;
}

at::DimVector out_shape(const at::Tensor& input, int64_t n) {
  at::DimVector shape(input.sizes().begin(), input.sizes().end());
  shape.back() = n;
  return shape;
}

void check_out_features(int64_t n, int64_t blocks, const char* op) {
  TORCH_CHECK((blocks - 1) * kBlockN < n && n <= blocks * kBlockN, "sglang_rvv_native::", op, ": out_features=", n,
              " does not fit a packed weight of ", blocks, " blocks of ", kBlockN);
}

at::Tensor pack_bf16_weight(const at::Tensor& weight, int64_t layout_version) {
  check_layout_version(layout_version, kLayoutVersion, "pack_bf16_weight");
  check_bf16_weight(weight, "pack_bf16_weight");
  const at::Tensor w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1), blocks = (n + kBlockN - 1) / kBlockN;
  at::Tensor packed = at::empty({blocks, k, kBlockN}, w.options());
  const uint16_t* src = bf16_bits(w);
  uint16_t* dst = bf16_bits_mut(packed);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) { pack_bf16_32x(src, dst, n, k, begin, end); });
  return packed;
}

at::Tensor packed_bf16_linear(const at::Tensor& input, const at::Tensor& packed_weight, int64_t n,
                              int64_t layout_version) {
  check_layout_version(layout_version, kLayoutVersion, "packed_bf16_linear");
  TORCH_CHECK(packed_weight.dim() == 3 && packed_weight.size(2) == kBlockN,
              "sglang_rvv_native::packed_bf16_linear expects a packed weight of shape [ceil(N/", kBlockN, "), K, ",
              kBlockN, "], got ", packed_weight.sizes());
  TORCH_CHECK(input.scalar_type() == at::kBFloat16 && packed_weight.scalar_type() == at::kBFloat16,
              "sglang_rvv_native::packed_bf16_linear expects bfloat16 input and weight, got input ",
              input.scalar_type(), " and weight ", packed_weight.scalar_type());
  const int64_t k = packed_weight.size(1), blocks = packed_weight.size(0);
  check_input(input, k, "packed_bf16_linear");
  check_out_features(n, blocks, "packed_bf16_linear");
  const int64_t m = input_rows(input);
  if (m == 0 || k == 0) return at::zeros(out_shape(input, n), input.options());  // an empty sum is +0

  at::Tensor out = new_output(out_shape(input, n), input.scalar_type());
  const at::Tensor x = input.contiguous();
  const at::Tensor w = packed_weight.contiguous();
  const LinearArgs args{bf16_bits(x), bf16_bits(w), bf16_bits_mut(out), m, k, n};
  const LinearKernel kernel = isa().bf16;
  for_blocks(args, blocks, [&](const LinearArgs& part, int64_t begin, int64_t end) {
    kernel(part, begin, end, thread_scratch(linear_scratch_floats(m)));
  });
  return out;
}

// What tells the quantized layouts apart at the entry point (int4_a8 packs as int4 does; its
// kernel quantizes the activations too).
struct QuantSpec {
  const char* pack_op;
  const char* linear_op;
  int64_t version;
  at::ScalarType qdtype;
  const char* qdtype_name;
  int64_t k_per_row;  // K steps per qweight row: 1 (int8), 2 (int4: a nibble pair)
  QuantLinearKernel Isa::*kernel;
  int64_t (*scratch_floats)(int64_t m, int64_t kp, int64_t group);
  int64_t group_multiple;  // the kernel's G must be a multiple: int4_a8 sums 16 K steps in int16
};

int64_t weight_only_scratch(int64_t m, int64_t /*kp*/, int64_t /*group*/) { return quant_scratch_floats(m); }

constexpr QuantSpec kInt8{"pack_int8_weight", "packed_int8_linear", kInt8LayoutVersion,
                          at::kChar,          "int8",             1,                  &Isa::int8,
                          weight_only_scratch, 1};
constexpr QuantSpec kInt4{"pack_int4_weight", "packed_int4_linear", kInt4LayoutVersion,
                          at::kByte,          "uint8",            2,                  &Isa::int4,
                          weight_only_scratch, 2};
constexpr QuantSpec kInt4A8{"pack_int4_a8_weight", "packed_int4_a8_linear", kInt4LayoutVersion,
                            at::kByte,          "uint8",                 2,                  &Isa::int4_a8,
                            a8_scratch_floats, 16};

std::tuple<at::Tensor, at::Tensor> pack_quantized(const QuantSpec& spec, const at::Tensor& weight, int64_t group,
                                                  int64_t layout_version) {
  check_layout_version(layout_version, spec.version, spec.pack_op);
  check_bf16_weight(weight, spec.pack_op);
  const at::Tensor w = weight.contiguous();
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(0 < group && group <= k, "sglang_rvv_native::", spec.pack_op, ": group size ", group,
              " must be in 1..K=", k, " (the effective group: K for one scale per output channel)");
  TORCH_CHECK(group % spec.k_per_row == 0, "sglang_rvv_native::", spec.pack_op, ": group size ", group,
              " must be a multiple of ", spec.k_per_row, " (two K steps share a byte)");
  const uint16_t* src = bf16_bits(w);
  for (int64_t i = 0; i < n * k; ++i) {
    TORCH_CHECK((src[i] & 0x7F80) != 0x7F80, "sglang_rvv_native::", spec.pack_op,
                ": the weight has non-finite values; it cannot be quantized");
  }
  const int64_t blocks = (n + kBlockN - 1) / kBlockN, groups = (k + group - 1) / group;
  at::Tensor qweight = at::empty({blocks, groups * group / spec.k_per_row, kBlockN}, w.options().dtype(spec.qdtype));
  at::Tensor scales = at::empty({blocks, groups, kBlockN}, w.options());
  uint16_t* s = bf16_bits_mut(scales);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    if (spec.k_per_row == 1) {
      quantize_int8_32x(src, qweight.mutable_data_ptr<int8_t>(), s, n, k, group, begin, end);
    } else {
      quantize_int4_32x(src, qweight.mutable_data_ptr<uint8_t>(), s, n, k, group, begin, end);
    }
  });
  return {qweight, scales};
}

at::Tensor quantized_linear(const QuantSpec& spec, const at::Tensor& input, const at::Tensor& qweight,
                            const at::Tensor& scales, int64_t n, int64_t k, int64_t layout_version) {
  const char* op = spec.linear_op;
  check_layout_version(layout_version, spec.version, op);
  TORCH_CHECK(qweight.dim() == 3 && qweight.size(2) == kBlockN && qweight.scalar_type() == spec.qdtype,
              "sglang_rvv_native::", op, " expects a ", spec.qdtype_name, " qweight of shape [ceil(N/", kBlockN, "), ",
              spec.k_per_row == 1 ? "Kp" : "Kp/2", ", ", kBlockN, "], got ", qweight.scalar_type(), " ",
              qweight.sizes(), "; pack it with ", spec.pack_op);
  const int64_t blocks = qweight.size(0), kp = qweight.size(1) * spec.k_per_row;
  TORCH_CHECK(scales.dim() == 3 && scales.scalar_type() == at::kBFloat16 && scales.size(0) == blocks &&
                  scales.size(2) == kBlockN && scales.size(1) > 0 && kp % scales.size(1) == 0,
              "sglang_rvv_native::", op, " expects bfloat16 scales of shape [", blocks, ", Kp/G, ", kBlockN,
              "] for a qweight of ", qweight.sizes(), ", got ", scales.scalar_type(), " ", scales.sizes());
  const int64_t group = kp / scales.size(1);
  TORCH_CHECK(k > 0 && (k + group - 1) / group * group == kp, "sglang_rvv_native::", op, ": in_features=", k,
              " does not fit a qweight packed with Kp=", kp, " in groups of ", group);
  TORCH_CHECK(group % spec.group_multiple == 0, "sglang_rvv_native::", op, ": group size ", group,
              " is not a multiple of ", spec.group_multiple, "; pack the weight with a group size of 32, 64 or 128");
  check_input(input, k, op);
  check_out_features(n, blocks, op);
  const int64_t m = input_rows(input);
  at::Tensor out = new_output(out_shape(input, n), input.scalar_type());
  if (m == 0) return out;
  const at::Tensor x = input.contiguous(), q = qweight.contiguous(), s = scales.contiguous();
  const QuantLinearArgs args{bf16_bits(x), static_cast<const uint8_t*>(q.const_data_ptr()), bf16_bits(s),
                             bf16_bits_mut(out), m, k, n, group};  // all 32 lanes
  const QuantLinearKernel kernel = isa().*spec.kernel;
  for_blocks(args, blocks, [&](const QuantLinearArgs& part, int64_t begin, int64_t end) {
    kernel(part, begin, end, thread_scratch(spec.scratch_floats(m, kp, group)));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> pack_int8_weight(const at::Tensor& weight, int64_t group, int64_t version) {
  return pack_quantized(kInt8, weight, group, version);
}
std::tuple<at::Tensor, at::Tensor> pack_int4_weight(const at::Tensor& weight, int64_t group, int64_t version) {
  return pack_quantized(kInt4, weight, group, version);
}
at::Tensor packed_int8_linear(const at::Tensor& input, const at::Tensor& qweight, const at::Tensor& scales, int64_t n,
                              int64_t k, int64_t version) {
  return quantized_linear(kInt8, input, qweight, scales, n, k, version);
}
at::Tensor packed_int4_linear(const at::Tensor& input, const at::Tensor& qweight, const at::Tensor& scales, int64_t n,
                              int64_t k, int64_t version) {
  return quantized_linear(kInt4, input, qweight, scales, n, k, version);
}
std::tuple<at::Tensor, at::Tensor> pack_int4_a8_weight(const at::Tensor& weight, int64_t group, int64_t version) {
  return pack_quantized(kInt4A8, weight, group, version);
}
at::Tensor packed_int4_a8_linear(const at::Tensor& input, const at::Tensor& qweight, const at::Tensor& scales,
                                 int64_t n, int64_t k, int64_t version) {
  return quantized_linear(kInt4A8, input, qweight, scales, n, k, version);
}

// --- the rest of a decode step -------------------------------------------------------------------

// Rows of at least this many elements in all run on torch's threads; a decode step's norms and
// activations (1..16 rows of 128..8960) stay on the calling thread, cheaper than a fork-join.
constexpr int64_t kParallelElements = 1 << 16;

// t as [rows, d] rows: its row stride, when its last dim is contiguous and its rows are evenly
// spaced (any contiguous tensor, or a column slice of one, as SGLang's gate/up halves are).
// (row_spacing: of any dtype; row_stride: of a bfloat16 one.)
int64_t row_spacing(const at::Tensor& t, int64_t d, const char* op, const char* what) {
  TORCH_CHECK(t.stride(-1) == 1 || d <= 1, "sglang_rvv_native::", op, ": the ", what,
              "'s last dim must be contiguous (stride ", t.stride(-1), ")");
  int64_t ld = d, span = 0;  // span: the stride the next outer dim of more than one row must have
  for (int64_t dim = t.dim() - 2; dim >= 0; --dim) {
    if (t.size(dim) == 1) continue;
    TORCH_CHECK(span == 0 || t.stride(dim) == span, "sglang_rvv_native::", op, ": the ", what,
                "'s rows are not evenly spaced (strides ", t.strides(), "); pass it .contiguous()");
    if (span == 0) ld = t.stride(dim);
    span = t.stride(dim) * t.size(dim);
  }
  return ld;
}

int64_t row_stride(const at::Tensor& t, int64_t d, const char* op, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 && t.dim() >= 1 && t.size(-1) == d, "sglang_rvv_native::", op,
              " expects a bfloat16 ", what, " whose last dim is ", d, ", got ", t.scalar_type(), " ", t.sizes());
  return row_spacing(t, d, op, what);
}

template <class Args, class Kernel>
void for_rows(const Args& args, int64_t rows, int64_t d, Kernel kernel) {
  if (rows * d < kParallelElements) {
    kernel(args, 0, rows);
    return;
  }
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) { kernel(args, begin, end); });
}

// The shapes, dtypes and strides an op takes, as predicates: its TORCH_CHECKs ask them, and so
// does its try_ form, which returns false where they fail instead of raising. SGLang's hooks call
// the try_ forms where they once asked a Python check first (a few hundred bytecodes and a dozen
// tensor attribute calls a call, 28 calls of each op a Qwen3-0.6B token): the same questions in
// C++, then the op runs or the hook runs SGLang's own code. A try_ op also refuses tensors off
// the CPU and tensors that need grad (the ops have no autograd); an index outside the cache still
// raises, as in its op.
bool eager_cpu(std::initializer_list<const at::Tensor*> tensors) {
  const bool grad = at::GradMode::is_enabled();
  for (const at::Tensor* t : tensors) {
    if (!t->is_cpu() || (grad && t->requires_grad())) return false;
  }
  return true;
}

bool norm_weight_ok(const at::Tensor& weight) {
  return weight.dim() == 1 && weight.scalar_type() == at::kBFloat16 && weight.is_contiguous();
}

// [tokens, heads * d] bfloat16 with a contiguous last dim: SGLang's q and k, the splits of one qkv row.
bool head_rows_ok(const at::Tensor& t, int64_t tokens, int64_t d) {
  return t.scalar_type() == at::kBFloat16 && t.dim() == 2 && t.size(0) == tokens && d > 0 && t.size(1) % d == 0 &&
         (t.stride(1) == 1 || t.size(1) <= 1);
}

int64_t norm_rows(const at::Tensor& input, const at::Tensor& weight, const char* op) {
  TORCH_CHECK(norm_weight_ok(weight),
              "sglang_rvv_native::", op, " expects a contiguous 1-D bfloat16 weight, got ", weight.scalar_type(),
              " ", weight.sizes());
  return weight.size(0) ? input.numel() / weight.size(0) : 0;
}

at::Tensor rmsnorm(const at::Tensor& input, const at::Tensor& weight, double eps) {
  const int64_t rows = norm_rows(input, weight, "rmsnorm"), d = weight.size(0);
  const int64_t ldx = row_stride(input, d, "rmsnorm", "input");
  at::Tensor out = new_output(input.sizes(), input.scalar_type());
  if (rows == 0 || d == 0) return out;
  const NormArgs args{bf16_bits(input), nullptr, bf16_bits(weight), bf16_bits_mut(out), ldx, 0, d, d,
                      static_cast<float>(eps)};
  for_rows(args, rows, d, isa().rmsnorm);
  return out;
}

bool add_norm_rows_ok(const at::Tensor& input, const at::Tensor& residual) {
  return input.is_contiguous() && residual.is_contiguous() && input.sizes() == residual.sizes();
}

// residual = bf16(input + residual); input = rmsnorm(residual): SGLang's fused_add_rmsnorm.

void fused_add_rmsnorm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight, double eps) {
  const int64_t rows = norm_rows(input, weight, "fused_add_rmsnorm"), d = weight.size(0);
  TORCH_CHECK(add_norm_rows_ok(input, residual),
              "sglang_rvv_native::fused_add_rmsnorm works in place on a contiguous input and residual of one "
              "shape, got ", input.sizes(), " and ", residual.sizes());
  row_stride(input, d, "fused_add_rmsnorm", "input");
  row_stride(residual, d, "fused_add_rmsnorm", "residual");
  if (rows == 0 || d == 0) return;
  const NormArgs args{bf16_bits(input), bf16_bits_mut(residual), bf16_bits(weight), bf16_bits_mut(input), d, d, d,
                      d, static_cast<float>(eps)};
  for_rows(args, rows, d, isa().rmsnorm);
}

bool try_fused_add_rmsnorm(at::Tensor& input, at::Tensor& residual, const at::Tensor& weight, double eps) {
  const auto bf16_rows = [&weight](const at::Tensor& t) {
    return t.scalar_type() == at::kBFloat16 && t.dim() >= 1 && t.size(-1) == weight.size(0);
  };
  if (!(eager_cpu({&input, &residual, &weight}) && norm_weight_ok(weight) && add_norm_rows_ok(input, residual) &&
        bf16_rows(input) && bf16_rows(residual))) {
    return false;
  }
  fused_add_rmsnorm(input, residual, weight, eps);
  return true;
}

// SGLang's apply_qk_norm in place: each head row of q [tokens, q_heads * d] and k [tokens, kv_heads
// * d] (rows any distance apart: the splits of one qkv row) RMS-normalised by its weight [d], the
// same bits as rmsnorm over each row. One call where SGLang's CPU path copies q and k to rows of
// d, norms them and views them back.
void qk_rmsnorm(at::Tensor& q, at::Tensor& k, const at::Tensor& q_weight, const at::Tensor& k_weight, double q_eps,
                double k_eps) {
  TORCH_CHECK(q.dim() == 2 && k.dim() == 2 && q.size(0) == k.size(0), "sglang_rvv_native::qk_rmsnorm expects q and "
              "k [tokens, heads * head_dim] of one token count, got ", q.sizes(), " and ", k.sizes());
  norm_rows(q, q_weight, "qk_rmsnorm");  // each weight: 1-D, bfloat16, contiguous
  norm_rows(k, k_weight, "qk_rmsnorm");
  const int64_t d = q_weight.size(0);
  TORCH_CHECK(d > 0 && k_weight.size(0) == d, "sglang_rvv_native::qk_rmsnorm expects weights of one head_dim, got ",
              q_weight.sizes(), " and ", k_weight.sizes());
  for (at::Tensor* t : {&q, &k}) {
    TORCH_CHECK(head_rows_ok(*t, q.size(0), d),
                "sglang_rvv_native::qk_rmsnorm expects bfloat16 q and k of whole heads of ", d,
                " with a contiguous last dim, got ", t->scalar_type(), " ", t->sizes(), " strides ", t->strides());
  }
  auto norm_heads = [d](at::Tensor& x, const at::Tensor& weight, double eps) {
    for (int64_t t = 0; t < x.size(0); ++t) {  // a token's heads are rows d apart; tokens stride(0) apart
      uint16_t* row = bf16_bits_mut(x) + t * x.stride(0);
      const NormArgs args{row, nullptr, bf16_bits(weight), row, d, 0, d, d, static_cast<float>(eps)};
      for_rows(args, x.size(1) / d, d, isa().rmsnorm);
    }
  };
  norm_heads(q, q_weight, q_eps);
  norm_heads(k, k_weight, k_eps);
}

bool try_qk_rmsnorm(at::Tensor& q, at::Tensor& k, const at::Tensor& q_weight, const at::Tensor& k_weight,
                    double q_eps, double k_eps) {
  if (!(eager_cpu({&q, &k, &q_weight, &k_weight}) && norm_weight_ok(q_weight) && norm_weight_ok(k_weight) &&
        k_weight.sizes() == q_weight.sizes() && q.dim() == 2 && head_rows_ok(q, q.size(0), q_weight.size(0)) &&
        head_rows_ok(k, q.size(0), q_weight.size(0)))) {
    return false;
  }
  qk_rmsnorm(q, k, q_weight, k_weight, q_eps, k_eps);
  return true;
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), "sglang_rvv_native::silu_mul expects gate and up of one shape, got ",
              gate.sizes(), " and ", up.sizes());
  const int64_t d = gate.dim() ? gate.size(-1) : 0;
  const int64_t ldg = row_stride(gate, d, "silu_mul", "gate"), ldu = row_stride(up, d, "silu_mul", "up");
  at::Tensor out = new_output(gate.sizes(), gate.scalar_type());
  const int64_t rows = d ? gate.numel() / d : 0;
  if (rows == 0) return out;
  const SiluMulArgs args{bf16_bits(gate), bf16_bits(up), bf16_bits_mut(out), ldg, ldu, d, d};
  for_rows(args, rows, d, isa().silu_mul);
  return out;
}

// SGLang's SiluAndMul: x [..., 2d] holds gate then up in each row; out [..., d]. One call where
// silu_mul would need the two halves sliced first (two more torch ops a layer).
at::Tensor silu_and_mul(const at::Tensor& x) {
  const int64_t two_d = x.dim() ? x.size(-1) : 0, d = two_d / 2;
  TORCH_CHECK(two_d % 2 == 0, "sglang_rvv_native::silu_and_mul expects a last dim of gate then up (even), got ",
              x.sizes());
  const int64_t ldx = row_stride(x, two_d, "silu_and_mul", "input");
  at::Tensor out = new_output(out_shape(x, d), x.scalar_type());
  const int64_t rows = d ? x.numel() / two_d : 0;
  if (rows == 0) return out;
  const uint16_t* gate = bf16_bits(x);
  const SiluMulArgs args{gate, gate + d, bf16_bits_mut(out), ldx, ldx, d, d};
  for_rows(args, rows, d, isa().silu_mul);
  return out;
}

// cos or sin as rotary's [batch, seq, >= d/2] table: a batch of one broadcasts (stride 0).
void check_rotary_table(const at::Tensor& t, const at::Tensor& q, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kBFloat16 && t.dim() == 3 && (t.size(0) == 1 || t.size(0) == q.size(0)) &&
                  t.size(1) == q.size(2) && 2 * t.size(2) >= q.size(3) && (t.stride(2) == 1 || t.size(2) <= 1),
              "sglang_rvv_native::rotary_neox expects a bfloat16 ", what, " of shape [batch, seq, >= head_dim/2] "
              "with a contiguous last dim for a query of shape ", q.sizes(), ", got ", t.scalar_type(), " ",
              t.sizes(), " strides ", t.strides());
}

at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const char* what) {
  const int64_t batch = x.size(0), heads = x.size(1), seq = x.size(2), d = x.size(3);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && (x.stride(3) == 1 || d <= 1),
              "sglang_rvv_native::rotary_neox expects a bfloat16 ", what, " with a contiguous last dim, got ",
              x.scalar_type(), " strides ", x.strides());
  // [batch, seq, heads, d] in memory, as transformers' q.view(...).transpose(1, 2) is.
  at::Tensor out = new_output({batch, seq, heads, d}, x.scalar_type()).transpose(1, 2);
  if (out.numel() == 0) return out;
  const int64_t cb = cos.size(0) == 1 ? 0 : cos.stride(0);
  const RotaryArgs args{bf16_bits(x), bf16_bits(cos), bf16_bits(sin), bf16_bits_mut(out), heads, seq, d,
                        x.stride(0), x.stride(1), x.stride(2), cb, cos.stride(1), out.stride(0), out.stride(1),
                        out.stride(2)};
  for_rows(args, batch * heads * seq, d, isa().rotary);
  return out;
}

// transformers' apply_rotary_pos_emb for the whole head, neox style: (q, k) [batch, heads, seq, d]
// rotated by cos and sin [batch or 1, seq, d] (only the first d/2 of each are read).
std::tuple<at::Tensor, at::Tensor> rotary_neox(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                               const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
                  q.size(3) == k.size(3) && q.size(3) % 2 == 0,
              "sglang_rvv_native::rotary_neox expects a query and key [batch, heads, seq, head_dim] of one batch, "
              "seq and even head_dim, got ", q.sizes(), " and ", k.sizes());
  check_rotary_table(cos, q, "cos");
  check_rotary_table(sin, q, "sin");
  TORCH_CHECK(cos.sizes() == sin.sizes() && cos.strides() == sin.strides(),
              "sglang_rvv_native::rotary_neox expects cos and sin of one shape and strides, got ", cos.sizes(), " ",
              cos.strides(), " and ", sin.sizes(), " ", sin.strides());
  return {rotate(q, cos, sin, "query"), rotate(k, cos, sin, "key")};
}

bool cos_sin_cache_ok(const at::Tensor& cache) {
  return cache.scalar_type() == at::kBFloat16 && cache.dim() == 2 && cache.size(1) % 2 == 0 && cache.size(1) > 0 &&
         cache.stride(1) == 1;
}

bool positions_ok(const at::Tensor& positions) {
  return positions.dim() == 1 && positions.scalar_type() == at::kLong && positions.is_contiguous();
}

// SGLang's RotaryEmbedding for the whole head, neox style: query [tokens, q_heads * d] and key
// [tokens, kv_heads * d] (rows any distance apart: the splits of one qkv row), token t rotated by
// row positions[t] of cos_sin_cache [positions, d] (cos then sin, d/2 each). Returns the rotated
// query and key, contiguous, in their shapes: the gather of the cache rows and the views around
// rotary_neox, in one call.
std::tuple<at::Tensor, at::Tensor> rotary_neox_at(const at::Tensor& positions, const at::Tensor& query,
                                                  const at::Tensor& key, const at::Tensor& cos_sin_cache) {
  const at::Tensor& cache = cos_sin_cache;
  TORCH_CHECK(cos_sin_cache_ok(cache),
              "sglang_rvv_native::rotary_neox_at expects a bfloat16 cos_sin_cache [positions, head_dim] (even, "
              "contiguous rows), got ", cache.scalar_type(), " ", cache.sizes(), " strides ", cache.strides());
  const int64_t d = cache.size(1), tokens = positions.numel();
  TORCH_CHECK(positions_ok(positions),
              "sglang_rvv_native::rotary_neox_at expects contiguous int64 positions [tokens], got ",
              positions.scalar_type(), " ", positions.sizes());
  for (const at::Tensor* t : {&query, &key}) {
    TORCH_CHECK(head_rows_ok(*t, tokens, d),
                "sglang_rvv_native::rotary_neox_at expects a bfloat16 query and key [", tokens, " tokens, heads * ",
                d, "] with a contiguous last dim, got ", t->scalar_type(), " ", t->sizes(), " strides ",
                t->strides());
  }
  const int64_t* at_row = positions.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(at_row[t] >= 0 && at_row[t] < cache.size(0), "sglang_rvv_native::rotary_neox_at: token ", t,
                " is at position ", at_row[t], ", outside the cos_sin_cache's ", cache.size(0), " rows");
  }
  auto rotated = [&](const at::Tensor& x) {
    at::Tensor out = new_output(x.sizes(), x.scalar_type());
    if (out.numel() == 0) return out;
    const int64_t heads = x.size(1) / d;
    RotaryArgs args{bf16_bits(x), bf16_bits(cache), bf16_bits(cache) + d / 2, bf16_bits_mut(out), heads, 1, d,
                    x.stride(0), d, 0, cache.stride(0), 0, heads * d, d, 0};
    args.positions = at_row;
    for_rows(args, tokens * heads, d, isa().rotary);
    return out;
  };
  return {rotated(query), rotated(key)};
}

// rotary_neox_at's [query, key], or [] where it does not cover the call.
std::vector<at::Tensor> try_rotary_neox_at(const at::Tensor& positions, const at::Tensor& query, const at::Tensor& key,
                                           const at::Tensor& cos_sin_cache) {
  if (!(eager_cpu({&positions, &query, &key, &cos_sin_cache}) && cos_sin_cache_ok(cos_sin_cache) &&
        positions_ok(positions) && head_rows_ok(query, positions.size(0), cos_sin_cache.size(1)) &&
        head_rows_ok(key, positions.size(0), cos_sin_cache.size(1)))) {
    return {};
  }
  auto [q, k] = rotary_neox_at(positions, query, key, cos_sin_cache);
  return {q, k};
}

// One decode step's attention, transformers' layout: q [batch, q_heads, 1, d], k and v [batch,
// kv_heads, keys, d] (any strides but a contiguous last dim), q_heads a multiple of kv_heads; the
// result is [batch, 1, q_heads, d], as transformers' sdpa_attention_forward returns it.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() && q.size(2) == 1 && q.size(0) == k.size(0) &&
                  q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0 && k.size(2) > 0,
              "sglang_rvv_native::decode_attention expects q [batch, q_heads, 1, d] and k, v [batch, kv_heads, "
              "keys >= 1, d] with q_heads a multiple of kv_heads, got ", q.sizes(), ", ", k.sizes(), " and ",
              v.sizes());
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && (t->stride(3) == 1 || t->size(3) <= 1),
                "sglang_rvv_native::decode_attention expects bfloat16 q, k and v with a contiguous last dim, got ",
                t->scalar_type(), " strides ", t->strides());
  }
  const int64_t batch = q.size(0), q_heads = q.size(1), keys = k.size(2), d = q.size(3);
  at::Tensor out = new_output({batch, 1, q_heads, d}, q.scalar_type());
  if (out.numel() == 0) return out;
  const AttentionArgs args{bf16_bits(q), bf16_bits(k), bf16_bits(v), bf16_bits_mut(out), q_heads, k.size(1), keys, d,
                           q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0),
                           v.stride(1), v.stride(2), out.stride(0), out.stride(2), static_cast<float>(scale)};
  const AttentionKernel kernel = isa().attention;
  for_rows(args, batch * q_heads, keys * d, [&](const AttentionArgs& part, int64_t begin, int64_t end) {
    kernel(part, begin, end, thread_scratch(keys));
  });
  return out;
}

bool paged_shapes_ok(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& out) {
  return q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes() && out.sizes() == q.sizes() &&
         q.size(2) == k_cache.size(2) && k_cache.size(1) > 0 && q.size(1) % k_cache.size(1) == 0;
}

bool paged_rows_ok(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 && (t.stride(2) == 1 || t.size(2) <= 1);
}

bool paged_indices_ok(const at::Tensor& req_to_token, const at::Tensor& pool, const at::Tensor& seq_lens,
                      int64_t batch) {
  return req_to_token.dim() == 2 && req_to_token.scalar_type() == at::kInt && req_to_token.is_contiguous() &&
         pool.dim() == 1 && pool.scalar_type() == at::kLong && pool.is_contiguous() && pool.size(0) == batch &&
         seq_lens.sizes() == pool.sizes() && seq_lens.scalar_type() == at::kLong && seq_lens.is_contiguous();
}

// One decode step's attention over SGLang's paged KV cache, in place of torch_native's gather and
// sdpa per request: q [batch, q_heads, d]; k_cache and v_cache [cache rows, kv_heads, d] (any
// strides but a contiguous last dim); batch row b attends to cache rows req_to_token[pool[b],
// :seq_lens[b]]; out [batch, q_heads, d] is written. Every index is checked before any is read.
void decode_attention_paged(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& req_to_token, const at::Tensor& pool, const at::Tensor& seq_lens,
                            double scale, at::Tensor& out) {
  TORCH_CHECK(paged_shapes_ok(q, k_cache, v_cache, out),
              "sglang_rvv_native::decode_attention_paged expects q and out [batch, q_heads, d] and k_cache, v_cache "
              "[cache rows, kv_heads, d] with q_heads a multiple of kv_heads, got ", q.sizes(), ", ", out.sizes(),
              ", ", k_cache.sizes(), " and ", v_cache.sizes());
  for (const at::Tensor* t : {&q, &k_cache, &v_cache, static_cast<const at::Tensor*>(&out)}) {
    TORCH_CHECK(paged_rows_ok(*t),
                "sglang_rvv_native::decode_attention_paged expects bfloat16 q, caches and out with a contiguous "
                "last dim, got ", t->scalar_type(), " strides ", t->strides());
  }
  const int64_t batch = q.size(0), rows = k_cache.size(0);
  TORCH_CHECK(paged_indices_ok(req_to_token, pool, seq_lens, batch),
              "sglang_rvv_native::decode_attention_paged expects a contiguous int32 req_to_token [requests, "
              "context] and contiguous int64 pool indices and seq_lens [batch], got ", req_to_token.scalar_type(),
              " ", req_to_token.sizes(), ", ", pool.scalar_type(), " ", pool.sizes(), " and ", seq_lens.scalar_type(),
              " ", seq_lens.sizes());
  const int32_t* slots = req_to_token.data_ptr<int32_t>();
  const int64_t* pools = pool.data_ptr<int64_t>();
  const int64_t* lengths = seq_lens.data_ptr<int64_t>();
  const int64_t requests = req_to_token.size(0), ls = req_to_token.size(1);
  int64_t keys = 0;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(pools[b] >= 0 && pools[b] < requests && lengths[b] >= 1 && lengths[b] <= ls,
                "sglang_rvv_native::decode_attention_paged: batch row ", b, " has pool index ", pools[b],
                " (of ", requests, ") and ", lengths[b], " keys (1 to ", ls, ")");
    const int32_t* row = slots + pools[b] * ls;
    for (int64_t j = 0; j < lengths[b]; ++j) {
      TORCH_CHECK(row[j] >= 0 && row[j] < rows, "sglang_rvv_native::decode_attention_paged: batch row ", b,
                  " key ", j, " is cache row ", row[j], ", outside the cache's ", rows);
    }
    keys = std::max(keys, lengths[b]);
  }
  if (out.numel() == 0) return;
  AttentionArgs args{bf16_bits(q), bf16_bits(k_cache), bf16_bits(v_cache), bf16_bits_mut(out), q.size(1),
                     k_cache.size(1), keys, q.size(2), q.stride(0), q.stride(1), 0, k_cache.stride(1),
                     k_cache.stride(0), 0, v_cache.stride(1), v_cache.stride(0), out.stride(0), out.stride(1),
                     static_cast<float>(scale)};
  args.slots = slots;
  args.pool = pools;
  args.lengths = lengths;
  args.ls = ls;
  const AttentionKernel kernel = isa().attention;
  for_rows(args, batch * q.size(1), keys * q.size(2), [&](const AttentionArgs& part, int64_t begin, int64_t end) {
    kernel(part, begin, end, thread_scratch(keys));
  });
}

bool try_decode_attention_paged(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                const at::Tensor& req_to_token, const at::Tensor& pool, const at::Tensor& seq_lens,
                                double scale, at::Tensor& out) {
  if (!(eager_cpu({&q, &k_cache, &v_cache, &req_to_token, &pool, &seq_lens, &out}) &&
        paged_shapes_ok(q, k_cache, v_cache, out) && paged_rows_ok(q) && paged_rows_ok(k_cache) &&
        paged_rows_ok(v_cache) && paged_rows_ok(out) && paged_indices_ok(req_to_token, pool, seq_lens, q.size(0)))) {
    return false;
  }
  decode_attention_paged(q, k_cache, v_cache, req_to_token, pool, seq_lens, scale, out);
  return true;
}

// torch.argmax(logits, -1) of bfloat16 or float32 logits (any rows but a contiguous last dim): the
// greedy sampler's next tokens, int64 [...].
at::Tensor top1(const at::Tensor& logits) {
  const at::ScalarType dtype = logits.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && logits.dim() >= 1 && logits.size(-1) >= 1,
              "sglang_rvv_native::top1 expects bfloat16 or float32 logits with a non-empty last dim, got ", dtype,
              " ", logits.sizes());
  const int64_t n = logits.size(-1), ld = row_spacing(logits, n, "top1", "logits");
  at::Tensor out = new_output(logits.sizes().slice(0, logits.dim() - 1), at::kLong);
  const int64_t rows = logits.numel() / n;
  if (rows == 0) return out;
  const bool bf16 = dtype == at::kBFloat16;
  const Top1Args args{bf16 ? bf16_bits(logits) : nullptr, bf16 ? nullptr : logits.const_data_ptr<float>(),
                      out.mutable_data_ptr<int64_t>(), ld, n};
  for_rows(args, rows, n, isa().top1);
  return out;
}

// logits.float() of bfloat16 logits (any rows but a contiguous last dim): float32, contiguous, the
// same bits as torch's.
at::Tensor widen(const at::Tensor& logits) {
  const int64_t d = logits.dim() ? logits.size(-1) : 0;
  const int64_t ldx = row_stride(logits, d, "widen", "logits");
  at::Tensor out = new_output(logits.sizes(), at::kFloat);
  const int64_t rows = d ? logits.numel() / d : 0;
  if (rows == 0) return out;
  const WidenArgs args{bf16_bits(logits), out.mutable_data_ptr<float>(), ldx, d};
  for_rows(args, rows, d, isa().widen);
  return out;
}

// a + b of bfloat16 tensors of one shape (any rows but contiguous last dims): transformers'
// residual add, contiguous, the same bits as torch's.
at::Tensor residual_add(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "sglang_rvv_native::residual_add expects a and b of one shape, got ", a.sizes(),
              " and ", b.sizes());
  const int64_t d = a.dim() ? a.size(-1) : 0;
  const int64_t lda = row_stride(a, d, "residual_add", "a"), ldb = row_stride(b, d, "residual_add", "b");
  at::Tensor out = new_output(a.sizes(), a.scalar_type());
  const int64_t rows = d ? a.numel() / d : 0;
  if (rows == 0) return out;
  const AddArgs args{bf16_bits(a), bf16_bits(b), bf16_bits_mut(out), lda, ldb, d};
  for_rows(args, rows, d, isa().add);
  return out;
}

bool kv_rows_ok(const at::Tensor& src, const at::Tensor& cache, int64_t tokens) {
  return src.dim() == 3 && cache.dim() == 3 && src.size(0) == tokens && src.size(1) == cache.size(1) &&
         src.size(2) == cache.size(2) && src.scalar_type() == cache.scalar_type() && cache.is_contiguous() &&
         (src.stride(2) == 1 || src.size(2) <= 1) && (src.stride(1) == src.size(2) || src.size(1) <= 1);
}

// SGLang's KV cache store, k_cache[loc[i]] = k[i] and v_cache[loc[i]] = v[i] for each token i: a
// row copy, no arithmetic, so no ISA kernel. k and v [tokens, kv_heads, d] with each token's row
// contiguous; the caches [cache rows, kv_heads, d], contiguous, of their dtype; loc int64
// [tokens]. Every slot is checked before any row is written.
void store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& loc) {
  TORCH_CHECK(positions_ok(loc),
              "sglang_rvv_native::store_kv expects contiguous int64 slots [tokens], got ", loc.scalar_type(), " ",
              loc.sizes());
  const int64_t tokens = loc.size(0);
  const std::pair<const at::Tensor*, at::Tensor*> pairs[] = {{&k, &k_cache}, {&v, &v_cache}};
  for (const auto& [src, cache] : pairs) {
    TORCH_CHECK(kv_rows_ok(*src, *cache, tokens),
                "sglang_rvv_native::store_kv expects k and v [tokens, kv_heads, d] with contiguous rows and "
                "contiguous caches [cache rows, kv_heads, d] of their dtype, ", tokens, " slots; got ",
                src->scalar_type(), " ", src->sizes(), " strides ", src->strides(), " into ", cache->scalar_type(),
                " ", cache->sizes());
  }
  const int64_t* slots = loc.const_data_ptr<int64_t>();
  const int64_t rows = std::min(k_cache.size(0), v_cache.size(0));
  for (int64_t i = 0; i < tokens; ++i) {
    TORCH_CHECK(slots[i] >= 0 && slots[i] < rows, "sglang_rvv_native::store_kv: token ", i, " has slot ", slots[i],
                ", outside the cache's ", rows, " rows");
  }
  for (const auto& [src, cache] : pairs) {
    const int64_t item = src->element_size(), row_bytes = src->size(1) * src->size(2) * item;
    const char* from = static_cast<const char*>(src->const_data_ptr());
    char* to = static_cast<char*>(cache->mutable_data_ptr());
    for (int64_t i = 0; i < tokens; ++i) {
      std::memcpy(to + slots[i] * row_bytes, from + i * src->stride(0) * item, static_cast<size_t>(row_bytes));
    }
  }
}

bool try_store_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                  const at::Tensor& loc) {
  if (!(eager_cpu({&k, &v, &k_cache, &v_cache, &loc}) && positions_ok(loc) && kv_rows_ok(k, k_cache, loc.size(0)) &&
        kv_rows_ok(v, v_cache, loc.size(0)))) {
    return false;
  }
  store_kv(k, v, k_cache, v_cache, loc);
  return true;
}

// transformers' KV cache appended in place (app/sglang_rvv/hf_cache.py): rows [batch, heads, n, d]
// (any strides) written into buffer[:, :, start:start + n] (a contiguous [batch, heads, capacity,
// d] of their dtype), and buffer[:, :, :start + n] returned, a view. One call where narrow, copy_
// and narrow from Python were three ops (and a TensorIterator for a few rows); no arithmetic, so
// no ISA kernel.
at::Tensor append_rows(at::Tensor& buffer, const at::Tensor& rows, int64_t start) {
  TORCH_CHECK(buffer.dim() == 4 && rows.dim() == 4 && buffer.is_contiguous() &&
                  rows.scalar_type() == buffer.scalar_type() && rows.size(0) == buffer.size(0) &&
                  rows.size(1) == buffer.size(1) && rows.size(3) == buffer.size(3),
              "sglang_rvv_native::append_rows expects rows [batch, heads, n, d] and a contiguous buffer [batch, "
              "heads, capacity, d] of their dtype, got ", rows.scalar_type(), " ",
              rows.sizes(), " strides ", rows.strides(), " into ", buffer.scalar_type(), " ", buffer.sizes());
  const int64_t n = rows.size(2), capacity = buffer.size(2);
  TORCH_CHECK(start >= 0 && start + n <= capacity, "sglang_rvv_native::append_rows: rows ", start, " to ", start + n,
              " do not fit the buffer's ", capacity);
  const int64_t d = rows.size(3), item = rows.element_size(), row_bytes = d * item;
  const bool whole_rows = rows.stride(3) == 1 || d <= 1;
  const char* from = static_cast<const char*>(rows.const_data_ptr());
  char* to = static_cast<char*>(buffer.mutable_data_ptr());
  for (int64_t b = 0; b < rows.size(0); ++b) {
    for (int64_t h = 0; h < rows.size(1); ++h) {
      const int64_t head = b * rows.size(1) + h;
      for (int64_t i = 0; i < n; ++i) {
        char* row = to + ((head * capacity) + start + i) * row_bytes;
        const char* src = from + (b * rows.stride(0) + h * rows.stride(1) + i * rows.stride(2)) * item;
        if (whole_rows) {
          std::memcpy(row, src, static_cast<size_t>(row_bytes));
        } else {
          for (int64_t j = 0; j < d; ++j) std::memcpy(row + j * item, src + j * rows.stride(3) * item, item);
        }
      }
    }
  }
  return buffer.narrow(2, 0, start + n);
}

// transformers' attention of one decode step after its projections, in one call (sglang_rvv.hf_step):
// q [batch, 1, q_heads * d] and k, v [batch, 1, kv_heads * d], the projections' contiguous rows;
// each head of q and k RMS-normalised by q_weight and k_weight (Qwen3's q_norm and k_norm; none
// given: not normalised), both rotated neox style by cos and sin [batch or 1, 1, d], k and v
// appended as row `length` of key_buffer and value_buffer [batch, kv_heads, capacity, d], and the
// decode attention of q over rows 0..length. Returns (the attention [batch, 1, q_heads * d], the
// keys and the values: the buffers' first length + 1 rows). rmsnorm, rotary_neox, append_rows and
// decode_attention in transformers' order on the same views, so the same bits as those ops called
// one by one, without the eleven views and Python frames between them (per layer per token).
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_step(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& q_weight,
    const std::optional<at::Tensor>& k_weight, double q_eps, double k_eps, const at::Tensor& cos,
    const at::Tensor& sin, at::Tensor& key_buffer, at::Tensor& value_buffer, int64_t length, double scale) {
  TORCH_CHECK(key_buffer.dim() == 4 && value_buffer.sizes() == key_buffer.sizes() && key_buffer.size(3) > 0,
              "sglang_rvv_native::attention_step expects key and value buffers [batch, kv_heads, capacity, d] of "
              "one shape, got ", key_buffer.sizes(), " and ", value_buffer.sizes());
  const int64_t batch = key_buffer.size(0), kv_heads = key_buffer.size(1), d = key_buffer.size(3);
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->dim() == 3 && t->size(0) == batch && t->size(1) == 1 &&
                    t->size(2) % d == 0 && t->is_contiguous(),
                "sglang_rvv_native::attention_step expects contiguous bfloat16 q, k and v [", batch,
                ", 1, heads * ", d, "], got ", t->scalar_type(), " ", t->sizes(), " strides ", t->strides());
  }
  TORCH_CHECK(k.size(2) == kv_heads * d && v.size(2) == kv_heads * d && q.size(2) > 0,
              "sglang_rvv_native::attention_step expects k and v of the buffers' ", kv_heads, " heads of ", d,
              ", got ", k.sizes(), " and ", v.sizes());
  const int64_t q_heads = q.size(2) / d;
  // [batch, heads, 1, d] views of rows [batch, 1, heads * d]: transformers' view(...).transpose(1, 2).
  const auto heads_view = [batch, d](const at::Tensor& rows, int64_t heads) {
    return rows.view({batch, 1, heads, d}).transpose(1, 2);
  };
  const auto normed = [&](const at::Tensor& rows, int64_t heads, const std::optional<at::Tensor>& weight,
                          double eps) {
    at::Tensor per_head = rows.view({batch, 1, heads, d});
    if (!weight.has_value()) return per_head.transpose(1, 2);
    TORCH_CHECK(weight->dim() == 1 && weight->size(0) == d, "sglang_rvv_native::attention_step expects norm "
                "weights of the head dim ", d, ", got ", weight->sizes());
    return rmsnorm(per_head, *weight, eps).transpose(1, 2);
  };
  auto [q_rot, k_rot] = rotary_neox(normed(q, q_heads, q_weight, q_eps), normed(k, kv_heads, k_weight, k_eps), cos,
                                    sin);
  at::Tensor keys = append_rows(key_buffer, k_rot, length);
  at::Tensor values = append_rows(value_buffer, heads_view(v, kv_heads), length);
  at::Tensor out = decode_attention(q_rot, keys, values, scale);
  return {out.view({batch, 1, q_heads * d}), keys, values};
}

}  // namespace
}  // namespace sglang_rvv

TORCH_LIBRARY(sglang_rvv_native, m) {
  m.def("pack_bf16_weight(Tensor weight, int layout_version) -> Tensor");
  m.def("packed_bf16_linear(Tensor input, Tensor packed_weight, int out_features, int layout_version) -> Tensor");
  m.def("pack_int8_weight(Tensor weight, int group, int layout_version) -> (Tensor, Tensor)");
  m.def("packed_int8_linear(Tensor input, Tensor qweight, Tensor scales, int out_features, int in_features, "
        "int layout_version) -> Tensor");
  m.def("pack_int4_weight(Tensor weight, int group, int layout_version) -> (Tensor, Tensor)");
  m.def("packed_int4_linear(Tensor input, Tensor qweight, Tensor scales, int out_features, int in_features, "
        "int layout_version) -> Tensor");
  m.def("pack_int4_a8_weight(Tensor weight, int group, int layout_version) -> (Tensor, Tensor)");
  m.def("packed_int4_a8_linear(Tensor input, Tensor qweight, Tensor scales, int out_features, int in_features, "
        "int layout_version) -> Tensor");
  m.def("rmsnorm(Tensor input, Tensor weight, float eps) -> Tensor");
  m.def("fused_add_rmsnorm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("qk_rmsnorm(Tensor(a!) q, Tensor(b!) k, Tensor q_weight, Tensor k_weight, float q_eps, float k_eps) -> ()");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("silu_and_mul(Tensor x) -> Tensor");
  m.def("rotary_neox(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.def("rotary_neox_at(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache) -> (Tensor, Tensor)");
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, float scale) -> Tensor");
  m.def("decode_attention_paged(Tensor q, Tensor k_cache, Tensor v_cache, Tensor req_to_token, Tensor pool, "
        "Tensor seq_lens, float scale, Tensor(a!) out) -> ()");
  m.def("top1(Tensor logits) -> Tensor");
  m.def("widen(Tensor logits) -> Tensor");
  m.def("residual_add(Tensor a, Tensor b) -> Tensor");
  m.def("store_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc) -> ()");
  m.def("append_rows(Tensor(a!) buffer, Tensor rows, int start) -> Tensor(a!)");
  m.def("attention_step(Tensor q, Tensor k, Tensor v, Tensor? q_weight, Tensor? k_weight, float q_eps, "
        "float k_eps, Tensor cos, Tensor sin, Tensor(a!) key_buffer, Tensor(b!) value_buffer, int length, "
        "float scale) -> (Tensor, Tensor(a!), Tensor(b!))");
  // SGLang's hooks' calls: defined with their kernels (CompositeImplicitAutograd), as they take
  // tensors of any device and autograd state and refuse those the ops may not (eager_cpu).
  m.def("try_fused_add_rmsnorm(Tensor(a!) input, Tensor(b!) residual, Tensor weight, float eps) -> bool",
        &sglang_rvv::try_fused_add_rmsnorm);
  m.def("try_qk_rmsnorm(Tensor(a!) q, Tensor(b!) k, Tensor q_weight, Tensor k_weight, float q_eps, float k_eps) "
        "-> bool", &sglang_rvv::try_qk_rmsnorm);
  m.def("try_rotary_neox_at(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache) -> Tensor[]",
        &sglang_rvv::try_rotary_neox_at);
  m.def("try_decode_attention_paged(Tensor q, Tensor k_cache, Tensor v_cache, Tensor req_to_token, Tensor pool, "
        "Tensor seq_lens, float scale, Tensor(a!) out) -> bool", &sglang_rvv::try_decode_attention_paged);
  m.def("try_store_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc) -> bool",
        &sglang_rvv::try_store_kv);
  // "rvv vlen=N" or "generic": which kernels the calls above run in this process.
  m.def("kernel_isa() -> str", [] { return sglang_rvv::isa().name; });
}

TORCH_LIBRARY_IMPL(sglang_rvv_native, CPU, m) {
  m.impl("pack_bf16_weight", &sglang_rvv::pack_bf16_weight);
  m.impl("packed_bf16_linear", &sglang_rvv::packed_bf16_linear);
  m.impl("pack_int8_weight", &sglang_rvv::pack_int8_weight);
  m.impl("packed_int8_linear", &sglang_rvv::packed_int8_linear);
  m.impl("pack_int4_weight", &sglang_rvv::pack_int4_weight);
  m.impl("packed_int4_linear", &sglang_rvv::packed_int4_linear);
  m.impl("pack_int4_a8_weight", &sglang_rvv::pack_int4_a8_weight);
  m.impl("packed_int4_a8_linear", &sglang_rvv::packed_int4_a8_linear);
  m.impl("rmsnorm", &sglang_rvv::rmsnorm);
  m.impl("fused_add_rmsnorm", &sglang_rvv::fused_add_rmsnorm);
  m.impl("qk_rmsnorm", &sglang_rvv::qk_rmsnorm);
  m.impl("silu_mul", &sglang_rvv::silu_mul);
  m.impl("silu_and_mul", &sglang_rvv::silu_and_mul);
  m.impl("rotary_neox", &sglang_rvv::rotary_neox);
  m.impl("rotary_neox_at", &sglang_rvv::rotary_neox_at);
  m.impl("decode_attention", &sglang_rvv::decode_attention);
  m.impl("decode_attention_paged", &sglang_rvv::decode_attention_paged);
  m.impl("top1", &sglang_rvv::top1);
  m.impl("widen", &sglang_rvv::widen);
  m.impl("residual_add", &sglang_rvv::residual_add);
  m.impl("store_kv", &sglang_rvv::store_kv);
  m.impl("append_rows", &sglang_rvv::append_rows);
  m.impl("attention_step", &sglang_rvv::attention_step);
}
