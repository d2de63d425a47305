"""The vLLM environments hold exactly their locks (``tools/vllm-env-locks/RELEASE.txt``).

``tools/vllm_env.sh`` installs what its steps resolve on the day, then puts every package at
the lock's version and removes what the lock does not name (``step_lock``), so a build on a
fresh machine holds what the environment the whole suite passed in held. These tests read a
built environment's distributions with its own interpreter and compare them with the lock:
a difference is drift (a build without the lock, or a package installed into the venv by
hand) that the suite's other results would silently depend on.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.wheels import vllm_env

REPO = Path(__file__).resolve().parents[1]
LOCKS = REPO / "tools" / "vllm-env-locks"
RELEASES = ("0.23.0.post1", "0.30.0rc2")
#: what a lock never pins: torch (the recipe's own pin), vLLM (built from its sdist), pip
UNLOCKED = {"torch", "vllm", "pip"}

INSTALLED = r'''
import json
from importlib import metadata
print(json.dumps({d.metadata["Name"]: d.version for d in metadata.distributions()}))
'''


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(release: str) -> dict[str, str]:
    pins = {}
    for line in (LOCKS / f"{release}.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        assert sep and name and version and " " not in line, f"not an exact pin: {line!r}"
        assert _norm(name) not in pins, f"pinned twice: {name}"
        pins[_norm(name)] = version
    return pins


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_has_a_lock_of_exact_pins_without_what_the_recipe_pins_itself(release):
    pins = _lock(release)
    assert not UNLOCKED & set(pins)
    # what vLLM-Ascend's tests and our twin need is in it, at one version each
    assert {"transformers", "triton", "ziglang", "unicorn", "pytest"} <= set(pins)


@pytest.mark.parametrize("release", RELEASES)
def test_the_built_environment_holds_exactly_its_lock(release):
    env_dir = vllm_env(release)
    stamp = json.loads((env_dir / "READY.json").read_text())
    # from the environment's folder: the working directory is on sys.path, and a checkout's
    # aicpu_tiling.egg-info there would count as installed
    proc = subprocess.run([str(env_dir / "venv" / "bin" / "python"), "-c", INSTALLED],
                          capture_output=True, text=True, cwd=env_dir, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    installed = {_norm(name): version for name, version in json.loads(proc.stdout).items()
                 if _norm(name) not in UNLOCKED}
    pins = _lock(release)
    assert stamp.get("lock") not in (None, "none"), \
        f"{release}'s environment was built without its lock: {stamp}"
    drift = {name: (pins.get(name), installed.get(name))
             for name in set(pins) | set(installed) if pins.get(name) != installed.get(name)}
    assert drift == {}, f"(lock, installed) where they differ: {drift}"
