// What the files of the extension strictops.ops._runtime._host_plans share; private to them.
// module.cpp says what the extension does. One concern a file:
//   state.cpp   the module state configure() sets, the guards and the gate
//   driver.cpp  the CUDA driver entry points
//   keys.cpp    a call's key and its leaves
//   run.cpp     running a plan: its checks, allocations, launch and result
//   parse.cpp   building plans from their Python description
//   module.cpp  the PlanCache type and the module
// What one file alone uses stays in an anonymous namespace there.

#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

#include "cuda.h"

namespace strictops_host {

// ---------------------------------------------------------------------------------------
// Module state, set by configure() (state.cpp).

extern PyObject* g_miss;
extern PyTypeObject* g_tensor_type;
extern PyObject* g_gate;
extern PyObject* g_get_device;
extern PyObject* g_get_stream;
extern PyObject* g_guards;
extern PyObject* g_recorder;
extern PyObject* g_empty;

bool guards_hold(PyObject* guards);
bool gate_open();

// ---------------------------------------------------------------------------------------
// The CUDA driver entry points, resolved once from libcuda (driver.cpp).

using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using GetErrorString = CUresult (*)(CUresult, const char**);

struct Driver {
  LaunchKernelEx launch = nullptr;
  CtxGetCurrent ctx_get_current = nullptr;
  GetErrorString error_string = nullptr;
};

const Driver* driver();

// ---------------------------------------------------------------------------------------
// Keys (keys.cpp).

bool make_key(PyObject* const* args, Py_ssize_t keyed, Py_ssize_t n, std::vector<int64_t>& key,
              std::vector<PyObject*>& flat);
void release_flat(std::vector<PyObject*>& flat);

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
// Plans (run.cpp runs them, parse.cpp builds them).

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

using PlanMap = std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Plan>, KeyHash>;

struct PlanCacheObject {
  PyObject_HEAD
  vectorcallfunc call;
  PlanMap* plans;
  Py_ssize_t max_entries;
  Py_ssize_t keyed;  // arguments in the key; -1: all
};

Py_ssize_t keyed_count(const PlanCacheObject* cache, Py_ssize_t n);
PyObject* cache_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames);

bool indices_in_range(const Plan& plan, Py_ssize_t keyed);
std::unique_ptr<Plan> parse_plan(PyObject* spec);

}  // namespace strictops_host
