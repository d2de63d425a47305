"""How the vLLM-Ascend hook finds the engine it captures into (`load_engine`).

Fallback guarantee: `load_engine` returns ``(None, reason)`` when our kernels cannot be
imported, no supported Ascend device is present, or the NPU engine cannot be made (no
placement chosen, our NPU kernels not built). The patch set then patches nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

from .engine import ENGINE_ENV, SUPPORTED_SOCS, TilingEngine
from .errors import ActivationError


def _from_env(spec: str) -> TilingEngine:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ActivationError(f"{ENGINE_ENV}={spec!r} is not of the form 'package.module:callable'")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory()


def _npu_device_reason() -> str | None:
    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed, so no Ascend device can be used"
    import torch
    import torch_npu  # noqa: F401 - registers torch.npu

    if not torch.npu.is_available():
        return "no Ascend NPU is available (torch.npu.is_available() is False)"
    soc = str(torch.npu.get_device_name())
    if not soc.startswith(SUPPORTED_SOCS):
        return f"device {soc} is not supported (supported: {', '.join(SUPPORTED_SOCS)}*)"
    return None


def load_engine() -> tuple[TilingEngine | None, str | None]:
    """Find the engine to capture into; returns ``(engine, None)`` or ``(None, reason)``.

    Order: the factory named by ``AICPU_TILING_ENGINE``; otherwise our kernels
    (``pyruntime.tiling``) must import, a supported NPU must be present, and the
    NPU engine must be made on the ``"npu"`` backend (`npu_engine.vllm_tiling_engine`): a placement chosen by
    ``aicpu-tiling selfcheck --backend npu`` (or ``AICPU_TILING_PLACEMENT``), our NPU
    kernels built and loadable. Any failure is returned as the reason.

    Raises:
        ActivationError: ``AICPU_TILING_ENGINE`` is set but malformed.
    """
    spec = os.environ.get(ENGINE_ENV, "").strip()
    if spec:
        return _from_env(spec), None
    try:
        importlib.import_module("pyruntime.tiling")
    except Exception as exc:  # noqa: BLE001 - any failure means: do not patch
        return None, f"our tiling kernels cannot load ({type(exc).__name__}: {exc})"
    try:
        reason = _npu_device_reason()
    except Exception as exc:  # noqa: BLE001
        return None, f"the Ascend device could not be queried ({type(exc).__name__}: {exc})"
    if reason is not None:
        return None, reason
    try:
        backend = importlib.import_module("pyruntime.backends").get("npu")
    except Exception as exc:  # noqa: BLE001
        return None, f"no NPU backend is available ({type(exc).__name__}: {exc})"
    try:
        from .npu_engine import vllm_tiling_engine

        return vllm_tiling_engine(backend), None
    except Exception as exc:  # noqa: BLE001 - any failure means: do not patch, say why
        return None, f"the NPU tiling engine is not available: {exc}"
