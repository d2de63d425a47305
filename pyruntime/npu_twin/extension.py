"""The twin of our torch_npu extension (``aicpu_kernels/npu_ext``) and of CANN's loader for
the AI-CPU binary it launches.

``torch.ops.load_library(<twin extension>)`` registers what ``plan_tiling_op.cpp`` registers:
the PrivateUse1 kernels of ``aicpu_tiling::plan_tiling`` and its array form ``plan_tilings``
(one launch, several tilings: argument block ABI v3), with every ``TORCH_CHECK`` of that
file as a check here (a test reads the C++ and matches them one by one), and
``aicpu_tiling::npu_load_tiling_kernel(op_info_json)``, which loads the AI-CPU binary the way
CANN's ``aclrtBinaryLoadFromFile`` does in CPU kernel mode 1 (hicann/runtime
``binary_loader.cc``: the runtime reads ``<json stem>.so``; ``program.cc`` sends it to the
device under its basename; the task names the JSON's ``kernelSo``, so the two must agree).

The binary is loaded once per device, at the first launch on that device, under an
``NPUGuard`` on the launch's device (``plan_tiling_op.cpp``: ``npu_load_tiling_kernel`` only
names the JSON, so nothing binds device 0 before vLLM-Ascend's worker sets its device; review
2 item 1). Every runtime call of a launcher runs in the current context: a stream of another
device is refused with CANN's 107003 (`pyruntime.npu_twin.device`).

A launch queues the launcher's fork/join (an ``ACL_EVENT_SYNC`` event recorded on the caller
stream, waited on by the launcher's flag-0 stream, the AI-CPU task, an event back) and the
AI-CPU task itself: the AArch64 build of the runtime entry ``aicpu_tiling_kernel(void
*args)`` run in the emulator (`pyruntime.aarch64`) on the argument block's device memory.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import device as twin

#: the file the twin's "extension" is; ``torch.ops.load_library`` of it registers the ops
EXTENSION_MARKER = "aicpu-tiling npu-twin extension v1\n"
#: num_q_heads .. sliding_window (ABI v5), as plan_tiling_op.cpp's kParamFields
PARAM_FIELDS = 13
OP_TYPE = "AicpuTilingKernel"
FUNCTION = "aicpu_tiling_kernel"
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
#: PlanTilings takes a c10_npu::NPUGuard on the launch's device around the lazy load and the
#: launch (a test checks the C++ still does; switching this off models the extension
#: without it: its runtime calls then run in the thread's current context)
HOLDS_DEVICE_GUARD = True
#: one launcher per device, loaded at the first launch there (plan_tiling_op.cpp
#: ``LauncherOn``); False models the extension before review 2 item 1: one launcher, loaded
#: by ``npu_load_tiling_kernel`` on the current device (device 0 in every vLLM worker)
LAUNCHER_PER_DEVICE = True

AclError = twin.AclError

#: the twin fault whose CANN runtime predates the host-args launch (`cann_runtime`)
OLD_CANN_FAULT = "old-cann"


def cann_runtime() -> tuple[str, str, bool]:
    """The CANN runtime the twin stands for: ``(version, what read it, whether its ACL
    library has aclrtLaunchKernelWithHostArgs)``.

    By default the CANN that vLLM-Ascend 0.23 and 0.30 require, 9.1.0 (their READMEs), read
    as CANN documents (hicann/runtime ``docs/zh/dev_guide/11_compatibility_handling.md``:
    ``aclsysGetVersionStr("runtime")``). Under the fault `OLD_CANN_FAULT`, CANN 8.2.RC1, whose
    API list has no ``aclrtLaunchKernelWithHostArgs`` (review 2 item 6; hicann/runtime v8.5.0
    is the first public tag, and it declares the function), read by
    ``aclsysGetCANNVersion(ACL_PKG_NAME_RUNTIME)``, the query torch_npu uses from 8.1.RC1 on
    (Ascend/pytorch ``torch_npu/csrc/core/npu/GetCANNInfo.cpp``); whether 8.2 already has
    ``aclsysGetVersionStr`` is not known here."""
    if twin.device().fault == OLD_CANN_FAULT:
        return "8.2.RC1", "aclsysGetCANNVersion(ACL_PKG_NAME_RUNTIME)", False
    return "9.1.0", 'aclsysGetVersionStr("runtime")', True


def missing_launch_message(version: str, source: str) -> str:
    """The one line ``ResolveHostArgsLaunch`` (``runtime_launcher.cpp``) writes when the loaded
    ACL library has no ``aclrtLaunchKernelWithHostArgs``: the CANN runtime `version` and what
    read it (`source`); an empty `version` says it is unknown and `source` why."""
    found = f"version unknown: {source}" if not version else f"{version}, read by {source}"
    return (f"the CANN runtime in this process ({found}) has no aclrtLaunchKernelWithHostArgs, "
            "which launches the AI-CPU tiling kernel; CANN 8.5.0 has it, and vLLM-Ascend 0.30 "
            "requires 9.1.0")


class _Launcher:
    """``RuntimeLauncher``'s state on one device: the binary, the AI-CPU stream, two events."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.path: str | None = None
        self.stream: twin.StreamState | None = None
        self.events: tuple[twin.EventState, twin.EventState] | None = None


#: device index -> its launcher (``Launchers()`` of plan_tiling_op.cpp)
_launchers: dict[int, _Launcher] = {}
#: the op-info JSON ``npu_load_tiling_kernel`` named (``KernelJson()``)
_json: str | None = None
_lock = threading.Lock()
_library: torch.library.Library | None = None


def load_binary(op_info_json: str, device: int | None = None) -> None:
    """``npu_load_tiling_kernel(json, device=None)``: names the JSON every device's launcher
    loads at its first launch (once per process; a second, different path is refused); with
    `device`, loads that device's launcher now, under a guard on it. A CANN runtime without
    ``aclrtLaunchKernelWithHostArgs`` (`cann_runtime`) is refused first, in one line
    (`missing_launch_message`), with nothing named."""
    global _json
    dev = twin.device()
    dev.check_alive()
    with _lock:
        if _json is not None and _json != op_info_json:
            raise RuntimeError(f"npu_load_tiling_kernel: already loaded from {_json}; cannot "
                               f"load {op_info_json}")
        if not Path(op_info_json).is_file():
            raise RuntimeError(f"npu_load_tiling_kernel: cannot read {op_info_json}")
        # ResolveHostArgsLaunch: the launch symbol is looked up at run time, before naming
        version, source, has_launch = cann_runtime()
        if not has_launch:
            raise RuntimeError("npu_load_tiling_kernel: "
                               + missing_launch_message(version, source))
        _json = op_info_json
    if not LAUNCHER_PER_DEVICE:  # the old extension: loaded here, on the current device
        dev.ensure_context()
        _launcher_on(dev.current_device())
    elif device is not None:
        with _guard(dev, int(device)):
            _launcher_on(int(device))


@contextlib.contextmanager
def _guard(dev: twin.Device, index: int):
    """``c10_npu::NPUGuard(index)``: `index` is the current device inside (its context made),
    the previous one after (`HOLDS_DEVICE_GUARD` off: nothing changes)."""
    if not HOLDS_DEVICE_GUARD:
        yield
        return
    previous = dev.current_device()
    dev.set_current_device(index)
    try:
        yield
    finally:
        dev.set_current_device(previous)


def _launcher_on(index: int) -> _Launcher:
    """``LauncherOn(device)``: device `index`'s launcher, loaded at its first use (the caller
    holds the device guard, so its context is current)."""
    dev = twin.device()
    if not LAUNCHER_PER_DEVICE and _launchers:
        return next(iter(_launchers.values()))  # the one launcher, wherever it was loaded
    with _lock:
        launcher = _launchers.get(index)
        if launcher is None or launcher.path is None:
            launcher = _Launcher(index)
            try:
                _load(dev, launcher, _json)
            except AclError as exc:
                raise RuntimeError(f"aicpu_tiling: loading the AI-CPU tiling kernel on NPU "
                                   f"{index}: {exc}") from exc
            _launchers[index] = launcher
        return launcher


def _load(dev: twin.Device, launcher: _Launcher, op_info_json: str) -> None:
    """``RuntimeLauncher::Load``: ``aclrtBinaryLoadFromFile(json, {CPU_KERNEL_MODE: 1})``,
    ``aclrtBinaryGetFunction``, a flag-0 stream and two ACL_EVENT_SYNC events, all in the
    current context (the launcher's device)."""
    dev.require_context("aclrtBinaryGetFunction")
    path = Path(op_info_json)
    if not path.is_file():
        raise AclError(507014, f"npu_load_tiling_kernel: aclrtBinaryLoadFromFile({path}): "
                               "path cannot be accessed (EE1012)")
    so = path.with_suffix(".so")  # mode 1: the runtime reads <json stem>.so
    if not so.is_file():
        raise AclError(507014, f"npu_load_tiling_kernel: aclrtBinaryLoadFromFile({path}): "
                               f"CPU kernel mode 1 loads {so.name} beside the JSON, which "
                               "is missing (EE1012)")
    try:
        info = json.loads(path.read_text())
        entry = info[OP_TYPE]["opInfo"]
    except (ValueError, KeyError, TypeError) as exc:
        raise AclError(507014, f"npu_load_tiling_kernel: {path} has no op {OP_TYPE!r} "
                               f"with opInfo ({exc})") from exc
    if entry.get("kernelSo") != so.name:
        raise AclError(507018, f"npu_load_tiling_kernel: the op-info JSON names kernelSo "
                               f"{entry.get('kernelSo')!r} but the runtime sends {so.name!r} "
                               "to the device: the AI-CPU dlopen would miss it")
    if entry.get("functionName") != FUNCTION:
        raise AclError(507018, f"npu_load_tiling_kernel: functionName is "
                               f"{entry.get('functionName')!r}, the .so exports {FUNCTION!r}")
    _check_elf(so)
    # aclrtCreateStreamWithConfig makes the stream in the current context
    launcher.stream = dev.new_stream("aicpu-launcher", dev.current_device())
    launcher.events = (twin.EventState(external=False), twin.EventState(external=False))
    launcher.path = op_info_json


def _check_elf(so: Path) -> None:
    """The binary must be an AArch64 shared object exporting the entry (the AI-CPU is
    AArch64; CANN dlopens it there)."""
    from elftools.elf.elffile import ELFFile

    with so.open("rb") as handle:
        try:
            elf = ELFFile(handle)
        except Exception as exc:
            raise AclError(507018, f"{so} is not an ELF file ({exc})") from exc
        if elf["e_machine"] != "EM_AARCH64" or elf["e_type"] != "ET_DYN":
            raise AclError(507018, f"{so} is {elf['e_machine']} {elf['e_type']}, the AI-CPU "
                                   "needs an AArch64 shared object")
        symbols = elf.get_section_by_name(".dynsym")
        names = {s.name for s in symbols.iter_symbols()} if symbols is not None else set()
        if FUNCTION not in names:
            raise AclError(507018, f"{so} exports no {FUNCTION}")


def _check_int32_npu(t: Any, name: str, min_numel: int) -> None:
    # CheckInt32Npu in plan_tiling_op.cpp
    _check_npu(t, name)
    if t.dtype != torch.int32:
        raise RuntimeError(f"plan_tiling: {name} must be int32, got {t.dtype}")
    _check_contiguous(t, name)
    if t.numel() < min_numel:
        raise RuntimeError(f"plan_tiling: {name} holds {t.numel()} values, needs at least "
                           f"{min_numel}")


def _check_npu(t: Any, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.device.type != "npu":
        where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
        raise RuntimeError(f"plan_tiling: {name} must be on the NPU, got {where}")


def _check_contiguous(t: torch.Tensor, name: str) -> None:
    if not t.is_contiguous():
        raise RuntimeError(f"plan_tiling: {name} must be contiguous")


def plan_tiling_npu(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_out, params,
                    causal) -> None:
    """The PrivateUse1 kernel of ``aicpu_tiling::plan_tiling`` (``PlanTilingNpu``)."""
    _plan_tilings(cu_seqlens_q, seqlens_kv, batch, step_epoch, [tiling_out], params, causal)


def plan_tilings_npu(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_outs, params,
                     causal) -> None:
    """The PrivateUse1 kernel of ``aicpu_tiling::plan_tilings`` (``PlanTilingsNpu``): one
    AI-CPU launch planning every tiling of ``tiling_outs`` (argument block ABI v3)."""
    _plan_tilings(cu_seqlens_q, seqlens_kv, batch, step_epoch, list(tiling_outs), params,
                  causal)


def _read_params(params, first: int):
    # ReadParams in plan_tiling_op.cpp
    from pyruntime import tiling

    words = params[first:first + PARAM_FIELDS]
    for i, v in enumerate(words):
        if not _INT32_MIN <= int(v) <= _INT32_MAX:
            raise RuntimeError(f"plan_tiling: params[{first + i}] = {v} is outside int32")
    try:
        return tiling.params_from_words([int(v) for v in words])  # C words: window 0 is None
    except (ValueError, tiling.TilingError) as exc:
        raise RuntimeError("plan_tiling: invalid tiling params (see "
                           f"pyruntime.tiling.TilingParams): {exc}") from exc


def _plan_tilings(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_outs, params,
                  causal) -> None:
    """``PlanTilings`` of plan_tiling_op.cpp, check for check in its order."""
    from pyruntime.aarch64.kernel import max_plans

    plans = len(tiling_outs)
    if not 1 <= plans <= max_plans():
        raise RuntimeError(f"plan_tiling: {plans} tiling buffers, one launch plans 1 to "
                           f"{max_plans()}")
    if len(params) != PARAM_FIELDS * plans:
        raise RuntimeError(f"plan_tiling: params has {len(params)} values, expected "
                           f"{PARAM_FIELDS} per tiling buffer")
    ps = [_read_params(params, k * PARAM_FIELDS) for k in range(plans)]
    n = seqlens_kv.numel() if isinstance(seqlens_kv, torch.Tensor) else 0
    _check_int32_npu(cu_seqlens_q, "cu_seqlens_q", n + 1)
    _check_int32_npu(seqlens_kv, "seqlens_kv", max(p.max_batch for p in ps))
    _check_int32_npu(batch, "batch", 1)
    _check_int32_npu(step_epoch, "step_epoch", 1)
    sizes = []
    for p, tiling_out in zip(ps, tiling_outs, strict=True):
        _check_npu(tiling_out, "tiling_out")
        _check_contiguous(tiling_out, "tiling_out")
        nbytes = tiling_out.numel() * tiling_out.element_size()
        if nbytes < p.tiling_bytes:
            raise RuntimeError(f"plan_tiling: tiling_out holds {nbytes} bytes, needs at least "
                               f"{p.tiling_bytes}")
        sizes.append(nbytes)
        if any(t.device != tiling_out.device for t in (cu_seqlens_q, seqlens_kv, batch,
                                                        step_epoch)):
            raise RuntimeError("plan_tiling: every tensor must be on the same NPU")
    if n > min(p.max_batch for p in ps):  # aicpu_tiling_kernel_check(): every plan's
        raise RuntimeError("plan_tiling: the argument block is invalid (arrays shorter than "
                           "max_batch?)")
    if _json is None:
        raise RuntimeError("plan_tiling: the AI-CPU tiling kernel is not loaded; call "
                           "torch.ops.aicpu_tiling.npu_load_tiling_kernel(<dir>/"
                           "libaicpu_tiling_runtime.json) before capturing")
    _enqueue_launch(ps, cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_outs, n, sizes,
                    bool(causal))


def _enqueue_launch(ps, cu, kv, batch, epoch, outs, n: int, sizes, causal: bool) -> None:
    dev = twin.device()
    index = outs[0].device.index
    with _guard(dev, index):  # PlanTilings: NPUGuard on the tensors' device
        launcher = _launcher_on(index)
        _launch(dev, launcher, dev.current_stream(index), ps, cu, kv, batch, epoch, outs, n,
                sizes, causal)


def _launch(dev, launcher: _Launcher, caller, ps, cu, kv, batch, epoch, outs, n: int, sizes,
            causal: bool) -> None:
    """``RuntimeLauncher::Launch``: record(caller), wait(AI-CPU stream), the launch,
    record(AI-CPU stream), wait(caller): each a runtime call on a stream, which must belong
    to the current context (107003 otherwise)."""
    side = launcher.stream
    dev.check_stream_context(caller, "Event recording (aclrtRecordEvent on the caller stream)")
    dev.check_stream_context(side, "Triggering stream event waiting (aclrtStreamWaitEvent on "
                                   "the AI-CPU stream)")
    if caller.open_group is not None:
        raise twin.CaptureViolation("aicpu_tiling_kernel: an AI-CPU task cannot join a task "
                                    "group (CANN updates AI Core tasks only)")
    ev_in, ev_out = launcher.events
    cu_i, kv_i, batch_i, epoch_i = (twin.inner(t) for t in (cu, kv, batch, epoch))
    outs_i = [twin.inner(t) for t in outs]

    def run() -> None:  # what the AI-CPU does with the argument block's addresses
        # (fault stale-aicpu-read: what it reads predates the last AI Core write)
        cu_r, kv_r, batch_r, epoch_r = (dev.aicpu_reads(t) for t in (cu_i, kv_i, batch_i,
                                                                     epoch_i))
        buffers = _run_entry(ps, cu_r, kv_r, n, int(batch_r[0]), int(epoch_r[0]), causal,
                             sizes)
        for out_i, buffer, nbytes in zip(outs_i, buffers, sizes, strict=True):
            out_i.view(-1).view(torch.uint8)[:nbytes].copy_(torch.from_numpy(buffer.copy()))

    dev.record_event(ev_in, caller)
    dev.wait_event(ev_in, side)
    dev.enqueue(twin.Work("aicpu", "aicpu_tiling_kernel", run), side)
    dev.record_event(ev_out, side)
    dev.wait_event(ev_out, caller)


_emulated = None


def _run_entry(ps, cu, kv, n: int, live_batch: int, epoch: int, causal: bool,
               sizes) -> list[np.ndarray]:
    """The AI-CPU entry on device memory: the AArch64 build in the emulator, one launch
    of one argument block planning every tiling (``more`` holds all but the first)."""
    global _emulated
    if _emulated is None:
        from pyruntime.aarch64.kernel import EmulatedKernel

        _emulated = EmulatedKernel()
    run = _emulated.launch_entry(ps[0], cu[: n + 1].tolist(), kv[:n].tolist(), n,
                                 live_batch=live_batch, step_epoch=epoch, causal=causal,
                                 buffer_bytes=sizes[0],
                                 more=list(zip(ps[1:], sizes[1:], strict=True)))
    if run.status != 0:
        # the entry refused the block: the device reports an AI-CPU exception
        raise twin.TwinError(f"the AI-CPU entry refused its argument block (status "
                             f"{run.status}): error 507018")
    return [np.frombuffer(b, dtype=np.uint8) for b in (run.buffer, *run.more_buffers)]


def register() -> None:
    """What ``torch.ops.load_library(libaicpu_tiling_npu.so)`` registers (once)."""
    global _library
    if _library is not None:
        return
    from pyruntime.kernels import custom_ops

    custom_ops.ops()  # the schema of plan_tiling comes from Python, as on the NPU
    fragment = torch.library.Library("aicpu_tiling", "FRAGMENT")
    fragment.define("npu_load_tiling_kernel(str op_info_json, int? device=None) -> ()")
    fragment.impl("npu_load_tiling_kernel", load_binary, "CompositeExplicitAutograd")
    # through the custom op's own kernel table (torch.library.custom_op), which the plain
    # tensor layer's stand-in for a missing kernel also uses (plain_tensors.route_custom_ops)
    from torch._library.custom_ops import OPDEFS

    OPDEFS["aicpu_tiling::plan_tiling"].register_kernel("privateuseone")(plan_tiling_npu)
    OPDEFS["aicpu_tiling::plan_tilings"].register_kernel("privateuseone")(plan_tilings_npu)
    _library = fragment
