"""Import hook that switches vLLM-Ascend from the host-update path to device tiling.

Turn it on from code::

    import pyruntime.hook
    pyruntime.hook.install()      # patches now, or when vllm_ascend is imported
    ...
    pyruntime.hook.uninstall()    # restores every original function exactly

or without code changes, for ``vllm serve``: ``AICPU_TILING=1 vllm serve ...``. Two start-up
paths read the variable: vLLM's general-plugin entry point (:mod:`.vllm_plugin`, registered
by every install, editable or not, and called by vLLM in each of its processes) and, for a
regular install, a ``.pth`` file that reads it at every interpreter start (:mod:`.pth`).

Nothing is patched when the installed vLLM-Ascend is outside the supported range, our
kernels cannot load, or the device is not supported; one log line on the
``pyruntime.hook`` logger says which, and :func:`status` reports it.
"""

from __future__ import annotations

import importlib

# The names below load on first use (PEP 562), not when this package is imported. The
# start-up paths (the .pth line imports ``pyruntime.hook.autostart``, vLLM loads
# ``pyruntime.hook.vllm_plugin:register``) import this package first, outside their own
# ``try``; an eager import here of activation -> versions -> packaging would turn a broken
# install into a traceback at every interpreter start instead of their one-line message.
_EXPORTS = {
    "Report": "activation",
    "install": "activation",
    "is_installed": "activation",
    "status": "activation",
    "uninstall": "activation",
    "AttentionCapture": "engine",
    "TilingEngine": "engine",
    "load_engine": "engine_loader",
    "ActivationError": "errors",
    "HookError": "errors",
    "PatchTargetError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
