"""Imported by the ``.pth`` line only when ``AICPU_TILING`` is an "on" value; installs the hook.

Never raises: a bad setting or a broken install prints one line to stderr and leaves
the interpreter (and vLLM-Ascend) exactly as it would be without us.
"""

from __future__ import annotations

import os
import sys


def _autostart() -> None:
    try:
        from .activation import install
        from .pth import ENV_VAR, env_enabled

        if env_enabled(os.environ.get(ENV_VAR)):
            install()
    except Exception as exc:  # noqa: BLE001 - interpreter start must never fail because of us
        print(f"aicpu-tiling: hook not installed: {type(exc).__name__}: {exc}", file=sys.stderr)


_autostart()
