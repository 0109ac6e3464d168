"""The build's one compiled part: ``strictops.ops._runtime._host_plans``, the C++ eager fast path
(``ops/_runtime/host_plans/``; ``strictops.ops._runtime.host_path`` says what it does).

It is built against the torch of the build environment, so install without build isolation
(``pip install --no-build-isolation .``). Without torch in the build environment, with
``STRICTOPS_NO_HOST_EXTENSION=1``, or where it fails to compile, the package installs without
it and every eager call takes the Python path.
"""

import glob
import os

from setuptools import setup


def _host_extension():
    if os.environ.get("STRICTOPS_NO_HOST_EXTENSION") == "1":
        return [], {}
    try:
        import triton
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        return [], {}
    cuda_headers = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")
    sources = "ops/_runtime/host_plans"
    extension = CppExtension(
        # One translation unit: module.cpp includes the other files (see its head).
        "strictops.ops._runtime._host_plans", [f"{sources}/module.cpp"],
        include_dirs=[sources, cuda_headers],
        depends=sorted(glob.glob(f"{sources}/*.h") + glob.glob(f"{sources}/*.cpp")),
        extra_compile_args=["-O2"], libraries=["dl"], optional=True)
    return [extension], {"build_ext": BuildExtension.with_options(use_ninja=False)}


_extensions, _commands = _host_extension()
setup(ext_modules=_extensions, cmdclass=_commands)
