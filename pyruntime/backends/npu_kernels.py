"""Our kernels on an Ascend NPU: find, build and load the torch_npu extension.

The extension ``libaicpu_tiling_npu.so`` (``aicpu_kernels/npu_ext/``) registers the
PrivateUse1 kernel of ``torch.ops.aicpu_tiling.plan_tiling``, which launches the AI-CPU
tiling kernel by the runtime route (``npu_ext/launch_route.h``: binary loaded once before
capture, a flag-0 AI-CPU stream, ``ACL_EVENT_SYNC`` events recorded and waited around the
launch, so the same call works captured or eager), and ``npu_load_tiling_kernel(json)``,
which loads the AI-CPU binary (``libaicpu_tiling_runtime.json`` and the ``.so`` of the same
stem, which CANN loads in CPU kernel mode 1).
The schema of ``plan_tiling`` is defined in Python (`pyruntime.kernels.custom_ops`), so it
is registered before the library is loaded.

Where they are looked for: ``$AICPU_TILING_NPU_EXT`` (the extension) and
``$AICPU_TILING_KERNEL_DIR`` (the directory of the runtime JSON), else what
``tools/build_aicpu_kernel.sh runtime`` and ``... npu_ext`` install under the build root
(`build_root`: ``$AICPU_TILING_BUILD_DIR/aicpu``, else ``build/aicpu`` of the source checkout
this package runs from, else the user cache). Building needs a source checkout: a regular
install carries no C sources. Nothing here has run on an NPU; on the NPU twin
(`pyruntime.npu_twin`) all of it runs in CI.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BackendError

EXT_ENV = "AICPU_TILING_NPU_EXT"
KERNEL_DIR_ENV = "AICPU_TILING_KERNEL_DIR"
EXT_NAME = "libaicpu_tiling_npu.so"
RUNTIME_JSON = "libaicpu_tiling_runtime.json"
BUILD_DIR_ENV = "AICPU_TILING_BUILD_DIR"
#: where a source checkout would be, if this package runs from one (editable install)
CHECKOUT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT_NAME = "tools/build_aicpu_kernel.sh"


def source_checkout() -> Path | None:
    """The repository this package runs from, or None after a regular install (the wheel
    carries no C sources and no build script)."""
    if (CHECKOUT / BUILD_SCRIPT_NAME).is_file() and (CHECKOUT / "aicpu_kernels").is_dir():
        return CHECKOUT
    return None


def build_root() -> Path:
    """Where built kernels are looked for: ``$AICPU_TILING_BUILD_DIR/aicpu``, else the
    checkout's ``build/aicpu``, else ``~/.cache/aicpu-tiling/build/aicpu`` (never
    site-packages)."""
    env = os.environ.get(BUILD_DIR_ENV, "").strip()
    if env:
        return Path(env) / "aicpu"
    checkout = source_checkout()
    if checkout is not None:
        return checkout / "build" / "aicpu"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "aicpu-tiling" / "build" / "aicpu"


class KernelsUnavailableError(BackendError):
    """Our NPU kernels are not built or cannot load; the message says what to do."""


@dataclass(frozen=True)
class KernelFiles:
    extension: Path
    runtime_json: Path


def _first(paths) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


def find() -> KernelFiles:
    """The extension and the runtime JSON.

    Raises:
        KernelsUnavailableError: either is missing (names where it was looked for).
    """
    root = build_root()
    env_ext = os.environ.get(EXT_ENV, "").strip()
    ext_candidates = [Path(env_ext)] if env_ext else sorted(root.glob(f"**/{EXT_NAME}"))
    env_dir = os.environ.get(KERNEL_DIR_ENV, "").strip()
    json_candidates = ([Path(env_dir) / RUNTIME_JSON] if env_dir
                       else sorted(root.glob(f"**/{RUNTIME_JSON}")))
    ext, js = _first(ext_candidates), _first(json_candidates)
    missing = []
    if ext is None:
        missing.append(f"the torch_npu extension {EXT_NAME} (${EXT_ENV} or under {root})")
    if js is None:
        missing.append(f"the AI-CPU kernel {RUNTIME_JSON} (${KERNEL_DIR_ENV} or under {root})")
    elif not js.with_suffix(".so").is_file():
        missing.append(f"the AI-CPU binary {js.with_suffix('.so').name} beside {js} (CANN "
                       "loads <json stem>.so in CPU kernel mode 1)")
    if missing:
        raise KernelsUnavailableError(
            f"our NPU kernels are not built: missing {' and '.join(missing)}; build them "
            f"with {build_command()}")
    return KernelFiles(ext, js)


def build_command() -> str:
    """The command that builds our NPU kernels here (or how to get a checkout first)."""
    script = BUILD_SCRIPT_NAME
    steps = (f"`source <CANN>/set_env.sh && bash {script} runtime && bash {script} npu_ext` "
             "or `aicpu-tiling selfcheck --backend npu --build`")
    if source_checkout() is None:
        return ("a source checkout (this install has no C sources): `git clone <aicpu-tiling "
                f"repository> && cd aicpu-tiling && pip install --no-deps -e .`, then {steps}")
    return f"{steps} in {source_checkout()}"


def build(*, timeout_s: float = 1800) -> str:
    """Run ``tools/build_aicpu_kernel.sh runtime`` then ``npu_ext``; returns their output.

    Raises:
        KernelsUnavailableError: the script is missing or a build failed (its last lines).
    """
    checkout = source_checkout()
    if checkout is None:
        raise KernelsUnavailableError(f"building our NPU kernels needs {build_command()}")
    out = []
    for target in ("runtime", "npu_ext"):
        proc = subprocess.run(["bash", str(checkout / BUILD_SCRIPT_NAME), target,
                               str(build_root())], capture_output=True, text=True,
                              timeout=timeout_s, check=False, cwd=checkout)
        out.append(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
            raise KernelsUnavailableError(f"building {target} failed: {tail}")
    return "\n".join(out)


_loaded: KernelFiles | None = None


def load(ops: Any = None, *, device: int | None = None) -> KernelFiles:
    """Register our custom ops, load the extension and name the AI-CPU binary (once).

    The binary itself is loaded per NPU by the extension, at the first tiling launch on a
    device, in that device's context; nothing here touches a device unless `device` is
    given. (The vLLM-Ascend hook loads this while vLLM-Ascend's worker imports its modules,
    before the worker sets its device: a binary, stream and events made then would sit on
    NPU 0 in every worker, review 2 item 1.)

    Args:
        ops: ``torch.ops`` (a stand-in in tests).
        device: also load the binary on this NPU now, so that a bad binary fails here (the
            self-check does, on the device it checks); None: at the first launch.

    Raises:
        KernelsUnavailableError: not built, or loading failed (with the cause).
    """
    global _loaded
    import torch

    from pyruntime.kernels import custom_ops

    ops = ops if ops is not None else torch.ops
    files = _loaded or find()
    try:
        if _loaded is None:
            custom_ops.ops()  # the schemas first: the extension only adds PrivateUse1 kernels
            ops.load_library(str(files.extension))
            ops.aicpu_tiling.npu_load_tiling_kernel(str(files.runtime_json))
            _loaded = files
        if device is not None:
            ops.aicpu_tiling.npu_load_tiling_kernel(str(files.runtime_json), device)
    except Exception as exc:
        raise KernelsUnavailableError(f"loading {files.extension} / {files.runtime_json} "
                                      f"failed: {type(exc).__name__}: {exc}") from exc
    return files


def attention_reason() -> str | None:
    """None when the attention kernels have an NPU build (Triton-Ascend), else why not."""
    try:
        from pyruntime.kernels import triton_launch
    except ImportError:
        return ("this build has no NPU attention kernel: the Triton AI Core kernels "
                "(pyruntime/kernels/triton_launch.py) are not part of it")
    return triton_launch.available()
