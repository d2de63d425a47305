"""Shared CLI plumbing: the user-error type, consoles, output files and progress.

Imports nothing beyond the standard library at module level (rich is imported where a
console or a bar is made): ``aicpu-tiling --help`` and usage errors go through here and
answer without the heavy imports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

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
    from rich.console import Console

    file = sys.stderr if stderr else sys.stdout
    width = None if file.isatty() else 100
    return Console(file=file, width=width, highlight=False, soft_wrap=False)


def emit_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


FORCE_HELP = "replace output files that exist (without it, an existing file is an error)"


def add_force_arg(parser: argparse.ArgumentParser) -> None:
    """``--force``: replace existing output files (refused without it, before any work)."""
    parser.add_argument("--force", action="store_true", help=FORCE_HELP)


def check_output(path: str | Path, *, flag: str, force: bool) -> Path:
    """Check, before any work, that ``path`` can be written as a new output file.

    A run that would only fail at its end, after minutes, fails here instead: the folder
    must exist and be writable, ``path`` must not be a folder, and an existing file is
    replaced only with ``force`` (never silently).

    Args:
        path: the output file a flag named (or its default).
        flag: the flag's name for the message (``-o``, ``--trace``).
        force: ``--force`` was given.

    Returns:
        ``path`` as a Path.

    Raises:
        CliError: one line naming the flag, the path and what to do.
    """
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise CliError(f"{flag} {path}: the folder {folder} {what} (nothing was run)")
    if path.is_dir():
        raise CliError(f"{flag} {path} is a folder; name a file (nothing was run)")
    if path.exists() and not force:
        raise CliError(f"{flag} {path} exists; --force replaces it (nothing was run)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: cannot write in {folder}: permission denied "
                       "(nothing was run)")
    return path


def check_outputs(outputs: dict[str, str | Path | None], *, force: bool) -> None:
    """`check_output` for each ``flag -> path`` given (None: not asked for); two flags naming
    the same file are an error too (the second write would replace the first)."""
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        resolved = check_output(path, flag=flag, force=force).resolve()
        if resolved in seen:
            raise CliError(f"{seen[resolved]} and {flag} both name {path} (nothing was run)")
        seen[resolved] = flag


def write_json(path: str | Path, data: Any, *, force: bool = False) -> Path:
    """Write ``data`` as JSON to ``path``, a new file unless ``force``.

    The path was checked before the work (`check_output`); a file that appeared at the
    path meanwhile is still not replaced without ``force``.

    Raises:
        CliError: the file exists (without ``force``) or cannot be written.
    """
    path = Path(path)
    try:
        with path.open("w" if force else "x") as f:
            f.write(json.dumps(data, indent=2) + "\n")
    except FileExistsError:
        raise CliError(f"{path} appeared while this ran; not replaced (--force replaces it)") \
            from None
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


def _clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour)."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class PlainProgress:
    """Progress as plain lines, for a stderr that is not a terminal (a log file, a pipe, CI),
    where a live bar shows nothing until it ends.

    One line each time the description changes (``bench`` names each grid point in it,
    ``selfcheck`` each check), with the work done so far, the time elapsed and an estimate
    of the time left, and one line at the end. The estimate assumes the remaining units of
    work (steps, checks, cases) cost what the finished ones did on average; it is absent
    until one unit has finished.

    Args:
        file: where the lines go (stderr).
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(self, file: IO[str], clock: Callable[[], float] = time.monotonic) -> None:
        self._file, self._clock = file, clock
        self._start = clock()
        self._tasks: dict[int, dict[str, Any]] = {}

    def add_task(self, description: str, total: float | None = None) -> int:
        task = len(self._tasks)
        self._tasks[task] = {"description": None, "total": total, "done": 0.0}
        self.update(task, description=description)
        return task

    def advance(self, task: int, advance: float = 1) -> None:
        self._tasks[task]["done"] += advance

    def update(self, task: int, *, description: str | None = None, **_: Any) -> None:
        state = self._tasks[task]
        if description is None or description == state["description"]:
            return
        state["description"] = description
        self._line(f"{description}: {self._where(state)}")

    def finish(self) -> None:
        """The closing line of each task: units done and the time it all took."""
        for state in self._tasks.values():
            total = state["total"]
            done = f"{state['done']:g} of {total:g}" if total else f"{state['done']:g}"
            self._line(f"{state['description']}: finished {done} in "
                       f"{_clock(self._clock() - self._start)}")

    def _where(self, state: dict[str, Any]) -> str:
        elapsed = self._clock() - self._start
        done, total = state["done"], state["total"]
        text = f"{done:g} of {total:g} done, {_clock(elapsed)} elapsed" if total else \
            f"{_clock(elapsed)} elapsed"
        if total and done > 0:
            text += f", about {_clock(elapsed / done * max(total - done, 0))} left"
        return text

    def _line(self, text: str) -> None:
        print(f"{PROG}: {text}", file=self._file, flush=True)


@contextmanager
def progress(enabled: bool) -> Iterator[Any]:
    """Progress on stderr: a transient rich bar on a terminal, `PlainProgress` lines
    elsewhere, or a no-op stand-in when not `enabled`."""
    if not enabled:
        yield _NullProgress()
        return
    if not sys.stderr.isatty():
        lines = PlainProgress(sys.stderr)
        yield lines
        lines.finish()
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

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
