"""The rule of `tests.wheels`: a missing wheel or sdist is downloaded once, then skips the
test, or fails it under ``CI=true`` (a green CI run has always read the real sources)."""

from __future__ import annotations

import subprocess

import pytest

import tests.wheels
from tests.wheels import cached_release, cached_wheel


@pytest.mark.parametrize("fetch, name", [
    (lambda: cached_wheel("vllm_ascend-0.23.0-*.whl"), r"vllm_ascend-0\.23\.0-\*\.whl"),
    (lambda: cached_release("0.30.0rc2"), r"vllm_ascend-0\.30\.0rc2\.tar\.gz"),
], ids=["wheel", "sdist"])
@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception),
                                         ("", pytest.skip.Exception)])
def test_a_missing_archive_fails_under_ci_and_skips_elsewhere(monkeypatch, tmp_path, ci,
                                                               outcome, fetch, name):
    calls = []
    monkeypatch.setattr(tests.wheels, "WHEEL_CACHE", tmp_path)  # empty cache
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))  # download fails
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=rf"{name} .*could not be downloaded"):
        fetch()
    assert len(calls) == 1  # it did try the download first
