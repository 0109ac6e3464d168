"""The three launch paths of an op whose body validates its arguments and launches one Triton
kernel on them (the Mamba state scatter, the conv-window scatter and its multi-pair form).

- :func:`KernelPath.launch`: ``kernel[grid]`` with a JIT, wrapped (traced) or interpreted
  kernel, the grid and arguments from the op's ``arguments`` function, tuning passed to it;
- :func:`KernelPath.forward`: the contract in full, then that launch (on the launch tensor's
  device when the launch is real): the op's body, also its fake;
- :func:`KernelPath.eager`: a plain eager call's path, the contract's verdict cached per
  metadata signature and the launch through the cached launcher, with the same rules and the
  same launch (docs/design/eager_host_cost.md); with ``writes`` given, a call it served also
  leaves a plan of its signature for the C++ path (:attr:`KernelPath.host`, see
  :mod:`strictops.ops._runtime.host_path`).
"""

from __future__ import annotations

import operator
from typing import Callable

from strictops.meta._contract import CachedValidation, Contract

from strictops.ops._runtime.dispatch import on_device_of
from strictops.ops._runtime.host_path import HostPath
from strictops.ops._runtime.launcher import Launcher, keyword_constexprs

__all__ = ["KernelPath"]


class KernelPath:
    """The launch paths of ``jit_fn`` for an op with ``contract`` (its arguments named
    ``names``): ``arguments(*op_args, **tuning)`` returns the grid and every kernel parameter
    in signature order, on validated inputs; ``launch_tensor(op_args)`` the tensor on whose
    device the kernel runs (by default the first argument); ``writes`` the names of the
    arguments the op writes, or a function of the arguments that returns the tensors it writes,
    for an op that returns None and takes the C++ path (:attr:`host`; None without
    ``writes``); ``settings`` the ``(namespace, name)`` of module
    settings the launch depends on (see :meth:`HostPath.register`)."""

    def __init__(self, jit_fn, contract: Contract, names: tuple[str, ...],
                 arguments: Callable, num_warps: int,
                 launch_tensor: Callable = operator.itemgetter(0),
                 writes: tuple[str, ...] | Callable | None = None, settings: tuple = ()) -> None:
        self.jit_fn = jit_fn
        self.contract = contract
        self.arguments = arguments
        self.num_warps = num_warps
        self.launch_tensor = launch_tensor
        self.validation = CachedValidation(contract, names)
        self.launcher = Launcher(jit_fn)
        self.options = (("num_warps", num_warps),)
        self.host = None if writes is None else HostPath(self.validation, writes)
        self.settings = settings
        self.eager = self._eager_function()

    def launch(self, kernel, *args, num_warps: int | None = None, **tuning) -> None:
        """Launch ``kernel`` (``jit_fn`` itself, wrapped or interpreted) on validated ``args``."""
        grid, parameters = self.arguments(*args, **tuning)
        runtime, constexprs = keyword_constexprs(self.jit_fn, parameters)
        kernel[grid](*runtime, **constexprs,
                     num_warps=self.num_warps if num_warps is None else num_warps)

    def forward(self, kernel, real_launch: bool, *args) -> None:
        """Validate in full, then launch (on the launch tensor's device when the launch is
        real)."""
        self.contract.validate(**dict(zip(self.validation.names, args)))
        with on_device_of(self.launch_tensor(args), real_launch):
            self.launch(kernel, *args)

    def _eager_function(self):
        # A closure: the hot path reads no attribute of ``self``.
        validation, arguments, launcher, options, launch_tensor, host, settings = (
            self.validation, self.arguments, self.launcher, self.options, self.launch_tensor,
            self.host, self.settings)

        def eager(*args) -> None:
            """The plain eager call: the cached verdict, then the cached launch."""
            validation(*args)
            grid, parameters = arguments(*args)
            device = launch_tensor(args).get_device()
            launcher(grid, parameters, options, device)
            if host is not None:
                host.register(args, launcher, grid, parameters, options, device,
                              settings=settings)

        return eager
