"""One self-check in its own process, so that a hang or a lost device is a reported failure.

Parent side: `run_in_child` writes a request (which check, the backend, the twin fault,
``quick``/``build`` and what earlier checks found: `Context.carried`), starts
``python -m pyruntime.selfcheck.child REQUEST RESULT`` in its own session, waits at most
the check's timeout and reads back the `CheckResult` as JSON. A timeout kills the child's
process group and is a ``fail`` saying so; a child that dies (non-zero exit, a signal, no
result) is a ``fail`` naming its exit status and the last lines of its output.

Child side (`main`): on ``npu-twin`` it calls ``pyruntime.npu_twin.activate(fault)`` first;
then it makes the backend, loads our kernels again when the check needs them (every process
loads them once; the ``kernels`` check did it in an earlier child), runs the check, writes
the result, and only then reads the device properties for the report's environment (so the
check is what first touches the device, and a hang there cannot cost the result).

The check is named by ``module:qualname`` and imported in the child, so the child runs the
very function the parent was given (tests pass their own); the child gets the parent's
``sys.path`` to find it.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .context import Context, make_context
from .report import CheckResult, failed

#: lines of the child's output kept in the JSON (``child_output_tail``) and in the detail
OUTPUT_TAIL_LINES, DETAIL_TAIL_LINES = 20, 3
KERNELS = "kernels"


def call_check(name: str, check: Callable[[Context], CheckResult], ctx: Context) -> CheckResult:
    """Run one check; one that raises is a ``fail`` naming the exception (never hides the
    checks after it). ``seconds`` is its wall time."""
    start = time.perf_counter()
    try:
        result = check(ctx)
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
        result = failed(name, f"the check raised {type(exc).__name__}: {exc}")
    result.seconds = time.perf_counter() - start
    return result


def check_reference(check: Callable) -> str:
    """``module:qualname`` of a check function, as the child imports it.

    Raises:
        ValueError: a function the child cannot import (a lambda or a nested function).
    """
    ref = f"{check.__module__}:{check.__qualname__}"
    if "<" in check.__qualname__:
        raise ValueError(f"check {ref} cannot run in a child process: only module-level "
                         "functions can be imported there")
    return ref


def resolve_check(ref: str) -> Callable[[Context], CheckResult]:
    """The function ``module:qualname`` names."""
    module, _, qualname = ref.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _write_json_atomically(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)  # the parent reads either nothing or the whole result


def main(argv: list[str] | None = None) -> int:
    """``python -m pyruntime.selfcheck.child REQUEST.json RESULT.json``; 0 when the result
    was written (a failed check is still 0: its status is in the result)."""
    request_path, result_path = (sys.argv[1:] if argv is None else argv)
    request = json.loads(Path(request_path).read_text())
    label = request["backend"]
    if label == "npu-twin":
        # before anything touches torch.npu: the twin stands in for torch_npu in this process
        from pyruntime import npu_twin

        # the twin's AI Core runs our Triton bodies under Triton's interpreter in the Triton
        # check, and the C reference body of the same ops elsewhere (so that the run takes
        # minutes: host_time alone steps six graphs of up to 61 layers)
        os.environ.setdefault(npu_twin.AICORE_ENV, "triton" if request["check"] ==
                              "attention_triton" else "reference")
        npu_twin.activate(request.get("twin_fault"))
    name = request["check"]
    ctx: Context | None = None
    try:
        ctx = make_context(label, quick=request["quick"], build=request["build"],
                           twin_fault=request.get("twin_fault"))
        for field, value in request["carried"].items():
            setattr(ctx, field, value)
        result = None
        if request["preload_kernels"]:
            from .kernels_check import kernels

            ctx.build = False  # the kernels check built them, if asked; here they only load
            loaded = call_check(KERNELS, kernels, ctx)
            ctx.build = request["build"]
            if loaded.status == "fail":
                result = failed(name, f"our kernels did not load in this check's process: "
                                      f"{loaded.detail}")
        if result is None:
            result = call_check(name, resolve_check(request["function"]), ctx)
    except Exception as exc:  # noqa: BLE001 - e.g. the backend does not start: report it
        result = failed(name, f"the check could not start in its child process: "
                              f"{type(exc).__name__}: {exc}")
    outcome: dict[str, Any] = {"result": result.as_dict(),
                               "carried": ctx.carried() if ctx is not None else {}}
    path = Path(result_path)
    _write_json_atomically(path, outcome)
    if request.get("want_environment") and label != "cpu":
        from .environment import device_environment

        outcome["environment"] = device_environment()
        _write_json_atomically(path, outcome)
    return 0


def _exit_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name} ({returncode})"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _tail(log: Path) -> list[str]:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if line.strip()][-OUTPUT_TAIL_LINES:]


def _with_tail(detail: str, tail: list[str]) -> str:
    if not tail:
        return detail + "; it printed nothing"
    return detail + "; last output: " + " | ".join(tail[-DETAIL_TAIL_LINES:])


def child_environment(extra: Mapping[str, str] | None = None, *,
                      device: bool = False) -> dict[str, str]:
    """The child's environment: this one, the parent's ``sys.path`` on ``PYTHONPATH`` (so it
    imports the same pyruntime and the same check functions), plus `extra`. For a device
    backend (`device`), without ``TRITON_INTERPRET``: device tensors need Triton compiled
    (Triton-Ascend), and the variable decides that when triton is first imported."""
    env = dict(os.environ)
    if device:
        env.pop("TRITON_INTERPRET", None)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(extra or {})
    return env


def run_in_child(name: str, check: Callable[[Context], CheckResult], ctx: Context, *,
                 timeout_s: float, workdir: str | Path | None = None,
                 want_environment: bool = False,
                 extra_env: Mapping[str, str] | None = None,
                 ) -> tuple[CheckResult, dict[str, Any] | None]:
    """Run one check in a child process; returns its result and, when asked and read, the
    child's device environment. Updates `ctx` with what the check found (`Context.carried`).

    Never raises for what the child does: a timeout or a dead child is a ``fail`` result.
    Interrupting the parent (Ctrl-C) kills the child first.
    """
    own_dir = None
    if workdir is None:
        own_dir = tempfile.TemporaryDirectory(prefix="aicpu-tiling-selfcheck-")
        workdir = own_dir.name
    workdir = Path(workdir)
    request_path, result_path = workdir / f"{name}.request.json", workdir / f"{name}.result.json"
    log_path = workdir / f"{name}.log"
    result_path.unlink(missing_ok=True)
    request = {"check": name, "function": check_reference(check),
               "backend": ctx.report_backend, "twin_fault": ctx.twin_fault,
               "quick": ctx.quick, "build": ctx.build, "carried": ctx.carried(),
               # the kernels check loads them itself; later checks without them skip anyway
               "preload_kernels": name != KERNELS and ctx.kernels_ready,
               "want_environment": want_environment}
    request_path.write_text(json.dumps(request))
    start = time.perf_counter()
    try:
        with log_path.open("wb") as log:
            # stdout too: CANN may log its errors there, and the parent's stdout may be JSON
            proc = subprocess.Popen(
                [sys.executable, "-m", "pyruntime.selfcheck.child", str(request_path),
                 str(result_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=child_environment(extra_env, device=ctx.report_backend != "cpu"),
                start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                if proc.poll() is None:  # timed out, or the parent was interrupted
                    _kill_group(proc)
        seconds = time.perf_counter() - start
        tail = _tail(log_path)
        outcome = json.loads(result_path.read_text()) if result_path.is_file() else None
    finally:
        if own_dir is not None:
            own_dir.cleanup()
    if outcome is None:
        if timed_out:
            detail = (f"timed out after {timeout_s:g} s (--check-timeout); its child process "
                      "was killed")
        else:
            detail = (f"its child process {_exit_status(proc.returncode)} without a result")
        result = failed(name, _with_tail(detail, tail), child_output_tail=tail,
                        child_exit=None if timed_out else proc.returncode,
                        timed_out=timed_out, timeout_s=timeout_s)
        result.seconds = seconds
        return result, None
    result = CheckResult.from_dict(outcome["result"])
    for field, value in outcome["carried"].items():
        setattr(ctx, field, value)
    if timed_out or proc.returncode != 0:
        # the result stands; how the process ended after it is worth knowing (a crash at
        # exit turns a pass into a non-zero status for anyone who runs the same code)
        how = (f"hung after reporting and was killed at the {timeout_s:g} s timeout"
               if timed_out else _exit_status(proc.returncode) + " after reporting")
        result.detail += f" (its child process {how})"
        result.data["child_output_tail"] = tail
    result.seconds = seconds
    return result, outcome.get("environment")


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group (a process stuck on a device ignores SIGTERM)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


if __name__ == "__main__":
    sys.exit(main())
