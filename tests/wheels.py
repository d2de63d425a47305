"""The real wheels (and sdists) some tests read (as archives, never installed): where they are
cached and how a test gets one. ``tools/fetch_wheels.sh`` downloads them into
``$AICPU_TILING_WHEEL_CACHE`` (default ``~/.cache/aicpu-tiling/wheels``). Without them a test
skips, except under ``CI=true``, where a missing one fails it: a green CI run has always read
the real wheels."""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WHEEL_CACHE = Path(os.environ.get("AICPU_TILING_WHEEL_CACHE",
                                  Path.home() / ".cache" / "aicpu-tiling" / "wheels"))
TORCH_NPU_WHEEL = "torch_npu-2.10.0.post4-*.whl"
TORCH_WHEEL = "torch-2.10.0-*.whl"
#: Every vllm-ascend release on the index from 0.23.0 to 0.30.0rc2 and what is cached of it:
#: its x86_64 cp311 wheel where the release has one, else its sdist (0.23.0.post1, and every
#: release since 0.27.1rc1, ships only an sdist). ``tools/fetch_wheels.sh`` fetches the same.
VLLM_ASCEND_RELEASES = {
    "0.23.0": "whl", "0.23.0.post1": "sdist", "0.24.0rc1": "whl", "0.25.1rc1": "whl",
    "0.26.0rc1": "whl", "0.27.1rc1": "sdist", "0.28.0rc1": "sdist", "0.29.0rc1": "sdist",
    "0.30.0rc1": "sdist", "0.30.0rc2": "sdist",
}  # fmt: skip


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


def read_wheel_file(glob: str, path: str) -> bytes:
    """The bytes of the file at `path` inside the cached wheel matching `glob`
    (:func:`cached_wheel`: downloaded once if missing, else a skip)."""
    with zipfile.ZipFile(cached_wheel(glob)) as wheel:
        return wheel.read(path)


#: The vLLM environments ``tools/vllm_env.sh`` builds (``.ci/run`` builds them), one folder a
#: release holding ``READY.json``, ``venv/`` and the release's source tree ``vllm-ascend/``.
VLLM_ENVS = Path(os.environ.get("AICPU_TILING_VLLM_ENVS",
                                Path.home() / ".cache" / "aicpu-tiling" / "vllm-envs"))


def vllm_env(release: str) -> Path:
    """The built vLLM environment of vllm-ascend `release`; a skip without it (a failure under
    CI=true)."""
    env = VLLM_ENVS / release
    if not (env / "READY.json").is_file():
        message = (f"no vLLM environment for {release} in {VLLM_ENVS} "
                   f"(tools/vllm_env.sh {release})")
        if wheels_required():
            pytest.fail(f"{message}; CI=true requires it")
        pytest.skip(message)
    return env


def cached_release(version: str) -> Path:
    """The cached wheel or sdist of vllm-ascend `version` (one of VLLM_ASCEND_RELEASES), with
    :func:`cached_wheel`'s rule: downloaded once if missing, else a skip (a failure under CI)."""
    kind = VLLM_ASCEND_RELEASES[version]
    return cached_wheel(f"vllm_ascend-{version}-*.whl" if kind == "whl"
                        else f"vllm_ascend-{version}.tar.gz")  # fmt: skip
