"""Where a transport pool's consumer maps the pool: its own device, a peer of the pool's.

The pool lives on the producer's GPU. A consumer on another GPU opens the pool's CUDA IPC handle
with its own device current, which maps the producer GPU's memory into that device's address
space over NVLink (``cudaIpcMemLazyEnablePeerAccess``, as ``torch.multiprocessing`` opens every
handle); the tensor it gets is on the consumer's device, so its stream-memory waits and acks, its
reads and its watchdog's abort kernel all run there and reach the pool's words and bytes through
the mapping. This is how sglang's consumers rebuild the pool (the handle's device redirected to
the consumer's). The publish then has to order the bytes before the ready word at system scope:
a pool made with ``consumers="same_device"`` does not, and refuses such a consumer.
"""

from __future__ import annotations

import inspect

import torch

from strictops.meta.transport.pool import SAME_DEVICE


def device_index(device) -> int:
    """The CUDA device index of ``device`` (an index, ``"cuda:N"``, a ``torch.device``; None:
    the current device)."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"a consumer's device must be a CUDA device, got {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


def check_placement(handle, device: int) -> None:
    """Refuse (``RuntimeError``) a consumer on CUDA device ``device`` that the pool of
    ``handle`` (a :class:`~strictops.ops.transport.producer.PoolHandle`) cannot serve: the pool
    is on another device and was made for consumers on its own device only, or ``device``
    has no peer access to the pool's device."""
    pool = handle.device
    if pool is None or pool == device:
        return
    if handle.consumers == SAME_DEVICE:
        raise RuntimeError(
            f"{handle.name} pool on cuda:{pool} was made with consumers='same_device': its "
            f"publish orders the bytes before the ready word for its own GPU only, not for a "
            f"consumer on cuda:{device}")
    if not torch.cuda.can_device_access_peer(device, pool):
        raise RuntimeError(
            f"{handle.name} consumer on cuda:{device} cannot map the pool on cuda:{pool}: no "
            f"peer access between the two devices (torch.cuda.can_device_access_peer("
            f"{device}, {pool}) is False)")


def open_mapped(handle, device: int) -> torch.Tensor:
    """The pool of ``handle`` mapped on CUDA device ``device``: its IPC handle opened with that
    device current (``reduce_tensor``'s rebuild, its device argument replaced), a uint8 tensor
    on ``device``. torch keeps one mapping per handle and process, so a second consumer of the
    same pool on another device needs a process of its own (``RuntimeError``)."""
    args = list(handle.args)
    args[list(inspect.signature(handle.rebuild).parameters).index("storage_device")] = device
    with torch.cuda.device(device):
        pool = handle.rebuild(*args)
    if pool.get_device() != device:
        raise RuntimeError(f"{handle.name} pool is already mapped on cuda:{pool.get_device()} "
                           f"in this process; a consumer on cuda:{device} needs a process of "
                           f"its own")
    return pool
