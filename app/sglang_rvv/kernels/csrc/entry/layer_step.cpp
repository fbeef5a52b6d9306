// A transformers decoder layer's decode step (sglang_rvv.hf_step) in one CPython function.
//
// The step is six kernel-library ops and seven projection calls. Through torch.ops' C++ callable
// each op call from Python costs about 11.5 k instructions under emulation (its schema parsing
// into IValues, boxing, and the dispatcher's autograd fallback), six a layer: about 1.9 M a
// Qwen3-0.6B token. Here the ops go through their typed handles, straight to their CPU kernels
// where the dispatcher would land there (lands_on_cpu), and the projections are called as Python
// calls (each module's own __call__: the routes' C methods, a plain Linear's nn.Module.__call__),
// in the order hf_step's Python sequence calls them, so the same bits.
//
// decode_layer(x, in_weight, in_eps, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
//              down_proj, q_weight, k_weight, q_eps, k_eps, cos, sin, key_buffer, value_buffer,
//              length, scale, post_weight, post_eps) -> (hidden, keys, values)
// q_weight and k_weight may be None (no QK norm). None, with nothing run, where a module called
// by itself would not take its kernel (covered: grad, the input, a norm weight, the rotary table):
// the layer then runs its own forward. The ops check the rest of their operands and raise a
// RuntimeError naming the problem; a projection's exception passes through as it is.

#include "entry.h"

#include <optional>
#include <tuple>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>

namespace sglang_rvv_entry {
namespace {

using NormOp = at::Tensor(const at::Tensor&, const at::Tensor&, double);
using PairOp = at::Tensor(const at::Tensor&, const at::Tensor&);
using StepOp = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, double, double, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&,
    int64_t, double);

template <class Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

struct Ops {
  c10::TypedOperatorHandle<NormOp> rmsnorm = handle<NormOp>("sglang_rvv_native::rmsnorm");
  c10::TypedOperatorHandle<PairOp> residual_add = handle<PairOp>("sglang_rvv_native::residual_add");
  c10::TypedOperatorHandle<PairOp> silu_mul = handle<PairOp>("sglang_rvv_native::silu_mul");
  c10::TypedOperatorHandle<StepOp> attention_step = handle<StepOp>("sglang_rvv_native::attention_step");
};

const Ops& ops() {
  static const Ops found;  // the kernel library registers them before this entry is loaded
  return found;
}

// A Python exception is already set: unwind to the function's end.
struct PythonError {};

// An owned reference, released on every path.
struct Ref {
  PyObject* obj;
  explicit Ref(PyObject* o) : obj(o) {
    if (obj == nullptr) throw PythonError{};
  }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(obj); }
};

Ref wrap(const at::Tensor& t) { return Ref(THPVariable_Wrap(at::TensorBase(t))); }

// A projection module called on one tensor, its output kept as a tensor.
at::Tensor project(PyObject* module, const Ref& input) {
  PyObject* args[1] = {input.obj};
  Ref out(PyObject_Vectorcall(module, args, 1, nullptr));
  if (!is_tensor(out.obj)) {
    PyErr_Format(PyExc_TypeError, "decode_layer: %s returned %s, not a tensor", Py_TYPE(module)->tp_name,
                 Py_TYPE(out.obj)->tp_name);
    throw PythonError{};
  }
  return unpack(out.obj);
}

const at::Tensor& tensor_arg(PyObject* obj, const char* name) {
  if (!is_tensor(obj)) {
    PyErr_Format(PyExc_TypeError, "decode_layer: %s must be a tensor, got %s", name, Py_TYPE(obj)->tp_name);
    throw PythonError{};
  }
  return unpack(obj);
}

std::optional<at::Tensor> optional_arg(PyObject* obj, const char* name) {
  if (obj == Py_None) return std::nullopt;
  return tensor_arg(obj, name);
}

double float_arg(PyObject* obj) {
  const double value = PyFloat_AsDouble(obj);
  if (value == -1.0 && PyErr_Occurred()) throw PythonError{};
  return value;
}

bool norm_weight_ok(const at::Tensor& weight, int64_t size) {
  return weight.scalar_type() == at::kBFloat16 && weight.dim() == 1 && weight.size(0) == size && weight.is_contiguous();
}

// hf_step.operands_covered's questions: whether the modules called one by one would each take
// their kernel here (fused.servable, rotary_servable), so the step gives their bits.
bool covered(const at::Tensor& x, const at::Tensor& in_weight, const at::Tensor& post_weight,
             const std::optional<at::Tensor>& q_weight, const std::optional<at::Tensor>& k_weight,
             const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& key_buffer) {
  if (at::GradMode::is_enabled() || x.scalar_type() != at::kBFloat16 || x.dim() != 3 || x.size(1) != 1 ||
      !x.is_cpu() || !x.is_contiguous() || key_buffer.dim() != 4) {
    return false;
  }
  const int64_t hidden = x.size(2), d = key_buffer.size(3);
  if (!norm_weight_ok(in_weight, hidden) || !norm_weight_ok(post_weight, hidden) ||
      q_weight.has_value() != k_weight.has_value() ||
      (q_weight.has_value() && !(norm_weight_ok(*q_weight, d) && norm_weight_ok(*k_weight, d)))) {
    return false;
  }
  return cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 && cos.dim() == 3 &&
         cos.size(1) == 1 && cos.size(2) == d && (cos.size(0) == 1 || cos.size(0) == x.size(0)) &&
         sin.sizes() == cos.sizes() && sin.strides() == cos.strides() && cos.stride(2) == 1;
}

template <class Sig, class... Args>
auto call(const c10::TypedOperatorHandle<Sig>& op, bool direct, Args&&... args) {
  return direct ? op.redispatch(kCpuKeys, std::forward<Args>(args)...) : op.call(std::forward<Args>(args)...);
}

PyObject* step(PyObject* const* a) {
  const at::Tensor& x = tensor_arg(a[0], "x");
  const at::Tensor& in_weight = tensor_arg(a[1], "in_weight");
  const double in_eps = float_arg(a[2]);
  PyObject *q_proj = a[3], *k_proj = a[4], *v_proj = a[5], *o_proj = a[6], *gate_proj = a[7], *up_proj = a[8],
           *down_proj = a[9];
  const std::optional<at::Tensor> q_weight = optional_arg(a[10], "q_weight"), k_weight = optional_arg(a[11], "k_weight");
  const double q_eps = float_arg(a[12]), k_eps = float_arg(a[13]);
  const at::Tensor& cos = tensor_arg(a[14], "cos");
  const at::Tensor& sin = tensor_arg(a[15], "sin");
  at::Tensor key_buffer = tensor_arg(a[16], "key_buffer"), value_buffer = tensor_arg(a[17], "value_buffer");
  const int64_t length = PyLong_AsLongLong(a[18]);
  if (length == -1 && PyErr_Occurred()) throw PythonError{};
  const double scale = float_arg(a[19]);
  const at::Tensor& post_weight = tensor_arg(a[20], "post_weight");
  const double post_eps = float_arg(a[21]);

  if (!covered(x, in_weight, post_weight, q_weight, k_weight, cos, sin, key_buffer)) Py_RETURN_NONE;
  const Ops& op = ops();
  // The projections' outputs join the operands the dispatcher would look at: a subclass or a
  // device elsewhere takes the full call.
  const bool operands_direct = lands_on_cpu({&x, &in_weight, &cos, &sin, &key_buffer, &value_buffer, &post_weight});
  const at::Tensor h = call(op.rmsnorm, operands_direct, x, in_weight, in_eps);
  const Ref h_obj = wrap(h);
  const at::Tensor q = project(q_proj, h_obj), k = project(k_proj, h_obj), v = project(v_proj, h_obj);
  auto [attended, keys, values] =
      call(op.attention_step, operands_direct && lands_on_cpu({&q, &k, &v}), q, k, v, q_weight, k_weight, q_eps, k_eps,
           cos, sin, key_buffer, value_buffer, length, scale);
  const at::Tensor o = project(o_proj, wrap(attended));
  const at::Tensor hidden = call(op.residual_add, operands_direct && lands_on_cpu({&o}), x, o);
  const Ref h2_obj = wrap(call(op.rmsnorm, operands_direct, hidden, post_weight, post_eps));
  const at::Tensor gate = project(gate_proj, h2_obj), up = project(up_proj, h2_obj);
  const at::Tensor down = project(down_proj, wrap(call(op.silu_mul, lands_on_cpu({&gate, &up}), gate, up)));
  const at::Tensor out = call(op.residual_add, operands_direct && lands_on_cpu({&down}), hidden, down);
  Ref out_obj = wrap(out), keys_obj = wrap(keys), values_obj = wrap(values);
  PyObject* result = PyTuple_Pack(3, out_obj.obj, keys_obj.obj, values_obj.obj);
  if (result == nullptr) throw PythonError{};
  return result;
}

}  // namespace

PyObject* decode_layer(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 22) {
    PyErr_SetString(PyExc_TypeError, "decode_layer(x, in_weight, in_eps, q_proj, k_proj, v_proj, o_proj, gate_proj, "
                    "up_proj, down_proj, q_weight, k_weight, q_eps, k_eps, cos, sin, key_buffer, value_buffer, length, "
                    "scale, post_weight, post_eps)");
    return nullptr;
  }
  try {
    return step(args);
  } catch (const PythonError&) {
    return nullptr;
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, message(error).c_str());
    return nullptr;
  }
}

}  // namespace sglang_rvv_entry
