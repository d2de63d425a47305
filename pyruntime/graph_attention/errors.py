"""Exceptions of the attention API.

Bad lengths inside a step are not raised here: the tiling reports them after the fact,
and `StaticAttention.check()` raises them as `pyruntime.tiling.TilingInputError`
subclasses that name the request.
"""

from __future__ import annotations


class AttentionError(Exception):
    """Base of the attention API's own errors. Never raised directly."""


class FrozenSizeError(AttentionError, ValueError):
    """A step asked for more than a size frozen at capture.

    Attributes:
        name: the frozen parameter (e.g. ``"max_batch"``).
        frozen: its value at capture.
        got: what the step needed.
    """

    def __init__(self, name: str, frozen: int, got: int, what: str) -> None:
        super().__init__(f"{what} is {got}, but {name} is frozen at {frozen} for this capture "
                         f"bucket; construct a StaticAttention with {name} >= {got} and capture "
                         "it, or split the step")
        self.name, self.frozen, self.got = name, frozen, got


class AttentionInputError(AttentionError, ValueError):
    """A step argument has the wrong type, dtype, rank or shape."""


class AttentionStateError(AttentionError, RuntimeError):
    """The API was called out of order (a step before capture, a second capture)."""


class AttentionClosedError(AttentionStateError):
    """A `StaticAttention` was used after `close()` (or after its ``with`` block ended)."""
