"""Activation at interpreter start through a ``.pth`` file and ``AICPU_TILING``.

setuptools installs :data:`PTH_FILENAME` into site-packages with the content of
:func:`pth_content`. Python's ``site`` module executes its single ``import`` line at
every interpreter start. The line itself only reads ``os.environ``, so with
``AICPU_TILING`` unset or ``0`` nothing of ours is imported; with ``AICPU_TILING=1`` it
imports :mod:`pyruntime.hook.autostart`, which calls :func:`install`.
"""

from __future__ import annotations

ENV_VAR = "AICPU_TILING"
PTH_FILENAME = "aicpu_tiling_hook.pth"
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def pth_content() -> str:
    """The exact text of the ``.pth`` file: one ``import`` line and a newline."""
    return (
        f"import os; os.environ.get({ENV_VAR!r}, '0').strip().lower() not in {_OFF!r} "
        "and __import__('pyruntime.hook.autostart')\n"
    )


def env_enabled(value: str | None) -> bool:
    """Interpret ``AICPU_TILING``: ``1/true/yes/on`` enable, ``0/false/no/off``/unset do not.

    Raises:
        pyruntime.hook.errors.ActivationError: for any other value.
    """
    from .errors import ActivationError

    text = (value or "").strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise ActivationError(
        f"{ENV_VAR}={value!r} is not understood; use 1 to enable or 0 to leave vLLM-Ascend as is"
    )
