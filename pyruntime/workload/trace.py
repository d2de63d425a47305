"""The Azure LLM inference trace 2023 (conversation): where it is and how to read it.

The file lives outside the repository, in ``../shared/data`` beside the repo root (CI
clones the repo next to ``shared/``). Set ``AICPU_TILING_TRACE`` to use another path.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

TRACE_ENV = "AICPU_TILING_TRACE"
TRACE_NAME = "azure_llm_2023_conv.csv"


class TraceNotFoundError(FileNotFoundError):
    """The trace file is not where it was looked for."""


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request: arrival (seconds since the first), prompt and output lengths."""

    arrival_s: float
    context_tokens: int
    generated_tokens: int


def trace_path() -> Path:
    """``$AICPU_TILING_TRACE`` if set, else ``<repo>/../shared/data/azure_llm_2023_conv.csv``,
    else ``../shared/data/`` beside the working directory (an installed, non-editable copy).

    Raises:
        TraceNotFoundError: the file does not exist.
    """
    env = os.environ.get(TRACE_ENV)
    repo = Path(__file__).resolve().parents[2]
    path = Path(env) if env else repo.parent / "shared" / "data" / TRACE_NAME
    if not env and not path.is_file():
        path = Path.cwd().parent / "shared" / "data" / TRACE_NAME
    if not path.is_file():
        how = f"{TRACE_ENV}={env}" if env else f"the default beside the repository ({repo})"
        raise TraceNotFoundError(f"the request trace {path} does not exist (looked up from "
                                 f"{how}); set {TRACE_ENV} to the CSV's path")
    return path


def _seconds(stamp: str) -> float:
    # "2023-11-16 18:15:46.6805900": only differences matter, within one trace
    day, clock = stamp.split(" ")
    hours, minutes, seconds = clock.split(":")
    return int(day[-2:]) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def load_trace(path: str | os.PathLike | None = None, *, limit: int | None = None
               ) -> list[TraceRequest]:
    """Read the trace (TIMESTAMP, ContextTokens, GeneratedTokens), arrivals from 0.

    Args:
        path: the CSV (default: `trace_path()`).
        limit: keep only the first `limit` requests.
    """
    rows = []
    with open(path or trace_path(), newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if limit is not None and i >= limit:
                break
            rows.append((_seconds(row["TIMESTAMP"]), int(row["ContextTokens"]),
                         int(row["GeneratedTokens"])))
    start = rows[0][0] if rows else 0.0
    return [TraceRequest(t - start, c, g) for t, c, g in rows]
