"""The backend exception family.

`BackendError` is the base and is never raised directly. Each subclass names one class of
failure so callers can catch exactly what they can handle:

- `CaptureError`: the capture/replay state machine was misused (capturing nothing,
  replaying a graph that is not captured or whose buffers were freed, copying during
  capture, a task group left open, a forked stream not joined back).
- `TaskUpdateError`: a task-group update broke a CANN rule (update stream capturing,
  different number or kind of tasks, concurrent updates of one group).
- `EventError`: an event was misused (an external event recorded twice without a reset,
  an external event never recorded before the wait timed out).
- `DeviceBufferError`: an argument is not a live device buffer of this backend, or a copy
  does not match its destination (also a `ValueError`).
- `LaunchError`: a launch's kernel, core count or arguments are wrong (also a
  `ValueError`).
- `DeviceTaskError`: a task failed while the device executed it; raised asynchronously,
  at the next synchronize of the stream that ran it, like a device error on an NPU.
"""

from __future__ import annotations


class BackendError(RuntimeError):
    """Base of every backend error. Never raised directly."""


class CaptureError(BackendError):
    """The graph capture/replay state machine was used out of order."""


class TaskUpdateError(BackendError):
    """A task-group update broke one of the CANN update rules."""


class EventError(BackendError):
    """An event or external event was misused."""


class DeviceBufferError(BackendError, ValueError):
    """An argument is not a live device buffer, or a copy does not fit its destination."""


class LaunchError(BackendError, ValueError):
    """A launch's core count or arguments do not fit its kernel."""


class DeviceTaskError(BackendError):
    """A device task failed; reported at the next synchronize of its stream.

    Attributes:
        task: the name of the failing task.
    """

    def __init__(self, task: str, cause: BaseException) -> None:
        super().__init__(f"device task {task!r} failed: {type(cause).__name__}: {cause}")
        self.task = task
        self.__cause__ = cause
