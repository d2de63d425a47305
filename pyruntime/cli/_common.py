"""Shared CLI plumbing: the user-error type, consoles, JSON output and progress bars."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

PROG = "aicpu-tiling"


class CliError(Exception):
    """A user error: printed as one line, exit code 2, never a traceback."""


def _shows_default(action: argparse.Action) -> bool:
    """An option whose default is worth saying (not None, False or suppressed)."""
    default = action.default
    return (bool(action.option_strings) and default is not None and default is not False
            and default != argparse.SUPPRESS)


class DefaultsShownFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless it says its default already (or
    has none worth saying)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not _shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors raise :class:`CliError` instead of exiting; its help
    shows defaults and plain text."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsShownFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CliError(f"{self.prog}: {message}")

    def format_help(self) -> str:
        # an option with no help text still shows its default (argparse prints nothing for it)
        for action in self._actions:
            if not action.help and _shows_default(action):
                action.help = "(default: %(default)s)"
        # module docstrings serve as descriptions: their reST ``literals`` read as plain text
        return super().format_help().replace("``", "")


def comma_choices(choices: tuple[str, ...], what: str):
    """An argparse ``type``: a comma-separated, non-empty subset of `choices` -> list[str].

    The error names the unknown entries (``unknown <what> x, y; choose from ...``).
    """

    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        bad = [n for n in names if n not in choices]
        if bad or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or repr(text)}; choose from {', '.join(choices)}"
            )
        return names

    return parse


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """``--json`` (machine output on stdout) and ``--no-progress``."""
    parser.add_argument(
        "--json", action="store_true", help="print the result as JSON on stdout (no tables)"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr) that wraps at the terminal width, 80 when piped."""
    file = sys.stderr if stderr else sys.stdout
    width = None if file.isatty() else 100
    return Console(file=file, width=width, highlight=False, soft_wrap=False)


def emit_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as JSON to ``path``; a missing parent folder is a user error."""
    path = Path(path)
    try:
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


class _NullProgress:
    """Stands in for a rich Progress when progress is hidden."""

    def add_task(self, description: str, total: float | None = None) -> int:
        return 0

    def advance(self, task: int, advance: float = 1) -> None:
        pass

    def update(self, task: int, **kwargs: Any) -> None:
        pass


@contextmanager
def progress(enabled: bool) -> Iterator[Any]:
    """A transient rich progress bar on stderr, or a no-op stand-in."""
    if not enabled:
        yield _NullProgress()
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )
    with bar:
        yield bar
