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
// Python path (strictops.ops._host_path); this file holds no rule of any contract.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include "cuda.h"

namespace {

// ---------------------------------------------------------------------------------------
// Module state, set by configure().

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

// ---------------------------------------------------------------------------------------
// The CUDA driver entry points, resolved once from libcuda.

using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using GetErrorString = CUresult (*)(CUresult, const char**);

struct Driver {
  LaunchKernelEx launch = nullptr;
  CtxGetCurrent ctx_get_current = nullptr;
  GetErrorString error_string = nullptr;
};

const Driver* driver() {
  static Driver d;
  static bool tried = false;
  if (!tried) {
    tried = true;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      d.launch = reinterpret_cast<LaunchKernelEx>(dlsym(lib, "cuLaunchKernelEx"));
      d.ctx_get_current = reinterpret_cast<CtxGetCurrent>(dlsym(lib, "cuCtxGetCurrent"));
      d.error_string = reinterpret_cast<GetErrorString>(dlsym(lib, "cuGetErrorString"));
    }
  }
  return d.launch && d.ctx_get_current ? &d : nullptr;
}

// ---------------------------------------------------------------------------------------
// Keys.

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

// Releases the leaves of a key on every way out.
struct FlatGuard {
  std::vector<PyObject*>& flat;
  ~FlatGuard() { release_flat(flat); }
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& key) const noexcept {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int64_t v : key) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

// ---------------------------------------------------------------------------------------
// Plans.

// A reference to a tensor of the call: argument ``index`` (>= 0), or new output ``-index - 1``;
// in a result, kNoneRef stands for None.
using Ref = int;
constexpr Ref kNoneRef = -(1 << 30);

// A parameter or a slice bound taken per call from integer argument ``index``, as ``kind``:
// 'i' an int32, 'q' an int64, 'A' an address that is a multiple of 16, 'a' one that is not (the
// alignment Triton specialised the plan's kernel for), 'n' a size (in [0, 2**63)).
struct Scalar {
  int index;
  char kind;
};

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

struct Allocation {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
  bool split;  // unbind along dim 0: sizes[0] outputs
};

struct Plan {
  Py_ssize_t arguments = 0;  // positional arguments of its calls
  int device = -1;  // CUDA device index; -1: no device (record mode only)
  std::vector<std::pair<Ref, Ref>> disjoint;
  std::vector<Ref> inside;  // tensors that must lie inside their storage
  std::vector<Allocation> allocations;
  // The launch.
  uint64_t function = 0;
  unsigned grid[3] = {1, 1, 1};
  unsigned threads = 0;
  unsigned shared = 0;
  unsigned num_ctas = 1;
  bool pdl = false;
  bool cooperative = false;
  std::vector<uint8_t> params;                   // packed, every parameter at a multiple of 8
  std::vector<size_t> offsets;                   // where each parameter starts in ``params``
  std::vector<std::pair<size_t, Ref>> pointers;  // (offset, tensor) filled per call
  std::vector<std::pair<size_t, Scalar>> scalars;  // (offset, argument) filled per call
  std::vector<int> bump;                         // arguments whose version counter is bumped
  int result_kind = 0;                           // 0: None, 1: one tensor, 2: a tuple
  std::vector<Ref> result;
  // Per result item, -1, or the arguments holding the start and length of the item's slice
  // along dim 0 (the item is then an argument, sliced).
  std::vector<std::pair<int, int>> slices;
  PyObject* guards = nullptr;                    // per-plan guards (owned)

  ~Plan() { Py_XDECREF(guards); }
};

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

using PlanMap = std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Plan>, KeyHash>;

struct PlanCacheObject {
  PyObject_HEAD
  vectorcallfunc call;
  PlanMap* plans;
  Py_ssize_t max_entries;
  Py_ssize_t keyed;  // arguments in the key; -1: all
};

// How many of ``n`` arguments the key of ``cache`` takes; -1 where there are too few.
Py_ssize_t keyed_count(const PlanCacheObject* cache, Py_ssize_t n) {
  if (cache->keyed < 0) return n;
  return n < cache->keyed ? -1 : cache->keyed;
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

// ---------------------------------------------------------------------------------------
// Building plans from their Python description (see strictops.ops._host_path).

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
  PlanCacheType.tp_name = "strictops.ops._host_plans.PlanCache";
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
