// What the entry's two files share: torch's Python tensor object, and the packed call of a plan.
#pragma once

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>

#include <exception>
#include <initializer_list>
#include <string>

// The two pieces of torch/csrc/autograd/python_variable.h used here. That header needs
// pybind11's, which the riscv64 sysroot (Debian's libtorch-dev) does not ship. A torch Tensor's
// Python object holds its at::Tensor right after the object header, in torch 2.13 and 2.14 alike;
// entry.py checks the round trip on load before any route uses this module.
struct THPVariable {
  PyObject_HEAD
  at::Tensor cdata;
};
extern PyObject* THPVariableClass;                  // torch.Tensor, set by libtorch_python
PyObject* THPVariable_Wrap(at::TensorBase&& var);  // a new reference to the tensor's Python object

namespace sglang_rvv_entry {

inline bool is_tensor(PyObject* obj) {
  return PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(THPVariableClass));
}

inline const at::Tensor& unpack(PyObject* obj) { return reinterpret_cast<THPVariable*>(obj)->cdata; }

// Whether the weak reference `ref` points at `obj`: compared by identity, no reference kept (a plan
// or a memo must not keep a replaced weight alive).
inline bool same_referent(PyObject* ref, PyObject* obj) {
  if (ref == nullptr || !PyWeakref_CheckRef(ref)) return false;
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* referent = nullptr;
  if (PyWeakref_GetRef(ref, &referent) < 0) {
    PyErr_Clear();
    return false;
  }
  const bool same = referent == obj;
  Py_XDECREF(referent);
  return same;
#else
  return PyWeakref_GetObject(ref) == obj;
#endif
}

inline const c10::DispatchKeySet kCpuKeys{c10::DispatchKey::CPU};

// A C++ exception's message as torch.ops gives it (without the C++ backtrace).
std::string message(const std::exception& error);

// Whether a call of the kernel library's ops on these operands (undefined ones aside) would land
// on the op's CPU kernel: then `redispatch(kCpuKeys, ...)` sends it there without the
// dispatcher's key computation, autograd's boxed fallback and the profiler's check (python_entry.cpp).
bool lands_on_cpu(std::initializer_list<const at::Tensor*> operands);

// The packed output of the plan held by `capsule` (python_entry.cpp's linear): a new reference,
// Py_None (new reference) when the plan no longer holds the weight or its buffers, or nullptr with
// an exception set. `capsule` that is not a plan is a TypeError.
PyObject* plan_linear(PyObject* capsule, PyObject* input, PyObject* weight, PyObject* buffers, PyObject* bias);

// route_call.cpp: the routes' __call__ methods (see there).
PyObject* route_method(PyObject*, PyObject* const* args, Py_ssize_t nargs);
PyObject* module_method(PyObject*, PyObject* const* args, Py_ssize_t nargs);

// layer_step.cpp: a transformers decoder layer's decode step (see there).
PyObject* decode_layer(PyObject*, PyObject* const* args, Py_ssize_t nargs);

}  // namespace sglang_rvv_entry
