"""The transport pool's layout, lease format and contract (:mod:`strictops.ops.transport`)."""
