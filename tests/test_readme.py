"""The README's fuzzing example runs as written (CPU only: fake CUDA tensors), and CI runs
the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Fuzz your model with the ops' input spaces"


def readme_example() -> str:
    """The first ``python`` code block of the README's fuzzing section."""
    text = README.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.find("\n## ", len(SECTION))]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_fuzzing_example_runs():
    code = readme_example()
    assert "strategies.calls(OP)" in code and "valid=False" in code
    exec(compile(code, f"{README}:fuzzing example", "exec"), {"__name__": "readme_example"})


def test_ci_runs_the_readme_test_commands():
    """``.ci/run`` (what CI runs) runs the README's test commands, verbatim: the pinned
    toolchain's first, then the newest Triton's."""
    lines = (README.parent / ".ci" / "run").read_text().strip().splitlines()
    commands = [line for line in lines if line.startswith("bash .ci/setup")]
    assert commands == ["bash .ci/setup && .venv/bin/pytest",
                        "bash .ci/setup newest && .venv-newest/bin/pytest"]
    assert lines[-2:] == commands
    for command in commands:
        assert f"\n{command}\n" in README.read_text()
