"""Import hook that switches vLLM-Ascend from the host-update path to device tiling.

Turn it on from code::

    import pyruntime.hook
    pyruntime.hook.install()      # patches now, or when vllm_ascend is imported
    ...
    pyruntime.hook.uninstall()    # restores every original function exactly

or without code changes, for ``vllm serve``: ``AICPU_TILING=1 vllm serve ...`` (the
package installs a ``.pth`` file that reads the variable at interpreter start).

Nothing is patched when the installed vLLM-Ascend is outside the supported range, our
kernels cannot load, or the device is not supported; one log line on the
``pyruntime.hook`` logger says which, and :func:`status` reports it.
"""

from .activation import Report, install, is_installed, status, uninstall
from .engine import AttentionCapture, TilingEngine, load_engine
from .errors import ActivationError, HookError, PatchTargetError

__all__ = [
    "ActivationError",
    "AttentionCapture",
    "HookError",
    "PatchTargetError",
    "Report",
    "TilingEngine",
    "install",
    "is_installed",
    "load_engine",
    "status",
    "uninstall",
]
