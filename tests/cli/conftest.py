"""Fixtures for the CLI, profiler and partitioner tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def cli(capsys):
    """Run ``aicpu-tiling`` in process: ``cli(*argv) -> (code, stdout, stderr)``."""
    from pyruntime.cli import main

    def run(*argv: str):
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def golden():
    """``golden(name, text)``: compare with tests/cli/golden/NAME; UPDATE_GOLDEN=1 rewrites."""
    import os

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if os.environ.get("UPDATE_GOLDEN") or not path.exists():
            path.write_text(text)
        assert text == path.read_text(), f"{name} differs; rerun with UPDATE_GOLDEN=1 to accept"

    return check


def load_json(text: str):
    """Parse CLI JSON output."""
    return json.loads(text)
