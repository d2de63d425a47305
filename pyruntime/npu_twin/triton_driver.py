"""Triton-Ascend's launch path on the twin.

On an NPU, ``kernel[grid](...)`` of a ``@triton.jit`` function compiles it with Triton-Ascend
and its launcher enqueues the binary on ``torch_npu._C._npu_getCurrentRawStream``, the
capture stream inside a capture, taking each tensor's ``data_ptr()`` with no device check
(``triton/backends/ascend/driver.py`` of the 3.2.0 wheel). The twin installs the same
seam: ``JITFunction.run`` with ``npu`` tensors queues one AI Core task on the current stream
(captured like any other) that runs the kernel's Python source under Triton's interpreter on
the tensors' device memory; a CPU tensor among the arguments is a host pointer handed to
the AI Core (`HostPointerError`). Product code keeps calling the compiled path: nothing in
it knows about the twin.

The twin also registers Triton-Ascend's backend the way the real wheel does, so code that asks
Triton which device it drives gets the answer it gets on an NPU (`register_backend`):

* ``triton.backends.backends["ascend"]`` (Triton-Ascend's ``setup.py`` registers the entry
  point ``ascend = triton.backends.ascend``), whose driver `TwinNPUDriver` is active while the
  twin is: vLLM's ``vllm/triton_utils/importing.py`` then finds exactly one active driver and
  sets ``HAS_TRITON`` itself (vLLM 0.23 and 0.30), and ``triton.runtime.driver.active`` is it;
* ``driver.active.utils.get_device_properties(device)`` as Triton-Ascend's ``NPUUtils``
  (``third_party/ascend/backend/driver.py``, commit a84b1eb): ``{"max_shared_mem": 1,
  "num_aicore": n, "num_vectorcore": 2 * n}`` with n from ``rtGetAiCoreCount`` (the twin's
  `device.AI_CORES`), cached per argument (``functools.lru_cache``), the argument otherwise
  unused; vLLM-Ascend sizes its grids from it (``init_device_properties_triton``,
  ``get_vectorcore_num``);
* the driver's device and stream queries as the wheel's ``torch_npu`` strategy
  (``third_party/ascend/backend/backend_register.py``): ``torch.npu.current_device()``,
  ``torch.npu.set_device``, ``torch_npu._C._npu_getCurrentRawStream(device)``, ``torch.npu``
  as the device interface; the target is ``GPUTarget("npu", <rtGetSocVersion>, 0)``;
* ``triton.language.extra.cann`` with interpreter versions of the extension ops vLLM-Ascend's
  kernels call (`pyruntime.npu_twin.triton_extension`);
* Triton-Ascend's SIMD-mode shape rules for the interpreted kernels: block shapes and
  ``tl.arange`` ranges need not be powers of two (its ``python/triton/_utils.py``
  ``validate_block_shape`` drops upstream's check, and ``semantic.arange`` keeps it only in
  SIMT mode); vLLM-Ascend's kernels rely on it (``tl.arange(0, q_hidden_size +
  kv_hidden_size)``).

Nothing compiles on the twin: the backend's compiler, the driver's launcher, binary loader and
benchmarker exist and raise `NotInTwinError`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any

import torch

from . import device as twin
from .npu_module import NotInTwinError, placeholder

#: the backend's name in ``triton.backends.backends`` (Triton-Ascend's entry point)
BACKEND_NAME = "ascend"
#: what ``rtGetSocVersion`` names (Triton-Ascend's ``get_arch``): the twin's SoC
SOC_NAME = "Ascend910B3"

_installed = False
_lock = threading.Lock()


def _interpreted(fn, grid, args, kwargs) -> None:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from pyruntime.kernels import triton_launch

    # nested @triton.jit helpers (ours and triton.language's own, e.g. tl.cdiv) were built
    # compiled in this process; inside the interpreted kernel each runs interpreted too
    with triton_launch._INTERPRETER_LOCK, _lock, ascend_shape_rules(), bf16_arithmetic():
        original = JITFunction.__call__
        JITFunction.__call__ = lambda self, *a, **k: InterpretedFunction(self.fn)(*a, **k)
        try:
            InterpretedFunction(fn)[grid](*args, **kwargs)
        finally:
            JITFunction.__call__ = original


class ShapeRuleError(ValueError):
    """A ``tl.arange`` Triton-Ascend refuses too (bounds not constexpr, past int32, empty)."""


@contextlib.contextmanager
def ascend_shape_rules():
    """Triton-Ascend's SIMD-mode shape rules in Triton's interpreter while the block runs:
    block shapes and ``tl.arange`` ranges of any length (its ``python/triton/_utils.py``
    ``validate_block_shape`` has upstream's power-of-two check commented out, its
    ``semantic.arange`` applies it only in SIMT mode); every other check of both stays.
    Restored on exit; callers hold the interpreter lock (the patch is process-wide)."""
    from triton._utils import TRITON_MAX_TENSOR_NUMEL
    from triton.language import core
    from triton.runtime.interpreter import interpreter_semantic

    def validate_block_shape(shape):
        numel = 1
        for i, d in enumerate(shape):
            if not isinstance(d, int):
                raise TypeError(f"Shape element {i} must have type `constexpr[int]`, got "
                                f"`constexpr[{type(d)}]")
            numel *= d
        if numel > TRITON_MAX_TENSOR_NUMEL:
            raise ValueError(f"numel ({numel}) exceeds triton maximum tensor numel "
                             f"({TRITON_MAX_TENSOR_NUMEL})")
        return numel

    def arange(start, end, *, ret_ty=None):
        import triton.language as tl

        if not isinstance(start, int) or not isinstance(end, int):
            raise ShapeRuleError("arange's arguments must be of type tl.constexpr")
        if bool(start >> 32) or bool(end >> 32):
            raise ShapeRuleError("arange must fit in int32")
        if end <= start:
            raise ShapeRuleError("arange's end argument must be greater than the start "
                                 "argument")
        ret_ty = tl.block_type(tl.int32, [end - start]) if ret_ty is None else ret_ty
        builder = interpreter_semantic.builder
        return interpreter_semantic.make_tensor(
            builder.create_make_range(ret_ty.to_ir(builder), start, end), ret_ty)

    original_validate = core.validate_block_shape
    core.validate_block_shape = validate_block_shape
    interpreter_semantic.arange = arange
    try:
        yield
    finally:
        core.validate_block_shape = original_validate
        del interpreter_semantic.arange


def _bf16_to_fp32(bits):
    """bf16 bit patterns (the interpreter keeps bf16 as uint16) -> float32, exactly."""
    import numpy as np

    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _fp32_to_bf16(values):
    """float32 -> bf16 bit patterns, rounded to nearest even (NaN stays a quiet NaN)."""
    import numpy as np

    values = np.array(values, dtype=np.float32)  # a contiguous copy that keeps a 0-d shape
    bits = values.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    quiet_nan = ((bits >> 16) | 0x0040).astype(np.uint16)
    return np.asarray(np.where(np.isnan(values), quiet_nan, rounded), dtype=np.uint16)


@contextlib.contextmanager
def bf16_arithmetic():
    """bf16 values as numbers in Triton's interpreter while the block runs.

    The interpreter stores bf16 as its bit patterns (``uint16``) and applies NumPy's
    arithmetic, comparisons and integer casts to those bits: ``x1 * cos`` of two bf16 tensors
    multiplies integers (vLLM-Ascend's ``split_qkv_rmsnorm_rope_kernel`` does its RoPE so and
    came out as garbage and NaN), and ``.to(tl.bfloat16)`` truncates. Here every bf16 binary
    and unary op computes on the exact float32 values and rounds the result to bf16 to
    nearest even (a correctly rounded bf16 op, as torch's bf16 ops on the CPU), comparisons
    compare values, casts to and from bf16 go through float32 with the same rounding, and
    ``tl.sum`` / ``tl.max`` / ``tl.min`` (and the arg- forms) of bf16 reduce the float32
    values (a sum accumulates in float32 and rounds once), and ``tl.dot`` of bf16 operands
    multiplies their values, accumulating in the accumulator's type.
    Restored on exit; callers hold the interpreter lock (the patch is process-wide)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import (
        ReduceOps,
        TensorHandle,
        _get_np_dtype,
        interpreter_builder,
    )

    builder_cls = type(interpreter_builder)

    def binary_op(lhs, rhs, op):
        if lhs.dtype.scalar != tl.bfloat16 or rhs.dtype.scalar != tl.bfloat16:
            return builder_cls.binary_op(interpreter_builder, lhs, rhs, op)
        out = op(_bf16_to_fp32(lhs.data), _bf16_to_fp32(rhs.data))
        if out.dtype == np.bool_:  # a comparison
            return TensorHandle(out, tl.int1)
        return TensorHandle(_fp32_to_bf16(out), tl.bfloat16)

    def unary_op(arg, op):
        if arg.dtype.scalar != tl.bfloat16:
            return builder_cls.unary_op(interpreter_builder, arg, op)
        return TensorHandle(_fp32_to_bf16(op(_bf16_to_fp32(arg.data))), tl.bfloat16)

    def cast_impl(src, dst_type):
        source, target = src.dtype.scalar, dst_type.scalar
        # a handle's dtype can be stale (the interpreter types a comparison's result by its
        # operands): bf16 data is what is stored as uint16
        if source == tl.bfloat16 and target != tl.bfloat16 and src.data.dtype == np.uint16:
            values = _bf16_to_fp32(src.data)
            return TensorHandle(values.astype(_get_np_dtype(target)), target)
        if target == tl.bfloat16 and source != tl.bfloat16:
            return TensorHandle(_fp32_to_bf16(src.data.astype(np.float32)), target)
        return builder_cls.cast_impl(interpreter_builder, src, dst_type)

    def create_dot(a, b, d, input_precision, max_num_imprecise_acc):
        # bf16 operands as values: the cube unit multiplies bf16 exactly and accumulates in
        # the accumulator's type (float32 for vLLM-Ascend's LoRA kernel,
        # _lora_shrink_splitk_kernel); the stock interpreter multiplied the bit patterns
        if tl.bfloat16 not in (a.dtype.scalar, b.dtype.scalar):
            return builder_cls.create_dot(interpreter_builder, a, b, d, input_precision,
                                          max_num_imprecise_acc)

        def values(h):
            return _bf16_to_fp32(h.data) if h.dtype.scalar == tl.bfloat16 \
                else h.data.astype(np.float32)

        out = np.matmul(values(a), values(b), dtype=np.float32) + values(d)
        if d.dtype.scalar == tl.bfloat16:
            return TensorHandle(_fp32_to_bf16(out), tl.bfloat16)
        return TensorHandle(out.astype(d.data.dtype), d.dtype.scalar)

    original_sum, original_min_max = ReduceOps.sum, ReduceOps.min_max

    def reduce_sum(self, input):
        if input.dtype != tl.bfloat16:
            return original_sum(self, input)
        total = np.sum(_bf16_to_fp32(input.handle.data), axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(_fp32_to_bf16(total), input.dtype)

    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        x = input[0] if isinstance(input, tuple) else input
        if x.dtype != tl.bfloat16:
            return original_min_max(self, input, val_reduce_op, idx_reduce_op)
        values = _bf16_to_fp32(x.handle.data)
        found = []
        if val_reduce_op:
            found.append(self.to_tensor(_fp32_to_bf16(val_reduce_op(
                values, axis=self.axis, keepdims=self.keep_dims)), x.dtype))
        if idx_reduce_op:
            found.append(self.to_tensor(idx_reduce_op(
                values, axis=self.axis, keepdims=self.keep_dims), tl.int32))
        if not found:
            raise ValueError("val_reduce_op and idx_reduce_op are both None")
        return tuple(found) if len(found) == 2 else found[0]

    interpreter_builder.binary_op = binary_op
    interpreter_builder.unary_op = unary_op
    interpreter_builder.cast_impl = cast_impl
    interpreter_builder.create_dot = create_dot
    ReduceOps.sum, ReduceOps.min_max = reduce_sum, min_max
    try:
        yield
    finally:
        del interpreter_builder.binary_op, interpreter_builder.unary_op
        del interpreter_builder.cast_impl, interpreter_builder.create_dot
        ReduceOps.sum, ReduceOps.min_max = original_sum, original_min_max


def _launch(jit_fn, args: tuple, kwargs: dict, grid: Any) -> None:
    dev = twin.device()
    dev.check_alive()
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    for t in tensors:
        if not twin.is_npu_tensor(t):
            raise twin.HostPointerError(
                f"triton kernel {jit_fn.__name__}: argument on {t.device} (shape "
                f"{tuple(t.shape)}): Triton-Ascend passes its data_ptr() to the AI Core "
                "unchecked, a host address (AI Core exception on hardware)")
        if twin.index_of(t) != dev.current_device():
            # the launcher takes driver.active.get_current_device()'s current stream and
            # context; another device's address is not mapped there
            raise twin.TwinError(
                f"triton kernel {jit_fn.__name__}: argument on npu:{twin.index_of(t)} launched "
                f"on npu:{dev.current_device()}, the current device (Triton-Ascend launches in "
                "the current device's context with the argument's data_ptr() unchecked)")
    inner_args = tuple(twin.inner(a) for a in args)
    inner_kwargs = {k: twin.inner(v) for k, v in kwargs.items()}
    if "UPCAST_DOT" in inner_kwargs:
        # Triton's interpreter computes a bf16 tl.dot inexactly; our kernels carry this
        # switch for the interpreter (pyruntime/kernels/triton_launch.py sets it on CPU
        # tensors); the compiled kernel on the NPU does not need it
        inner_kwargs["UPCAST_DOT"] = True
    grid = tuple(grid) if not callable(grid) else grid
    name = jit_fn.__name__

    def run() -> None:
        _interpreted(jit_fn.fn, grid, inner_args, inner_kwargs)

    dev.enqueue(twin.Work("aicore", f"triton {name}", run))


# ---- Triton-Ascend's backend -----------------------------------------------------------------
class TwinNPUUtils:
    """``driver.active.utils``: Triton-Ascend's ``NPUUtils`` (``driver.py``) without its
    compiled helper module: the queries vLLM-Ascend makes; loading a binary is not in the
    twin."""

    @functools.lru_cache  # noqa: B019 - as the real one: one answer per argument, for good
    def get_device_properties(self, device: Any) -> dict[str, int]:
        """``{"max_shared_mem": 1, "num_aicore": n, "num_vectorcore": 2 * n}``: n AI Cores
        (``rtGetAiCoreCount``), each with two vector cores; ``device`` (an int, a
        ``torch.device`` or a string) only keys the cache, as in Triton-Ascend."""
        num_aic = self.get_aicore_num()
        return {"max_shared_mem": 1, "num_aicore": num_aic, "num_vectorcore": num_aic * 2}

    def get_arch(self) -> str:
        """The SoC name ``rtGetSocVersion`` reports."""
        return SOC_NAME

    def get_aicore_num(self) -> int:
        """``rtGetAiCoreCount``: the twin's AI Cores."""
        twin.device().check_alive()
        return twin.AI_CORES

    def get_aivector_core_num(self) -> int:
        return self.get_device_properties("npu")["num_vectorcore"]

    load_binary = staticmethod(placeholder("triton.backends.ascend.driver.NPUUtils.load_binary"))


def _make_backend_classes() -> tuple[type, type]:
    """The driver and compiler classes (built here: their bases import triton)."""
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.backends.driver import DriverBase

    class TwinNPUDriver(DriverBase):
        """Triton-Ascend's ``NPUDriver`` on the twin: active while the twin is installed (the
        real one is active when the bisheng compiler lists the ``hiipu64`` target); its
        device and stream queries are the torch_npu strategy's."""

        def __init__(self) -> None:
            self.utils = TwinNPUUtils()
            self.launcher_cls = placeholder("triton.backends.ascend.driver.NPULauncher")
            super().__init__()

        @classmethod
        def is_active(cls) -> bool:
            return _installed

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise NotInTwinError("triton.backends.ascend.driver.NPUDriver."
                                 "map_python_to_cpp_type: the twin builds no launcher")

        def get_current_target(self):
            return GPUTarget("npu", self.utils.get_arch(), 0)

        def get_current_device(self) -> int:
            return torch.npu.current_device()

        def get_active_torch_device(self) -> torch.device:
            return torch.device("npu", self.get_current_device())

        def set_current_device(self, device: int) -> None:
            return torch.npu.set_device(device)

        def get_current_stream(self, device: int | None = None) -> int:
            import torch_npu

            if device is None:
                device = torch.npu.current_device()
            return torch_npu._C._npu_getCurrentRawStream(device)

        def get_device_interface(self):
            return torch.npu

        get_benchmarker = placeholder("triton.backends.ascend.driver.NPUDriver.get_benchmarker")
        get_empty_cache_for_benchmark = placeholder(
            "triton.backends.ascend.driver.NPUDriver.get_empty_cache_for_benchmark")
        clear_cache = placeholder("triton.backends.ascend.driver.NPUDriver.clear_cache")

    def not_compiled(name: str):
        def call(*args, **kwargs):
            raise NotInTwinError(f"triton.backends.ascend.compiler.AscendBackend.{name}: the "
                                 "twin compiles no kernel (it runs npu launches under Triton's "
                                 "interpreter); a compiled launch here had no npu tensor")
        return call

    class TwinAscendBackend(BaseBackend):
        """Triton-Ascend's compiler backend, for target ``npu``; on the twin nothing
        compiles, so every compile step raises `NotInTwinError`."""

        @staticmethod
        def supports_target(target) -> bool:
            return target.backend == "npu"

        hash = not_compiled("hash")
        parse_options = not_compiled("parse_options")
        add_stages = not_compiled("add_stages")
        load_dialects = not_compiled("load_dialects")
        get_module_map = not_compiled("get_module_map")
        get_codegen_implementation = not_compiled("get_codegen_implementation")
        pack_metadata = not_compiled("pack_metadata")

    return TwinNPUDriver, TwinAscendBackend


def register_backend() -> None:
    """Add the twin's ``ascend`` backend to ``triton.backends.backends`` (the dict Triton
    and vLLM read; it was filled from entry points when ``triton.backends`` was imported)."""
    from triton.backends import Backend, backends

    present = backends.get(BACKEND_NAME)
    if present is not None:
        if getattr(present.driver, "_npu_twin", False):
            return
        raise twin.TwinError(f"a real Triton backend {BACKEND_NAME!r} is installed "
                             f"({present.driver.__module__}): the twin would shadow "
                             "Triton-Ascend")
    driver, compiler = _make_backend_classes()
    driver._npu_twin = True
    backends[BACKEND_NAME] = Backend(compiler=compiler, driver=driver)


def install() -> None:
    """Route ``JITFunction.run`` with twin tensors through the twin, register the ``ascend``
    backend and ``triton.language.extra.cann`` (once per process)."""
    global _installed
    if _installed:
        return
    from triton.runtime.jit import JITFunction

    from . import triton_extension

    register_backend()
    triton_extension.install()

    compiled_run = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        # any tensor argument: a launch on the NPU, where a CPU tensor is a host pointer
        # (`_launch` refuses it); no tensor at all: the compiled path, which the twin's
        # backend refuses (NotInTwinError) instead of compiling
        if any(isinstance(v, torch.Tensor) for v in (*args, *kwargs.values())):
            if warmup:
                return None
            _launch(self, args, kwargs, grid)
            return None
        return compiled_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = run
    _installed = True
