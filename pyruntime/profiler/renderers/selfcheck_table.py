"""Rich rendering of an ``aicpu-tiling selfcheck`` report: environment, checks, verdict."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

_STYLE = {"pass": "green", "fail": "bold red", "skip": "yellow", "running": "cyan"}


def _env_line(env: dict) -> str:
    cann = env.get("cann") or {}
    dev = env.get("device") or {}
    parts = [f"python {env.get('python')}", f"torch {env.get('torch')}",
             f"torch_npu {env.get('torch_npu') or '-'}",
             f"CANN {cann.get('version') or ('-' if not cann.get('home') else '?')}",
             f"triton {env.get('triton') or '-'}"]
    if env.get("TASK_QUEUE_ENABLE") is not None:  # shown only when set: 2 refuses capture
        parts.append(f"TASK_QUEUE_ENABLE={env['TASK_QUEUE_ENABLE']}")
    if dev.get("soc"):
        parts.append(f"{dev['soc']}: {dev.get('ai_cores') or '?'} AI Cores, "
                     f"{dev.get('aicpu_cores') or '?'} AI-CPUs")
    else:
        parts.append("no NPU")
    if env.get("twin"):  # what answered is the twin, not a device
        parts.append(f"NPU twin, fault {env['twin'].get('fault') or 'none'}")
    return ", ".join(parts)


def selfcheck_tables(report: dict) -> list:
    """The environment line, the checks table, the verdict line and one line per hint (what
    to change when a known cause of failure was seen) of a report dict."""
    table = Table(title=f"aicpu-tiling selfcheck, backend {report['backend']}",
                  title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail")
    for c in report["checks"]:
        # Text, not a str: rich would read "pip install 'aicpu-tiling[test]'" as markup
        table.add_row(c["name"], Text(c["status"], style=_STYLE[c["status"]]), Text(c["detail"]))
    verdict = report["verdict"]
    line = Text(f"verdict: {verdict}", style="bold green" if verdict == "pass" else "bold red")
    line.append(f"; placement: {report['placement'] or 'none found'}", style="bold")
    hints = [Text(f"hint: {hint}", style="bold yellow") for hint in report.get("hints", [])]
    return [Text(_env_line(report["environment"]), style="dim"), table, line, *hints]
