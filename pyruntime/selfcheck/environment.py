"""What the self-check reports about the machine: Python, torch, CANN, torch_npu, the SoC
and its AI Core and AI-CPU counts, where they can be found without side effects."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
from pathlib import Path
from typing import Any

#: environment variables CANN's set_env.sh exports (the first that is set wins)
CANN_HOME_ENVS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")


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


def environment(backend: str, npu: Any = None) -> dict[str, Any]:
    """The environment block of the report."""
    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(),
        "machine": platform.machine(), "cpus": os.cpu_count(),
        "torch": _version("torch"), "torch_npu": _version("torch_npu"),
        "triton": _version("triton") or _version("triton-ascend"), "cann": cann(),
    }
    if backend == "npu" and npu is not None:
        env["device"] = npu_device(npu)
    else:
        env["device"] = {"soc": None, "reason": "the CPU backend emulates the NPU; no device"}
    return env
