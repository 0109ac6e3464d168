// Running a plan (Plan in host_plans.h): the per-call checks, the allocations, the launch, the
// version-counter bumps and the result; and the PlanCache's call, which finds the plan.

#include "host_plans.h"

#include <cstring>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/python_variable.h>

namespace strictops_host {
namespace {

// Argument ``o`` as ``kind`` (see Scalar) in ``value``; false where it is not an ``int`` in
// the kind's range.
bool scalar_value(PyObject* o, char kind, int64_t& value) {
  if (Py_TYPE(o) != &PyLong_Type) return false;
  if (kind == 'A' || kind == 'a') {
    unsigned long long address = PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    if (((address & 15) == 0) != (kind == 'A')) return false;
    std::memcpy(&value, &address, sizeof value);
    return true;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  if (kind == 'i' && (v < INT32_MIN || v > INT32_MAX)) return false;
  if (kind == 'n' && v < 0) return false;
  value = v;
  return true;
}

// What the parameters hold of a call, filled in per call.
struct Call {
  PyObject* const* args;
  std::vector<at::Tensor> fresh;
};

const at::Tensor& tensor_of(const Call& call, Ref ref) {
  return ref >= 0 ? THPVariable_Unpack(call.args[ref]) : call.fresh[-ref - 1];
}

// The contract's ``disjoint`` rule for two tensors: they do not share a byte when either is
// empty or they do not alias one storage or their byte ranges from their offsets do not meet.
bool disjoint(const at::Tensor& x, const at::Tensor& y) {
  if (!x.is_alias_of(y)) return true;
  const int64_t x_start = x.storage_offset() * static_cast<int64_t>(x.element_size());
  const int64_t y_start = y.storage_offset() * static_cast<int64_t>(y.element_size());
  const int64_t x_end = x_start + x.numel() * static_cast<int64_t>(x.element_size());
  const int64_t y_end = y_start + y.numel() * static_cast<int64_t>(y.element_size());
  return x_start == x_end || y_start == y_end || x_end <= y_start || y_end <= x_start;
}

// The contract's ``inside_storage`` rule: every element of ``t`` lies inside its storage.
bool inside_storage(const at::Tensor& t) {
  if (t.numel() == 0) return true;
  int64_t reach = t.storage_offset();
  auto sizes = t.sizes();
  auto strides = t.strides();
  for (size_t d = 0; d < sizes.size(); ++d) reach += (sizes[d] - 1) * strides[d];
  return (reach + 1) * static_cast<int64_t>(t.element_size()) <=
         static_cast<int64_t>(t.storage().nbytes());
}

thread_local std::vector<int64_t> t_key;

PyObject* raise_launch_error(CUresult code) {
  const char* text = nullptr;
  const Driver* d = driver();
  if (d && d->error_string) d->error_string(code, &text);
  PyErr_Format(PyExc_RuntimeError, "Triton Error [CUDA]: %s", text ? text : "unknown error");
  return nullptr;
}

// Runs ``plan`` on the call's arguments; MISS where a check fails or nothing may launch.
PyObject* run_plan(const Plan& plan, PyObject* const* args) {
  Call call{args, {}};
  for (const auto& [a, b] : plan.disjoint) {
    if (!disjoint(tensor_of(call, a), tensor_of(call, b))) return Py_NewRef(g_miss);
  }
  for (Ref r : plan.inside) {
    if (!inside_storage(tensor_of(call, r))) return Py_NewRef(g_miss);
  }
  std::vector<uint8_t> params(plan.params);
  for (const auto& [offset, scalar] : plan.scalars) {
    int64_t value;
    if (!scalar_value(args[scalar.index], scalar.kind, value)) return Py_NewRef(g_miss);
    std::memcpy(params.data() + offset, &value, scalar.kind == 'i' ? 4 : 8);
  }
  // Each result slice, [start, start + length) of its argument's dim 0, lies inside it.
  std::vector<std::pair<int64_t, int64_t>> bounds(plan.slices.size(), {-1, -1});
  for (size_t i = 0; i < plan.slices.size(); ++i) {
    const auto [start_index, length_index] = plan.slices[i];
    if (start_index < 0) continue;
    int64_t start, length;
    if (!scalar_value(args[start_index], 'n', start) ||
        !scalar_value(args[length_index], 'n', length) ||
        length > THPVariable_Unpack(args[plan.result[i]]).size(0) - start) {
      return Py_NewRef(g_miss);
    }
    bounds[i] = {start, length};
  }
  if (!guards_hold(plan.guards)) return Py_NewRef(g_miss);

  uint64_t stream = 0;
  const Driver* d = nullptr;
  const bool record = g_recorder != nullptr && g_recorder != Py_None;
  if (plan.device >= 0) {
    PyObject* current = PyObject_CallNoArgs(g_get_device);
    if (current == nullptr) return nullptr;
    long device = PyLong_AsLong(current);
    Py_DECREF(current);
    if (device != plan.device) return Py_NewRef(g_miss);  // the Python path switches device
    PyObject* index = PyLong_FromLong(device);
    PyObject* s = PyObject_CallOneArg(g_get_stream, index);
    Py_DECREF(index);
    if (s == nullptr) return nullptr;
    stream = PyLong_AsUnsignedLongLong(s);
    Py_DECREF(s);
    if (PyErr_Occurred()) return nullptr;
    if (!record) {
      d = driver();
      CUcontext context = nullptr;
      if (d == nullptr || d->ctx_get_current(&context) != CUDA_SUCCESS || context == nullptr) {
        return Py_NewRef(g_miss);  // no context on this thread yet: Triton's launcher makes it
      }
    }
  } else if (!record) {
    return Py_NewRef(g_miss);
  }

  try {
    for (const Allocation& a : plan.allocations) {
      at::TensorOptions options = at::TensorOptions().dtype(a.dtype).device(
          plan.device >= 0 ? c10::Device(c10::DeviceType::CUDA, plan.device)
                           : c10::Device(c10::DeviceType::CPU));
      at::Tensor t = at::empty(a.sizes, options);
      if (a.split) {
        for (at::Tensor& part : t.unbind(0)) call.fresh.push_back(std::move(part));
      } else {
        call.fresh.push_back(std::move(t));
      }
    }
  } catch (const std::exception&) {
    return Py_NewRef(g_miss);  // the Python path allocates again and raises torch's error
  }

  for (const auto& [offset, ref] : plan.pointers) {
    uint64_t address = reinterpret_cast<uint64_t>(tensor_of(call, ref).data_ptr());
    std::memcpy(params.data() + offset, &address, sizeof address);
  }

  if (record) {
    PyObject* blob = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(params.data()),
                                               static_cast<Py_ssize_t>(params.size()));
    PyObject* offsets = PyTuple_New(static_cast<Py_ssize_t>(plan.offsets.size()));
    for (size_t i = 0; i < plan.offsets.size(); ++i) {
      PyTuple_SET_ITEM(offsets, i, PyLong_FromSize_t(plan.offsets[i]));
    }
    PyObject* r = PyObject_CallFunction(
        g_recorder, "K(III)IIIiiKNN", static_cast<unsigned long long>(plan.function),
        plan.grid[0], plan.grid[1], plan.grid[2], plan.threads, plan.shared, plan.num_ctas,
        static_cast<int>(plan.pdl), static_cast<int>(plan.cooperative),
        static_cast<unsigned long long>(stream), blob, offsets);
    if (r == nullptr) return nullptr;
    Py_DECREF(r);
  } else if (plan.grid[0] * plan.grid[1] * plan.grid[2] > 0) {
    std::vector<void*> pointers(plan.offsets.size());
    for (size_t i = 0; i < plan.offsets.size(); ++i) pointers[i] = params.data() + plan.offsets[i];
    CUlaunchAttribute attributes[4];
    unsigned n_attributes = 0;
    if (plan.pdl) {
      attributes[n_attributes].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attributes[n_attributes++].value.programmaticStreamSerializationAllowed = 1;
    }
    if (plan.cooperative) {
      attributes[n_attributes].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
      attributes[n_attributes++].value.cooperative = 1;
    }
    CUlaunchConfig config;
    std::memset(&config, 0, sizeof config);
    config.gridDimX = plan.grid[0] * plan.num_ctas;
    config.gridDimY = plan.grid[1];
    config.gridDimZ = plan.grid[2];
    config.blockDimX = plan.threads;
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = plan.shared;
    config.hStream = reinterpret_cast<CUstream>(stream);
    config.attrs = attributes;
    config.numAttrs = n_attributes;
    const CUfunction function = reinterpret_cast<CUfunction>(plan.function);
    CUresult code;
    Py_BEGIN_ALLOW_THREADS;
    code = d->launch(&config, function, pointers.data(), nullptr);
    Py_END_ALLOW_THREADS;
    if (code != CUDA_SUCCESS) return raise_launch_error(code);
  }

  for (int index : plan.bump) {
    const at::Tensor& t = THPVariable_Unpack(args[index]);
    if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
  }
  if (plan.result_kind == 0) Py_RETURN_NONE;
  auto result_item = [&](size_t i) -> PyObject* {
    const Ref ref = plan.result[i];
    if (ref == kNoneRef) return Py_NewRef(Py_None);
    if (bounds[i].first >= 0) {
      const auto [start, length] = bounds[i];
      return THPVariable_Wrap(THPVariable_Unpack(args[ref]).slice(0, start, start + length));
    }
    return ref >= 0 ? Py_NewRef(args[ref]) : THPVariable_Wrap(call.fresh[-ref - 1]);
  };
  if (plan.result_kind == 1) return result_item(0);
  PyObject* result = PyTuple_New(static_cast<Py_ssize_t>(plan.result.size()));
  if (result == nullptr) return nullptr;
  for (size_t i = 0; i < plan.result.size(); ++i) {
    PyObject* item = result_item(i);
    if (item == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
    PyTuple_SET_ITEM(result, i, item);
  }
  return result;
}

}  // namespace

// How many of ``n`` arguments the key of ``cache`` takes; -1 where there are too few.
Py_ssize_t keyed_count(const PlanCacheObject* cache, Py_ssize_t n) {
  if (cache->keyed < 0) return n;
  return n < cache->keyed ? -1 : cache->keyed;
}

PyObject* cache_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* cache = reinterpret_cast<PlanCacheObject*>(self);
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) return Py_NewRef(g_miss);
  std::shared_ptr<const Plan> plan;
  const Py_ssize_t keyed = keyed_count(cache, n);
  if (keyed < 0 || cache->plans->empty()) return Py_NewRef(g_miss);
  std::vector<PyObject*> flat;
  FlatGuard release{flat};
  try {
    if (!make_key(args, keyed, n, t_key, flat)) return Py_NewRef(g_miss);
    auto found = cache->plans->find(t_key);
    if (found == cache->plans->end() || !found->second) return Py_NewRef(g_miss);
    plan = found->second;  // kept alive through the launch, which releases the GIL
  } catch (const std::exception&) {
    return Py_NewRef(g_miss);  // e.g. a tensor without sizes or storage
  }
  if (!gate_open() || !guards_hold(g_guards)) return Py_NewRef(g_miss);
  if (plan->arguments != static_cast<Py_ssize_t>(flat.size())) return Py_NewRef(g_miss);
  try {
    return run_plan(*plan, flat.data());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

}  // namespace strictops_host
