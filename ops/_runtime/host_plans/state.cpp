// The module state, set by configure() (module.cpp), the guards and the gate.

#include "host_plans.h"

namespace strictops_host {

PyObject* g_miss = nullptr;          // the MISS sentinel
PyTypeObject* g_tensor_type = nullptr;  // torch.Tensor
PyObject* g_gate = nullptr;          // tuple of callables; every one must return a false value
PyObject* g_get_device = nullptr;    // () -> int, the current CUDA device
PyObject* g_get_stream = nullptr;    // (int) -> int, the current stream of a device
PyObject* g_guards = nullptr;        // tuple of guards, see guards_hold()
PyObject* g_recorder = nullptr;      // None, or a callable that receives launches (tests)
PyObject* g_empty = nullptr;         // the EMPTY guard marker

// A guard: (root, path, expected[, equal]). The object reached from ``root`` through ``path``
// (attribute names, or keys where the object is a dict) must be ``expected`` itself; equal to
// it where ``equal`` is True; or, where ``expected`` is EMPTY, a sized object of length 0.
bool guards_hold(PyObject* guards) {
  if (guards == nullptr) return true;
  Py_ssize_t n = PyTuple_GET_SIZE(guards);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* g = PyTuple_GET_ITEM(guards, i);
    PyObject* obj = PyTuple_GET_ITEM(g, 0);
    PyObject* path = PyTuple_GET_ITEM(g, 1);
    PyObject* expected = PyTuple_GET_ITEM(g, 2);
    Py_INCREF(obj);
    Py_ssize_t m = PyTuple_GET_SIZE(path);
    for (Py_ssize_t j = 0; j < m && obj != nullptr; ++j) {
      PyObject* name = PyTuple_GET_ITEM(path, j);
      PyObject* next;
      if (PyDict_Check(obj)) {
        next = PyDict_GetItemWithError(obj, name);
        Py_XINCREF(next);
      } else {
        next = PyObject_GetAttr(obj, name);
      }
      Py_DECREF(obj);
      obj = next;
    }
    if (obj == nullptr) {
      PyErr_Clear();
      return false;
    }
    bool ok;
    if (expected == g_empty) {
      Py_ssize_t len = PyObject_Length(obj);
      if (len < 0) PyErr_Clear();
      ok = len == 0;
    } else if (PyTuple_GET_SIZE(g) > 3 && PyTuple_GET_ITEM(g, 3) == Py_True) {
      int equal = PyObject_RichCompareBool(obj, expected, Py_EQ);
      if (equal < 0) PyErr_Clear();
      ok = equal == 1;
    } else {
      ok = obj == expected;
    }
    Py_DECREF(obj);
    if (!ok) return false;
  }
  return true;
}

// Whether the gate's callables all return a false value (plain eager mode).
bool gate_open() {
  if (g_gate == nullptr) return false;
  Py_ssize_t n = PyTuple_GET_SIZE(g_gate);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* r = PyObject_CallNoArgs(PyTuple_GET_ITEM(g_gate, i));
    if (r == nullptr) {
      PyErr_Clear();
      return false;
    }
    int truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (truth != 0) {
      if (truth < 0) PyErr_Clear();
      return false;
    }
  }
  return true;
}

}  // namespace strictops_host
