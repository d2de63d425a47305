"""The twin across processes: what a fork child keeps, and who removes the state directory.

How children get the twin: a spawn, forkserver or ``subprocess`` child is a fresh interpreter
and activates its own twin through the ``.pth`` line when ``AICPU_TILING_TWIN`` is on
(:mod:`pyruntime.npu_twin.pth`); a fork child inherits the parent's activated twin (its
modules, ``torch.npu``, its device object). Every process of one tree shares one state
directory (``AICPU_TILING_TWIN_STATE``, set by the first activation and inherited), as the
processes of one machine share its NPU: a device lost by one is lost for all (the
``device-lost`` fault).

What :func:`install` arranges at activation, for the fork case:

* **The state directory** is removed at exit by the process that created it, and only by
  it: a fork child inherits the parent's ``atexit`` handlers (an ``os.fork()`` child that
  returns normally runs them; multiprocessing's fork children leave through ``os._exit`` and
  do not), so the handler compares the pid. A child that outlives the creator loses the
  directory (and its kernel files) when the creator exits, as a worker outliving its engine
  would; vLLM's parents outlive their workers.
* **Threads** do not survive a fork: the child forgets the parent's device thread (it starts
  its own at its first synchronisation) and gets a fresh AI-CPU launcher lock (another
  parent thread may have held it at the fork).
* **torch_npu's fork rule**: a multiprocessing fork child of a process that had initialised
  the NPU cannot use it. torch_npu 2.10.0.post4, ``torch_npu/npu/__init__.py``: ``_after_fork``
  (registered with ``multiprocessing.util.register_after_fork``) sets
  ``_is_internal_in_bad_fork`` when ``_initialized`` and the pid changed, and ``_lazy_init``
  then raises ``RuntimeError("Cannot re-initialize NPU in forked subprocess. To use NPU with
  multiprocessing, you must use the 'spawn' start method")``. The twin's "initialised" is its
  device context (``torch.npu.is_initialized()``: ``set_device`` or a first allocation) or a
  device thread that has run work (a synchronisation, which on torch_npu initialises too).
  Like torch_npu's, the rule runs only in multiprocessing's children (``Process._bootstrap``
  runs the after-fork registry); a bare ``os.fork()`` child is not marked. A fork child of a
  parent that never touched the device starts with a clean device, as on hardware.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing.util
import os
import shutil
import threading
from pathlib import Path

from . import device as twin
from . import extension

_creator_pid: int | None = None
_installed = False
#: in a fork child: whether the parent had used its device (see _mark_bad_fork)
_parent_used_device = False


def remove_at_exit(state_dir: Path) -> None:
    """Remove `state_dir` when this process exits, but never from a fork child."""
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(state_dir, ignore_errors=True)

    atexit.register(remove)


@contextlib.contextmanager
def children_without_the_twin():
    """Python children started inside the block do not activate the twin.

    The twin's activation runs Python tools (``python -m ziglang`` builds the AI-CPU binary
    when its cache is cold). With ``AICPU_TILING_TWIN`` on, each would activate a twin of its
    own at start, which would build again, and so on without end; inside the block the
    variable reads ``0`` and the previous value comes back after it.
    """
    from .pth import ENV_VAR

    saved = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = saved


def install() -> None:
    """Register the fork handlers for this process's twin (once; activation calls it)."""
    global _creator_pid, _installed
    _creator_pid = os.getpid()
    if _installed:
        return
    _installed = True
    os.register_at_fork(after_in_child=_forget_parent_threads)
    multiprocessing.util.register_after_fork(_mark_bad_fork, _mark_bad_fork)


def _forget_parent_threads() -> None:
    """In every fork child: the parent's threads are gone."""
    global _parent_used_device
    dev = twin._device
    if dev is not None:
        _parent_used_device = bool(dev.contexts) or dev._executor is not None
        dev._executor = None  # its worker thread did not survive the fork
        dev._device_thread = None
    extension._lock = threading.Lock()  # held by a parent thread that no longer exists


def _mark_bad_fork(_registered: object) -> None:
    """torch_npu's ``_after_fork``, in a multiprocessing fork child."""
    dev = twin._device
    if dev is not None and _parent_used_device and _creator_pid != os.getpid():
        dev.contexts.clear()  # torch_npu: _initialized = False
        dev.in_bad_fork = True
