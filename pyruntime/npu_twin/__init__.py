"""The NPU twin: a strict emulation of the parts of torch_npu and CANN that our NPU code uses,
so that code runs, unmodified, on a machine without an NPU.

``activate()`` makes ``device="npu"`` real in this process (torch's PrivateUse1 backend renamed
``npu``: plain ``torch.Tensor`` objects over host memory whose aten ops reach the twin's rules
through one boxed fallback, `pyruntime.npu_twin.plain_tensors`; ``AICPU_TILING_TWIN_TENSORS=wrapper``
chooses the older wrapper-subclass layer, `device.NpuTensor`, for one more round), installs ``torch.npu`` and a ``torch_npu`` module with torch_npu 2.10.0.post4's
signatures, the twin of our torch_npu extension (``plan_tiling`` with the checks of
``plan_tiling_op.cpp`` and the AI-CPU binary loader's naming rule), Triton-Ascend's launch
seam (kernels run under Triton's interpreter) and a stand-in FIA. Its rules and where they
come from: `pyruntime.npu_twin.device`. After it, ``pyruntime.backends.get("npu")`` is the
real NPU backend, on the twin.

What the twin is not: a performance model (work runs when the host synchronises), a model
of CANN's AI-CPU scheduler, or evidence about hardware. What it proves is that the NPU code
path obeys the documented rules; what only hardware can answer (does a replay re-run a
captured AI-CPU task?) stays a question, asked by ``aicpu-tiling selfcheck --backend npu``.

Faults (``activate(fault=...)``), for proving that the self-check reports them: see `FAULTS`.
Activation is once per process and cannot be undone (torch's PrivateUse1 backend is renamed
once); tests run the twin in subprocesses.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path

#: fault name -> what it does
FAULTS: dict[str, str] = {
    "no-aicpu-replay": "graph replay does not re-run captured AI-CPU tasks (the self-check "
                       "must choose placement pre-replay)",
    "device-lost": "the device dies at the first AI Core kernel it runs and stays lost, for "
                   "this process and every later one sharing the twin's state directory",
    "capture-refused": "graph capture is refused as with TASK_QUEUE_ENABLE=2",
    "kernel-missing": "the AI-CPU binary (libaicpu_tiling_runtime.so) is not installed "
                      "beside its op-info JSON",
    "stale-aicpu-read": "the AI-CPU task reads its inputs as they were before the last AI "
                        "Core task that wrote them (the self-check's stale_read must fail)",
    "old-cann": "the CANN runtime is 8.2.RC1, whose ACL library has no "
                "aclrtLaunchKernelWithHostArgs: loading our kernels fails in one line naming "
                "that version (review 2 item 6)",
}
STATE_ENV = "AICPU_TILING_TWIN_STATE"
#: the tensor layer: ``plain`` (the default: `pyruntime.npu_twin.plain_tensors`, plain
#: torch.Tensors on PrivateUse1, which Dynamo traces and vLLM's parameter subclasses keep) or
#: ``wrapper`` (opt-in: `device.NpuTensor`, a wrapper subclass; the same rules)
TENSORS_ENV = "AICPU_TILING_TWIN_TENSORS"
TENSOR_LAYERS = ("plain", "wrapper")
DEFAULT_TENSORS = "plain"
#: ``triton`` (default: our AI Core ops run their Triton bodies, interpreted) or
#: ``reference`` (they run their CPU body, the C reference attention, as an AI Core task)
AICORE_ENV = "AICPU_TILING_TWIN_AICORE"
REPO = Path(__file__).resolve().parents[2]
OP_INFO_JSON = REPO / "aicpu_kernels" / "npu_ext" / "libaicpu_tiling_runtime.json"
EXTENSION_NAME = "libaicpu_tiling_npu.so"

_active: str | None = None
_activated = False


class TwinUnavailableError(RuntimeError):
    """The twin cannot start here (says why and what to do)."""


def is_active() -> bool:
    return _activated


def tensor_layer() -> str:
    """The tensor layer `activate` installs: ``AICPU_TILING_TWIN_TENSORS``, ``plain`` when
    unset or empty.

    Raises:
        ValueError: any other value than ``plain`` or ``wrapper``.
    """
    chosen = os.environ.get(TENSORS_ENV) or DEFAULT_TENSORS
    if chosen not in TENSOR_LAYERS:
        raise ValueError(f"{TENSORS_ENV}={chosen!r}: choose plain (the default) or wrapper")
    return chosen


def activate(fault: str | None = None) -> None:
    """Install the twin into this process (idempotent for the same fault).

    Args:
        fault: one of `FAULTS`, or None.

    Raises:
        ValueError: unknown fault, or the twin is already active with another fault.
        TwinUnavailableError: a real torch_npu is importable (the twin would shadow it), or
            the AI-CPU binary cannot be built (no ziglang, or not a source checkout).

    Twin tensors are plain ``torch.Tensor`` objects on PrivateUse1
    (`pyruntime.npu_twin.plain_tensors`); ``AICPU_TILING_TWIN_TENSORS=wrapper`` makes them
    `device.NpuTensor` wrappers instead (`tensor_layer`). The rules, faults and everything
    else are the same on both.
    """
    global _active, _activated
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown twin fault {fault!r}; choose one of {', '.join(FAULTS)}")
    if _activated:
        if fault != _active:
            raise ValueError(f"the NPU twin is active with fault {_active!r} in this process; "
                             f"it cannot switch to {fault!r}")
        return
    if "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None:
        raise TwinUnavailableError("a real torch_npu is importable here: the NPU twin would "
                                   "shadow it; use --backend npu on an NPU machine")
    tensors = tensor_layer()
    import torch
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    from . import (
        device,
        extension,
        npu_module,
        parameters,
        placeholder_packages,
        processes,
        torch_npu_module,
        vllm_ascend_c,
    )

    given = os.environ.get(STATE_ENV)
    state = Path(given or tempfile.mkdtemp(prefix="aicpu-tiling-twin-"))
    state.mkdir(parents=True, exist_ok=True)
    if not given:  # ours: child processes inherit it through the variable while we run
        processes.remove_at_exit(state)
    os.environ[STATE_ENV] = str(state)
    with processes.children_without_the_twin():  # its compiler runs are Python processes
        kernel_dir, ext = prepare_kernels(state, missing_binary=fault == "kernel-missing")

    if tensors == "plain":
        # plain torch.Tensors on PrivateUse1 (a C++ allocator, guard and hooks) whose ops
        # reach the same rules through one boxed fallback (pyruntime.npu_twin.plain_tensors)
        from . import plain_tensors

        plain_tensors.activate(backend_module=npu_module)
        device.install_device(plain_tensors.PlainDevice(fault=fault, state_dir=state))
        plain_tensors.route_custom_ops(device.device())
    else:
        device.install_device(device.Device(fault=fault, state_dir=state))
    processes.install()  # what a fork child keeps (pyruntime.npu_twin.processes)
    device.install_pinned_memory()
    parameters.install()  # nn.Parameter subclasses of npu tensors keep their class
    # device work runs on the host thread; torch's intra-op pool on a small shared machine
    # makes each small op spin (15 ms instead of 25 us per logsumexp here on 2 loaded cores)
    torch.set_num_threads(1)
    if tensors == "wrapper":
        _setup_privateuseone_for_python_backend(rename="npu", backend_module=npu_module)
    npu_module.install_accelerator()
    if tensors == "wrapper":
        global _factories
        _factories = torch.library.Library("aten", "IMPL")
        device.register_factories(_factories)
    torch_npu_module.install()
    placeholder_packages.install()  # acl, fla_npu: CANN's and Ascend's other Python packages
    vllm_ascend_c.install()  # import vllm_ascend.vllm_ascend_C: custom ops on, as on hardware
    if importlib.util.find_spec("triton") is not None:
        from . import triton_driver

        triton_driver.install()
    _patch_load_library(torch, ext, extension)
    os.environ["AICPU_TILING_NPU_EXT"] = str(ext)
    os.environ["AICPU_TILING_KERNEL_DIR"] = str(kernel_dir)
    _active, _activated = fault, True


_factories = None


def _patch_load_library(torch, ext: Path, extension) -> None:
    """``torch.ops.load_library`` of the twin's extension registers the twin's ops."""
    original = torch.ops.load_library

    def load_library(path):
        candidate = Path(path)
        if candidate.is_file() and candidate.read_bytes() == extension.EXTENSION_MARKER.encode():
            extension.register()
            return
        return original(path)

    torch.ops.load_library = load_library


def prepare_kernels(state: Path, *, missing_binary: bool = False) -> tuple[Path, Path]:
    """The twin's kernel files: ``<state>/kernels/`` with the real op-info JSON and the real
    AArch64 ``libaicpu_tiling_runtime.so`` (ziglang build, cached by source hash), and the
    twin's extension file. Returns (kernel dir, extension path).

    Raises:
        TwinUnavailableError: not a source checkout, or the cross-compile cannot run.
    """
    from pyruntime.aarch64 import toolchain

    from .extension import EXTENSION_MARKER

    kernel_dir, ext = state / "kernels", state / "ext" / EXTENSION_NAME
    kernel_dir.mkdir(parents=True, exist_ok=True)
    ext.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(ext, EXTENSION_MARKER.encode())
    source = OP_INFO_JSON if OP_INFO_JSON.is_file() else REPO / "aicpu_kernels" / "npu_ext" / \
        "aicpu_tiling_runtime.json"
    if not source.is_file():
        raise TwinUnavailableError(f"the op-info JSON is not at {OP_INFO_JSON}: the NPU twin "
                                   "runs from a clone of the repository (pip install -e .)")
    _write_atomically(kernel_dir / source.name, source.read_bytes())
    if missing_binary:
        return kernel_dir, ext
    unit = next(u for u in toolchain.cross_units() if u.name == "runtime-route .so")
    cache = Path(os.environ.get("AICPU_TILING_BUILD_DIR", REPO / "build")) / "npu-twin"
    cached = cache / f"libaicpu_tiling_runtime-{toolchain._sources_digest(unit)}.so"
    if not cached.is_file():
        try:
            built = toolchain.run_unit(unit, cache / f"tmp-{os.getpid()}")
        except toolchain.ToolchainError as exc:
            raise TwinUnavailableError(f"the NPU twin needs the AArch64 AI-CPU binary: {exc}") \
                from exc
        os.replace(built, cached)
    _write_atomically(kernel_dir / unit.output, cached.read_bytes())
    return kernel_dir, ext


def _write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one rename: the processes of one tree share the state
    directory and each activation rewrites its kernel files, while another may be reading
    them (a reader keeps the file it opened, never a half-written one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
