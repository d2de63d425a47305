"""Plain npu tensors: the twin's next tensor layer, opt-in, without the twin's rules yet.

Today's twin (`pyruntime.npu_twin.device`) makes ``device="npu"`` with torch's Python
PrivateUse1 backend and a wrapper subclass (``NpuTensor``). Dynamo cannot trace that wrapper,
and vLLM's ``nn.Parameter`` subclasses and ``param.data = ...`` break on it (issue 28, the
engine probe). Here a twin tensor is an ordinary ``torch.Tensor`` on the PrivateUse1 device
renamed ``npu``:

* ``csrc/plain_device.cpp``, a small C++ extension: an allocator over host memory with live
  per-device accounting (allocated / reserved / peak), a device guard (the device count from
  ``AICPU_TILING_TWIN_DEVICES``, default 2; the current device per thread), torch 2.13's
  PrivateUse1 hooks, and the kernels every tensor needs (empty, empty_strided, as_strided,
  view, _reshape_alias, resize_, set_, copies between cpu and npu, item);
* one boxed Python fallback for every other aten op (`_fallback`): it runs the op on CPU
  tensors over the same bytes and hands back npu tensors. It is the single dispatch point
  where the twin's rules (queued execution per stream, capture records, replay, sync rules,
  host-pointer refusal, faults) are to plug in; none of them is ported yet, so every op here
  runs at once, synchronously.

Use: ``AICPU_TILING_TWIN_TENSORS=plain`` makes `pyruntime.npu_twin.activate` install this
layer instead of the wrapper twin (and nothing else of the twin), or call `activate` here.
Activation is once per process, and excludes the wrapper twin in the same process (both
rename torch's PrivateUse1 backend).

The extension is compiled at first use (g++, ``-Wall -Wextra -Werror``, torch's headers as
``-isystem``) into ``$XDG_CACHE_HOME/aicpu-tiling/twin-ext/<key>/`` (default ``~/.cache``),
where the key hashes the source, the flags, the compiler and torch's version; an ``fcntl``
lock on that folder makes parallel test workers build it once.
"""

from __future__ import annotations

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

TENSORS_ENV = "AICPU_TILING_TWIN_TENSORS"
DEVICES_ENV = "AICPU_TILING_TWIN_DEVICES"
SOURCE = Path(__file__).resolve().parent / "csrc" / "plain_device.cpp"
LIBRARY_NAME = "aicpu_twin_plain.so"
CFLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror")
#: the order of ``torch.ops.aicpu_twin.memory_stats``
STAT_NAMES = ("allocated", "reserved", "peak_allocated", "peak_reserved", "live_blocks")

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


def activate() -> None:
    """Make ``device="npu"`` plain PrivateUse1 tensors in this process (idempotent).

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
    library = build_extension()
    torch.utils.rename_privateuse1_backend("npu")
    torch.ops.load_library(str(library))
    torch._register_device_module("npu", _device_module())
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    _fallback_library = torch.library.Library("_", "IMPL")
    _fallback_library.fallback(_fallback, "PrivateUse1")
    _active = True


# ---- torch.npu (the device part only) ------------------------------------------------------
def memory_stats(device: int | str | torch.device | None = None) -> dict[str, int]:
    """Live accounting of one device's allocator: bytes ``allocated`` (asked for),
    ``reserved`` (in 512-byte blocks), their peaks since the last reset, and ``live_blocks``."""
    values = torch.ops.aicpu_twin.memory_stats(_index(device))
    return dict(zip(STAT_NAMES, values))


def _index(device: int | str | torch.device | None) -> int:
    if device is None:
        return torch.ops.aicpu_twin.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "npu":
        raise ValueError(f"expected an npu device, got {device}")
    return torch.ops.aicpu_twin.current_device() if device.index is None else device.index


class _DeviceContext:
    """``torch.npu.device(k)``: the current device is k inside the block."""

    def __init__(self, device: int | str | torch.device | None) -> None:
        self.index = None if device is None else _index(device)
        self.previous = -1

    def __enter__(self):
        self.previous = torch.ops.aicpu_twin.current_device()
        if self.index is not None:
            torch.ops.aicpu_twin.set_device(self.index)
        return self

    def __exit__(self, *exc) -> None:
        torch.ops.aicpu_twin.set_device(self.previous)


def _device_module() -> types.ModuleType:
    """The ``torch.npu`` of the plain layer: devices and memory only. Every other name raises
    `NotInTwinError` when called, never an object that accepts anything."""
    from .npu_module import placeholder

    module = types.ModuleType("torch.npu", "The NPU twin's plain tensor layer (devices, memory)")
    functions = {
        "is_available": lambda: True,
        "_is_in_bad_fork": lambda: False,
        # torch calls it before a device's first use; the host-backed device needs no setup
        "_lazy_init": lambda: None,
        "device_count": lambda: torch.ops.aicpu_twin.device_count(),
        "current_device": lambda: torch.ops.aicpu_twin.current_device(),
        "set_device": lambda device: torch.ops.aicpu_twin.set_device(_index(device)),
        "device": _DeviceContext,
        "memory_stats": memory_stats,
        "memory_allocated": lambda device=None: memory_stats(device)["allocated"],
        "memory_reserved": lambda device=None: memory_stats(device)["reserved"],
        "max_memory_allocated": lambda device=None: memory_stats(device)["peak_allocated"],
        "max_memory_reserved": lambda device=None: memory_stats(device)["peak_reserved"],
        "reset_peak_memory_stats":
            lambda device=None: torch.ops.aicpu_twin.reset_peak_memory_stats(_index(device)),
    }
    for name, function in functions.items():
        setattr(module, name, function)

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"torch.npu.{name}")

    module.__getattr__ = missing  # type: ignore[method-assign]
    return module


# ---- the one dispatch point -----------------------------------------------------------------
#: ops that take CPU index tensors with npu data, as torch's CUDA indexing does
_HOST_INDEX_OPS = frozenset({"aten::index", "aten::index_put", "aten::index_put_",
                             "aten::_index_put_impl_"})


def _fallback(op: torch._ops.OpOverload, *args, **kwargs):
    """Every aten op without an npu kernel of its own: run on the host, over the same bytes.

    Tensors on npu are replaced by CPU aliases (`aicpu_twin::host_alias`), so in-place ops
    write device memory directly; ``out=`` arguments get a fresh host result that is copied
    into them (resizing them as torch's out= contract allows); views come back as npu views of
    their base; new results are copied into fresh npu memory on the inputs' device.

    Raises:
        RuntimeError: tensors of two npu devices, or a CPU tensor that is not a 0-dim scalar
            among npu tensors (torch's "Expected all tensors to be on the same device").
    """
    schema = op._schema
    flat = pytree.tree_leaves((args, kwargs))
    device = _common_device(op, flat, kwargs)
    outs: dict[int, torch.Tensor] = {}  # argument position -> npu out tensor
    host_args, host_kwargs = [], {}
    for position, argument in enumerate(schema.arguments):
        if argument.kwarg_only:
            if argument.name not in kwargs:
                continue
            value = kwargs[argument.name]
        elif position < len(args):
            value = args[position]
        else:
            continue
        writes = argument.alias_info is not None and argument.alias_info.is_write
        if writes and argument.kwarg_only and isinstance(value, torch.Tensor) \
                and value.device.type == "npu":
            outs[position] = value
            host = torch.empty(0, dtype=value.dtype)
        else:
            host = pytree.tree_map(_to_host, value)
        if argument.kwarg_only:
            host_kwargs[argument.name] = host
        else:
            host_args.append(host)
    result = op(*host_args, **host_kwargs)

    by_alias = {}  # alias set -> (npu argument, its host alias)
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None:
            continue
        value = kwargs.get(argument.name) if argument.kwarg_only else \
            (args[position] if position < len(args) else None)
        host = host_kwargs.get(argument.name) if argument.kwarg_only else \
            (host_args[position] if position < len(host_args) else None)
        for alias_set in argument.alias_info.before_set:
            by_alias[alias_set] = (position, value, host)

    single = len(schema.returns) == 1
    results = (result,) if single else tuple(result)
    back = []
    for returned, value in zip(schema.returns, results):
        alias = returned.alias_info
        if alias is not None and alias.before_set and next(iter(alias.before_set)) in by_alias:
            position, original, host = by_alias[next(iter(alias.before_set))]
            if position in outs:
                back.append(_fill_out(outs[position], value))
            elif alias.is_write:
                back.append(original)
            else:
                back.append(_view_of(original, host, value))
        else:
            back.append(pytree.tree_map(lambda item: _to_device(item, device), value))
    return back[0] if single else tuple(back)


def _common_device(op, flat: list, kwargs: dict) -> torch.device:
    npu = {x.device for x in flat if isinstance(x, torch.Tensor) and x.device.type == "npu"}
    host = [x for x in flat if isinstance(x, torch.Tensor) and x.device.type == "cpu"
            and x.dim() > 0]
    if len(npu) > 1 or (npu and host and op._schema.name not in _HOST_INDEX_OPS):
        names = sorted(str(d) for d in npu)
        first, second = names[:2] if len(names) > 1 else (names[0], "cpu")
        raise RuntimeError("Expected all tensors to be on the same device, but found at "
                           f"least two devices, {first} and {second}! ({op})")
    if npu:
        return next(iter(npu))
    asked = kwargs.get("device")
    if asked is not None and torch.device(asked).type == "npu":
        asked = torch.device(asked)
        if asked.index is not None:
            return asked
    return torch.device("npu", torch.ops.aicpu_twin.current_device())


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "npu":
        return torch.ops.aicpu_twin.host_alias(value)
    if isinstance(value, torch.device) and value.type == "npu":
        return torch.device("cpu")
    return value


def _to_device(value: Any, device: torch.device) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    fresh = torch.empty_like(value, device=device)
    fresh.copy_(value)
    return fresh


def _fill_out(out: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    if out.shape != host.shape:
        out.resize_(host.shape)
    out.copy_(host)
    return out


def _view_of(base: torch.Tensor, host_base: torch.Tensor, host_view: torch.Tensor):
    """The npu view of ``base`` that ``host_view`` is of ``host_base`` (same storage, so its
    storage offset and strides carry over)."""
    if host_view.untyped_storage().data_ptr() != host_base.untyped_storage().data_ptr():
        raise RuntimeError("npu twin: a view op returned memory that is not its base's")
    view = base if host_view.dtype == base.dtype else base.view(host_view.dtype)
    return view.as_strided(host_view.shape, host_view.stride(), host_view.storage_offset())

