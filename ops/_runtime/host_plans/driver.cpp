// The CUDA driver entry points (declared in host_plans.h), resolved once from libcuda.

#include "host_plans.h"

#include <dlfcn.h>

namespace strictops_host {

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

}  // namespace strictops_host
