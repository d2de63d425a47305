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


UPDATE_ENV = "AICPU_TILING_UPDATE_GOLDEN"


class GoldenFiles:
    """``golden(name, text)`` compares ``text`` with the file ``directory/name``.

    A missing or different file fails the test. Only ``AICPU_TILING_UPDATE_GOLDEN=1`` (read
    when the fixture is made) writes the files instead, for review and commit.
    """

    def __init__(self, directory: Path, update: bool) -> None:
        self.directory, self.update = directory, update

    def __call__(self, name: str, text: str) -> None:
        path = self.directory / name
        if self.update:
            path.write_text(text)
            return
        if not path.is_file():
            pytest.fail(f"golden file {path} is missing; create it with {UPDATE_ENV}=1, "
                        "review it and commit it")
        assert text == path.read_text(), f"{name} differs; rerun with {UPDATE_ENV}=1 to accept"


@pytest.fixture
def golden():
    """``golden(name, text)`` against tests/cli/golden/NAME (see :class:`GoldenFiles`)."""
    import os

    return GoldenFiles(GOLDEN, update=os.environ.get(UPDATE_ENV, "").strip() == "1")


def load_json(text: str):
    """Parse CLI JSON output."""
    return json.loads(text)
