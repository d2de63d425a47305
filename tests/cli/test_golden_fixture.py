"""The golden-text fixture itself: a missing or different golden file fails, never self-heals."""

from __future__ import annotations

import pytest

from .conftest import GoldenFiles


def test_a_missing_golden_file_fails_and_is_not_written(tmp_path, golden):
    golden.directory = tmp_path  # the real fixture, pointed at an empty folder
    golden.update = False
    with pytest.raises(pytest.fail.Exception, match="missing; create it with "
                       "AICPU_TILING_UPDATE_GOLDEN=1"):
        golden("table.txt", "rendered\n")
    assert not (tmp_path / "table.txt").exists()


def test_a_different_golden_file_fails(tmp_path):
    (tmp_path / "table.txt").write_text("old\n")
    with pytest.raises(AssertionError, match="table.txt differs"):
        GoldenFiles(tmp_path, update=False)("table.txt", "new\n")
    GoldenFiles(tmp_path, update=False)("table.txt", "old\n")  # equal text passes


def test_update_writes_then_compares_equal(tmp_path):
    GoldenFiles(tmp_path, update=True)("table.txt", "rendered\n")
    assert (tmp_path / "table.txt").read_text() == "rendered\n"
    GoldenFiles(tmp_path, update=False)("table.txt", "rendered\n")


@pytest.mark.parametrize("value, update", [("1", True), ("", False), ("0", False)])
def test_only_the_explicit_variable_updates(monkeypatch, request, value, update):
    monkeypatch.setenv("AICPU_TILING_UPDATE_GOLDEN", value)
    monkeypatch.delenv("UPDATE_GOLDEN", raising=False)
    assert request.getfixturevalue("golden").update is update
