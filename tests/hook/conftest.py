"""Shared fixtures: the vllm_ascend fixture package on sys.path, a clean hook each test."""

import logging
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _drop_vllm_ascend():
    for name in [n for n in sys.modules if n == "vllm_ascend" or n.startswith("vllm_ascend.")]:
        del sys.modules[name]


@pytest.fixture
def fixture_pkg(monkeypatch):
    """Put tests/fixtures first on sys.path; forget vllm_ascend modules before and after."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    _drop_vllm_ascend()
    yield FIXTURES
    _drop_vllm_ascend()


@pytest.fixture(autouse=True)
def clean_hook():
    """Every test starts and ends with no installation and an empty hook registry."""
    from pyruntime.hook import activation, registry

    activation.uninstall()
    registry.clear()
    logging.getLogger("pyruntime.hook").setLevel(logging.INFO)
    yield
    activation.uninstall()
    registry.clear()
