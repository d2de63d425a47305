"""What every check shares: the backend to test, how to make more of it, the request trace."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pyruntime.workload.synthetic import synthetic_requests
from pyruntime.workload.trace import TraceError, load_trace


@dataclasses.dataclass
class Context:
    """Args:
        backend: ``"cpu"`` or ``"npu"``.
        make_backend: ``make_backend(**options)`` returns a new backend of that name (the
            CPU backend takes ``replay_aicpu``).
        quick: fewer steps everywhere (tests).
        npu: the ``torch.npu`` module (NPU only), for device queries and FIA.
        build: build our NPU kernels when they are missing (``--build``).
    Attributes:
        placement: set by the ``aicpu_replay`` check; later checks use it.
    """

    backend: str
    make_backend: Callable[..., Any]
    quick: bool = False
    npu: Any = None
    placement: str | None = None
    kernels_ready: bool = True
    build: bool = False
    _requests: list | None = None
    requests_source: str = ""

    def requests(self) -> list:
        """Trace requests (the Azure trace if found, else a synthetic long-tail stand-in)."""
        if self._requests is None:
            try:
                self._requests = load_trace(limit=800)
                self.requests_source = "Azure LLM trace 2023 (conversation), first 800 requests"
            except TraceError as exc:
                self._requests = synthetic_requests("long_tail", 400, max_context=600,
                                                    max_generated=24, seed=0)
                self.requests_source = f"synthetic long-tail requests ({exc})"
        return self._requests
