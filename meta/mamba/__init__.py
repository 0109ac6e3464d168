"""The contracts of the Mamba family (:mod:`strictops.ops.mamba`)."""
