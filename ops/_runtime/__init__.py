"""The eager runtime every op family shares (private).

- :mod:`.dispatch`: when a public op may skip the PyTorch dispatcher;
- :mod:`.launcher`: cached launches of compiled Triton and Gluon kernels;
- :mod:`.triton_abi`: the running Triton's launcher layout, verified per kernel;
- :mod:`.host_path` and ``host_plans/`` (the C++ extension ``_host_plans``): eager calls
  replayed in C++ from a plan per call signature;
- :mod:`.kernel_path`: the launch paths of an op that launches one Triton kernel;
- :mod:`.interpret`: kernels run in the Triton interpreter on CPU tensors;
- :mod:`.gluon_compat`: the Gluon API differences between Triton releases.
"""
