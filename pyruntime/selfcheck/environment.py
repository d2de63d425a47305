"""What the self-check reports about the machine: Python, torch, CANN, torch_npu,
``TASK_QUEUE_ENABLE``, the SoC and its AI Core and AI-CPU counts, where they can be found
without side effects.

On ``npu`` and ``npu-twin`` the device part is read in the checks' child processes
(`device_environment`, after the check has run), never in the parent: reading the device
properties opens a device context, and the parent must not hold the device while its children
use it, nor open it before the first check does (that would hide a check that touches the
device before ``set_device``, which the twin refuses as torch_npu does).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from pathlib import Path
from typing import Any

#: environment variables CANN's set_env.sh exports (the first that is set wins)
CANN_HOME_ENVS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")
#: torch_npu's task queue level; 2 (vLLM-Ascend's tuning advice) makes it refuse graph capture
TASK_QUEUE_ENV = "TASK_QUEUE_ENABLE"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cann() -> dict[str, Any]:
    """CANN's home and version (from ``<home>/*/version.cfg`` or ``version.info``), or why
    none was found."""
    for env in CANN_HOME_ENVS:
        home = os.environ.get(env, "").strip()
        if not home:
            continue
        root = Path(home)
        for candidate in (root / "version.cfg", root / "version.info",
                          *sorted(root.glob("*/version.cfg")), *sorted(root.glob("*/version.info"))):
            if candidate.is_file():
                text = candidate.read_text(errors="replace")
                match = re.search(r"(?:version|Version)\s*[=:]\s*\[?([\w.\-]+)", text)
                return {"home": str(root), "version": match.group(1) if match else None}
        return {"home": str(root), "version": None}
    return {"home": None, "version": None,
            "reason": f"none of {', '.join(CANN_HOME_ENVS)} is set (source <CANN>/set_env.sh)"}


def npu_device(npu: Any) -> dict[str, Any]:
    """SoC name and core counts from a live ``torch.npu`` (torch_npu imported)."""
    info: dict[str, Any] = {"soc": str(npu.get_device_name())}
    try:
        props = npu.get_device_properties(npu.current_device())
        info["ai_cores"] = getattr(props, "cube_core_num", None)
        info["vector_cores"] = getattr(props, "vector_core_num", None)
    except Exception as exc:  # noqa: BLE001 - a report, not a requirement
        info["ai_cores"] = None
        info["cores_reason"] = f"{type(exc).__name__}: {exc}"
    # torch_npu exposes no AI-CPU count; docs/design.md section 7 quotes 6 (910B2) / 7 (910B3/B4)
    info["aicpu_cores"] = None
    info["aicpu_reason"] = "torch_npu exposes no AI-CPU count (npu-smi info -t aicpu shows it)"
    return info


def device_environment() -> dict[str, Any]:
    """In a check's child process, after the check: the device block and the torch_npu
    version this process imported (the twin's stand-in has no package metadata)."""
    import sys

    import torch

    module = sys.modules.get("torch_npu")
    try:
        device = npu_device(torch.npu)
    except Exception as exc:  # noqa: BLE001 - e.g. the device is lost: a report, not a check
        device = {"soc": None, "reason": f"{type(exc).__name__}: {exc}"}
    return {"device": device, "torch_npu": getattr(module, "__version__", None)}


def environment(backend: str, npu: Any = None) -> dict[str, Any]:
    """The environment block of the report.

    Args:
        backend: as reported (``cpu``, ``npu``, ``npu-twin``).
        npu: a live ``torch.npu`` to read the device from; without it, on ``npu`` and
            ``npu-twin`` the device block says it is read in the child processes (the
            parent fills it in from the first child that reports one).
    """
    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(),
        "machine": platform.machine(), "cpus": os.cpu_count(),
        "torch": _version("torch"), "torch_npu": _version("torch_npu"),
        "triton": _version("triton") or _version("triton-ascend"), "cann": cann(),
        TASK_QUEUE_ENV: os.environ.get(TASK_QUEUE_ENV),
    }
    if backend in ("npu", "npu-twin") and npu is not None:
        env["device"] = npu_device(npu)
    elif backend in ("npu", "npu-twin"):
        env["device"] = {"soc": None, "reason": "read in the checks' child processes; none "
                                                "has reported it yet"}
    else:
        env["device"] = {"soc": None, "reason": "the CPU backend emulates the NPU; no device"}
    return env
