"""What every check shares: the backend to test, how to make more of it, the request trace."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pyruntime.workload.synthetic import synthetic_requests
from pyruntime.workload.trace import TraceError, load_trace

#: the ``--backend`` names: ``npu-twin`` is the NPU backend on the NPU twin
#: (`pyruntime.npu_twin`), so its checks take the ``npu`` code path
BACKEND_LABELS = ("cpu", "npu", "npu-twin")

#: the directory the NPU twin keeps device state in that outlives one process (a lost
#: device); the selfcheck sets it once per run so that every child sees the same device
TWIN_STATE_ENV = "AICPU_TILING_TWIN_STATE"
#: what the child processes carry over from one check to the next (see `Context.carried`)
CARRIED_FIELDS = ("placement", "kernels_ready", "requests_source")


@dataclasses.dataclass
class Context:
    """Args:
        backend: ``"cpu"`` or ``"npu"``: the code path the check bodies take. On the NPU
            twin it is ``"npu"`` too, so the bodies cannot tell the twin from a device.
        make_backend: ``make_backend(**options)`` returns a new backend of that name (the
            CPU backend takes ``replay_aicpu``).
        quick: fewer steps everywhere (tests).
        npu: the ``torch.npu`` module (NPU only), for device queries and FIA.
        build: build our NPU kernels when they are missing (``--build``).
        twin: the NPU backend runs on the NPU twin (``--backend npu-twin``); only what is
            reported, and checks that need a real device (stock FIA numerics), look at it.
        twin_fault: the fault injected into the twin (``--twin-fault``), or None.
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
    twin: bool = False
    twin_fault: str | None = None
    _requests: list | None = None
    requests_source: str = ""

    @property
    def report_backend(self) -> str:
        """The backend as reported (JSON ``backend``): ``cpu``, ``npu`` or ``npu-twin``."""
        return "npu-twin" if self.twin else self.backend

    def carried(self) -> dict[str, Any]:
        """What later checks need from earlier ones, as JSON (parent <-> child process)."""
        return {field: getattr(self, field) for field in CARRIED_FIELDS}

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


def _no_device_here(**options: Any) -> Any:
    raise RuntimeError("this process must not open the device: on npu and npu-twin every "
                       "check runs in its own child process (pyruntime.selfcheck.child)")


def make_context(label: str, *, quick: bool = False, build: bool = False,
                 twin_fault: str | None = None, open_device: bool = True) -> Context:
    """The context for ``--backend label``.

    Args:
        label: one of `BACKEND_LABELS`.
        open_device: False in the parent of the child processes on ``npu``/``npu-twin``:
            the parent then never imports torch_npu nor activates the twin, and a check run
            in it by mistake fails at ``make_backend`` instead of opening the device.
            True makes the backend (in a child, or on ``cpu``).

    Raises:
        BackendError: ``npu`` without torch_npu (only with ``open_device``).
    """
    from pyruntime import backends

    if label not in BACKEND_LABELS:
        raise ValueError(f"unknown backend {label!r}; choose one of {BACKEND_LABELS}")
    if label == "cpu":
        def make_cpu(**options: Any) -> Any:
            return backends.get("cpu", num_threads=2, wait_timeout_s=120.0, **options)

        return Context("cpu", make_cpu, quick=quick, build=build)
    twin = label == "npu-twin"
    if not open_device:
        return Context("npu", _no_device_here, quick=quick, build=build, twin=twin,
                       twin_fault=twin_fault)
    first = backends.get("npu")  # imports torch_npu (the twin's, after activate); no device yet
    return Context("npu", lambda **options: backends.get("npu", **options), quick=quick,
                   npu=first.npu, build=build, twin=twin, twin_fault=twin_fault)


def twin_faults() -> dict[str, str] | None:
    """``pyruntime.npu_twin.FAULTS`` (fault name -> one-line description), or None when this
    build has no NPU twin. Imported here, lazily: the twin is needed only for
    ``--backend npu-twin`` and its help."""
    import importlib.util

    # find_spec, not a caught ImportError: a twin that is there but broken must say so. An
    # empty folder of that name elsewhere on the path is a namespace package (no origin),
    # not a twin.
    spec = importlib.util.find_spec("pyruntime.npu_twin")
    if spec is None or spec.origin is None:
        return None
    from pyruntime import npu_twin

    return dict(npu_twin.FAULTS)
