import pytest

from pyruntime import backends


@pytest.fixture
def cpu():
    """A CPU backend whose device-side waits give up instead of hanging a broken test.

    30 s, not less: a legitimate cross-stream wait behind real work must not fail on a
    loaded CI machine. Tests of the timeout itself make their own backend with 0.2 s.
    """
    backend = backends.get("cpu", num_threads=2, wait_timeout_s=30.0)
    yield backend
    backend.close()
