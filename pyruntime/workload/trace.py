"""The Azure LLM inference trace 2023 (conversation): where it is and how to read it.

The trace ships inside this package, gzip-compressed, as package data
(``pyruntime/workload/data/azure_llm_2023_conv.csv.gz``; CC-BY 4.0, attribution in
``data/ATTRIBUTION.md`` beside it), so a wheel or any clone has it. ``AICPU_TILING_TRACE``
points at another CSV with the same columns (:data:`TRACE_COLUMNS`), plain or gzip-compressed
(recognised by its content, not its name).

    from pyruntime.workload.trace import load_trace
    requests = load_trace(limit=500)        # [TraceRequest(arrival_s=0.0, ...), ...]
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import gzip
import io
import os
from importlib import resources
from pathlib import Path
from typing import TextIO

TRACE_ENV = "AICPU_TILING_TRACE"
TRACE_NAME = "azure_llm_2023_conv.csv.gz"
TRACE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_GZIP_MAGIC = b"\x1f\x8b"


class TraceError(Exception):
    """Base of the trace errors; never raised directly."""


class TraceNotFoundError(TraceError, FileNotFoundError):
    """The trace file is not where it was looked for."""


class TraceFormatError(TraceError, ValueError):
    """The file exists but is not a trace: missing columns, bad values or no requests."""


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request: arrival (seconds since the first), prompt and output lengths."""

    arrival_s: float
    context_tokens: int
    generated_tokens: int


def bundled_trace_path() -> Path:
    """The trace inside the installed package (``pyruntime/workload/data/``).

    Raises:
        TraceNotFoundError: the package was installed without its data file.
    """
    resource = resources.files(__package__) / "data" / TRACE_NAME
    path = Path(str(resource))
    if not isinstance(resource, Path) or not path.is_file():
        raise TraceNotFoundError(
            f"the bundled request trace {path} is missing (the package was installed without "
            f"its data); reinstall aicpu-tiling or set {TRACE_ENV} to a trace CSV"
        )
    return path


def trace_path() -> Path:
    """``$AICPU_TILING_TRACE`` if set (and not empty), else :func:`bundled_trace_path`.

    Raises:
        TraceNotFoundError: the file does not exist.
    """
    env = os.environ.get(TRACE_ENV)
    if not env:
        return bundled_trace_path()
    path = Path(env).expanduser()
    if not path.is_file():
        raise TraceNotFoundError(
            f"the request trace {path} does not exist ({TRACE_ENV}={env}); set {TRACE_ENV} to "
            f"a CSV with columns {','.join(TRACE_COLUMNS)}, or unset it for the bundled trace"
        )
    return path


def open_trace(path: str | os.PathLike | None = None) -> TextIO:
    """The trace's text, decompressed when the file is gzip data; the caller closes it.

    Args:
        path: the file (default: :func:`trace_path`).

    Raises:
        TraceNotFoundError: no such file.
        TraceFormatError: the file cannot be read as text.
    """
    path = Path(path) if path is not None else trace_path()
    try:
        raw = path.open("rb")
    except FileNotFoundError as exc:
        raise TraceNotFoundError(f"the request trace {path} does not exist") from exc
    except OSError as exc:
        message = f"cannot read the request trace {path}: {exc.strerror or exc}"
        raise TraceFormatError(message) from exc
    if raw.peek(len(_GZIP_MAGIC))[: len(_GZIP_MAGIC)] == _GZIP_MAGIC:
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8", newline="")
    return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def _seconds(stamp: str) -> float:
    """Seconds of a ``2023-11-16 18:15:46.6805900`` timestamp (or of a plain number)."""
    try:
        return float(stamp)
    except ValueError:
        pass
    day, clock = stamp.strip().split(" ")
    hours, minutes, seconds = clock.split(":")
    days = datetime.date.fromisoformat(day).toordinal()
    return days * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def load_trace(path: str | os.PathLike | None = None, *, limit: int | None = None
               ) -> list[TraceRequest]:
    """Read a trace with columns ``TIMESTAMP, ContextTokens, GeneratedTokens``; arrivals from 0.

    Extra columns are ignored. Token counts must be integers >= 0.

    Args:
        path: the CSV, plain or gzip (default: :func:`trace_path`).
        limit: keep only the first `limit` requests.

    Raises:
        TraceNotFoundError: no such file.
        TraceFormatError: a column is missing, a value is malformed, or there is no request.
    """
    path = Path(path) if path is not None else trace_path()
    rows = []
    with open_trace(path) as f:
        try:
            reader = csv.DictReader(f)
            missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                found = ",".join(reader.fieldnames or []) or "nothing"
                raise TraceFormatError(
                    f"the request trace {path} lacks column {', '.join(missing)}: its header is "
                    f"{found[:80]!r}; expected {','.join(TRACE_COLUMNS)}"
                )
            for row in reader:
                if limit is not None and len(rows) >= limit:
                    break
                rows.append(_parse_row(path, reader.line_num, row))
        except (UnicodeDecodeError, EOFError, OSError, csv.Error) as exc:
            raise TraceFormatError(f"cannot read the request trace {path}: {exc}") from exc
    if not rows and limit != 0:
        raise TraceFormatError(f"the request trace {path} has no requests")
    start = rows[0][0] if rows else 0.0
    return [TraceRequest(t - start, c, g) for t, c, g in rows]


def _parse_row(path: Path, line: int, row: dict) -> tuple[float, int, int]:
    try:
        stamp, context, generated = (row[c] for c in TRACE_COLUMNS)
        values = _seconds(stamp), int(context), int(generated)
    except (ValueError, TypeError, AttributeError) as exc:
        shown = ",".join(str(row.get(c)) for c in TRACE_COLUMNS)
        raise TraceFormatError(
            f"the request trace {path}, line {line}: {shown!r} is not "
            f"'YYYY-MM-DD HH:MM:SS[.f],<int>,<int>'"
        ) from exc
    if values[1] < 0 or values[2] < 0:
        raise TraceFormatError(f"the request trace {path}, line {line}: negative token count")
    return values
