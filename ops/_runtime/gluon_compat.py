"""The Gluon names that differ between the Tritons strictops supports (3.6 to 3.9), each
resolved once from what the running ``triton.experimental.gluon`` has (feature detection, never
a version string). The sm_90 sparse MLA kernels (``gluon_shared_s``, ``gluon_block_pair``,
``gluon_transpose``) call these instead of the names themselves; each is the builtin of
this Triton, so a kernel compiles to what it compiled to with the name written out.

- ``thread_barrier()``: the barrier of every thread of the CTA (``bar.sync``):
  ``gl.thread_barrier()`` on 3.6; from 3.7 ``gl.barrier()``, whose default ``cluster=False``
  lowers to the same barrier (both are the semantic's ``debug_barrier``).
- ``reinterpret(smem, dtype, shape, layout)``: a shared-memory descriptor viewed with another
  element type, shape and layout (the same bytes): ``smem._reinterpret`` up to 3.8,
  ``smem.reinterpret`` from 3.9.
- ``async_load(smem, pointer, mask=None)``: ``cp.async`` copies from global to shared memory,
  a false mask writing zeros: ``async_copy.async_copy_global_to_shared`` up to 3.7,
  ``async_copy.async_load`` from 3.8 (on 3.9 the old name raises when called).
- ``tma_store(descriptor, coordinates, smem)``: an asynchronous TMA store of a shared-memory
  box: ``tma.async_copy_shared_to_global`` on 3.6, ``tma.async_store`` where it exists (on 3.9
  the old name raises when called).

Importing this module needs Gluon's Hopper API (``ImportError`` otherwise), as the kernels do.
"""

from __future__ import annotations

from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import tma

__all__ = ["async_load", "reinterpret", "thread_barrier", "tma_store"]

thread_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
reinterpret = (gl.shared_memory_descriptor.reinterpret
               if hasattr(gl.shared_memory_descriptor, "reinterpret")
               else gl.shared_memory_descriptor._reinterpret)
async_load = (async_copy.async_load if hasattr(async_copy, "async_load")
              else async_copy.async_copy_global_to_shared)
tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global
