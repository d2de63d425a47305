"""Host phase timing: wrap a backend's calls so each step's host time splits into phases.

Wrapping is per instance and reversible. Phases nest (a host tiling call inside a task
update); each phase gets its exclusive time, so the phases of a step add up to the time
spent inside instrumented calls. Calls are mapped to phases by :data:`PHASE_OF`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .clock import Clock

#: backend method -> host phase
PHASE_OF = {
    "copy_h2d": "input_copies",
    "plan_on_host": "host_tiling",
    "graph_task_update_begin": "task_updates",
    "graph_task_update_end": "task_updates",
    "launch": "task_updates",
    "event_record": "task_updates",
    "replay": "replay_launch",
    "synchronize": "synchronize",
    "stream_synchronize": "synchronize",
    "event_synchronize": "synchronize",
}


class PhaseRecorder:
    """Exclusive time per phase, from nested ``enter``/``exit`` calls on a clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.phases: dict[str, float] = {}
        self.spans: list[tuple[str, float, float]] = []
        self._stack: list[list[Any]] = []  # [phase, start, child_seconds]

    def reset(self) -> None:
        """Forget what was recorded (call at the start of each step)."""
        self.phases = {}
        self.spans = []
        self._stack = []

    def enter(self, phase: str) -> None:
        """Start a phase (nested inside the current one, if any)."""
        self._stack.append([phase, self.clock.now(), 0.0])

    def exit(self) -> None:
        """End the innermost phase and book its exclusive time."""
        phase, start, child = self._stack.pop()
        end = self.clock.now()
        self.phases[phase] = self.phases.get(phase, 0.0) + (end - start) - child
        if self._stack:
            self._stack[-1][2] += end - start
        else:
            self.spans.append((phase, start, end))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``with recorder.phase("x"):`` times the block as phase ``x``."""
        self.enter(name)
        try:
            yield
        finally:
            self.exit()


@contextmanager
def instrument(backend: Any, recorder: PhaseRecorder) -> Iterator[PhaseRecorder]:
    """Time the backend's calls into ``recorder`` while the block runs; then restore."""
    originals = {}
    for method, phase in PHASE_OF.items():
        fn = getattr(backend, method, None)
        if fn is None or not callable(fn):
            continue
        originals[method] = backend.__dict__.get(method)

        def timed(*args: Any, __fn: Any = fn, __phase: str = phase, **kwargs: Any) -> Any:
            recorder.enter(__phase)
            try:
                return __fn(*args, **kwargs)
            finally:
                recorder.exit()

        setattr(backend, method, functools.wraps(fn)(timed))
    try:
        yield recorder
    finally:
        for method, original in originals.items():
            if original is None:
                delattr(backend, method)
            else:
                setattr(backend, method, original)
