// Building plans from their Python description (see strictops.ops._runtime.host_path).

#include "host_plans.h"

#include <cstring>

#include <torch/csrc/Dtype.h>

namespace strictops_host {
namespace {

bool as_refs(PyObject* seq, std::vector<Ref>& out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of tensor references");
  if (fast == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
    out.push_back(static_cast<Ref>(v));
  }
  Py_DECREF(fast);
  return true;
}

// A per-call integer: ``(index, kind)`` (see Scalar).
bool as_scalar(PyObject* item, Scalar& scalar) {
  const char* kind;
  if (!PyArg_ParseTuple(item, "is", &scalar.index, &kind)) return false;
  if (std::strlen(kind) != 1 || std::strchr("iqAa", kind[0]) == nullptr) {
    PyErr_SetString(PyExc_ValueError, "a per-call parameter's kind is one of i, q, A, a");
    return false;
  }
  scalar.kind = kind[0];
  return true;
}

// Result items: a reference, or ``(argument, start argument, length argument)``: a slice.
bool as_result(PyObject* seq, Plan& plan) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of result items");
  if (fast == nullptr) return false;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
    int ref, start = -1, length = -1;
    ok = PyTuple_Check(item) ? PyArg_ParseTuple(item, "iii", &ref, &start, &length) != 0
                             : (ref = static_cast<int>(PyLong_AsLong(item)), !PyErr_Occurred());
    if (ok && PyTuple_Check(item) && ref < 0) {
      PyErr_SetString(PyExc_ValueError, "a result slice is of an argument");
      ok = false;
    }
    plan.result.push_back(ref);
    plan.slices.emplace_back(start, length);
  }
  Py_DECREF(fast);
  return ok;
}

}  // namespace

// Whether every argument index of ``plan`` names one of the call's ``arguments`` (those
// below ``keyed`` for tensors, the others for per-call integers).
bool indices_in_range(const Plan& plan, Py_ssize_t keyed) {
  int64_t fresh = 0;
  for (const Allocation& a : plan.allocations) fresh += a.split ? a.sizes.at(0) : 1;
  auto ref_ok = [&](Ref r) {
    return r == kNoneRef || (r >= 0 ? r < keyed : -static_cast<int64_t>(r) - 1 < fresh);
  };
  auto scalar_ok = [&](int i) { return i >= keyed && i < plan.arguments; };
  for (const auto& [a, b] : plan.disjoint) {
    if (!ref_ok(a) || !ref_ok(b) || a < 0 || b < 0) return false;
  }
  for (Ref r : plan.inside) if (r < 0 || !ref_ok(r)) return false;
  for (const auto& [offset, ref] : plan.pointers) if (!ref_ok(ref)) return false;
  for (const auto& [offset, scalar] : plan.scalars) if (!scalar_ok(scalar.index)) return false;
  for (int b : plan.bump) if (b < 0 || b >= keyed) return false;
  for (size_t i = 0; i < plan.result.size(); ++i) {
    if (!ref_ok(plan.result[i])) return false;
    const auto [start, length] = plan.slices[i];
    if (start >= 0 && (!scalar_ok(start) || !scalar_ok(length))) return false;
  }
  return true;
}

// spec: (device, disjoint pairs, allocations, launch, bump, result_kind, result items, guards
//        [, inside refs])
//   allocations: ((sizes, dtype, split), ...)
//   launch: (function, (gx, gy, gz), threads, shared, num_ctas, pdl, cooperative, params)
//   params: per parameter, bytes (a constant, packed), an int (a tensor reference whose
//   address the 8-byte parameter holds) or ``(index, kind)`` (a per-call integer argument)
//   result items: see as_result
std::unique_ptr<Plan> parse_plan(PyObject* spec) {
  auto plan = std::make_unique<Plan>();
  PyObject *disjoint, *allocations, *launch, *bump, *result, *guards, *inside = nullptr;
  int device, result_kind;
  if (!PyArg_ParseTuple(spec, "iOOOOiOO|O", &device, &disjoint, &allocations, &launch, &bump,
                        &result_kind, &result, &guards, &inside)) {
    return nullptr;
  }
  if (inside != nullptr && !as_refs(inside, plan->inside)) return nullptr;
  plan->device = device;
  plan->result_kind = result_kind;
  std::vector<Ref> pair_refs;
  if (!as_refs(disjoint, pair_refs) || pair_refs.size() % 2 != 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "disjoint: flat pairs");
    return nullptr;
  }
  for (size_t i = 0; i < pair_refs.size(); i += 2) {
    plan->disjoint.emplace_back(pair_refs[i], pair_refs[i + 1]);
  }
  if (!as_refs(bump, plan->bump) || !as_result(result, *plan)) return nullptr;
  PyObject* allocs = PySequence_Fast(allocations, "allocations");
  if (allocs == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(allocs); ++i) {
    PyObject *sizes, *dtype;
    int split;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(allocs, i), "OOp", &sizes, &dtype, &split)) {
      Py_DECREF(allocs);
      return nullptr;
    }
    if (!THPDtype_Check(dtype)) {
      Py_DECREF(allocs);
      PyErr_SetString(PyExc_TypeError, "allocation dtype must be a torch.dtype");
      return nullptr;
    }
    Allocation a;
    PyObject* dims = PySequence_Fast(sizes, "allocation sizes");
    if (dims == nullptr) {
      Py_DECREF(allocs);
      return nullptr;
    }
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(dims); ++j) {
      a.sizes.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, j)));
    }
    Py_DECREF(dims);
    if (PyErr_Occurred()) {
      Py_DECREF(allocs);
      return nullptr;
    }
    a.dtype = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
    a.split = split != 0;
    plan->allocations.push_back(std::move(a));
  }
  Py_DECREF(allocs);

  PyObject* params;
  unsigned long long function;
  int pdl, cooperative;
  if (!PyArg_ParseTuple(launch, "K(III)IIIppO", &function, &plan->grid[0], &plan->grid[1],
                        &plan->grid[2], &plan->threads, &plan->shared, &plan->num_ctas, &pdl,
                        &cooperative, &params)) {
    return nullptr;
  }
  plan->function = function;
  plan->pdl = pdl != 0;
  plan->cooperative = cooperative != 0;
  PyObject* items = PySequence_Fast(params, "params");
  if (items == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items); ++i) {
    PyObject* p = PySequence_Fast_GET_ITEM(items, i);
    size_t offset = plan->params.size();
    plan->offsets.push_back(offset);
    if (PyTuple_Check(p)) {
      Scalar scalar;
      if (!as_scalar(p, scalar)) {
        Py_DECREF(items);
        return nullptr;
      }
      plan->params.resize(offset + 8, 0);
      plan->scalars.emplace_back(offset, scalar);
    } else if (PyBytes_Check(p)) {
      Py_ssize_t size = PyBytes_GET_SIZE(p);
      if (size < 1 || size > 8) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_ValueError, "a packed parameter takes 1 to 8 bytes");
        return nullptr;
      }
      plan->params.resize(offset + 8, 0);
      std::memcpy(plan->params.data() + offset, PyBytes_AS_STRING(p), size);
    } else {
      long ref = PyLong_AsLong(p);
      if (ref == -1 && PyErr_Occurred()) {
        Py_DECREF(items);
        return nullptr;
      }
      plan->params.resize(offset + 8, 0);
      plan->pointers.emplace_back(offset, static_cast<Ref>(ref));
    }
  }
  Py_DECREF(items);
  if (guards != Py_None) {
    if (!PyTuple_Check(guards)) {
      PyErr_SetString(PyExc_TypeError, "guards must be a tuple or None");
      return nullptr;
    }
    plan->guards = Py_NewRef(guards);
  }
  return plan;
}

}  // namespace strictops_host
