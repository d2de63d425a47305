"""Typed errors of the import hook.

``HookError`` is the base class and is never raised directly. Each subclass names one
class of failure so callers can catch exactly what they can handle.
"""

from __future__ import annotations


class HookError(Exception):
    """Base class of every error raised by :mod:`pyruntime.hook`; never raised itself."""


class PatchTargetError(HookError, LookupError):
    """A patch names a module attribute that does not exist (or has the wrong kind).

    Attributes:
        module: the dotted module name the patch targets.
        path: the attribute path inside that module, e.g. ``"Cls.method"``.
    """

    def __init__(self, module: str, path: str, detail: str) -> None:
        super().__init__(f"cannot patch {module}:{path}: {detail}")
        self.module = module
        self.path = path


class ActivationError(HookError, ValueError):
    """An activation setting (environment variable or argument) has a value we cannot use."""
