import pytest

from pyruntime import backends


@pytest.fixture
def cpu():
    """A CPU backend whose device-side waits give up after 2 s instead of hanging."""
    backend = backends.get("cpu", num_threads=2, wait_timeout_s=2.0)
    yield backend
    backend.close()
