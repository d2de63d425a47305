"""Suite-wide settings.

Hypothesis: no deadlines and no too-slow health check anywhere (the machines are shared and
timing is not what these properties test). Under CI (``CI`` set) examples are derandomized,
so a run is reproducible from the commit alone; by hand the search stays random.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "aicpu-tiling",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("aicpu-tiling")
