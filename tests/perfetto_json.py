"""What Perfetto's JSON importer would drop or refuse in a Chrome trace we write.

No Perfetto binary or browser can be had on the development machine (docs/profiler.md), so
"the trace opens in Perfetto" is checked against the importer's own rules, read from
google/perfetto (trace processor):

* ``src/trace_processor/importers/json/json_trace_parser_impl.cc``, ``ParseJsonPacket``: an
  event whose ``ph`` is not a string is ignored; ``pid`` / ``tid`` are coerced to uint32; a
  complete event (``ph == "X"``) without a numeric ``dur`` is dropped (``if
  (!opt_dur.has_value()) return;``); the metadata events ``process_name`` /
  ``thread_name`` name a lane only with a non-empty ``args.name``. Every ``X`` event lands on
  its (pid, tid) thread track.
* ``src/trace_processor/importers/common/slice_tracker.cc``, ``MaybeCloseStack``: slices on
  one track must be nested or disjoint; a complete slice that starts inside an open one and
  ends after it is dropped (``slice_drop_overlapping_complete_event``). Timestamps are
  microseconds, held as integer nanoseconds there, so the check is made on both the float
  microseconds and their whole nanoseconds.
"""

from __future__ import annotations

import math

UINT32_MAX = 2**32 - 1


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _uint32(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= UINT32_MAX


def import_problems(trace: dict) -> list[str]:
    """Every event of ``trace`` (a Chrome trace dict) Perfetto's importer would drop, and why.

    Empty when the whole trace would be imported as written."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    problems: list[str] = []
    slices: dict[tuple, list] = {}
    for index, event in enumerate(events):
        where = f"event {index} ({event.get('name')!r})"
        if not isinstance(event.get("ph"), str):
            problems.append(f"{where}: ph is not a string, the event is ignored")
            continue
        for key in ("pid", "tid"):
            if key in event and not _uint32(event[key]):
                problems.append(f"{where}: {key} {event[key]!r} is not a uint32")
        if (event["ph"] == "M" and event.get("name") in ("process_name", "thread_name")
                and not (event.get("args") or {}).get("name")):
            problems.append(f"{where}: a lane name without args.name")
        if event["ph"] != "X":
            continue
        if not _is_number(event.get("dur")) or event["dur"] < 0:
            problems.append(f"{where}: a complete event without a non-negative dur is dropped")
            continue
        if not _is_number(event.get("ts")):
            problems.append(f"{where}: ts {event.get('ts')!r} is not a number")
            continue
        slices.setdefault((event.get("pid"), event.get("tid")), []).append(
            (event["ts"], event["dur"], where))
    for lane, spans in slices.items():
        for unit in ("us", "ns"):
            problems += [f"lane {lane} ({unit}): {p}" for p in _partial_overlaps(spans, unit)]
    return problems


def _partial_overlaps(spans: list, unit: str) -> list[str]:
    def bounds(ts, dur):
        if unit == "us":
            return ts, ts + dur
        start = int(ts * 1000)
        return start, start + int(dur * 1000)

    ordered = sorted((bounds(ts, dur) + (where,) for ts, dur, where in spans),
                     key=lambda s: (s[0], -s[1]))
    open_slices: list = []
    found = []
    for start, end, where in ordered:
        while open_slices and open_slices[-1][1] <= start:
            open_slices.pop()
        if open_slices and end > open_slices[-1][1]:
            found.append(f"{where} [{start}, {end}) starts inside {open_slices[-1][2]} "
                         f"[{open_slices[-1][0]}, {open_slices[-1][1]}) and ends after it: dropped")
            continue  # Perfetto drops it, so it opens nothing
        open_slices.append((start, end, where))
    return found
