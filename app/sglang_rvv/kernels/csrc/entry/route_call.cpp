// A routed projection's call without a Python frame: the `__call__` of routing.ModuleRoute, and
// of transformers' routed Linear classes (adapters.RoutedLinear), as C methods.
//
// Under emulation a memoised packed call through the native entry cost ~30.6 k instructions,
// 21 k of them the interpreter's: DirectCall.__call__, RoutedLinear.forward and ModuleRoute.call,
// three frames of attribute reads, the memo's key and guards, and the counter (12.9 k in all
// with these in C, 9.1 k with the memo's last hit and outputs.cpp's kept blocks). Here the same
// steps run in C, in the same order and with the same guards:
// - route_method's `__call__(route, module, input, weight, bias)`: the memo (CallMemo) is used only
//   while its weight object, source record, status, packed layout, config and route table are
//   the very ones the route holds now, without grad, and only for a bfloat16 CPU input whose
//   (shape, dtype, CPU-ness) key holds a planned call (MemoCall.plan; the memo's last hit is
//   compared first, memo_call); then the plan's packed call
//   (python_entry.cpp's plan_linear: the source check, the buffers by name, the op, the bias)
//   and the call's counter. The slots are read at the offsets their classes declare, checked
//   once when the method is made; each object's exact class is checked on every call.
// - module_method's `__call__(module, input)`: where DirectCall.__call__ would only call
//   forward (no hook of the module's or a global one, no module.compile(), one positional
//   argument, the class's forward, none set on the instance), it reads the weight and bias
//   from `_parameters` and the route from the module's dict, as RoutedLinear.forward does.
// Anything else, and a plan that no longer holds, goes to the Python code these stand for
// (ModuleRoute.call, ModuleRoute._route, DirectCall.__call__), which decides as before.

#include "entry.h"

#include <ATen/core/grad_mode.h>

#include <array>
#include <vector>

#ifndef Py_T_OBJECT_EX  // Python before 3.12
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

namespace sglang_rvv_entry {
namespace {

// Where one __slots__ member lives in its object.
using Offset = Py_ssize_t;

struct RouteSpec {
  PyTypeObject *route_type = nullptr, *record_type = nullptr, *context_type = nullptr, *memo_type = nullptr;
  Offset route_context = 0, route_record = 0, route_memo = 0, route_status = 0;
  Offset record_source = 0, record_layout = 0;
  Offset context_config = 0, context_counters = 0, context_table = 0;
  Offset memo_weight_ref = 0, memo_source = 0, memo_status = 0, memo_layout = 0, memo_config = 0, memo_table = 0,
         memo_calls = 0, memo_last = 0;
  PyObject* python_call = nullptr;  // ModuleRoute.call
  PyObject* bfloat16 = nullptr;     // torch.bfloat16: the dtype in a memo key
  Py_ssize_t counter_index = 0, plan_index = 0;  // MemoCall's fields
};

struct ModuleSpec {
  PyTypeObject* module_type = nullptr;
  PyObject* python_call = nullptr;  // DirectCall.__call__
  PyObject* forward = nullptr;      // RoutedLinear.forward: what this call stands for
  PyObject* route_attr = nullptr;
  // torch.nn.modules.module's four global hook dicts, which torch fills in place and never rebinds.
  std::array<PyObject*, 4> global_hooks{};
  std::array<PyTypeObject*, 8> checked{};  // classes seen whose forward is `forward` (kept alive)
};

RouteSpec* g_route = nullptr;
ModuleSpec* g_module = nullptr;

PyObject* interned(const char* text) {
  PyObject* name = PyUnicode_InternFromString(text);
  if (name == nullptr) std::abort();  // only at load, out of memory
  return name;
}

struct Names {
  PyObject *buffers, *parameters, *weight, *bias, *route, *forward, *compiled;
  std::array<PyObject*, 4> hooks, global_hooks;
};

const Names& names() {
  static const Names n = {
      interned("_buffers"), interned("_parameters"), interned("weight"), interned("bias"), interned("_route"),
      interned("forward"), interned("_compiled_call_impl"),
      {interned("_forward_hooks"), interned("_forward_pre_hooks"), interned("_backward_hooks"),
       interned("_backward_pre_hooks")},
      {interned("_global_forward_hooks"), interned("_global_forward_pre_hooks"), interned("_global_backward_hooks"),
       interned("_global_backward_pre_hooks")}};
  return n;
}

inline PyObject** slot_address(PyObject* obj, Offset offset) {
  return reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
}

inline PyObject* slot(PyObject* obj, Offset offset) { return *slot_address(obj, offset); }

// The offset of `type`'s own __slots__ member `name`, or -1 with a ValueError.
Offset slot_offset(PyTypeObject* type, const char* name) {
  PyObject* descr = PyDict_GetItemString(type->tp_dict, name);  // borrowed; the class's own slots only
  if (descr == nullptr || !Py_IS_TYPE(descr, &PyMemberDescr_Type) ||
      reinterpret_cast<PyMemberDescrObject*>(descr)->d_member->type != Py_T_OBJECT_EX) {
    PyErr_Format(PyExc_ValueError, "route_method: %s has no __slots__ member %s", type->tp_name, name);
    return -1;
  }
  return reinterpret_cast<PyMemberDescrObject*>(descr)->d_member->offset;
}

// Both slots set and the same object (CallMemo.holds compares them by identity, the status by
// equality: its members are singletons, so a status that differs never passes here either).
inline bool same(PyObject* a, PyObject* b) { return a != nullptr && a == b; }

// `sizes` as a tuple: the shape in the memo's key (a plain tuple hashes and compares as the
// torch.Size does).
PyObject* shape_tuple(c10::IntArrayRef sizes) {
  PyObject* shape = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
  if (shape == nullptr) return nullptr;
  for (size_t d = 0; d < sizes.size(); ++d) {
    PyObject* size = PyLong_FromLongLong(sizes[d]);
    if (size == nullptr) {
      Py_DECREF(shape);
      return nullptr;
    }
    PyTuple_SET_ITEM(shape, static_cast<Py_ssize_t>(d), size);
  }
  return shape;
}

// Whether `shape` is a tuple that shape_tuple made of these `sizes`.
bool same_shape(PyObject* shape, c10::IntArrayRef sizes) {
  if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) != static_cast<Py_ssize_t>(sizes.size())) return false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    PyObject* size = PyTuple_GET_ITEM(shape, static_cast<Py_ssize_t>(d));
    int overflow = 0;
    if (!PyLong_CheckExact(size) || PyLong_AsLongLongAndOverflow(size, &overflow) != sizes[d] || overflow) return false;
  }
  return true;
}

// The memo's call for `x` (borrowed), or nullptr (with an exception if one occurred). It is
// calls[(x.shape, bfloat16, True)], the key ModuleRoute.call builds from (input.shape,
// input.dtype, input.is_cpu). A hit is kept in the memo's `last` with its shape, so that the
// next call of the same shape (a decoding module's every call) compares sizes instead of
// building, hashing and freeing a key: about 900 instructions under emulation. CallMemo.remember
// clears `last` on every write to calls.
PyObject* memo_call(const RouteSpec& spec, PyObject* memo, PyObject* calls, const at::Tensor& x) {
  PyObject** last = slot_address(memo, spec.memo_last);
  if (*last != nullptr && PyTuple_CheckExact(*last) && PyTuple_GET_SIZE(*last) == 2 &&
      same_shape(PyTuple_GET_ITEM(*last, 0), x.sizes())) {
    return PyTuple_GET_ITEM(*last, 1);
  }
  PyObject* shape = shape_tuple(x.sizes());
  if (shape == nullptr) return nullptr;
  PyObject* key = PyTuple_Pack(3, shape, spec.bfloat16, Py_True);
  PyObject* call = key == nullptr ? nullptr : PyDict_GetItemWithError(calls, key);  // borrowed
  Py_XDECREF(key);
  PyObject* hit = call == nullptr ? nullptr : PyTuple_Pack(2, shape, call);
  Py_DECREF(shape);
  if (hit == nullptr) return nullptr;
  Py_XSETREF(*last, hit);  // the old pair's call, if it is this one, is still the dict's
  return call;
}

int count(PyObject* counters, PyObject* key) {
  if (counters == nullptr || !PyDict_Check(counters)) {
    PyErr_SetString(PyExc_TypeError, "the route context's counters are not a dict");
    return -1;
  }
  PyObject* old = PyDict_GetItemWithError(counters, key);  // borrowed
  if (old == nullptr && PyErr_Occurred()) return -1;
  const long long n = old == nullptr ? 0 : PyLong_AsLongLong(old);
  if (n == -1 && PyErr_Occurred()) return -1;
  PyObject* next = PyLong_FromLongLong(n + 1);
  if (next == nullptr) return -1;
  const int status = PyDict_SetItem(counters, key, next);
  Py_DECREF(next);
  return status;
}

// The memoised packed call of `route`: a new reference; nullptr with an exception; or nullptr
// without one when the Python route must take the call (ModuleRoute.call's memo check fails,
// or the memoised decision is not a planned packed call).
PyObject* memoised(const RouteSpec& spec, PyObject* route, PyObject* module, PyObject* buffers, PyObject* input,
                   PyObject* weight, PyObject* bias) {
  if (Py_TYPE(route) != spec.route_type) return nullptr;
  PyObject *memo = slot(route, spec.route_memo), *record = slot(route, spec.route_record),
           *context = slot(route, spec.route_context);
  if (memo == nullptr || record == nullptr || context == nullptr || Py_TYPE(memo) != spec.memo_type ||
      Py_TYPE(record) != spec.record_type || Py_TYPE(context) != spec.context_type) {
    return nullptr;
  }
  if (!same_referent(slot(memo, spec.memo_weight_ref), weight) ||
      !same(slot(memo, spec.memo_source), slot(record, spec.record_source)) ||
      !same(slot(memo, spec.memo_status), slot(route, spec.route_status)) ||
      !same(slot(memo, spec.memo_layout), slot(record, spec.record_layout)) ||
      !same(slot(memo, spec.memo_config), slot(context, spec.context_config)) ||
      !same(slot(memo, spec.memo_table), slot(context, spec.context_table)) || at::GradMode::is_enabled()) {
    return nullptr;
  }
  if (!is_tensor(input)) return nullptr;
  const at::Tensor& x = unpack(input);
  if (x.scalar_type() != at::kBFloat16 || !x.is_cpu()) return nullptr;
  PyObject* calls = slot(memo, spec.memo_calls);
  if (calls == nullptr || !PyDict_Check(calls)) return nullptr;
  PyObject* call = memo_call(spec, memo, calls, x);
  if (call == nullptr || !PyTuple_Check(call) || PyTuple_GET_SIZE(call) <= spec.plan_index ||
      PyTuple_GET_SIZE(call) <= spec.counter_index || PyTuple_GET_ITEM(call, spec.plan_index) == Py_None) {
    return nullptr;
  }
  if (buffers == nullptr || !PyDict_Check(buffers)) return nullptr;
  // Kept while the op runs without the GIL: another thread may replace the memo meanwhile.
  Py_INCREF(call);
  Py_INCREF(context);
  PyObject* out = plan_linear(PyTuple_GET_ITEM(call, spec.plan_index), input, weight, buffers, bias);
  if (out == Py_None) {  // the plan no longer holds: the full path re-plans
    Py_CLEAR(out);
    PyObject* args[] = {route, module, input, weight, bias};
    out = PyObject_VectorcallMethod(names().route, args, 5, nullptr);
  } else if (out != nullptr &&
             count(slot(context, spec.context_counters), PyTuple_GET_ITEM(call, spec.counter_index)) < 0) {
    Py_CLEAR(out);
  }
  Py_DECREF(context);
  Py_DECREF(call);
  return out;
}

// `fallback(self, *args, **kwnames)`.
PyObject* call_python(PyObject* fallback, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                      PyObject* kwnames) {
  const auto total = static_cast<size_t>(nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0)) + 1;
  std::array<PyObject*, 8> small;  // a projection's call: no allocation
  std::vector<PyObject*> large(total > small.size() ? total : 0);
  PyObject** all = total > small.size() ? large.data() : small.data();
  all[0] = self;
  for (size_t i = 1; i < total; ++i) all[i] = args[i - 1];
  return PyObject_Vectorcall(fallback, all, static_cast<size_t>(nargs) + 1, kwnames);
}

// ModuleRoute.__call__(self, module, input, weight, bias=None)
PyObject* route_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const RouteSpec& spec = *g_route;
  if (kwnames == nullptr && (nargs == 3 || nargs == 4)) {
    PyObject* bias = nargs == 4 ? args[3] : Py_None;
    PyObject* dict = PyObject_GenericGetDict(args[0], nullptr);
    if (dict == nullptr) {
      PyErr_Clear();
    } else {
      PyObject* buffers = PyDict_GetItemWithError(dict, names().buffers);  // borrowed, kept by the module
      PyObject* out = buffers == nullptr ? nullptr : memoised(spec, self, args[0], buffers, args[1], args[2], bias);
      Py_DECREF(dict);
      if (out != nullptr || PyErr_Occurred()) return out;
    }
  }
  return call_python(spec.python_call, self, args, nargs, kwnames);
}

bool empty_hooks(PyObject* hooks) { return hooks != nullptr && PyDict_Check(hooks) && PyDict_GET_SIZE(hooks) == 0; }

// Whether `type`'s forward is the routed Linear's (a subclass may have its own) and its
// _compiled_call_impl is None.
bool routed_forward(ModuleSpec& spec, PyTypeObject* type) {
  for (PyTypeObject* seen : spec.checked) {
    if (seen == type) return true;
  }
  PyObject* forward = PyObject_GetAttr(reinterpret_cast<PyObject*>(type), names().forward);
  PyObject* compiled = PyObject_GetAttr(reinterpret_cast<PyObject*>(type), names().compiled);
  if (forward == nullptr || compiled == nullptr) PyErr_Clear();
  const bool same_forward = forward != nullptr && forward == spec.forward && compiled == Py_None;
  Py_XDECREF(forward);
  Py_XDECREF(compiled);
  if (same_forward) {
    for (PyTypeObject*& seen : spec.checked) {
      if (seen == nullptr) {
        Py_INCREF(type);
        seen = type;
        break;
      }
    }
  }
  return same_forward;
}

// What DirectCall.__call__ and RoutedLinear.forward would do, when it comes to calling the route.
PyObject* module_direct(ModuleSpec& spec, PyObject* self, PyObject* dict, PyObject* input) {
  const Names& n = names();
  for (PyObject* name : n.hooks) {
    if (!empty_hooks(PyDict_GetItemWithError(dict, name))) return nullptr;
  }
  // module.compile() sets its own; the class's default (checked once per class) is None.
  PyObject* compiled = PyDict_GetItemWithError(dict, n.compiled);
  if ((compiled != nullptr && compiled != Py_None) || PyDict_GetItemWithError(dict, n.forward) != nullptr) {
    return nullptr;
  }
  for (PyObject* hooks : spec.global_hooks) {
    if (!empty_hooks(hooks)) return nullptr;
  }
  if (PyErr_Occurred() || !routed_forward(spec, Py_TYPE(self))) return nullptr;
  PyObject* params = PyDict_GetItemWithError(dict, n.parameters);
  PyObject* route = PyDict_GetItemWithError(dict, spec.route_attr);
  // Another callable in the route's place is the forward's to call.
  if (params == nullptr || route == nullptr || !PyDict_Check(params) || Py_TYPE(route) != g_route->route_type) {
    return nullptr;
  }
  PyObject* weight = PyDict_GetItemWithError(params, n.weight);
  PyObject* bias = PyDict_GetItemWithError(params, n.bias);
  if (weight == nullptr || bias == nullptr) return nullptr;  // set as plain attributes: forward reads them
  PyObject* buffers = PyDict_GetItemWithError(dict, n.buffers);
  if (buffers == nullptr) return nullptr;
  // Kept across the call: the route may re-plan, and a re-plan may replace what the dicts hold.
  Py_INCREF(route);
  Py_INCREF(weight);
  Py_INCREF(bias);
  PyObject* out = memoised(*g_route, route, self, buffers, input, weight, bias);
  if (out == nullptr && !PyErr_Occurred()) {
    PyObject* args[] = {route, self, input, weight, bias};
    out = PyObject_Vectorcall(g_route->python_call, args, 5, nullptr);
  }
  Py_DECREF(route);
  Py_DECREF(weight);
  Py_DECREF(bias);
  return out;
}

// RoutedLinear.__call__(self, input)
PyObject* module_call(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  ModuleSpec& spec = *g_module;
  if (kwnames == nullptr && nargs == 1) {
    PyObject* dict = PyObject_GenericGetDict(self, nullptr);
    if (dict == nullptr) {
      PyErr_Clear();
    } else {
      PyObject* out = module_direct(spec, self, dict, args[0]);
      Py_DECREF(dict);
      if (out != nullptr || PyErr_Occurred()) return out;
    }
  }
  return call_python(spec.python_call, self, args, nargs, kwnames);
}

PyMethodDef kRouteCall = {"__call__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(route_call)),
                          METH_FASTCALL | METH_KEYWORDS,
                          "ModuleRoute.call, its memoised planned packed calls in C (route_call.cpp)"};
PyMethodDef kModuleCall = {"__call__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(module_call)),
                           METH_FASTCALL | METH_KEYWORDS,
                           "DirectCall.__call__ and RoutedLinear.forward in C, down to the route (route_call.cpp)"};

}  // namespace

// route_method(route_type, python_call, record_type, context_type, memo_type, bfloat16, counter_index,
// plan_index) -> a method descriptor for route_type.__call__
PyObject* route_method(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8 || !PyType_Check(args[0]) || !PyCallable_Check(args[1]) || !PyType_Check(args[2]) || !PyType_Check(args[3]) ||
      !PyType_Check(args[4]) || !PyLong_Check(args[6]) || !PyLong_Check(args[7])) {
    PyErr_SetString(PyExc_TypeError, "route_method(route_type, python_call, record_type, context_type, memo_type, "
                                     "bfloat16, counter_index, plan_index)");
    return nullptr;
  }
  auto* route_type = reinterpret_cast<PyTypeObject*>(args[0]);
  RouteSpec spec;
  spec.route_type = route_type;
  spec.record_type = reinterpret_cast<PyTypeObject*>(args[2]);
  spec.context_type = reinterpret_cast<PyTypeObject*>(args[3]);
  spec.memo_type = reinterpret_cast<PyTypeObject*>(args[4]);
  const std::array<std::pair<Offset*, std::pair<PyTypeObject*, const char*>>, 17> members = {{
      {&spec.route_context, {spec.route_type, "context"}}, {&spec.route_record, {spec.route_type, "record"}},
      {&spec.route_memo, {spec.route_type, "memo"}}, {&spec.route_status, {spec.route_type, "status"}},
      {&spec.record_source, {spec.record_type, "source"}}, {&spec.record_layout, {spec.record_type, "layout"}},
      {&spec.context_config, {spec.context_type, "config"}}, {&spec.context_counters, {spec.context_type, "counters"}},
      {&spec.context_table, {spec.context_type, "table"}}, {&spec.memo_weight_ref, {spec.memo_type, "weight_ref"}},
      {&spec.memo_source, {spec.memo_type, "source"}}, {&spec.memo_status, {spec.memo_type, "status"}},
      {&spec.memo_layout, {spec.memo_type, "layout"}}, {&spec.memo_config, {spec.memo_type, "config"}},
      {&spec.memo_table, {spec.memo_type, "table"}}, {&spec.memo_calls, {spec.memo_type, "calls"}},
      {&spec.memo_last, {spec.memo_type, "last"}},
  }};
  for (const auto& [offset, member] : members) {
    *offset = slot_offset(member.first, member.second);
    if (*offset < 0) return nullptr;
  }
  spec.counter_index = PyLong_AsSsize_t(args[6]);
  spec.plan_index = PyLong_AsSsize_t(args[7]);
  if (spec.counter_index < 0 || spec.plan_index < 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "route_method: negative MemoCall index");
    return nullptr;
  }
  if (g_route != nullptr && g_route->route_type != route_type) {  // one route class per process
    PyErr_Format(PyExc_ValueError, "route_method: already made for %s", g_route->route_type->tp_name);
    return nullptr;
  }
  names();
  spec.python_call = Py_NewRef(args[1]);
  spec.bfloat16 = Py_NewRef(args[5]);
  if (g_route == nullptr) {  // the classes are kept for the process; made again, their slots are where they were
    for (PyObject* type : {args[0], args[2], args[3], args[4]}) Py_INCREF(type);
    g_route = new RouteSpec();
  } else {
    Py_DECREF(g_route->python_call);
    Py_DECREF(g_route->bfloat16);
  }
  *g_route = spec;
  return PyDescr_NewMethod(route_type, &kRouteCall);
}

// module_method(module_type, python_call, forward, route_attr, hook_globals) -> a method
// descriptor for module_type.__call__; route_method must have been made first.
PyObject* module_method(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyType_Check(args[0]) || !PyCallable_Check(args[1]) || !PyUnicode_Check(args[3]) ||
      !PyDict_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "module_method(module_type, python_call, forward, route_attr, hook_globals)");
    return nullptr;
  }
  if (g_route == nullptr) {
    PyErr_SetString(PyExc_ValueError, "module_method: make route_method first");
    return nullptr;
  }
  auto* module_type = reinterpret_cast<PyTypeObject*>(args[0]);
  if (g_module != nullptr && g_module->module_type != module_type) {
    PyErr_Format(PyExc_ValueError, "module_method: already made for %s", g_module->module_type->tp_name);
    return nullptr;
  }
  ModuleSpec spec;
  spec.module_type = module_type;
  const Names& n = names();
  for (size_t i = 0; i < n.global_hooks.size(); ++i) {
    PyObject* hooks = PyDict_GetItemWithError(args[4], n.global_hooks[i]);
    if (hooks == nullptr || !PyDict_Check(hooks)) {
      if (!PyErr_Occurred()) {
        PyErr_Format(PyExc_ValueError, "module_method: hook_globals has no dict %U", n.global_hooks[i]);
      }
      return nullptr;
    }
    spec.global_hooks[i] = hooks;
  }
  // Nothing is kept until every check passed: a descriptor made before keeps working on a failure.
  for (PyObject* hooks : spec.global_hooks) Py_INCREF(hooks);
  spec.python_call = Py_NewRef(args[1]);
  spec.forward = Py_NewRef(args[2]);
  spec.route_attr = Py_NewRef(args[3]);
  PyUnicode_InternInPlace(&spec.route_attr);
  if (g_module == nullptr) {
    Py_INCREF(module_type);
    g_module = new ModuleSpec();
  } else {  // made again: the classes seen are checked against the new forward
    for (PyObject* obj : {g_module->python_call, g_module->forward, g_module->route_attr}) Py_DECREF(obj);
    for (PyObject* hooks : g_module->global_hooks) Py_DECREF(hooks);
    for (PyTypeObject* seen : g_module->checked) Py_XDECREF(seen);
  }
  *g_module = spec;
  return PyDescr_NewMethod(module_type, &kModuleCall);
}

}  // namespace sglang_rvv_entry
