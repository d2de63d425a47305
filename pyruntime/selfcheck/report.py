"""The self-check's result: one record per check, a verdict, and its JSON form."""

from __future__ import annotations

import dataclasses
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


def passed(name: str, detail: str, **data: Any) -> CheckResult:
    return CheckResult(name, "pass", detail, data)


def failed(name: str, detail: str, **data: Any) -> CheckResult:
    return CheckResult(name, "fail", detail, data)


def skipped(name: str, reason: str, **data: Any) -> CheckResult:
    return CheckResult(name, "skip", reason, data)


@dataclasses.dataclass
class Report:
    """Everything one self-check run found."""

    backend: str
    placement: str | None
    environment: dict[str, Any]
    checks: list[CheckResult]
    command: str = "aicpu-tiling selfcheck"

    @property
    def verdict(self) -> str:
        """``pass`` when no check failed and at least one passed (skips are allowed)."""
        if any(c.status == "fail" for c in self.checks):
            return "fail"
        return "pass" if any(c.status == "pass" for c in self.checks) else "fail"

    def as_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": SCHEMA_VERSION, "command": self.command,
                "backend": self.backend, "placement": self.placement, "verdict": self.verdict,
                "environment": self.environment,
                "checks": [c.as_dict() for c in self.checks]}
