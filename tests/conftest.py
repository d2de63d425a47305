"""Suite-wide settings.

Triton: the interpreter is on for the whole run (``TRITON_INTERPRET=1``, see below).

Parallel runs: ``python -m pytest`` runs on one pytest-xdist worker per CPU
(``-n auto --dist loadgroup`` in pyproject.toml; ``-n 0`` runs in one process). Tests are
handed out one by one, except that the tests of a module with a module-scoped fixture stay
together on one worker (`pytest_collection_modifyitems` below), so the fixture is built once.
A test marked ``alone`` (it judges host time) runs while no other test runs (`tests/alone.py`).

Hypothesis: no deadlines and no too-slow health check anywhere (the machines are shared and
timing is not what these properties test). Under CI (``CI`` set) examples are derandomized,
so a run is reproducible from the commit alone; by hand the search stays random.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

# The Triton AI Core kernels run under Triton's interpreter here. @triton.jit reads
# TRITON_INTERPRET when a module defining kernels is imported, triton's own language helpers
# included, and torch imports triton by itself (FakeTensorMode does), so it must be set
# before anything is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "aicpu-tiling",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("aicpu-tiling")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Group each module whose tests share a module-scoped fixture (`xdist_group`)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = any(defs and defs[-1].scope == "module"
                     for name, defs in info.name2fixturedefs.items()
                     if name in item.fixturenames)
        if shared:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(autouse=True)
def _alone_or_beside_others(request):
    """``alone`` tests hold the run's lock exclusively, every other test shared."""
    from tests.alone import holding

    with holding(exclusive=request.node.get_closest_marker("alone") is not None):
        yield
