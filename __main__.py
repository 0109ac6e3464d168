"""``python -m strictops``: the self-check. See :mod:`strictops.ops.selfcheck`."""

from strictops.ops.selfcheck import main

if __name__ == "__main__":
    raise SystemExit(main())
