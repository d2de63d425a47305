"""The self-check's result: one record per check, a verdict, and its JSON form."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

SCHEMA = "aicpu-tiling/selfcheck"
SCHEMA_VERSION = 1
STATUSES = ("pass", "fail", "skip")


@dataclasses.dataclass
class CheckResult:
    """One check: ``status`` is pass, fail or skip; ``detail`` one or two sentences (for a
    skip, the reason); ``data`` any measured values (JSON-serialisable)."""

    name: str
    status: str
    detail: str
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name}: status must be one of {STATUSES}, "
                             f"got {self.status!r}")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail,
                "seconds": round(self.seconds, 3), **self.data}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> CheckResult:
        """The inverse of `as_dict` (how a child process hands its result back)."""
        record = dict(record)
        name, status, detail = record.pop("name"), record.pop("status"), record.pop("detail")
        seconds = float(record.pop("seconds", 0.0))
        return cls(name, status, detail, record, seconds)


def passed(name: str, detail: str, **data: Any) -> CheckResult:
    return CheckResult(name, "pass", detail, data)


def failed(name: str, detail: str, **data: Any) -> CheckResult:
    return CheckResult(name, "fail", detail, data)


def skipped(name: str, reason: str, **data: Any) -> CheckResult:
    return CheckResult(name, "skip", reason, data)


#: torch_npu's refusal of graph capture under TASK_QUEUE_ENABLE=2 (its message is "Do not
#: support TASK_QUEUE_ENABLE = 2 during NPU graph capture"); spacing tolerated
TASK_QUEUE_REFUSAL = re.compile(r"TASK_QUEUE_ENABLE\s*=\s*2\s+during\s+NPU\s+graph\s+capture")
TASK_QUEUE_HINT = ("graph capture was refused because TASK_QUEUE_ENABLE=2: torch_npu's level-2 "
                   "task queue cannot be captured, and every check that captures a graph fails "
                   "with it; rerun the selfcheck with TASK_QUEUE_ENABLE=1 (or 0), e.g. "
                   "`TASK_QUEUE_ENABLE=1 aicpu-tiling selfcheck --backend npu`")


def hints(checks: list[CheckResult]) -> list[str]:
    """One line per known cause of failure found in the failed checks (what to do about it)."""
    found = []
    for check in checks:
        if check.status != "fail":
            continue
        text = check.detail + "\n" + "\n".join(check.data.get("child_output_tail", []))
        if TASK_QUEUE_REFUSAL.search(text) and TASK_QUEUE_HINT not in found:
            found.append(TASK_QUEUE_HINT)
    return found


@dataclasses.dataclass
class Report:
    """Everything one self-check run found (or has found so far).

    Attributes:
        backend: as reported: ``cpu``, ``npu`` or ``npu-twin``.
        checks_planned: the checks this run runs, in order.
        running: the check running now, while the run is under way (the partial JSON
            written after every check names it with status ``running``); None when done.
        complete: False until the last planned check has finished (verdict ``incomplete``).
    """

    backend: str
    placement: str | None
    environment: dict[str, Any]
    checks: list[CheckResult]
    command: str = "aicpu-tiling selfcheck"
    checks_planned: list[str] = dataclasses.field(default_factory=list)
    running: str | None = None
    complete: bool = True

    @property
    def verdict(self) -> str:
        """``pass`` when no check failed and at least one passed (skips are allowed);
        ``incomplete`` until the run is over."""
        if not self.complete or self.running is not None:
            return "incomplete"
        if any(c.status == "fail" for c in self.checks):
            return "fail"
        return "pass" if any(c.status == "pass" for c in self.checks) else "fail"

    def as_dict(self) -> dict[str, Any]:
        checks = [c.as_dict() for c in self.checks]
        if self.running is not None:
            # if the process dies now, the file on disk still says which check it died in
            checks.append({"name": self.running, "status": "running",
                           "detail": "started and not finished: if the run is over, the "
                                     "process died or hung in this check"})
        return {"schema": SCHEMA, "version": SCHEMA_VERSION, "command": self.command,
                "backend": self.backend, "placement": self.placement, "verdict": self.verdict,
                "checks_planned": list(self.checks_planned),
                "hints": hints(self.checks),
                "environment": self.environment,
                "checks": checks}
