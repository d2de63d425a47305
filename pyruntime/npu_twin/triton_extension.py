"""``triton.language.extra.cann``: Triton-Ascend's language extensions, as the twin runs them.

vLLM-Ascend resolves ``insert_slice``, ``extract_slice`` and ``get_element`` from
``triton.language.extra.cann.extension`` (``vllm_ascend/ops/triton/triton_utils.py``,
``_resolve_triton_ascend_op``; 0.23.0.post1 and 0.30.0rc2) and calls them as plain globals
inside its ``@triton.jit`` kernels (the fused QK-norm + RoPE kernels of
``ops/triton/linearnorm/``, ``swiglu_quant``, ``reject_sample``, ``solve_tril``, ...). On the
twin every kernel runs under Triton's interpreter (`pyruntime.npu_twin.triton_driver`), so
these three are interpreter implementations over the interpreter's tensors (``tl.tensor``
whose ``handle.data`` is a NumPy array). Their semantics and checks come from Triton-Ascend
(github.com/triton-lang/triton-ascend, commit a84b1eb):

* ``third_party/ascend/language/cann/extension/vec_ops.py``: the signatures, the rank checks
  (``len(ful.shape) == len(offsets) == len(sizes) == len(strides)``, ``ful`` and ``sub`` of one
  rank, rank > 0), ``sizes >= 1``, ``strides >= 0``; ``get_element``'s "Indice's rank must be
  equal to src tensor's rank"; the result of ``insert_slice`` has ``ful``'s type, that of
  ``extract_slice`` ``ful``'s element type and shape ``sizes``;
* ``third_party/ascend/triton_ascend.cc``: ``create_insert_slice`` / ``create_extract_slice``
  build ``tensor.insert_slice`` / ``tensor.extract_slice`` with dynamic offsets (any integer
  value, cast to ``index``) and static sizes and strides (``std::vector<int>``: compile-time
  integers only), ``create_extract_scalar`` a ``tensor.extract``; MLIR's ``tensor``
  dialect requires the inserted tensor to have the shape ``sizes`` and ``ful``'s element type;
* ``python/triton/runtime/ascend_interpreter.py`` (Triton-Ascend's own interpreter): element
  ``k`` of a dimension is at ``offset + k * stride``; ``insert_slice`` returns a copy;
* ``docs/zh/triton_api/Extension_Ops/{insert_slice,extract_slice,get_element}.md``: bool
  tensors are not supported (A2/A3), the inserted region must lie inside ``ful`` and an
  extracted one inside the source. The twin refuses bool for ``insert_slice`` and
  ``extract_slice``, not for ``get_element``: its compiler path has no dtype check
  (``vec_ops.py`` ``get_element`` builds ``create_extract_scalar`` on any element type), and
  vLLM-Ascend's greedy rejection sampler reads its bool mask with it on the path every
  speculative-decoding step takes (0.30.0rc2 ``vllm_ascend/ops/triton/reject_sample.py``,
  ``rejection_greedy_sample_triton``: ``get_element(is_greedy_mask, (pos,))``, where
  ``is_greedy_mask = mask & (is_greedy != 0)``), a kernel its nightly single-card NPU tests
  run on the device (``tests/e2e/nightly/single_node/ops/singlecard_ops/triton/
  test_rejection_sample.py``, ``test_rejection_greedy_sample_triton_kernel``, with a bool
  ``is_greedy``). So the released path reads a bool element on A2/A3 despite the table; the
  twin follows the path (the element as a bool scalar) and says so in docs/npu-twin.md.

A slice or element outside its tensor is undefined on the AI Core (MLIR leaves an
out-of-bounds dynamic offset undefined); the twin raises `ExtensionOpError` for it, and for
every rule above, instead of reading or writing past the tensor. Inside a kernel the
interpreter wraps it: the launch's synchronize raises Triton's ``InterpreterError`` from it.

Every other name Triton-Ascend's extension exports (``sort``, ``flip``, ``cast``,
``index_put``, ...) and every ``libdevice`` function exists and raises `NotInTwinError` when
called (no path the twin runs calls them yet); a name Triton-Ascend does not export raises
``AttributeError``, so vLLM-Ascend's ``getattr(module, name, None)`` fallback to
``triton.language`` behaves as with the real package.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

from . import device as twin
from .npu_module import NotInTwinError, placeholder

#: ``third_party/ascend/language/cann/extension/__init__.py``'s ``__all__`` (commit a84b1eb),
#: less the three the twin implements
EXTENSION_NAMES_NOT_IN_TWIN = (
    "builtin", "copy_from_ub_to_l1", "copy", "CORE", "debug_barrier", "fixpipe",
    "FixpipeDMAMode", "FixpipeDualDstMode", "FixpipePreQuantMode", "FixpipePreReluMode", "int64",
    "is_builtin", "MODE", "PIPE", "IteratorType", "sub_vec_id", "sub_vec_num", "sync_block_all",
    "SYNC_IN_VF", "ascend_address_space", "affine_expr", "affine_constant_expr",
    "affine_dim_expr", "affine_symbol_expr", "affine_binary_op_expr", "affine_map",
    "AffineExpr", "AffineConstantExpr", "AffineDimExpr", "AffineSymbolExpr",
    "AffineBinaryOpExpr", "AffineMap", "scope", "custom", "custom_semantic",
    "register_custom_op", "atan2", "isfinited", "finitef", "sync_block_set", "sync_block_wait",
    "parallel", "compile_hint", "multibuffer", "sort", "flip", "cast", "index_put",
    "gather_out_to_ub", "scatter_ub_to_out", "index_select_simd",
)
IMPLEMENTED = ("insert_slice", "extract_slice", "get_element")


class ExtensionOpError(twin.TwinError):
    """A Triton-Ascend extension op called against its rules: what Triton-Ascend's compiler
    rejects (its asserts, the ``tensor`` dialect's verifier) or a slice / element outside its
    tensor (undefined on the AI Core)."""


# ---- the ops ---------------------------------------------------------------------------------
def _value(x: Any) -> Any:
    import triton.language as tl

    return x.value if isinstance(x, tl.constexpr) else x


#: the ops whose bool operands the twin refuses (the module docstring says why get_element is
#: not among them)
BOOL_REFUSED = ("insert_slice", "extract_slice")


def _shape(t: Any, op: str, what: str) -> tuple[int, ...]:
    import triton.language as tl

    if not isinstance(t, tl.tensor):
        raise ExtensionOpError(f"{op}: {what} must be a Triton tensor, got {type(t).__name__}")
    shape = tuple(int(_value(d)) for d in t.shape)
    if not shape:
        raise ExtensionOpError(f"{op}: {what} is a scalar; it needs a ranked tensor (rank > 0)")
    if t.dtype == tl.int1 and op in BOOL_REFUSED:
        raise ExtensionOpError(f"{op}: {what} is a bool tensor, which Triton-Ascend's {op} "
                               "does not support on A2/A3 (Extension_Ops docs)")
    return shape


def _dynamic_index(value: Any, op: str, what: str) -> int:
    """An offset or index: a Python / constexpr int or a scalar integer tensor (dynamic)."""
    import triton.language as tl

    value = _value(value)
    if isinstance(value, bool):
        raise ExtensionOpError(f"{op}: {what} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, tl.tensor):
        if value.shape or not value.dtype.is_int():
            raise ExtensionOpError(f"{op}: {what} must be a scalar integer, got a "
                                   f"{value.type} tensor")
        return int(value.handle.data.reshape(-1)[0])
    raise ExtensionOpError(f"{op}: {what} must be an integer, got {type(value).__name__}")


def _static_ints(values: Any, op: str, what: str, rank: int, minimum: int) -> tuple[int, ...]:
    """Sizes or strides: compile-time integers (``std::vector<int>`` in the builder)."""
    values = _value(values)
    if not isinstance(values, (tuple, list)):
        raise ExtensionOpError(f"{op}: {what} must be a tuple of ints, got {values!r}")
    out = []
    for value in values:
        value = _value(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ExtensionOpError(f"{op}: {what} must be compile-time ints (constexpr), got "
                                   f"{type(value).__name__} {value!r}")
        if value < minimum:
            raise ExtensionOpError(f"{op}: every entry of {what} must be >= {minimum}, got "
                                   f"{tuple(_value(v) for v in values)}")
        out.append(value)
    if len(out) != rank:
        raise ExtensionOpError(f"{op}: {what} has {len(out)} entries for a rank-{rank} tensor")
    return tuple(out)


def _region(op: str, shape: tuple[int, ...], offsets: Any, sizes: Any, strides: Any,
            whose: str) -> tuple[Any, tuple[int, ...]]:
    """The NumPy index of the region ``offset + k * stride`` (k < size) per dimension, and
    the region's shape; `ExtensionOpError` when it leaves ``shape``."""
    import numpy as np

    rank = len(shape)
    offsets = _value(offsets)
    if not isinstance(offsets, (tuple, list)) or len(offsets) != rank:
        raise ExtensionOpError(f"{op}: offsets {offsets!r} must have one entry per dimension "
                               f"of the rank-{rank} tensor")
    starts = tuple(_dynamic_index(o, op, "offsets") for o in offsets)
    sizes = _static_ints(sizes, op, "sizes", rank, 1)
    strides = _static_ints(strides, op, "strides", rank, 0)
    for dim, (start, size, stride, extent) in enumerate(zip(starts, sizes, strides, shape)):
        last = start + (size - 1) * stride
        if start < 0 or last >= extent:
            raise ExtensionOpError(
                f"{op}: the region at offsets {starts}, sizes {sizes}, strides {strides} "
                f"leaves {whose} of shape {shape} in dimension {dim} (elements {start}.."
                f"{last} of {extent}): undefined on the AI Core")
    index = np.ix_(*(start + stride * np.arange(size)
                     for start, size, stride in zip(starts, sizes, strides)))
    return index, sizes


def insert_slice(ful, sub, offsets, sizes, strides, _semantic=None, _generator=None):
    """``ful`` with ``sub`` written at ``offsets[d] + k * strides[d]`` (k < ``sizes[d]``).

    Args:
        ful: the tensor written into (any shape, rank > 0, not bool).
        sub: the tensor inserted: shape ``sizes``, ``ful``'s dtype.
        offsets: one integer per dimension (constexpr, int or a scalar integer tensor).
        sizes: one compile-time int >= 1 per dimension.
        strides: one compile-time int >= 0 per dimension.

    Returns:
        a new tensor of ``ful``'s type (``ful`` itself is not changed).

    Raises:
        ExtensionOpError: a rule of Triton-Ascend's ``insert_slice`` is broken, or the
            region leaves ``ful``.
    """
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    shape = _shape(ful, "insert_slice", "ful")
    sub_shape = _shape(sub, "insert_slice", "sub")
    if len(sub_shape) != len(shape):
        raise ExtensionOpError(f"insert_slice: sub of rank {len(sub_shape)} into ful of rank "
                               f"{len(shape)} (they must have the same rank)")
    index, sizes = _region("insert_slice", shape, offsets, sizes, strides, "ful")
    if sub_shape != sizes:
        raise ExtensionOpError(f"insert_slice: sub has shape {sub_shape}, sizes are {sizes} "
                               "(tensor.insert_slice needs the source to have shape sizes)")
    if sub.dtype != ful.dtype:
        raise ExtensionOpError(f"insert_slice: sub is {sub.dtype}, ful is {ful.dtype} "
                               "(tensor.insert_slice keeps one element type; cast sub first)")
    data = ful.handle.data.copy()
    data[index] = sub.handle.data
    return tl.tensor(TensorHandle(data, ful.handle.dtype), ful.type)


def extract_slice(ful, offsets, sizes, strides, _semantic=None, _generator=None):
    """The elements of ``ful`` at ``offsets[d] + k * strides[d]`` (k < ``sizes[d]``).

    Args:
        ful: the source tensor (any shape, rank > 0, not bool).
        offsets: one integer per dimension (constexpr, int or a scalar integer tensor).
        sizes: one compile-time int >= 1 per dimension.
        strides: one compile-time int >= 0 per dimension.

    Returns:
        a tensor of shape ``sizes`` and ``ful``'s dtype.

    Raises:
        ExtensionOpError: a rule of Triton-Ascend's ``extract_slice`` is broken, or the
            region leaves ``ful``.
    """
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    shape = _shape(ful, "extract_slice", "ful")
    index, sizes = _region("extract_slice", shape, offsets, sizes, strides, "ful")
    data = ful.handle.data[index].copy()
    return tl.tensor(TensorHandle(data, ful.handle.dtype), tl.block_type(ful.dtype, list(sizes)))


def get_element(src, indice, _semantic=None, _generator=None):
    """The element of ``src`` at ``indice`` (one integer per dimension), as a scalar of
    ``src``'s dtype.

    Raises:
        ExtensionOpError: ``indice``'s length is not ``src``'s rank, an index is not an
            integer, or the element is outside ``src``.
    """
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    shape = _shape(src, "get_element", "src")
    indice = _value(indice)
    if not isinstance(indice, (tuple, list)) or len(indice) != len(shape):
        raise ExtensionOpError(f"get_element: Indice's rank must be equal to src tensor's rank "
                               f"(indice {indice!r}, src of shape {shape})")
    at = tuple(_dynamic_index(i, "get_element", "indice") for i in indice)
    if any(not 0 <= i < n for i, n in zip(at, shape)):
        raise ExtensionOpError(f"get_element: index {at} is outside src of shape {shape}: "
                               "undefined on the AI Core")
    value = src.handle.data[at]
    return tl.tensor(TensorHandle(value.reshape(1).copy(), src.handle.dtype), src.dtype)


# ---- the modules -----------------------------------------------------------------------------
class _StrictModule(types.ModuleType):
    """A module that has exactly its names: the real package's other exports raise
    `NotInTwinError` when called (`placeholder`), a name the real one lacks is an
    AttributeError."""

    def __init__(self, name: str, not_in_twin: tuple[str, ...]) -> None:
        super().__init__(name)
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        self.__path__ = []
        self.__file__ = __file__
        self._not_in_twin = frozenset(not_in_twin)

    def __getattr__(self, name: str):
        if not name.startswith("_") and name in self._not_in_twin:
            return placeholder(f"{self.__name__}.{name}")
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


class _LibdeviceModule(types.ModuleType):
    """``triton.language.extra.cann.libdevice``: every function raises `NotInTwinError`
    (vLLM-Ascend calls ``isnan`` / ``nearbyint`` only in kernels off the twin's paths)."""

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return placeholder(f"{self.__name__}.{name}")


def install() -> None:
    """Make ``import triton.language.extra.cann.extension`` (and ``tl.extra.cann``) resolve
    to the twin's modules. Idempotent."""
    from triton.language import extra

    if "triton.language.extra.cann" in sys.modules:
        if getattr(sys.modules["triton.language.extra.cann"], "_twin", False):
            return
        raise NotInTwinError("triton.language.extra.cann is already a real module in this "
                             "process (Triton-Ascend is installed): the twin would shadow it")
    cann = _StrictModule("triton.language.extra.cann", ())
    cann._twin = True
    extension = _StrictModule("triton.language.extra.cann.extension",
                              EXTENSION_NAMES_NOT_IN_TWIN)
    for name in IMPLEMENTED:
        setattr(extension, name, globals()[name])
    extension.__all__ = [*IMPLEMENTED, *EXTENSION_NAMES_NOT_IN_TWIN]
    libdevice = _LibdeviceModule("triton.language.extra.cann.libdevice")
    libdevice.__spec__ = importlib.machinery.ModuleSpec(libdevice.__name__, None)
    cann.extension, cann.libdevice = extension, libdevice
    cann.__all__ = ["libdevice", "extension"]
    sys.modules[extension.__name__] = extension
    sys.modules[libdevice.__name__] = libdevice
    sys.modules[cann.__name__] = cann
    extra.cann = cann
