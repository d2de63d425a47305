"""``aicpu-tiling selfcheck``: check this machine end to end and give a verdict.

Runs the checks of `pyruntime.selfcheck` on the chosen backend (cpu: the emulation here,
every check that can run, in this process; npu: an Ascend device through torch_npu;
npu-twin: the NPU backend's code path on the NPU twin, a strict CPU stand-in for
torch_npu and CANN, with an optional injected fault). On npu and npu-twin every check runs
in its own child process with a timeout, so a hang or a lost device fails that check and
the run goes on. Prints a table (or JSON with --json); with -o FILE the JSON is rewritten
after every check, so a run that dies leaves every finished check and names the one it
died in. On npu it saves the placement found for the vLLM-Ascend hook when tiling_kernel
and aicpu_replay both passed. Exit status: 0 pass, 1 a check failed, 2 a usage error.

The parent process never imports torch_npu nor opens the device on npu: a device held by the
parent would be shared with every child, and one lost there would take the whole run with it;
the SoC and core counts are read in the children, after their check.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ..profiler.renderers.selfcheck_table import selfcheck_tables
from ._common import CliError, add_output_args, check_output, emit_json, make_console, progress


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown where there is one (not for flags and unset options); the
    ``--twin-fault`` help lists the twin's faults, read only when the help is printed (so
    no other command imports the twin)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.dest == "twin_fault":
            return _twin_fault_help().replace("%", "%%")
        if action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def _twin_fault_help() -> str:
    from ..selfcheck import twin_faults

    faults = twin_faults()
    text = "npu-twin only: inject one fault into the twin, to see the selfcheck report it"
    if faults is None:
        return text + " (this build has no NPU twin: pyruntime.npu_twin is missing)"
    return text + ": " + "; ".join(f"{name}: {what}" for name, what in faults.items())


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``selfcheck``."""
    from ..selfcheck import BACKEND_LABELS, CHECKS, DEFAULT_CHECK_TIMEOUT_S, FIRST_CHECK

    p = sub.add_parser("selfcheck", help="check kernels, AI-CPU replay, attention and host time; "
                                         "give a verdict",
                       description=__doc__.split("\n\n")[1].replace("\n", " "),
                       formatter_class=_HelpFormatter)
    p.add_argument("--backend", choices=BACKEND_LABELS, default="cpu",
                   help="cpu: the emulation, checks in this process; npu: an Ascend NPU; "
                        "npu-twin: the NPU code path on the NPU twin (never saves a placement)")
    standard_order = ", ".join(name for name, _ in CHECKS)
    p.add_argument("--checks", metavar="A,B,...", type=_names, default=None,
                   help=f"run only these checks, in the standard order ({standard_order}); "
                        f"{FIRST_CHECK} always runs first, since it finds (or builds) the "
                        "kernels every later check loads; a check whose input was not produced "
                        "skips (e.g. the attention checks without aicpu_replay). The placement "
                        "question alone: --checks tiling_kernel,aicpu_replay "
                        "(default: all checks)")
    p.add_argument("--twin-fault", metavar="NAME", default=None,
                   help="(the twin's faults, listed by _HelpFormatter)")
    p.add_argument("--check-timeout", metavar="SECONDS", type=_positive_seconds,
                   default=DEFAULT_CHECK_TIMEOUT_S,
                   help="npu, npu-twin: kill a check's child process after this long (its "
                        "start-up, torch_npu's import included) and fail the check (cpu runs "
                        "the checks in process, without a timeout)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="also write the JSON report here, rewritten atomically (a temporary "
                        "file, then a rename) after every check, so a run that dies leaves a "
                        "whole report; an existing FILE is replaced (bench and profile refuse "
                        "one without --force); a missing folder is refused before any check")
    p.add_argument("--build", action="store_true",
                   help="npu: build our kernels with tools/build_aicpu_kernel.sh if missing")
    p.add_argument("--quick", action="store_true", help="fewer steps in every check")
    p.add_argument("--no-save-placement", action="store_true",
                   help="npu: do not save the placement found for the vLLM-Ascend hook")
    add_output_args(p)
    p.set_defaults(run=run)
    return p


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    return list(dict.fromkeys(names))  # checked against the table in `run`


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _context(args: argparse.Namespace, isolate: bool):
    """The run's context. On npu it only checks that torch_npu is installed (find_spec, no
    import): the children import it."""
    import importlib.util

    from ..backends import BackendError
    from ..selfcheck import make_context, twin_faults

    if args.twin_fault is not None and args.backend != "npu-twin":
        raise CliError(f"--twin-fault needs --backend npu-twin (got --backend {args.backend})")
    if args.backend == "npu-twin":
        faults = twin_faults()
        if faults is None:
            raise CliError("--backend npu-twin: this build has no NPU twin "
                           "(pyruntime/npu_twin is missing)")
        if args.twin_fault is not None and args.twin_fault not in faults:
            raise CliError(f"--twin-fault: unknown fault {args.twin_fault}; choose from "
                           f"{', '.join(faults)}")
    if args.backend == "npu" and importlib.util.find_spec("torch_npu") is None:
        raise CliError("--backend npu: the npu backend needs torch_npu (and CANN) installed; "
                       "use --backend cpu or npu-twin on machines without an Ascend NPU")
    try:
        return make_context(args.backend, quick=args.quick, build=args.build,
                            twin_fault=args.twin_fault, open_device=not isolate)
    except BackendError as exc:
        raise CliError(f"--backend {args.backend}: {exc}") from exc


def write_json_atomically(path: str | Path, data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` through a temporary file in the same folder and a
    rename, so a reader (or a run that dies) sees the old file or the new one, never half.

    Raises:
        CliError: the file cannot be written (e.g. a missing folder).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())  # a host that goes down with the device keeps the file too
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def run(args: argparse.Namespace, *, checks_table=None, isolate: bool | None = None) -> int:
    """Run the checks, report, save; 0 on a pass verdict, 1 otherwise (2 usage errors).

    Args:
        checks_table: ``(name, function)`` pairs instead of `pyruntime.selfcheck.CHECKS`
            (tests inject checks that hang or crash).
        isolate: run each check in a child process; default on npu and npu-twin only.
    """
    from .. import selfcheck

    if isolate is None:
        isolate = args.backend != "cpu"
    try:
        planned = selfcheck.plan(args.checks, checks_table)
    except selfcheck.UnknownCheckError as exc:
        raise CliError(f"--checks: {exc}") from exc
    if args.output:  # its folder, before any check runs (the file itself is replaced)
        check_output(args.output, flag="-o", force=True)
    ctx = _context(args, isolate)
    command = " ".join(getattr(args, "argv", ["aicpu-tiling", "selfcheck"]))

    def as_data(report) -> dict:
        report.command = command
        return report.as_dict()

    def on_update(report) -> None:
        if args.output:
            write_json_atomically(args.output, as_data(report))

    with progress(not (args.json or args.no_progress)) as bar:
        task = bar.add_task("selfcheck", total=len(planned))
        done: list[str] = []

        def on_check(name: str) -> None:
            if done:
                bar.advance(task)
            done.append(name)
            bar.update(task, description=f"selfcheck: {name}")

        report = selfcheck.run(ctx, checks=args.checks, table=checks_table, isolate=isolate,
                               timeout_s=args.check_timeout, on_check=on_check,
                               on_update=on_update)
        bar.advance(task)
    data = as_data(report)
    notes = _save_placement(args, report, data)
    if args.output:
        notes.append(f"wrote {write_json_atomically(args.output, data)}")
    if args.json:
        emit_json(data)
    else:
        console = make_console()
        for item in selfcheck_tables(data):
            console.print(item)
        for note in notes:
            console.print(note)
    return 0 if report.verdict == "pass" else 1


def _save_placement(args: argparse.Namespace, report, data: dict) -> list[str]:
    """Save the placement when `selfcheck.placement_to_save` allows it; record either way."""
    from .. import placement, selfcheck

    value, why = selfcheck.placement_to_save(report)
    if value is not None and args.no_save_placement:
        value, why = None, "not saved: --no-save-placement"
    data["placement_saved"] = value is not None
    data["placement_save_reason"] = why
    if value is None:
        return [f"placement {report.placement or 'none'}: {why}"] if report.backend != "cpu" else []
    replay = next(c for c in report.checks if c.name == "aicpu_replay")
    try:
        path = placement.save(value, backend="npu",
                              device=str(data["environment"]["device"].get("soc")),
                              evidence=replay.detail)
    except OSError as exc:
        raise CliError(f"cannot save the placement: {exc}") from exc
    data["placement_file"] = str(path)
    return [f"saved placement {value} to {path} (the vLLM-Ascend hook reads it; {why})"]
