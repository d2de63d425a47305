"""install() / uninstall(): wire the patch set to post-import hooks, reversibly.

``install()`` registers a post-import hook per target module. The first target to be
imported settles the installation: the version of vLLM-Ascend is checked and the
device-tiling engine is loaded; if either fails, one log line says why and nothing is
patched, ever, for this installation. ``uninstall()`` removes the hooks and restores
every original attribute exactly. Both are idempotent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from . import registry
from . import vllm_ascend_mla as mla
from . import vllm_ascend_patches as patches
from . import vllm_ascend_targets as targets
from .engine import TilingEngine
from .engine_loader import load_engine
from .versions import VersionRange, installed_version

log = logging.getLogger("pyruntime.hook")

VERSIONS = VersionRange(targets.DISTRIBUTION, targets.MINIMUM, targets.BELOW)


@dataclass
class Report:
    """What an installation did; see :func:`status`."""

    installed: bool = False
    #: "waiting" (no target imported yet), "active" or "skipped"
    state: str = "waiting"
    reason: str | None = None
    version: str | None = None
    engine: str | None = None
    patched_modules: list[str] = field(default_factory=list)
    host_path_layers: list[tuple[str, str]] = field(default_factory=list)
    device_tiled_layers: int = 0
    updates_skipped: int = 0
    #: device-path layers whose logits soft cap our kernels apply (vLLM-Ascend's path does not)
    soft_capped_layers: list[str] = field(default_factory=list)
    #: device-path layer -> the vLLM-Ascend entry that captured it (``full_graph_fia``, or
    #: ``full_graph_fia_v2`` for the layers with attention sinks)
    device_entries: dict[str, str] = field(default_factory=dict)


_lock = threading.RLock()
_installed = False
_engine_factory: Callable[[], tuple[TilingEngine | None, str | None]] = load_engine
_report = Report()
_state: patches.PatchState | None = None
_callbacks: dict[str, Callable[[ModuleType], None]] = {}


def _settle() -> patches.PatchState | None:
    """Decide once per installation whether to patch; returns the state or None."""
    global _state
    if _report.state != "waiting":
        return _state
    version = installed_version(targets.DISTRIBUTION)
    _report.version = version
    reason = VERSIONS.check(version)
    engine = None
    if reason is None:
        engine, reason = _engine_factory()
    if reason is not None or engine is None:
        _report.state, _report.reason = "skipped", reason or "no engine"
        log.warning("aicpu-tiling: vLLM-Ascend left untouched: %s", _report.reason)
        return None
    _state = patches.PatchState(engine=engine, line=targets.release_line(version))
    _report.state, _report.engine = "active", getattr(engine, "name", type(engine).__name__)
    log.info(
        "aicpu-tiling: patching %s %s (line %s) with engine %s",
        targets.DISTRIBUTION,
        version,
        _state.line,
        _report.engine,
    )
    return _state


def _on_import(name: str, module: ModuleType) -> None:
    with _lock:
        if not _installed:
            return
        state = _settle()
        if state is None:
            return
        if name == targets.ACL_GRAPH:
            if state.update_wrapper is None or state.update_original is not module.__dict__.get(
                "update_full_graph_params"
            ):
                patches.patch_acl_graph(module, state)
        elif name == targets.ATTENTION:
            if state.impl_cls is not getattr(module, targets.IMPL, None):
                import importlib

                acl_graph = importlib.import_module(targets.ACL_GRAPH)
                patches.patch_attention(module, state, acl_graph)
        elif name == mla.MODULE:
            if state.mla_impl_cls is not getattr(module, mla.IMPL, None):
                import importlib

                mla.patch_mla(module, state, importlib.import_module(targets.ACL_GRAPH))
        else:
            patches.patch_importer(module, state)
        if name not in state.patched_modules:
            state.patched_modules.append(name)
            log.info("aicpu-tiling: patched %s", name)


def install(
    *, engine_factory: Callable[[], tuple[TilingEngine | None, str | None]] | None = None
) -> Report:
    """Switch vLLM-Ascend's FIA full-graph decode to device tiling, now or on import.

    Args:
        engine_factory: returns ``(engine, None)`` or ``(None, reason)``; defaults to
            :func:`pyruntime.hook.engine_loader.load_engine` (kernels, device and backend
            checks, or ``AICPU_TILING_ENGINE``).

    Returns:
        The live :class:`Report`. Calling ``install()`` again changes nothing.
    """
    global _installed, _engine_factory, _report
    with _lock:
        if _installed:
            return status()
        _installed = True
        _engine_factory = engine_factory or load_engine
        _report = Report(installed=True)
        names = (targets.ACL_GRAPH, targets.ATTENTION, mla.MODULE, *targets.IMPORTERS)
        for name in names:
            _callbacks[name] = _make_callback(name)
    for name in names:  # may fire at once for modules already imported
        registry.when_imported(name, _callbacks[name])
    return status()


def _make_callback(name: str) -> Callable[[ModuleType], None]:
    def callback(module: ModuleType) -> None:
        _on_import(name, module)

    return callback


def uninstall() -> int:
    """Remove the hooks and restore every patched attribute; returns how many. Idempotent."""
    global _installed, _state, _report
    with _lock:
        if not _installed:
            return 0
        for name, callback in _callbacks.items():
            registry.discard(name, callback)
        _callbacks.clear()
        restored = _state.ledger.restore_all() if _state is not None else 0
        _installed, _state, _report = False, None, Report()
        log.info("aicpu-tiling: uninstalled, %d attributes restored", restored)
        return restored


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _installed


def status() -> Report:
    """A snapshot of the current installation (counts and layers included)."""
    with _lock:
        report = Report(**{k: getattr(_report, k) for k in Report.__dataclass_fields__})
        if _state is not None:
            report.patched_modules = list(_state.patched_modules)
            report.host_path_layers = sorted(_state.host_layers)
            report.device_tiled_layers = sum(len(v) for v in _state.device_layers.values())
            report.updates_skipped = _state.updates_skipped
            report.soft_capped_layers = sorted(_state.soft_capped_layers)
            report.device_entries = dict(_state.device_entries)
        return report
