"""``--backend cpu|npu|npu-twin`` for ``bench`` and ``profile``: which backend the measured
runs use, and what their times are (issue 32).

* ``cpu``: the CPU backend, an emulation of the device here (the default).
* ``npu``: the NPU backend on an Ascend device through torch_npu.
* ``npu-twin``: the NPU backend's code path on the NPU twin (`pyruntime.npu_twin`), a strict
  CPU stand-in for torch_npu and CANN, activated in this process (once; it cannot be undone),
  as ``selfcheck --backend npu-twin`` does in its child processes. Its AI Cores run our ops'
  C reference bodies (not the Triton bodies under the interpreter, which take far longer).

Times on ``cpu`` and ``npu-twin`` are emulated, never device times: every JSON says so
(`times_note`) and every table title carries `title_note`. On the twin only the counts
(calls, counters, task counts) mean anything about the NPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Callable
from typing import Any

from ._common import CliError

BACKENDS = ("cpu", "npu", "npu-twin")
#: what the times of each backend are, as the JSON states it
TIMES = {
    "cpu": "emulated: the CPU backend runs the device's tasks on host threads here; times are "
           "not device times",
    "npu": "measured on the Ascend device (device lanes from torch_npu's profiler)",
    "npu-twin": "emulated: the NPU twin runs the device's tasks on the host; only counts are "
                "judged, times are not device times",
}
#: what every table title of a backend's run carries
TITLE_NOTE = {"cpu": "emulated, CPU backend", "npu": "NPU", "npu-twin": "emulated, NPU twin"}


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    """Register ``--backend``."""
    p.add_argument("--backend", choices=BACKENDS, default="cpu",
                   help="cpu: the CPU emulation (default); npu: an Ascend NPU through "
                        "torch_npu; npu-twin: the NPU code path on the NPU twin (times "
                        "emulated, counts judged)")


def is_emulated(label: str) -> bool:
    """Whether the times of `label`'s runs are emulated (cpu, npu-twin)."""
    return label != "npu"


def backend_factory(label: str) -> Callable[[], Any] | None:
    """A factory of new backends for ``--backend label`` (None: the default, the CPU backend).

    ``npu-twin`` activates the twin in this process first.

    Raises:
        CliError: ``npu`` without torch_npu, or a twin that cannot start here (says why).
    """
    if label == "cpu":
        return None
    from .. import backends

    if label == "npu":
        if importlib.util.find_spec("torch_npu") is None:
            raise CliError("--backend npu: the npu backend needs torch_npu (and CANN) "
                           "installed; use --backend cpu or npu-twin on machines without an "
                           "Ascend NPU")
    elif label == "npu-twin":
        from .. import npu_twin

        os.environ.setdefault(npu_twin.AICORE_ENV, "reference")
        try:
            npu_twin.activate()
        except npu_twin.TwinUnavailableError as exc:
            raise CliError(f"--backend npu-twin: {exc}") from exc
    else:
        raise CliError(f"--backend: unknown backend {label!r}; choose from {', '.join(BACKENDS)}")
    return lambda: backends.get("npu")
