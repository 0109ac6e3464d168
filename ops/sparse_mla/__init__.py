"""Sparse MLA prefill with FP8 Q and KV (DeepSeek-V3.2): ``sparse_mla_q8kv8_prefill_fwd``.

- :mod:`.prefill`: the op, its portable Triton kernel and its reference;
- :mod:`.sm90`: which warp-specialised Gluon kernel runs on sm_90, and its launches;
- :mod:`.gluon_block_pair`, :mod:`.gluon_shared_s`: the two Gluon kernels;
- :mod:`.gluon_transpose`: the on-chip Vᵀ transpose they share.

The contract is :mod:`strictops.meta.sparse_mla.prefill`.
"""
