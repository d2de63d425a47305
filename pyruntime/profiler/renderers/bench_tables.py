"""Rich tables for ``bench`` (A/B grid) and ``bench tiling`` (kernel time per call)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text


def _us(x: float) -> str:
    if x >= 10_000:
        return f"{x / 1000:.1f}k"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}"


def _cell(stat: dict, fmt=_us) -> Text:
    text = Text(fmt(stat["median"]))
    text.append(f"\n{fmt(stat['ci'][0])}–{fmt(stat['ci'][1])}", style="dim")
    return text


def _ms(x: float) -> str:
    return f"{x / 1000:.2f}"


def _ratio(r: dict, digits: int = 1) -> Text:
    text = Text(f"{r['value']:.{digits}f}x", style="bold")
    text.append(f"\n{r['ci'][0]:.{digits}f}–{r['ci'][1]:.{digits}f}", style="dim")
    return text


def _grid_table(title: str, result: dict, key: str, ratio_key: str, fmt, digits: int) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("L, batch, source", no_wrap=True)
    for name in ("host_update", "device_tiling", "ratio"):
        table.add_column(name, justify="right", no_wrap=True)
    for p in result["points"]:
        a, b = p["modes"]["host_update"], p["modes"]["device_tiling"]
        table.add_row(
            f"L={p['layers']}, batch {p['batch']}\n{p['source']}",
            _cell(a[key], fmt),
            _cell(b[key], fmt),
            _ratio(p[ratio_key], digits),
        )
    return table


def bench_table(result: dict) -> list:
    """The A/B grid: host time per step per mode with the ratio, then end-to-end step time."""
    out: list = [
        _grid_table("Host time per step (us): median, 95% CI below", result, "host_us",
                    "host_ratio", _us, 1),
        _grid_table("End-to-end step time (ms): median, 95% CI below", result, "step_us",
                    "step_ratio", _ms, 2),
    ]  # fmt: skip
    head = result.get("headline")
    if head:
        out.append(
            Text(
                f"headline: L={head['layers']}, batch {head['batch']}, {head['source']}: "
                f"host {head['host_update_us']:.0f} us -> {head['device_tiling_us']:.1f} us "
                f"per step, {head['host_ratio']:.1f}x less host time",
                style="bold",
            )
        )
    cfg = result["config"]
    out.append(
        Text(
            f"{cfg['steps']} measured steps per mode per point after {cfg['warmup']} warm-up, "
            f"A/B interleaved; ratio = host_update / device_tiling; CIs: bootstrap "
            f"({cfg['resamples']} resamples, seed {cfg['seed']}), paired for ratios",
            style="dim",
        )
    )
    return out


def tiling_bench_table(result: dict) -> list:
    """The C kernel's time per call per batch size."""
    table = Table(
        title="Tiling kernel time per call (C, -O3, host CPU): median of repeats",
        title_justify="left",
    )
    # The AArch64 instruction count (emulated, pyruntime.aarch64) when it was measured.
    counted = any("aarch64_instructions" in row for row in result["rows"])
    for name in ("batch", "ns/call", "ns/request", "min ns", "max ns", "repeats"):
        table.add_column(name, justify="right")
    if counted:
        table.add_column("aarch64 instr/call", justify="right")
    for row in result["rows"]:
        cells = [
            str(row["batch"]),
            f"{row['ns_per_call']:.0f}",
            f"{row['ns_per_request']:.1f}",
            f"{row['min_ns']:.0f}",
            f"{row['max_ns']:.0f}",
            str(row["repeats"]),
        ]
        if counted:
            cells.append(f"{row['aarch64_instructions']:.0f}"
                         if "aarch64_instructions" in row else "-")
        table.add_row(*cells)
    return [table, Text(f"source: {result['source']}", style="dim")]
