"""``aicpu-tiling selfcheck``: turn an hour on an Ascend machine into a verdict.

Checks, in order (each passes, fails or skips with the reason):

* ``kernels``: our kernels are there (the cffi tiling kernel; on an NPU also the torch_npu
  extension and the AI-CPU binary, built with ``--build`` when missing).
* ``tiling_kernel``: the tiling task run on the backend writes exactly the host build's
  bytes (and the Python oracle's) on trace batches and invalid inputs; on the CPU backend
  also the AArch64 build in the emulator, when ziglang and unicorn are installed.
* ``aicpu_replay``: a captured tiling task replayed 8 times with a new step epoch each
  time: the epoch it echoes counts the replays it ran in; all -> placement ``graph``, at
  most the first -> ``pre-replay``. On the CPU backend it runs with ``replay_aicpu`` True
  and False and must tell them apart.
* ``stale_read`` (NPU only): an AI Core op writes the lengths immediately before the
  tiling task on the same stream, and the tiling must be planned from the written lengths,
  1,000 times (25 with ``--quick``); fails at the first iteration that read the lengths from
  before the write (the twin's fault ``stale-aicpu-read`` makes it fail at iteration 1).
* ``attention_correctness``: our attention on that placement against a float64 reference
  on trace batches (decode, spec decode, chunked prefill, padded buckets), fp32 and bf16.
* ``mla_correctness``: ``StaticMLAAttention`` (absorbed MLA decode, issue 20) on that
  placement against float64, fp32 and bf16, with MTP, padded buckets and split units.
* ``attention_fia``: the same against torch_npu's FIA run eagerly (NPU only).
* ``attention_triton``: the Triton AI Core kernels (interpreted on CPU, compiled on NPU).
* ``host_time``: host and step time per step, host_update against device tiling at
  L = 61, and the flatness figure: device tiling's host time at L = 61 over L = 1, side by
  side, at most 1.3 (`pyruntime.measurement.abrun.FLATNESS_TARGET`).

The verdict is ``pass`` when no check failed. On the NPU backend the placement found is
saved for the vLLM-Ascend hook (`pyruntime.placement`) when ``tiling_kernel`` and
``aicpu_replay`` both passed in the run (`placement_to_save`); a run on the NPU twin never
saves one.

A run may name a subset of the checks (`plan`); they run in the order above, and
``kernels`` always runs first, since it finds (or builds) the kernels that every later check
loads. On ``npu`` and ``npu-twin`` every check runs in its own child process with a timeout
(`child`), so a hang or a lost device fails that check and the run goes on; on ``cpu`` they
run in this process unless asked otherwise (``isolate``).
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from .context import BACKEND_LABELS, TWIN_STATE_ENV, Context, make_context, twin_faults
from .environment import environment
from .kernels_check import kernels
from .report import SCHEMA, SCHEMA_VERSION, CheckResult, Report


def _deferred(module: str, name: str) -> Callable[[Context], CheckResult]:
    """The check `name` of submodule `module`, imported when the check runs.

    Those submodules import torch (seconds), and this package is imported to list the checks
    (``aicpu-tiling selfcheck --help``, usage errors), which must answer without it. The
    stand-in carries the real function's ``__module__`` and ``__qualname__``, so a child
    process (`child.check_reference`) imports the real one.
    """
    qualified = f"{__name__}.{module}"

    def check(ctx: Context) -> CheckResult:
        return getattr(importlib.import_module(qualified), name)(ctx)

    check.__module__, check.__name__, check.__qualname__ = qualified, name, name
    check.__doc__ = f"`{qualified}.{name}`, imported when it runs."
    return check


attention_correctness = _deferred("attention_checks", "attention_correctness")
attention_fia = _deferred("attention_checks", "attention_fia")
attention_triton = _deferred("attention_checks", "attention_triton")
host_time = _deferred("attention_checks", "host_time")
aicpu_replay = _deferred("device_checks", "aicpu_replay")
tiling_kernel = _deferred("device_checks", "tiling_kernel")
stale_read = _deferred("stale_read", "stale_read")
mla_correctness = _deferred("mla_checks", "mla_correctness")

__all__ = [
    "BACKEND_LABELS",
    "CHECKS",
    "DEFAULT_CHECK_TIMEOUT_S",
    "SCHEMA",
    "SCHEMA_VERSION",
    "CheckResult",
    "Context",
    "Report",
    "UnknownCheckError",
    "make_context",
    "placement_to_save",
    "plan",
    "run",
    "twin_faults",
]

#: (name, function) in run order; later checks use what earlier ones found
CHECKS: tuple[tuple[str, Callable[[Context], CheckResult]], ...] = (
    ("kernels", kernels),
    ("tiling_kernel", tiling_kernel),
    ("aicpu_replay", aicpu_replay),
    ("stale_read", stale_read),
    ("attention_correctness", attention_correctness),
    ("mla_correctness", mla_correctness),
    ("attention_fia", attention_fia),
    ("attention_triton", attention_triton),
    ("host_time", host_time),
)
#: runs first whenever anything runs: it finds (or builds) the kernels later checks load
FIRST_CHECK = "kernels"
#: the two checks that decide the placement; it is saved only when both passed
PLACEMENT_CHECKS = ("tiling_kernel", "aicpu_replay")
#: per check on npu / npu-twin: the slowest check on a 910B (host_time, six captures of up
#: to 61 layers, plus torch_npu start-up in the child) takes a few minutes; ten leaves room
#: without letting a hang eat the hour
DEFAULT_CHECK_TIMEOUT_S = 600.0

CheckTable = Sequence[tuple[str, Callable[[Context], CheckResult]]]


class UnknownCheckError(ValueError):
    """``--checks`` named a check that does not exist (the message lists the valid names)."""


def plan(requested: Sequence[str] | None, table: CheckTable | None = None) -> list[str]:
    """The checks a run runs: all of `table` (default `CHECKS`), or those `requested`, in
    the table's order, with `FIRST_CHECK` always in front.

    Raises:
        UnknownCheckError: a requested name that is not in the table, or none at all.
    """
    names = [name for name, _ in (CHECKS if table is None else table)]
    if requested is None:
        return names
    unknown = [r for r in requested if r not in names]
    if unknown or not requested:
        raise UnknownCheckError(f"unknown check {', '.join(unknown) or '(none given)'}; "
                                f"choose from {', '.join(names)}")
    return [n for n in names if n in requested or n == FIRST_CHECK]


def placement_to_save(report: Report) -> tuple[str | None, str]:
    """``(placement, why)`` to save for the vLLM-Ascend hook, or ``(None, why not)``.

    Saved only from a real NPU (never the CPU emulation nor the NPU twin), and only when
    both `PLACEMENT_CHECKS` ran and passed in this run: a placement from a probe that failed,
    or whose tiling was wrong, must not reach the hook. Later checks do not decide it (they
    test attention and host time on the placement, not the placement).
    """
    if report.backend != "npu":
        return None, (f"--backend {report.backend} never saves a placement (only a real NPU "
                      "answers the question for this machine)")
    status = {c.name: c.status for c in report.checks}
    missing = [n for n in PLACEMENT_CHECKS if n not in status]
    if missing:
        return None, f"not saved: {' and '.join(missing)} did not run"
    not_passed = [f"{n} {status[n]}" for n in PLACEMENT_CHECKS if status[n] != "pass"]
    if not_passed:
        return None, f"not saved: {', '.join(not_passed)} (both must pass)"
    if report.placement is None:
        return None, "not saved: no placement was found"
    return report.placement, f"{' and '.join(PLACEMENT_CHECKS)} passed"


def run(ctx: Context, *, checks: Sequence[str] | None = None, table: CheckTable | None = None,
        isolate: bool | None = None, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
        on_check: Callable[[str], None] | None = None,
        on_update: Callable[[Report], None] | None = None,
        environment_info: dict | None = None) -> Report:
    """Run the planned checks on `ctx`; a check that raises is a ``fail`` naming the exception.

    Args:
        checks: names to run (see `plan`); None runs them all.
        table: ``(name, function)`` pairs in run order (default `CHECKS`; tests pass theirs).
        isolate: run each check in a child process with `timeout_s` (`child.run_in_child`);
            default: on the NPU (``ctx.backend == "npu"``, the twin included), where a check
            can hang or lose the device; on the CPU the checks run in this process.
        on_check: called with each check's name before it runs (progress).
        on_update: called with the report so far before each check (the running check named
            in it) and after each one, and at the end; the CLI writes its JSON file there.
    """
    from .child import call_check, run_in_child  # not at import: `python -m ...child` runs it

    table = CHECKS if table is None else table
    functions = dict(table)
    planned = plan(checks, table)
    if isolate is None:
        isolate = ctx.backend == "npu"
    env = environment_info if environment_info is not None else environment(
        ctx.report_backend, None if isolate else ctx.npu)
    if ctx.twin:
        faults = twin_faults() or {}
        env["twin"] = {"fault": ctx.twin_fault,
                       "fault_description": faults.get(ctx.twin_fault) if ctx.twin_fault
                       else None}
    report = Report(ctx.report_backend, None, env, [], checks_planned=planned, complete=False)

    def update() -> None:
        report.placement = ctx.placement
        if on_update is not None:
            on_update(report)

    with tempfile.TemporaryDirectory(prefix="aicpu-tiling-selfcheck-") as workdir:
        extra_env: dict[str, str] = {}
        if ctx.twin and not os.environ.get(TWIN_STATE_ENV):
            # one twin device for the whole run: a device lost in one child stays lost
            state = os.path.join(workdir, "twin-state")
            os.mkdir(state)
            extra_env[TWIN_STATE_ENV] = state
        for name in planned:
            if on_check is not None:
                on_check(name)
            report.running = name
            update()
            if isolate:
                want_env = env.get("device", {}).get("soc") is None
                result, device_env = run_in_child(name, functions[name], ctx,
                                                  timeout_s=timeout_s, workdir=workdir,
                                                  want_environment=want_env,
                                                  extra_env=extra_env)
                if device_env is not None and want_env:
                    _merge_device_environment(env, device_env)
            else:
                result = call_check(name, functions[name], ctx)
            report.checks.append(result)
            report.running = None
            update()
    report.complete = True
    update()
    return report


def _merge_device_environment(env: dict[str, Any], device_env: dict[str, Any]) -> None:
    """Take a child's device block (and its torch_npu version when the package has no
    metadata, as on the twin) into the report's environment."""
    env["device"] = device_env["device"]
    if env.get("torch_npu") is None and device_env.get("torch_npu"):
        env["torch_npu"] = device_env["torch_npu"]
