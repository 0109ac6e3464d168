"""The contract of sparse MLA prefill (:mod:`strictops.ops.sparse_mla`)."""
