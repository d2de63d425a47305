"""Reversible attribute replacement with a ledger.

Every replacement is recorded as (owner, name, original, replacement) where ``original``
is the raw value from the owner's ``__dict__`` (a ``staticmethod`` object stays a
``staticmethod`` object). :meth:`PatchLedger.restore_all` puts the originals back in
reverse order, so after it ``Owner.__dict__[name] is original`` holds exactly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .errors import PatchTargetError

log = logging.getLogger("pyruntime.hook")

_MISSING = object()


@dataclass
class _Entry:
    owner: Any
    name: str
    original: Any
    replacement: Any


class PatchLedger:
    """Applies replacements and remembers how to undo them."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []

    def resolve(self, module: ModuleType, path: str) -> tuple[Any, str, Any]:
        """Return ``(owner, name, raw_value)`` for ``path`` (``"func"`` or ``"Cls.attr"``).

        Raises:
            PatchTargetError: when a component of the path does not exist.
        """
        owner: Any = module
        parts = path.split(".")
        for part in parts[:-1]:
            owner = vars(owner).get(part, _MISSING) if hasattr(owner, "__dict__") else _MISSING
            if owner is _MISSING:
                raise PatchTargetError(module.__name__, path, f"{part!r} not found")
        name = parts[-1]
        raw = vars(owner).get(name, _MISSING)
        if raw is _MISSING:
            raise PatchTargetError(module.__name__, path, f"{name!r} not found")
        return owner, name, raw

    def replace(self, owner: Any, name: str, replacement: Any, *, original: Any = _MISSING) -> None:
        """Set ``owner.name = replacement`` and record what to restore.

        Args:
            owner: a module or class.
            name: the attribute name, which must already exist on ``owner``.
            replacement: the new raw value (wrap in ``staticmethod`` yourself if needed).
            original: what :meth:`restore_all` puts back; defaults to the current raw
                value. Pass it when the current value is already a replacement that was
                copied here (``from m import f`` after ``m.f`` was patched).
        """
        current = vars(owner).get(name, _MISSING)
        if current is _MISSING:
            raise PatchTargetError(getattr(owner, "__name__", repr(owner)), name, "not found")
        self._entries.append(
            _Entry(owner, name, current if original is _MISSING else original, replacement)
        )
        setattr(owner, name, replacement)

    def restore_all(self) -> int:
        """Restore every recorded original, newest first; returns how many were restored.

        An attribute that someone else has rebound since we patched it is left alone
        (and logged), because restoring it would undo their change.
        """
        restored = 0
        while self._entries:
            entry = self._entries.pop()
            if vars(entry.owner).get(entry.name, _MISSING) is not entry.replacement:
                log.warning(
                    "aicpu-tiling: %s.%s was rebound by someone else; not restoring it",
                    getattr(entry.owner, "__qualname__", entry.owner),
                    entry.name,
                )
                continue
            setattr(entry.owner, entry.name, entry.original)
            restored += 1
        return restored

    def targets(self) -> list[tuple[Any, str]]:
        """``(owner, name)`` of every recorded replacement, oldest first (for checks and tests)."""
        return [(e.owner, e.name) for e in self._entries]

    def patched(self, owner: Any, name: str) -> bool:
        """Whether ``owner.name`` currently holds a replacement recorded here."""
        value = vars(owner).get(name, _MISSING)
        return any(
            e.owner is owner and e.name == name and e.replacement is value for e in self._entries
        )
