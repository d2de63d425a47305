"""The README's example runs as written, and its two set-up commands match .ci/run."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
CI = README.parent / ".ci" / "run"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_example_runs(capsys):
    blocks = python_blocks()
    assert blocks, "the README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})  # noqa: S102 - the point
    printed = capsys.readouterr().out
    assert "Segment(core=0, request=0" in printed
    assert "request 1: cu_seqlens_q runs past max_tokens" in printed


def test_ci_runs_the_readme_test_command():
    readme = README.read_text()
    assert 'pip install torch==2.13.0 -e ".[test]" && python -m pytest -q' in readme
    ci = CI.read_text()
    assert "torch==2.13.0" in ci and '-e ".[test]"' in ci
    assert re.search(r"^python3? -m pytest -q$", ci, flags=re.MULTILINE)
