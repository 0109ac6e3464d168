// Eager calls of strictops ops, prepared once per call signature and replayed in C++.
//
// A PlanCache belongs to one op. ``cache(*args)`` (the op's positional arguments) computes the
// call's key from its first ``keyed`` arguments (all of them by default): per argument, None; a
// plain torch.Tensor's dtype, device, layout, sizes, strides, storage offset, whether its
// address is a multiple of 16 and which earlier argument, if any, is the same object; a bool's,
// int's or float's type and value. Anything else, a tensor subclass, a tensor that requires
// grad while grad mode is on, a call while a dispatch or torch-function mode or a functorch
// transform is active, or one of the configured guards not holding: ``MISS``. The arguments
// after the keyed ones are per-call integers (a lease's offsets, an address) that parameters
// or a result slice may take; each must be an ``int`` in the range its use declares, else
// ``MISS``. A key with a plan runs it:
//
//   1. per-call disjointness checks (pairs of arguments that must not share a byte, as the
//      contract's ``disjoint`` rows define it); a failing one is a MISS, so the Python path
//      raises the contract's error;
//   2. the allocations of the outputs not given (``at::empty``; a group may be split along
//      dim 0 into views);
//   3. one kernel launch (``cuLaunchKernelEx``) of a compiled Triton kernel on the current
//      stream of the plan's device, the parameters packed once with the arguments' addresses
//      filled in per call, exactly as Triton's own launcher packs them;
//   4. the version-counter bump of the arguments the op writes;
//   5. the result: None, one tensor, or a tuple of tensors (arguments or new outputs, or a
//      1-D slice of one whose start and length are per-call integers).
//
// Plans are made by the Python side after the same call succeeded through the op's full
// Python path (strictops.ops._runtime.host_path); these files hold no rule of any contract.
//
// The files of this folder, one concern each, are listed in host_plans.h; this one holds the
// PlanCache type and the module, and includes the others.

#include "host_plans.h"

// One translation unit (a unity build): the concerns are separate files for the reader and are
// compiled together, so that a call's path inlines across them (key, gate, guards, plan) and
// torch's headers are parsed once. setup.py compiles this file alone.
#include "state.cpp"
#include "driver.cpp"
#include "keys.cpp"
#include "run.cpp"
#include "parse.cpp"

#include <cstddef>
#include <exception>

using namespace strictops_host;  // what the files of this folder share (host_plans.h)

namespace {

// cache.add(args, spec): the plan of ``args``'s key (spec None: the key has no plan, and its
// calls stay MISS without asking again). Returns whether ``args`` has a key.
PyObject* cache_add(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  auto* cache = reinterpret_cast<PlanCacheObject*>(self);
  if (n != 2 || !PyTuple_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "add(args: tuple, spec)");
    return nullptr;
  }
  const Py_ssize_t n_args = PyTuple_GET_SIZE(args[0]);
  const Py_ssize_t keyed = keyed_count(cache, n_args);
  std::vector<int64_t> key;
  std::vector<PyObject*> flat;
  FlatGuard release{flat};
  Py_ssize_t keyed_leaves = 0;
  try {
    if (keyed < 0 || !make_key(&PyTuple_GET_ITEM(args[0], 0), keyed, n_args, key, flat)) {
      Py_RETURN_FALSE;
    }
    keyed_leaves = static_cast<Py_ssize_t>(flat.size()) - (n_args - keyed);
  } catch (const std::exception&) {
    Py_RETURN_FALSE;
  }
  std::shared_ptr<const Plan> plan;
  if (args[1] != Py_None) {
    std::unique_ptr<Plan> parsed = parse_plan(args[1]);
    if (!parsed) return nullptr;
    parsed->arguments = static_cast<Py_ssize_t>(flat.size());
    if (!indices_in_range(*parsed, keyed_leaves)) {
      PyErr_SetString(PyExc_ValueError, "a plan names an argument or output the call lacks");
      return nullptr;
    }
    plan = std::move(parsed);
  }
  if (static_cast<Py_ssize_t>(cache->plans->size()) >= cache->max_entries) cache->plans->clear();
  (*cache->plans)[std::move(key)] = std::move(plan);
  Py_RETURN_TRUE;
}

// cache.known(*args): whether ``args``'s key has an entry (a plan or None); None where
// ``args`` has no key (no plan can ever serve it). The arguments past the keyed ones may be
// left out.
PyObject* cache_known(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  auto* cache = reinterpret_cast<PlanCacheObject*>(self);
  const Py_ssize_t keyed = cache->keyed < 0 ? n : cache->keyed;
  std::vector<int64_t> key;
  std::vector<PyObject*> flat;
  FlatGuard release{flat};
  try {
    if (n < keyed || !make_key(args, keyed, keyed, key, flat)) Py_RETURN_NONE;
  } catch (const std::exception&) {
    Py_RETURN_NONE;
  }
  return PyBool_FromLong(cache->plans->count(key) != 0);
}

PyObject* cache_clear(PyObject* self, PyObject*) {
  reinterpret_cast<PlanCacheObject*>(self)->plans->clear();
  Py_RETURN_NONE;
}

Py_ssize_t cache_len(PyObject* self) {
  return static_cast<Py_ssize_t>(reinterpret_cast<PlanCacheObject*>(self)->plans->size());
}

PyObject* cache_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  Py_ssize_t max_entries = 1024, keyed = -1;
  static const char* names[] = {"max_entries", "keyed", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|nn", const_cast<char**>(names),
                                   &max_entries, &keyed)) {
    return nullptr;
  }
  auto* self = reinterpret_cast<PlanCacheObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->call = cache_call;
  self->plans = new PlanMap();
  self->max_entries = max_entries;
  self->keyed = keyed;
  return reinterpret_cast<PyObject*>(self);
}

void cache_dealloc(PyObject* self) {
  delete reinterpret_cast<PlanCacheObject*>(self)->plans;
  Py_TYPE(self)->tp_free(self);
}

}  // namespace

static PyMethodDef cache_methods[] = {
    {"add", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(cache_add)),
     METH_FASTCALL, "add(args, spec): the plan of the call signature of args (spec None: none)"},
    {"known", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(cache_known)),
     METH_FASTCALL, "known(*args): whether the call signature of args has an entry"},
    {"clear", cache_clear, METH_NOARGS, "drop every plan"},
    {nullptr, nullptr, 0, nullptr}};

static PySequenceMethods cache_sequence = {cache_len};

static PyTypeObject PlanCacheType = {PyVarObject_HEAD_INIT(nullptr, 0)};

static PyObject* configure(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"tensor_type", "gate", "get_device", "get_stream", "guards",
                                "recorder", nullptr};
  PyObject *tensor_type, *gate, *get_device, *get_stream, *guards, *recorder;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!OOO!O", const_cast<char**>(names),
                                   &PyType_Type, &tensor_type, &PyTuple_Type, &gate, &get_device,
                                   &get_stream, &PyTuple_Type, &guards, &recorder)) {
    return nullptr;
  }
  Py_XSETREF(g_tensor_type, reinterpret_cast<PyTypeObject*>(Py_NewRef(tensor_type)));
  Py_XSETREF(g_gate, Py_NewRef(gate));
  Py_XSETREF(g_get_device, Py_NewRef(get_device));
  Py_XSETREF(g_get_stream, Py_NewRef(get_stream));
  Py_XSETREF(g_guards, Py_NewRef(guards));
  Py_XSETREF(g_recorder, Py_NewRef(recorder));
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(configure)),
     METH_VARARGS | METH_KEYWORDS,
     "configure(tensor_type, gate, get_device, get_stream, guards, recorder)"},
    {nullptr, nullptr, 0, nullptr}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_host_plans",
                                        "Eager calls prepared once per signature, run in C++.",
                                        -1, module_methods};

PyMODINIT_FUNC PyInit__host_plans(void) {
  PlanCacheType.tp_name = "strictops.ops._runtime._host_plans.PlanCache";
  PlanCacheType.tp_basicsize = sizeof(PlanCacheObject);
  PlanCacheType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  PlanCacheType.tp_vectorcall_offset = offsetof(PlanCacheObject, call);
  PlanCacheType.tp_call = PyVectorcall_Call;
  PlanCacheType.tp_new = cache_new;
  PlanCacheType.tp_dealloc = cache_dealloc;
  PlanCacheType.tp_methods = cache_methods;
  PlanCacheType.tp_as_sequence = &cache_sequence;
  PlanCacheType.tp_doc =
      "PlanCache(max_entries=1024, keyed=-1): plans of one op's eager calls, keyed by the call "
      "signature of the first ``keyed`` arguments (-1: all).";
  if (PyType_Ready(&PlanCacheType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  g_miss = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  g_empty = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  if (g_miss == nullptr || g_empty == nullptr ||
      PyModule_AddObjectRef(m, "MISS", g_miss) < 0 ||
      PyModule_AddObjectRef(m, "EMPTY", g_empty) < 0 ||
      PyModule_AddObjectRef(m, "PlanCache", reinterpret_cast<PyObject*>(&PlanCacheType)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
