"""Post-import hooks: run a callback when a named module finishes importing.

Modelled on wrapt's post-import hooks. :func:`when_imported` registers a callback for a
dotted module name. If the module is already in ``sys.modules`` the callback runs at
once; otherwise a finder on ``sys.meta_path`` wraps that module's loader so the callback
runs right after the module body has executed, before the importing statement returns.

Locking: callbacks never run while this registry's own lock is held (so a callback may
register or remove hooks, or import other modules). Like every post-import mechanism in
CPython they do run while the interpreter holds the per-module lock of the module that
just loaded, so a callback must not start threads that import that same module and
wait for them.

A callback that raises is logged and swallowed: a broken patch must never break the
import of the package it patches.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType

log = logging.getLogger("pyruntime.hook")

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
_hooks: dict[str, list[Callback]] = {}
_finder: _PostImportFinder | None = None


class _LoaderWrapper(importlib.abc.Loader):
    """Delegates to the real loader, then fires the hooks registered for the module."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _fire(module.__name__)

    def __getattr__(self, name: str) -> object:
        # get_resource_reader, get_source, is_package ... keep working unchanged.
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; asks the other finders and wraps the loader of hooked names."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(self, fullname, path, target=None):  # importlib protocol
        with _lock:
            if fullname not in _hooks:
                return None
        busy: set[str] = self._busy.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = _find_spec_elsewhere(self, fullname, path, target)
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _LoaderWrapper(spec.loader)
        return spec


def _find_spec_elsewhere(me, fullname, path, target):
    for finder in sys.meta_path:
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _fire(name: str) -> None:
    module = sys.modules.get(name)
    if module is None:
        return
    with _lock:
        callbacks = list(_hooks.get(name, ()))
    for callback in callbacks:  # outside the registry lock on purpose
        try:
            callback(module)
        except Exception:  # a patch must never break the import
            log.exception("aicpu-tiling: post-import hook for %s failed; module left as is", name)


def _ensure_finder() -> None:
    global _finder
    if _finder is None:
        _finder = _PostImportFinder()
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def when_imported(name: str, callback: Callback) -> None:
    """Run ``callback(module)`` once ``name`` is imported, or now if it already is.

    Args:
        name: the dotted module name, e.g. ``"vllm_ascend.compilation.acl_graph"``.
        callback: called with the module object; runs outside the registry lock.

    A module that is re-imported later (after removal from ``sys.modules``) fires its
    callbacks again, so callbacks must be idempotent.
    """
    with _lock:
        _hooks.setdefault(name, []).append(callback)
        _ensure_finder()
        already = name in sys.modules
    if already:
        _fire_one(name, callback)


def _fire_one(name: str, callback: Callback) -> None:
    module = sys.modules.get(name)
    if module is None:
        return
    try:
        callback(module)
    except Exception:
        log.exception("aicpu-tiling: post-import hook for %s failed; module left as is", name)


def discard(name: str, callback: Callback) -> None:
    """Remove one registration; removes the finder once no hooks remain. Idempotent."""
    with _lock:
        callbacks = _hooks.get(name)
        if callbacks and callback in callbacks:
            callbacks.remove(callback)
            if not callbacks:
                del _hooks[name]
        if not _hooks:
            _remove_finder()


def clear() -> None:
    """Forget every hook and take the finder off ``sys.meta_path`` (for tests)."""
    with _lock:
        _hooks.clear()
        _remove_finder()


def _remove_finder() -> None:
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def registered() -> dict[str, int]:
    """Module names with hooks and how many callbacks each has (a snapshot)."""
    with _lock:
        return {name: len(cbs) for name, cbs in _hooks.items()}
