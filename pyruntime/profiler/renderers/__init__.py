"""Renderers: rich tables, Chrome trace JSON and PNG plots (the ``plot`` extra).

Renderers take processed data (plain dicts and lists) and never compute statistics.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

from rich.console import Console, RenderableType


def render_text(renderables: Iterable[RenderableType], width: int = 80) -> str:
    """Render rich renderables to plain text at a fixed width (golden tests, files)."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system=None, force_terminal=False, highlight=False,
        legacy_windows=False, emoji=False,
    )  # fmt: skip
    for item in renderables:
        console.print(item)
    return buf.getvalue()
