"""The real wheels some tests read (as zips, never installed): where they are cached and how
a test gets one. ``tools/fetch_wheels.sh`` downloads them into ``$AICPU_TILING_WHEEL_CACHE``
(default ``~/.cache/aicpu-tiling/wheels``). Without them a test skips, except under
``CI=true``, where a missing wheel fails it: a green CI run has always read the real wheels."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WHEEL_CACHE = Path(os.environ.get("AICPU_TILING_WHEEL_CACHE",
                                  Path.home() / ".cache" / "aicpu-tiling" / "wheels"))
TORCH_NPU_WHEEL = "torch_npu-2.10.0.post4-*.whl"
TORCH_WHEEL = "torch-2.10.0-*.whl"


def wheels_required() -> bool:
    """True under CI (``CI=true``, as CI services set it): a missing wheel is then a failure."""
    return os.environ.get("CI", "").strip().lower() == "true"


def cached_wheel(glob: str) -> Path:
    """The newest cached wheel matching `glob`, downloading the set once if it is missing."""
    found = sorted(WHEEL_CACHE.glob(glob))
    if not found:
        subprocess.run(["bash", str(REPO / "tools" / "fetch_wheels.sh")], capture_output=True,
                       check=False, timeout=900)  # fmt: skip
        found = sorted(WHEEL_CACHE.glob(glob))
    if not found:
        message = f"wheel {glob} not in {WHEEL_CACHE} and could not be downloaded"
        if wheels_required():
            pytest.fail(f"{message}; CI=true requires it (run tools/fetch_wheels.sh)")
        pytest.skip(message)
    return found[-1]
