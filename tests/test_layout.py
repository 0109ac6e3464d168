"""The source tree as a reader finds it: one folder per op family under ``ops/`` and ``meta/``
alike, and no source file too long to read in one sitting."""

from __future__ import annotations

from pathlib import Path

import strictops.ops
from strictops.meta import CONTRACTS

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 700


def test_families_are_folders():
    """Each op module sits in its family's folder, under ops/ and meta/ alike."""
    for op, module in strictops.ops.OP_MODULES.items():
        family, name = CONTRACTS[op].module.split(".")
        assert module.__name__ == f"strictops.ops.{family}.{name}"
        assert module.contract.__name__ == f"strictops.meta.{family}.{name}"


def test_no_source_file_over_the_line_limit():
    sources = [p for folder in ("ops", "meta") for p in (ROOT / folder).rglob("*")
               if p.suffix in (".py", ".cpp", ".h")]
    assert len(sources) > 30
    long = {str(p.relative_to(ROOT)): n for p in sources
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
