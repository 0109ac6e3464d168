"""Stream memory operations through ``cuda-bindings``: wait for and write one 32-bit word in
stream order, with no host polling.

``cuda-bindings`` is an optional dependency (``pip install 'strictops[cuda]'``): it is imported on
the first call, so the package imports, and CPU-only CI runs, without it. Both operations can be
captured in a CUDA graph.
"""

from __future__ import annotations

import functools
import logging

import torch

# CUstreamWaitValue_flags. CU_STREAM_WAIT_VALUE_GEQ, the driver's default, is a cyclic
# greater-or-equal: (int32)(*addr - value) >= 0. A consumer waits for its lease's generation with
# it, so that a watchdog can release the wait by writing an abort word that every generation is
# cyclically below (strictops.ops.transport.producer); the consumer refuses on the host a lease
# older than one it acknowledged, which GEQ alone would let through onto a newer lease's bytes.
# CU_STREAM_WAIT_VALUE_EQ: the producer's own waits (cancel_lease), which nothing aborts.
WAIT_VALUE_GEQ = 0x0
WAIT_VALUE_EQ = 0x1
# CUstreamWriteValue_flags: CU_STREAM_WRITE_VALUE_DEFAULT (the write waits for prior work).
WRITE_VALUE_DEFAULT = 0x0


@functools.cache
def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise ImportError(
            "stream-ordered waits and writes need cuda-bindings: pip install 'strictops[cuda]'"
        ) from exc
    return driver


def _check(result: tuple, call: str) -> None:
    driver = _driver()
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, text = driver.cuGetErrorString(err)
        raise RuntimeError(f"{call} failed: {err.name} ({text.decode() if text else '?'})")


def wait_value32(stream: torch.cuda.Stream, address: int, value: int,
                 flags: int = WAIT_VALUE_EQ) -> None:
    """Block ``stream`` (not the host) until the int32 at device ``address`` equals ``value``
    (``WAIT_VALUE_EQ``) or is cyclically at least ``value`` (``WAIT_VALUE_GEQ``)."""
    with torch.cuda.device(stream.device):
        _check(_driver().cuStreamWaitValue32(stream.cuda_stream, address, value, flags),
               "cuStreamWaitValue32")


def write_value32(stream: torch.cuda.Stream, address: int, value: int) -> None:
    """Write ``value`` to the int32 at device ``address`` once ``stream``'s prior work is done."""
    with torch.cuda.device(stream.device):
        _check(_driver().cuStreamWriteValue32(stream.cuda_stream, address, value,
                                              WRITE_VALUE_DEFAULT),
               "cuStreamWriteValue32")


def relax_capture_mode() -> None:
    """Let the calling thread synchronize and copy to the host while another thread of the
    process captures a CUDA graph (``cuThreadExchangeStreamCaptureMode`` to
    ``CU_STREAM_CAPTURE_MODE_RELAXED``, for this thread only, for good).

    A capture in the default global mode (``torch.cuda.graph``'s ``capture_error_mode``)
    forbids every other thread a potentially unsafe call, such as a synchronous copy to the
    host, and is invalidated by one. The pool's recycler and a consumer's watchdog make such
    calls on streams of their own, which the capture does not touch."""
    driver = _driver()
    relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    _check(driver.cuThreadExchangeStreamCaptureMode(relaxed), "cuThreadExchangeStreamCaptureMode")


def relax_capture_mode_or_warn(logger: logging.Logger, who: str) -> None:
    """:func:`relax_capture_mode` for a background thread ``who`` (e.g. ``"x pool recycler"``);
    where it fails (no cuda-bindings, a driver error) the thread goes on, and ``logger`` warns
    that a CUDA graph captured meanwhile in another thread in the global mode may fail."""
    try:
        relax_capture_mode()
    except Exception:
        logger.warning("%s: capture mode not relaxed; a CUDA graph captured in another thread "
                       "of this process in the global mode may fail", who, exc_info=True)
