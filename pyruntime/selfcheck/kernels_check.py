"""The ``kernels`` check: find (or, when asked, build) our kernels for the backend."""

from __future__ import annotations

from .context import Context
from .report import CheckResult, failed, passed


def kernels(ctx: Context) -> CheckResult:
    name = "kernels"
    try:
        from pyruntime import tiling
    except ImportError as exc:
        ctx.kernels_ready = False
        return failed(name, f"the tiling kernel's extension does not import ({exc}); build it "
                            "with `pip install -e .` (or `python setup.py build_ext --inplace`)")
    native = getattr(tiling.lib, "__file__", None) or "pyruntime._native"
    if ctx.backend != "npu":
        return passed(name, f"tiling kernel (C, cffi) loaded from {native}; the CPU backend "
                            "runs it as the AI-CPU task and the C reference as AI Core",
                      native=str(native))
    from pyruntime.backends import npu_kernels

    built = None
    try:
        try:
            npu_kernels.find()
        except npu_kernels.KernelsUnavailableError:
            if not ctx.build:
                raise
            npu_kernels.build()
            built = "built now with tools/build_aicpu_kernel.sh"
        import torch

        # the binary on the device this check runs on, now: a bad one fails here, not at the
        # first capture (the hook's load leaves it to the first launch on each device)
        files = npu_kernels.load(device=torch.npu.current_device())
    except npu_kernels.KernelsUnavailableError as exc:
        ctx.kernels_ready = False
        return failed(name, str(exc))
    attention = npu_kernels.attention_reason()
    data = {"extension": str(files.extension), "runtime_json": str(files.runtime_json),
            "attention_kernels": attention or "Triton-Ascend"}
    if attention is not None:
        ctx.kernels_ready = False
        return failed(name, f"tiling extension loaded, but no NPU attention kernel: {attention}",
                      **data)
    return passed(name, f"tiling extension {files.extension} and AI-CPU binary "
                        f"{files.runtime_json} loaded" + (f" ({built})" if built else ""), **data)
