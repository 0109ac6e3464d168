// Keys: a call's key and its leaves (the overview in module.cpp says what a key holds).

#include "host_plans.h"

#include <cstring>

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/python_variable.h>

namespace strictops_host {
namespace {

enum : int64_t { kNone = 0, kTensor = 1, kBool = 2, kInt = 3, kFloat = 4, kList = 5, kTuple = 6 };

// Lists and tuples nest at most this deep in an argument (a list of tensor pairs: 2).
constexpr int kMaxDepth = 2;

// Appends the key of one argument; false where the argument has none (a MISS).
bool append_key(PyObject* o, bool grad, std::vector<int64_t>& key) {
  if (o == Py_None) {
    key.push_back(kNone);
    return true;
  }
  PyTypeObject* type = Py_TYPE(o);
  if (type == g_tensor_type) {
    const at::Tensor& t = THPVariable_Unpack(o);
    if (!t.defined() || t.layout() != c10::kStrided || (grad && t.requires_grad())) return false;
    const c10::Device device = t.device();
    auto sizes = t.sizes();
    auto strides = t.strides();
    key.push_back(kTensor);
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back((static_cast<int64_t>(device.type()) << 16) | (device.index() & 0xffff));
    key.push_back(static_cast<int64_t>(sizes.size()));
    key.insert(key.end(), sizes.begin(), sizes.end());
    key.insert(key.end(), strides.begin(), strides.end());
    key.push_back(t.storage_offset());
    key.push_back((reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == 0);
    return true;
  }
  if (type == &PyBool_Type) {
    key.push_back(kBool);
    key.push_back(o == Py_True);
    return true;
  }
  if (type == &PyLong_Type) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    key.push_back(kInt);
    key.push_back(v);
    return true;
  }
  if (type == &PyFloat_Type) {
    double v = PyFloat_AS_DOUBLE(o);
    int64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    key.push_back(kFloat);
    key.push_back(bits);
    return true;
  }
  return false;
}

// Appends the key of argument ``o`` and its leaves to ``flat``: a list or a tuple by its type,
// length and items, anything else as append_key, a tensor also with the leaf it is the same
// object as, if any.
bool append_flat(PyObject* o, bool grad, int depth, std::vector<int64_t>& key,
                 std::vector<PyObject*>& flat) {
  PyTypeObject* type = Py_TYPE(o);
  if (type == &PyList_Type || type == &PyTuple_Type) {
    if (depth >= kMaxDepth) return false;
    const Py_ssize_t m = PySequence_Fast_GET_SIZE(o);
    key.push_back(type == &PyList_Type ? kList : kTuple);
    key.push_back(m);
    PyObject** items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t i = 0; i < m; ++i) {
      if (!append_flat(items[i], grad, depth + 1, key, flat)) return false;
    }
    return true;
  }
  if (!append_key(o, grad, key)) return false;
  if (type == g_tensor_type) {
    Py_ssize_t same = -1;
    for (size_t j = 0; j < flat.size() && same < 0; ++j) {
      same = flat[j] == o ? static_cast<Py_ssize_t>(j) : -1;
    }
    key.push_back(same);
  }
  flat.push_back(o);
  return true;
}

}  // namespace

// The key of the first ``keyed`` of ``n`` arguments, and every argument's leaves in ``flat``
// (lists and tuples flattened; the arguments past ``keyed`` as they are), each a new
// reference (release_flat). Plans name tensors and per-call integers by their index in
// ``flat``: an op without list arguments by its argument's index.
bool make_key(PyObject* const* args, Py_ssize_t keyed, Py_ssize_t n, std::vector<int64_t>& key,
              std::vector<PyObject*>& flat) {
  key.clear();
  flat.clear();
  key.push_back(keyed);
  const bool grad = c10::GradMode::is_enabled();
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < keyed; ++i) ok = append_flat(args[i], grad, 0, key, flat);
  for (Py_ssize_t i = keyed; ok && i < n; ++i) flat.push_back(args[i]);
  for (PyObject* o : flat) Py_INCREF(o);  // a list's items outlive a change of the list
  return ok;
}

void release_flat(std::vector<PyObject*>& flat) {
  for (PyObject* o : flat) Py_DECREF(o);
  flat.clear();
}

}  // namespace strictops_host
