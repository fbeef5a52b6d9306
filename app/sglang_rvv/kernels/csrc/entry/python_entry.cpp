// The eager route's projection call in one CPython function: the source check and the packed
// op, without torch.ops' argument parsing or a Python frame between them.
//
// Under emulation a memoised packed projection call cost ~51 k instructions, ~29 k of them
// the op's Python binding (schema parsing into IValues, boxing) and the source check's dozen
// tensor attribute reads. Here `linear(plan, input, weight, buffers, bias)` compares the
// weight with the plan's stamp of it (identity, version counter, data pointer, sizes,
// strides, dtype, CPU) as packed_state.PackedWeightSource.matches does, looks the packed
// buffers up by name in the module's own buffer dict (so a released or replaced buffer is
// never used), and calls the op: straight to its CPU kernel where the dispatcher would land there
// (run), else through the dispatcher. It returns None when anything
// differs: the Python route then takes its full path, which re-plans.
//
// route_call.cpp puts the routes' __call__ in front of this call, in C as well.
//
// A CPython extension module of its own (libsglang_rvv_entry.so, loaded by
// sglang_rvv.kernels.entry), not part of the kernel library: that one links with -z defs and
// must load without an interpreter's symbols. This one leaves the interpreter's symbols to the
// process that loads it, as every extension module does.

#include "entry.h"

#include <array>
#include <cstdint>
#include <exception>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

namespace sglang_rvv_entry {
namespace {

constexpr const char* kPlanCapsule = "sglang_rvv.entry.plan";
constexpr int kMaxBuffers = 2;
constexpr int kMaxDims = 4;
// A call of fewer multiply-adds keeps the GIL: every decode projection of the supported models
// but lm_head and the 1.5B model's MLP. At 2^23 that is 16 MB of BF16 weights (about 4 ms at the
// board model's 4.5 GB/s, int4 about 1 ms), within the interpreter's 5 ms switch interval, which a
// thread running Python holds it for too; releasing and retaking it, with the owned tensor
// handles that needs, costs about 1 k instructions a call. Longer calls release it, as torch's
// ops do.
constexpr int64_t kHoldGilWork = int64_t{1} << 23;
const at::Tensor kUndefined;

enum Kind : int { kBf16 = 0, kInt8 = 1, kInt4 = 2, kInt4A8 = 3 };  // entry.KINDS

using Bf16Op = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t);
using QuantOp = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t);

// What a plan knows: its weight's stamp, its buffers' names and the op's trailing arguments.
struct Plan {
  PyObject* weight_ref = nullptr;  // a weak reference: a plan must not keep a replaced weight alive
  PyObject* buffers[kMaxBuffers] = {nullptr, nullptr};
  int nbuffers = 0;
  Kind kind = kBf16;
  int64_t out_features = 0, in_features = 0, layout_version = 0;
  const void* data = nullptr;
  int64_t dims = 0;
  std::array<int64_t, kMaxDims> sizes{}, strides{};
  at::ScalarType dtype = at::kBFloat16;
  bool cpu = true;
  bool versioned = true;  // inference tensors have no version counter
  uint32_t version = 0;
};

const c10::TypedOperatorHandle<Bf16Op>& bf16_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("sglang_rvv_native::packed_bf16_linear", "")
                             .typed<Bf16Op>();
  return op;
}

const c10::TypedOperatorHandle<QuantOp>& quant_op(Kind kind) {
  static const auto int8 = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("sglang_rvv_native::packed_int8_linear", "")
                               .typed<QuantOp>();
  static const auto int4 = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("sglang_rvv_native::packed_int4_linear", "")
                               .typed<QuantOp>();
  static const auto int4_a8 = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("sglang_rvv_native::packed_int4_a8_linear", "")
                                  .typed<QuantOp>();
  return kind == kInt8 ? int8 : kind == kInt4 ? int4 : int4_a8;
}

void destroy(Plan* plan) {
  Py_XDECREF(plan->weight_ref);
  for (PyObject* name : plan->buffers) Py_XDECREF(name);
  delete plan;
}

void free_plan(PyObject* capsule) {
  if (auto* plan = static_cast<Plan*>(PyCapsule_GetPointer(capsule, kPlanCapsule))) destroy(plan);
}

// The plan a capsule holds, or nullptr. A plan's capsule is named by kPlanCapsule's very address
// and holds the plan as its context too: PyCapsule_GetPointer would compare the names with
// strcmp, about 200 instructions a call under emulation.
const Plan* plan_of(PyObject* capsule) {
  if (!PyCapsule_CheckExact(capsule) || PyCapsule_GetName(capsule) != kPlanCapsule) return nullptr;
  return static_cast<const Plan*>(PyCapsule_GetContext(capsule));
}

// packed_state.PackedWeightSource.matches, field for field.
bool matches(const Plan& plan, PyObject* weight_obj) {
  if (!same_referent(plan.weight_ref, weight_obj)) return false;
  const at::Tensor& w = unpack(weight_obj);
  if (plan.versioned && (w.is_inference() || w._version() != plan.version)) return false;
  if (w.const_data_ptr() != plan.data || w.dim() != plan.dims || w.scalar_type() != plan.dtype ||
      w.is_cpu() != plan.cpu) {
    return false;
  }
  for (int64_t d = 0; d < plan.dims; ++d) {
    if (w.size(d) != plan.sizes[d] || w.stride(d) != plan.strides[d]) return false;
  }
  return true;
}

// plan(kind, weight, buffer_names, out_features, in_features, layout_version) -> capsule
PyObject* make_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "plan(kind, weight, buffer_names, out_features, in_features, layout_version)");
    return nullptr;
  }
  const long kind = PyLong_AsLong(args[0]);
  if (PyErr_Occurred()) return nullptr;
  const int wanted = kind == kBf16 ? 1 : 2;
  if (kind < kBf16 || kind > kInt4A8 || !is_tensor(args[1]) || !PyTuple_Check(args[2]) ||
      PyTuple_GET_SIZE(args[2]) != wanted) {
    PyErr_Format(PyExc_ValueError, "plan: kind %ld (0 bf16, 1 int8, 2 int4, 3 int4_a8) takes a weight tensor and %d buffer "
                 "names", kind, wanted);
    return nullptr;
  }
  const at::Tensor& w = unpack(args[1]);
  if (w.dim() > kMaxDims) {
    PyErr_Format(PyExc_ValueError, "plan: a weight of %lld dimensions (at most %d)",
                 static_cast<long long>(w.dim()), kMaxDims);
    return nullptr;
  }
  try {  // the op must be registered (the kernel library loaded) before any call needs it
    if (kind == kBf16) {
      bf16_op();
    } else {
      quant_op(static_cast<Kind>(kind));
    }
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, message(error).c_str());
    return nullptr;
  }
  auto* plan = new Plan();
  plan->kind = static_cast<Kind>(kind);
  plan->out_features = PyLong_AsLongLong(args[3]);
  plan->in_features = PyLong_AsLongLong(args[4]);
  plan->layout_version = PyLong_AsLongLong(args[5]);
  plan->weight_ref = PyWeakref_NewRef(args[1], nullptr);
  if (PyErr_Occurred() || plan->weight_ref == nullptr) {
    destroy(plan);
    return nullptr;
  }
  plan->nbuffers = wanted;
  for (int i = 0; i < wanted; ++i) {
    plan->buffers[i] = PyTuple_GET_ITEM(args[2], i);
    Py_INCREF(plan->buffers[i]);
  }
  plan->data = w.const_data_ptr();
  plan->dims = w.dim();
  for (int64_t d = 0; d < plan->dims; ++d) {
    plan->sizes[d] = w.size(d);
    plan->strides[d] = w.stride(d);
  }
  plan->dtype = w.scalar_type();
  plan->cpu = w.is_cpu();
  plan->versioned = !w.is_inference();
  plan->version = plan->versioned ? w._version() : 0;
  PyObject* capsule = PyCapsule_New(plan, kPlanCapsule, free_plan);
  if (capsule == nullptr) {
    destroy(plan);
  } else if (PyCapsule_SetContext(capsule, plan) < 0) {
    Py_CLEAR(capsule);  // its destructor frees the plan
  }
  return capsule;
}

// The plan's op on these operands, with the bias added; on failure an undefined tensor and the
// error's message in `failure`. Where the call would land on the CPU kernel, it is sent there
// (redispatch) without the dispatcher's key computation, autograd's boxed fallback and the
// profiler's check (with the memo's last hit and the capsule read without strcmp, 2.5 k
// instructions a call under emulation). Anything else, a profiler included, takes the
// dispatcher's full call.
at::Tensor run(const Plan& plan, const at::Tensor& x, const at::Tensor& first, const at::Tensor& second,
               const at::Tensor& b, std::string& failure) {
  try {
    const bool direct = lands_on_cpu({&x, &first, &second, &b});
    at::Tensor out;
    if (plan.kind == kBf16) {
      out = direct ? bf16_op().redispatch(kCpuKeys, x, first, plan.out_features, plan.layout_version)
                   : bf16_op().call(x, first, plan.out_features, plan.layout_version);
    } else {
      const auto& op = quant_op(plan.kind);
      out = direct ? op.redispatch(kCpuKeys, x, first, second, plan.out_features, plan.in_features,
                                   plan.layout_version)
                   : op.call(x, first, second, plan.out_features, plan.in_features, plan.layout_version);
    }
    if (b.defined()) out.add_(b);
    return out;
  } catch (const std::exception& error) {
    failure = message(error);
    if (failure.empty()) failure = "the packed op failed";
    return {};
  }
}

}  // namespace

std::string message(const std::exception& error) {
  const auto* torch_error = dynamic_cast<const c10::Error*>(&error);
  return torch_error ? torch_error->what_without_backtrace() : error.what();
}

// Outside grad mode, autograd's fallback for an op without a formula only passes the call on
// below it, and ADInplaceOrView and BackendSelect pass these ops through: when nothing else is
// left but CPU (no mode or Python key in this thread, no autocast, no tensor subclass's key, no
// profiler), the call would land on the CPU kernel.
bool lands_on_cpu(std::initializer_list<const at::Tensor*> operands) {
  if (at::GradMode::is_enabled() || at::hasCallbacks()) return false;
  c10::DispatchKeySet keys;
  for (const at::Tensor* t : operands) {
    if (t->defined()) keys = keys | t->key_set();
  }
  const c10::impl::LocalDispatchKeySet local = c10::impl::tls_local_dispatch_key_set();
  return (((keys | local.included_) - local.excluded_) - c10::autograd_dispatch_keyset_with_ADInplaceOrView -
          c10::DispatchKeySet(c10::DispatchKey::BackendSelect)) == kCpuKeys;
}

PyObject* plan_linear(PyObject* capsule, PyObject* input, PyObject* weight, PyObject* buffers, PyObject* bias) {
  const Plan* plan = plan_of(capsule);
  if (plan == nullptr) {
    PyErr_SetString(PyExc_TypeError, "linear: the plan must be one that plan() made");
    return nullptr;
  }
  if (!is_tensor(input) || !is_tensor(weight) || !PyDict_Check(buffers) || (bias != Py_None && !is_tensor(bias))) {
    PyErr_SetString(PyExc_TypeError, "linear: input and weight must be tensors, buffers a dict, bias a tensor or None");
    return nullptr;
  }
  if (!matches(*plan, weight)) Py_RETURN_NONE;
  PyObject* packed[kMaxBuffers] = {nullptr, nullptr};
  for (int i = 0; i < plan->nbuffers; ++i) {
    packed[i] = PyDict_GetItemWithError(buffers, plan->buffers[i]);  // borrowed
    if (packed[i] == nullptr) {
      if (PyErr_Occurred()) return nullptr;
      Py_RETURN_NONE;  // released: the route re-plans
    }
    if (!is_tensor(packed[i])) Py_RETURN_NONE;
  }
  const at::Tensor& x = unpack(input);
  const at::Tensor& first = unpack(packed[0]);
  const at::Tensor& second = plan->nbuffers > 1 ? unpack(packed[1]) : kUndefined;
  const at::Tensor& b = bias != Py_None ? unpack(bias) : kUndefined;
  std::string failure;
  at::Tensor out;
  if (x.numel() * plan->out_features < kHoldGilWork) {  // rows x K x N multiply-adds
    out = run(*plan, x, first, second, b, failure);
  } else {
    // Owned handles, taken while the GIL is held: below it is released, and another thread may
    // then drop the Python objects (a buffer released, the bias replaced).
    const at::Tensor owned_x = x, owned_first = first, owned_second = second, owned_b = b;
    Py_BEGIN_ALLOW_THREADS
    out = run(*plan, owned_x, owned_first, owned_second, owned_b, failure);
    Py_END_ALLOW_THREADS
  }
  if (!failure.empty()) {
    PyErr_SetString(PyExc_RuntimeError, failure.c_str());
    return nullptr;
  }
  return THPVariable_Wrap(std::move(out));
}

namespace {

// linear(plan, input, weight, buffers, bias) -> Tensor, or None when the plan no longer holds
PyObject* linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "linear(plan, input, weight, buffers, bias)");
    return nullptr;
  }
  return plan_linear(args[0], args[1], args[2], args[3], args[4]);
}

PyMethodDef kMethods[] = {
    {"plan", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(make_plan)), METH_FASTCALL,
     "plan(kind, weight, buffer_names, out_features, in_features, layout_version): a weight's stamp for linear"},
    {"linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(linear)), METH_FASTCALL,
     "linear(plan, input, weight, buffers, bias): the packed op's output, or None if the plan no longer holds"},
    {"route_method", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(route_method)), METH_FASTCALL,
     "route_method(route_type, python_call, record_type, context_type, memo_type, bfloat16, counter_index, "
     "plan_index): ModuleRoute's __call__, its memoised packed calls native (route_call.cpp)"},
    {"module_method", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(module_method)), METH_FASTCALL,
     "module_method(module_type, python_call, forward, route_attr, hook_globals): a routed Linear's __call__ "
     "straight to its route (route_call.cpp)"},
    {"decode_layer", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(decode_layer)), METH_FASTCALL,
     "decode_layer(x, in_weight, in_eps, q_proj, ..., post_weight, post_eps) -> (hidden, keys, values): a "
     "transformers decoder layer's decode step (layer_step.cpp)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_sglang_rvv_entry", nullptr, -1, kMethods,
                       nullptr, nullptr, nullptr, nullptr};

}  // namespace
}  // namespace sglang_rvv_entry

extern "C" __attribute__((visibility("default"))) PyObject* PyInit__sglang_rvv_entry() {
  return PyModule_Create(&sglang_rvv_entry::kModule);
}
