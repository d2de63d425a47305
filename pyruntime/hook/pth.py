"""Activation at interpreter start through a ``.pth`` file and ``AICPU_TILING``.

A regular install puts :data:`PTH_FILENAME` into site-packages with the content of
:func:`pth_content` (setup.py's ``build_py_with_pth``); an editable install does not, which is
why vLLM processes are covered by the plugin entry point instead (:mod:`.vllm_plugin`). Python's ``site`` module executes its single ``import`` line at
every interpreter start. The line itself only reads ``os.environ``:

* ``1``, ``true``, ``yes``, ``on`` (any case): it imports :mod:`pyruntime.hook.autostart`,
  which calls :func:`install`.
* unset, empty, ``0``, ``false``, ``no``, ``off``: nothing of ours is imported.
* anything else (``maybe``): nothing of ours is imported either, and one line on stderr
  names the accepted values. A typo must not half-enable the hook, and must not pass
  unnoticed.
"""

from __future__ import annotations

ENV_VAR = "AICPU_TILING"
PTH_FILENAME = "aicpu_tiling_hook.pth"
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
_WARNED = "_aicpu_tiling_warned"


#: printf-style, one ``%r`` for the value: the .pth line formats it without importing us
_WARNING = (
    f"aicpu-tiling: {ENV_VAR}=%r is not understood, so the vLLM-Ascend hook stays off; "
    f"accepted values: {'/'.join(_ON)} (on), {'/'.join(v for v in _OFF if v)} or unset (off)"
)


def unknown_value_warning(value: str) -> str:
    """The one stderr line for an ``AICPU_TILING`` value that is neither on nor off."""
    return _WARNING % (value,)


def pth_content() -> str:
    """The exact text of the ``.pth`` file: one ``import`` line and a newline.

    ``site`` runs only lines that start with ``import``, so the whole decision is one
    expression: import the autostart module for an "on" value, nothing for an "off" value,
    print :func:`unknown_value_warning` (and import nothing) for anything else. ``site``
    runs the .pth files of a venv created with ``--system-site-packages`` twice (CPython's
    ``site.venv`` and ``site.main`` both add the venv's site-packages), so the warning is
    printed only once per process, remembered in a private attribute of ``sys``.
    """
    return (
        "import os, sys; (lambda raw, value: "
        f"__import__('pyruntime.hook.autostart') if value in {_ON!r} "
        f"else value in {_OFF!r} or getattr(sys, {_WARNED!r}, False) "
        f"or setattr(sys, {_WARNED!r}, True) or print({_WARNING!r} % (raw,), file=sys.stderr))"
        f"(os.environ.get({ENV_VAR!r}, ''), os.environ.get({ENV_VAR!r}, '').strip().lower())\n"
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
