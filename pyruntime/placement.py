"""Which tiling placement this machine uses, as the self-check found it.

``aicpu-tiling selfcheck --backend npu`` decides whether a captured AI-CPU task re-runs at
graph replay and saves the answer (``graph`` or ``pre-replay``) in
``~/.cache/aicpu-tiling/placement.json`` (directory: ``$AICPU_TILING_CACHE_DIR``). The
vLLM-Ascend hook reads it back; ``AICPU_TILING_PLACEMENT`` overrides the file.

Example::

    from pyruntime import placement
    placement.save("pre-replay", backend="npu", device="Ascend910B3", evidence="ran 1/8")
    placement.load()        # ("pre-replay", "/root/.cache/aicpu-tiling/placement.json")
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pyruntime.graph_attention.device_tiling import PLACEMENTS

PLACEMENT_ENV = "AICPU_TILING_PLACEMENT"
CACHE_ENV = "AICPU_TILING_CACHE_DIR"
SCHEMA = "aicpu-tiling/placement"


class PlacementError(ValueError):
    """A placement value or the saved placement file is not usable."""


def cache_dir() -> Path:
    """``$AICPU_TILING_CACHE_DIR`` or ``~/.cache/aicpu-tiling``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    return Path(env) if env else Path.home() / ".cache" / "aicpu-tiling"


def placement_file() -> Path:
    return cache_dir() / "placement.json"


def check(value: str) -> str:
    """`value` if it is a placement, else PlacementError naming the choices."""
    if value not in PLACEMENTS:
        raise PlacementError(f"unknown tiling placement {value!r}; choose one of "
                             f"{', '.join(PLACEMENTS)}")
    return value


def save(value: str, *, backend: str, device: str, evidence: str) -> Path:
    """Write the placement file (creating its directory); returns its path.

    Raises:
        PlacementError: unknown placement; OSError: the file cannot be written.
    """
    path = placement_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"schema": SCHEMA, "version": 1, "placement": check(value), "backend": backend,
              "device": device, "evidence": evidence,
              "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def load() -> tuple[str | None, str]:
    """``(placement, where it came from)``, or ``(None, why there is none)``.

    Order: ``AICPU_TILING_PLACEMENT``, then the placement file. A bad value in either is
    reported as the reason, never guessed around.
    """
    env = os.environ.get(PLACEMENT_ENV, "").strip()
    if env:
        try:
            return check(env), f"${PLACEMENT_ENV}"
        except PlacementError as exc:
            return None, f"{PLACEMENT_ENV}: {exc}"
    path = placement_file()
    if not path.is_file():
        return None, (f"no tiling placement has been chosen on this machine ({path} does not "
                      f"exist): run `aicpu-tiling selfcheck --backend npu` or set "
                      f"{PLACEMENT_ENV}=graph|pre-replay")
    try:
        record = json.loads(path.read_text())
        return check(record["placement"]), str(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{path} is not a placement file ({type(exc).__name__}: {exc})"
