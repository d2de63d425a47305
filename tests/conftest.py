"""Suite-wide settings.

Triton: the interpreter is on for the whole run (``TRITON_INTERPRET=1``, see below).

Hypothesis: no deadlines and no too-slow health check anywhere (the machines are shared and
timing is not what these properties test). Under CI (``CI`` set) examples are derandomized,
so a run is reproducible from the commit alone; by hand the search stays random.
"""

import os

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
