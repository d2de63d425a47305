"""Rich rendering of one tiling for ``inspect``: summary, per-core load bars, splits."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

BAR_WIDTH = 28
_EIGHTHS = " ▏▎▍▌▋▊▉"


def load_bar(value: float, peak: float, width: int = BAR_WIDTH) -> str:
    """A bar of ``width`` cells, full at ``peak``, with eighth-cell resolution."""
    if peak <= 0 or value <= 0:
        return ""
    eighths = round(8 * width * min(value, peak) / peak)
    full, part = divmod(eighths, 8)
    return "█" * full + (_EIGHTHS[part] if part else "")


def _pos(p: list[int]) -> str:
    return ":".join(str(x) for x in p)


def tiling_tables(view: dict) -> list:
    """Summary line, core table and combine table of an ``inspect`` view dict."""
    out: list = []
    h = view["summary"]
    if view["status"] != 0:
        out.append(Text(f"status {view['status']}: {view['error']}", style="bold red"))
        out.append(Text("every core is idle; no work is assigned", style="dim"))
        return out
    out.append(
        Text(
            f"status OK · batch {h['batch']} · tokens {h['num_tokens']} · units {h['num_units']}"
            f" · segments {h['num_segments']} · splits {h['num_combine']}"
            f" · busiest/ideal {h['ratio']:.3f}"
        )
    )
    cores = Table(title="Per-core load (cost model units)", title_justify="left")
    for name, justify in (
        ("core", "right"),
        ("cost", "right"),
        ("load", "left"),
        ("segs", "right"),
        ("begin", "left"),
        ("end", "left"),
    ):
        cores.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    peak = max((c["cost"] for c in view["cores"]), default=0)
    for i, c in enumerate(view["cores"]):
        cores.add_row(
            str(i),
            str(c["cost"]),
            load_bar(c["cost"], peak),
            str(c["num_segments"]),
            _pos(c["begin"]),
            _pos(c["end"]),
        )
    out.append(cores)
    out.append(
        Text(
            f"ideal {h['ideal']:.1f} = total {h['total_cost']} / {len(view['cores'])} cores + "
            f"segment {view['params']['cost_segment']}; positions are "
            "request:kv_head:q_tile:block, in head-major order",
            style="dim",
        )
    )
    if view["combine"]:
        splits = Table(title="Split units (merged by the combine step)", title_justify="left")
        for name in ("request", "kv head", "q tile", "pieces", "slots"):
            splits.add_column(name, justify="right")
        for rec in view["combine"]:
            first, n = rec["first_slot"], rec["num_pieces"]
            splits.add_row(
                str(rec["request"]),
                str(rec["kv_head"]),
                str(rec["q_tile"]),
                str(n),
                f"{first}..{first + n - 1}",
            )
        out.append(splits)
    return out
