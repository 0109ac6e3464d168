"""The transport pool: tensors handed between processes, and GPUs, through one shared CUDA byte
pool, published in stream order.

- :mod:`.pool`: ``copy_and_publish``, the copy-then-flag op; :mod:`.publish_kernel`: its
  Triton kernel;
- :mod:`.leases`: the lease allocator; :mod:`.producer`: the producer's ``TransportPool``;
  :mod:`.consumer`: the consumers' ``TransportConsumer``;
- :mod:`.faults`: consumer liveness and wait timeouts; :mod:`.peers`: pools mapped on other
  GPUs; :mod:`.cuda_stream`: the driver's stream-memory operations (``cuda-bindings``).

The pool's layout, lease format and contract are :mod:`strictops.meta.transport.pool`.
"""
