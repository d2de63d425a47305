"""Plain npu tensors: the twin's tensor layer without a wrapper subclass (the default).

The older twin tensor (`pyruntime.npu_twin.device.NpuTensor`, still chosen by
``AICPU_TILING_TWIN_TENSORS=wrapper``) is a wrapper subclass. Dynamo cannot trace it, and
vLLM's ``nn.Parameter`` subclasses and ``param.data = ...`` break on it (issue 28, the engine
probe). Here a twin tensor is an ordinary ``torch.Tensor`` on the
PrivateUse1 device renamed ``npu``, and its ops reach the same rules (device.py):

* ``csrc/plain_device.cpp``, a small C++ extension: an allocator over host memory that
  accounts per device as `pyruntime.npu_twin.memory` does (blocks, cache, peaks, device size,
  out of memory), a device guard (the device count from ``AICPU_TILING_TWIN_DEVICES``,
  default 2; the current device per thread), torch 2.13's PrivateUse1 hooks, and the kernels
  that only make or reshape tensors (empty, empty_strided, as_strided, view, _reshape_alias,
  resize_, set_);
* one boxed Python fallback for every other aten op (`_fallback`): copies and ``.item()`` go
  to device.py's sync rules, views are made at once, every other op is queued on its
  device's current stream or recorded by the capture on it (`device._queue_op`);
* `PlainDevice`: device.py's `Device` with the current device and memory in the extension;
* `route_custom_ops`: our custom ops' missing-kernel and reference-body rules.

Use: `pyruntime.npu_twin.activate` installs the twin with this layer unless
``AICPU_TILING_TWIN_TENSORS=wrapper`` (`pyruntime.npu_twin.tensor_layer`; the rest of the twin
is the same). Activation is once per process, and excludes the wrapper twin in the same
process (both rename torch's PrivateUse1 backend).

The extension is compiled at first use (g++, ``-Wall -Wextra -Werror``, torch's headers as
``-isystem``) into ``$XDG_CACHE_HOME/aicpu-tiling/twin-ext/<key>/`` (default ``~/.cache``),
where the key hashes the source, the flags, the compiler and torch's version; an ``fcntl``
lock on that folder makes parallel test workers build it once.
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import device as twin
from .memory import total_from_env

DEVICES_ENV = "AICPU_TILING_TWIN_DEVICES"
SOURCE = Path(__file__).resolve().parent / "csrc" / "plain_device.cpp"
LIBRARY_NAME = "aicpu_twin_plain.so"
CFLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror")
#: the order of ``torch.ops.aicpu_twin.memory_stats`` (the model of `memory.DeviceMemory`)
STAT_NAMES = ("allocated", "reserved", "peak_allocated", "peak_reserved", "live_blocks",
              "peak_blocks", "allocations", "frees", "allocated_total", "freed_total",
              "num_ooms", "total")

_active = False
_fallback_library: Any = None


class PlainTensorsUnavailableError(RuntimeError):
    """The plain tensor layer cannot start here (says why and what to do)."""


# ---- build ----------------------------------------------------------------------------------
def cache_root() -> Path:
    """``$XDG_CACHE_HOME/aicpu-tiling/twin-ext`` (``~/.cache`` when the variable is unset)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "aicpu-tiling" / "twin-ext"


def compiler() -> str:
    """The C++ compiler: ``$CXX``, else ``g++``."""
    return os.environ.get("CXX") or "g++"


def compile_command(output: Path) -> list[str]:
    """The one g++ line that builds the extension into ``output``: torch's and Python's
    headers as ``-isystem`` (their warnings are not ours), our source under -Werror."""
    from torch.utils import cpp_extension

    torch_dir = Path(torch.__file__).resolve().parent
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [compiler(), *CFLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(flag for path in includes for flag in ("-isystem", str(path))),
            str(SOURCE), f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu", "-ltorch",
            f"-Wl,-rpath,{torch_dir / 'lib'}", "-o", str(output)]


def build_key() -> str:
    """16 hex digits over the source, the flags, the compiler and torch's version."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    for part in (*CFLAGS, compiler(), torch.__version__, sys.version):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:16]


def build_extension() -> Path:
    """The extension's shared library, compiled once per key (see the module's docstring).

    Parallel callers (test workers) wait on one ``fcntl`` lock per key; the first compiles,
    the others find the library when the lock is theirs. The library appears atomically
    (``os.replace``), so a reader never sees half a file.

    Raises:
        PlainTensorsUnavailableError: no compiler, or the compile failed (its output says why).
    """
    folder = cache_root() / build_key()
    library = folder / LIBRARY_NAME
    if library.is_file():
        return library
    if shutil.which(compiler()) is None:
        raise PlainTensorsUnavailableError(
            f"the plain npu tensor layer compiles a C++ extension at first use, and the "
            f"compiler {compiler()!r} is not on PATH: install g++ or set CXX")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.is_file():  # another process built it while we waited
            return library
        partial = folder / f"partial-{os.getpid()}.so"
        done = subprocess.run(compile_command(partial), capture_output=True, text=True,
                              check=False)
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            raise PlainTensorsUnavailableError(
                f"compiling {SOURCE.name} failed (exit {done.returncode}):\n"
                f"{done.stdout}{done.stderr}")
        (folder / "build.log").write_text(" ".join(compile_command(library)) + "\n"
                                          + done.stdout + done.stderr)
        os.replace(partial, library)
    return library


# ---- activation -----------------------------------------------------------------------------
def is_active() -> bool:
    return _active


def activate(backend_module: types.ModuleType) -> None:
    """Make ``device="npu"`` plain PrivateUse1 tensors in this process (idempotent): build and
    load the extension, rename PrivateUse1 ``npu`` with `backend_module` as ``torch.npu``, and
    send every aten op without a kernel of its own through `_fallback` to the twin's rules
    (`pyruntime.npu_twin.device`). `pyruntime.npu_twin.activate` calls it, then installs
    a `PlainDevice` and the rest of the twin as for the wrapper layer.

    Raises:
        PlainTensorsUnavailableError: torch's PrivateUse1 backend already has another name
            (the wrapper twin or a real torch_npu took it), or the extension cannot be built.
    """
    global _active, _fallback_library
    if _active:
        return
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        raise PlainTensorsUnavailableError(
            f"torch's PrivateUse1 backend is already named {name!r} in this process (the "
            "wrapper twin or torch_npu): the plain npu tensor layer needs a fresh process")
    twin.device_count_from_env()  # a bad AICPU_TILING_TWIN_DEVICES fails here, in Python
    library = build_extension()
    torch.utils.rename_privateuse1_backend("npu")
    torch.ops.load_library(str(library))
    torch._register_device_module("npu", backend_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    twin._plain_host_alias = torch.ops.aicpu_twin.host_alias
    # host blocks of the extension's pinned allocator (pin_memory=True made in C++)
    twin._plain_is_pinned_ptr = torch.ops.aicpu_twin.is_pinned_ptr
    _fallback_library = torch.library.Library("_", "IMPL")
    _fallback_library.fallback(_fallback, "PrivateUse1")
    _active = True


# ---- the device: device.Device with the current device and memory in C++ -------------------
def memory_stats(index: int) -> dict[str, int]:
    """The C++ allocator's accounting of device `index` (`STAT_NAMES`)."""
    return dict(zip(STAT_NAMES, torch.ops.aicpu_twin.memory_stats(index)))


class PlainMemory:
    """`pyruntime.npu_twin.memory.DeviceMemory`'s interface over the C++ allocator's
    accounting (the same model, kept per device in ``csrc/plain_device.cpp``) of the calling
    thread's current device."""

    def __init__(self, total: int) -> None:
        self.total = total
        for index in range(torch.ops.aicpu_twin.device_count()):
            torch.ops.aicpu_twin.set_memory_total(index, total)

    @staticmethod
    def _now() -> dict[str, int]:
        return memory_stats(torch.ops.aicpu_twin.current_device())

    allocated = property(lambda self: self._now()["allocated"])
    reserved = property(lambda self: self._now()["reserved"])
    peak_allocated = property(lambda self: self._now()["peak_allocated"])
    peak_reserved = property(lambda self: self._now()["peak_reserved"])

    def empty_cache(self) -> None:
        torch.ops.aicpu_twin.empty_cache(torch.ops.aicpu_twin.current_device())

    def reset_peak(self) -> None:
        torch.ops.aicpu_twin.reset_peak_memory_stats(torch.ops.aicpu_twin.current_device())

    def free_bytes(self) -> int:
        return self.total - self.reserved

    def stats(self) -> collections.OrderedDict:
        """``torch.npu.memory_stats()``: the keys of `DeviceMemory.stats`."""
        now = self._now()
        flat = {
            "allocated_bytes.all.current": now["allocated"],
            "allocated_bytes.all.peak": now["peak_allocated"],
            "allocated_bytes.all.allocated": now["allocated_total"],
            "allocated_bytes.all.freed": now["freed_total"],
            "active_bytes.all.current": now["allocated"],
            "active_bytes.all.peak": now["peak_allocated"],
            "reserved_bytes.all.current": now["reserved"],
            "reserved_bytes.all.peak": now["peak_reserved"],
            "num_alloc_retries": 0,
            "num_ooms": now["num_ooms"],
        }
        return collections.OrderedDict(sorted(flat.items()))


class PlainDevice(twin.Device):
    """The twin's `device.Device` for plain tensors: the same rules, with the current device
    in the extension's thread-local (the device guard torch's kernels use) and memory in its
    allocator (`PlainMemory`)."""

    def __init__(self, *, fault: str | None, state_dir: Path) -> None:
        super().__init__(fault=fault, state_dir=state_dir,
                         count=torch.ops.aicpu_twin.device_count())
        self.memory = PlainMemory(total_from_env())

    def current_device(self) -> int:
        return torch.ops.aicpu_twin.current_device()

    def set_current_device(self, index: int) -> None:
        self.check_alive()
        self.checked(index)
        torch.ops.aicpu_twin.set_device(index)
        self.contexts.add(index)

    @property
    def context(self) -> bool:
        # torch_npu creates the context at the first allocation (lazy set-device), and plain
        # tensors are allocated by the extension, not through Python
        index = self.current_device()
        return index in self.contexts or memory_stats(index)["allocations"] > 0


# ---- the one dispatch point -----------------------------------------------------------------
_aten = torch.ops.aten


def _fallback(op: torch._ops.OpOverload, *args, **kwargs):
    """Every aten op without an npu kernel of its own, with the twin's rules
    (`pyruntime.npu_twin.device`, the same code as for the wrapper layer):

    * copies (``_copy_from``, which ``copy_``, ``.to()`` and ``.cpu()`` reach) and ``.item()``
      follow the sync rules (`device._copy`, `device._device_to_host`);
    * view ops make npu views at once (metadata only, no device work);
    * ops whose output shape comes from the values (``unique_consecutive``) run at once on a
      synchronized stream (`device._run_shape_from_values`);
    * every other op is queued on the current stream of its tensors' device, or recorded by
      the capture on it (`device._queue_op`): outputs are allocated now and written when the
      stream runs it, on the host memory behind the tensors (`device.inner`).

    Raises:
        device.TwinError: a custom op without an npu kernel; the rules' own errors.
    """
    if op.namespace != "aten":
        raise twin.TwinError(f"{op.name()} has no NPU (PrivateUse1) kernel: the extension "
                             "that registers it is not loaded")
    if op is _aten._copy_from.default:
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        return twin._copy(args[1], args[0], bool(non_blocking))
    if op is _aten._copy_from_and_resize.default:
        src, dst = args
        if dst.shape != src.shape:
            dst.resize_(src.shape)
        return twin._copy(dst, src, False)
    if op is _aten._local_scalar_dense.default:
        return twin._device_to_host(args[0], {}).item()
    if op is _aten.set_.source_Tensor:  # metadata: share the source's storage
        self, source = args
        return self.set_(source.untyped_storage(), source.storage_offset(), source.shape,
                         source.stride())
    if _is_view(op):
        return _view(op, args, kwargs)
    if op in twin._SHAPE_FROM_VALUES_OPS:  # synchronous, as on the wrapper layer (LoRA's meta)
        return twin._run_shape_from_values(twin.device(), op, args, kwargs)
    try:
        return twin._queue_op(twin.device(), op, args, kwargs)
    except RuntimeError as exc:
        # the op refused a Python number where its schema has a Tensor (before anything was
        # allocated or queued: the meta call comes first); other ops keep their numbers, as
        # the boxed call gave them
        if "Expected a value of type 'Tensor'" not in str(exc):
            raise
        fixed_args, fixed_kwargs = _wrapped_numbers_as_tensors(op, args, kwargs)
        unchanged = all(a is b for a, b in zip(fixed_args, args)) and \
            all(fixed_kwargs[k] is v for k, v in kwargs.items())
        if unchanged:
            raise
        return twin._queue_op(twin.device(), op, fixed_args, fixed_kwargs)


def _wrapped_numbers_as_tensors(op: torch._ops.OpOverload, args: tuple,
                                kwargs: dict) -> tuple[tuple, dict]:
    """`args` and `kwargs` with a Python number in a ``Tensor`` argument made a 0-dim host
    tensor again.

    Why: ``x % 128`` is ``remainder.Scalar``, whose CompositeExplicitAutograd kernel calls
    ``remainder.Tensor`` with the scalar wrapped in a 0-dim tensor (ATen's
    ``wrapped_scalar_tensor``); with no PrivateUse1 kernel the structured op reaches this
    boxed fallback as ``remainder.Tensor_out``, and boxing to Python hands a wrapped number
    over as the Python number (``torch/csrc/jit/python/pybind_utils`` ``toPyObject``), which
    the same overload then refuses. A 0-dim host tensor is what the wrapped number was; the
    output's dtype is already fixed by ``out``. (vLLM's ``compute_new_slot_mapping``,
    ``vllm/v1/spec_decode/utils.py``, does this on device positions.)"""
    number = (bool, int, float, complex)
    schema = op._schema.arguments
    if not any(isinstance(a, number) for a in args) and \
            not any(isinstance(v, number) for v in kwargs.values()):
        return args, kwargs
    tensor_arguments = {a.name for a in schema if str(a.type) == "Tensor"}
    fixed = tuple(torch.tensor(value) if isinstance(value, number) and i < len(schema)
                  and schema[i].name in tensor_arguments else value
                  for i, value in enumerate(args))
    fixed_kwargs = {k: torch.tensor(v) if isinstance(v, number) and k in tensor_arguments
                    else v for k, v in kwargs.items()}
    return fixed, fixed_kwargs


def _is_view(op: torch._ops.OpOverload) -> bool:
    """The op returns an alias of an argument without writing it (a view)."""
    return op.is_view or any(
        r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


def _view(op: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """A view op: run on the host aliases, then the same view of the npu base."""
    schema = op._schema
    twin._device_of(op, args, kwargs)  # the same-device rule
    host_args = pytree.tree_map(twin.inner, list(args))
    host_kwargs = pytree.tree_map(twin.inner, kwargs)
    result = op(*host_args, **host_kwargs)
    by_alias = {}  # alias set -> (npu argument, its host alias)
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None:
            continue
        if argument.kwarg_only:
            value, host = kwargs.get(argument.name), host_kwargs.get(argument.name)
        elif position < len(args):
            value, host = args[position], host_args[position]
        else:
            continue
        for alias_set in argument.alias_info.before_set:
            by_alias[alias_set] = (value, host)
    single = len(schema.returns) == 1
    results = (result,) if single else tuple(result)
    back = []
    for returned, value in zip(schema.returns, results):
        alias = returned.alias_info
        if alias is None or not alias.before_set or next(iter(alias.before_set)) not in by_alias:
            raise twin.TwinError(f"{op}: a view op whose result aliases no argument")
        original, host = by_alias[next(iter(alias.before_set))]
        if isinstance(value, (list, tuple)):
            back.append(type(value)(_view_of(original, host, item) for item in value))
        else:
            back.append(_view_of(original, host, value))
    return back[0] if single else tuple(back)


def _view_of(base: torch.Tensor, host_base: torch.Tensor, host_view: torch.Tensor):
    """The npu view of ``base`` that ``host_view`` is of ``host_base`` (same storage, so its
    storage offset and strides carry over)."""
    if host_view.untyped_storage().data_ptr() != host_base.untyped_storage().data_ptr():
        raise RuntimeError("npu twin: a view op returned memory that is not its base's")
    view = base if host_view.dtype == base.dtype else base.view(host_view.dtype)
    return view.as_strided(host_view.shape, host_view.stride(), host_view.storage_offset())



# ---- custom ops ----------------------------------------------------------------------------
def route_custom_ops(dev) -> None:
    """Our custom ops (``torch.ops.aicpu_tiling``) on plain tensors, with the twin's rules:

    * an op without an npu kernel would run its CPU body (the ``CompositeExplicitAutograd``
      kernel `torch.library.custom_op` registers) on device memory, silently; the twin
      refuses it (`device.TwinError`), as the wrapper layer's dispatch does, until the
      extension's kernel replaces the refusal (`extension.register`);
    * under ``AICPU_TILING_TWIN_AICORE=reference`` the AI Core ops queue their CPU reference
      body as the AI Core task (`device.REFERENCE_BODIES`).

    Both go through the op's own kernel table (``CustomOpDef.register_kernel``), so a later
    registration of the real npu kernel replaces the refusal without a second registration.
    """
    from torch._library.custom_ops import OPDEFS

    from pyruntime.kernels import custom_ops

    custom_ops.ops()
    for qualname, opdef in list(OPDEFS.items()):
        if not qualname.startswith(f"{custom_ops.NAMESPACE}::"):
            continue
        overload = getattr(getattr(torch.ops, custom_ops.NAMESPACE),
                           qualname.split("::")[1]).default
        if dev.aicore_body == "reference" and str(overload) in twin.REFERENCE_BODIES:
            opdef.register_kernel("privateuseone")(_reference_kernel(dev, overload))
        elif "privateuseone" not in opdef._backend_fns:
            opdef.register_kernel("privateuseone")(_missing_kernel(qualname))


def _reference_kernel(dev, overload):
    def kernel(*args, **kwargs):
        dev.check_alive()
        return twin._queue_reference_body(dev, overload, args, kwargs)
    return kernel


def _missing_kernel(qualname: str):
    def kernel(*args, **kwargs):
        raise twin.TwinError(f"{qualname} has no NPU (PrivateUse1) kernel: the extension "
                             "that registers it is not loaded (torch.ops.load_library of "
                             "libaicpu_tiling_npu.so)")
    return kernel
