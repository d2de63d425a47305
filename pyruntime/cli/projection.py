"""``aicpu-tiling bench projection``: what the host-time saving could be on an NPU, with its
assumptions stated, from a bench JSON and the one real figure we have.

The one real figure: 3.68 ms of host task updates per decode step for 20 layers on an Atlas
910B3, against 1.21 ms of replay, from a comment on vLLM-Ascend issue #13058
(https://github.com/vllm-project/vllm-ascend/issues/13058): 184 us per layer. On an NPU a
host_update step costs about ``R + L * u`` on the host (R: the host cost of the step's
common work, one ``NPUGraph.replay`` with its synchronize and input copies; u: one layer's
update), and a device-tiling step ``R + E`` (E: what our path adds per step, the hook
engine's work; from the bench JSON's floor, else 0). Projected saving ``L * u - E``, ratio
``(R + L * u) / (R + E)``, over a range of R and L: no single number here is an NPU result.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._common import CliError, emit_json

#: vLLM-Ascend issue #13058, the comment's 910B3 figures: host updates per step, layers, replay
REAL_UPDATES_US, REAL_LAYERS, REAL_REPLAY_US = 3680.0, 20, 1210.0
REAL_SOURCE = "https://github.com/vllm-project/vllm-ascend/issues/13058"
REAL_PER_LAYER_US = REAL_UPDATES_US / REAL_LAYERS  # 184 us
#: the replay host cost R (us) and layer counts the table spans: R from a bare replay's tens
#: of microseconds to the comment's 1.21 ms; L from the comment's 20 to 94 (Qwen3-235B)
REPLAY_US = (20.0, 50.0, 200.0, REAL_REPLAY_US)
LAYERS = (20, 61, 94)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench projection``."""
    p = sub.add_parser("projection", help="projected host saving on an NPU, with assumptions",
                       description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--from", dest="source", type=Path, default=None, metavar="BENCH_JSON",
                   help="an aicpu-tiling bench JSON (default: the real figure alone)")
    p.add_argument("--selfcheck", type=Path, default=None, metavar="SELFCHECK_JSON",
                   help="an aicpu-tiling selfcheck JSON: adds the rows projected with the "
                        "replay host cost and the per-layer update cost it measured (an NPU's "
                        "once selfcheck --backend npu ran on one; marked emulated otherwise)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(run=run)
    return p


def _measured(result: dict | None) -> dict:
    """What the bench JSON measured here: host_update's per-layer cost (least-squares slope
    over the headline batch's layer counts, else host time / L at one point), our path's
    extra host work per step over its floor, and the invariants when present."""
    out = {"host_update_per_layer_us": None, "extra_us": {}, "invariants": None,
           "method": None}
    if result is None:
        return out
    out["method"] = (result.get("method") or {}).get("headline", "old")
    placements = result.get("placements")
    if placements and len(placements.get("layers", [])) >= 2:
        xs, ys = placements["layers"], placements["host_us"]["host_update"]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        out["host_update_per_layer_us"] = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
                                           / sum((x - mx) ** 2 for x in xs))
    elif result.get("points"):
        p = result["points"][0]
        out["host_update_per_layer_us"] = (p["modes"]["host_update"]["host_us"]["median"]
                                           / p["layers"])
    points, head = result.get("points") or [], result.get("headline")
    at = next((q for q in points if head and (q["layers"], q["batch"], q["source"]) ==
               (head["layers"], head["batch"], head["source"])), points[0] if points else None)
    floor = at["modes"].get("floor") if at else None
    if floor is not None:
        for m in ("device_tiling", "pre_replay"):
            out["extra_us"][m] = max(0.0, at["modes"][m]["host_us"]["median"]
                                     - floor["host_us"]["median"])
    out["invariants"] = result.get("invariants")
    return out


def from_selfcheck(report: dict) -> dict:
    """What a selfcheck report measured for the projection: ``replay_host_us`` (the
    aicpu_replay probe's host cost of one replay of a one-task graph), ``update_per_layer_us``
    (host_time's host_update cost per layer over the device path), the backend they ran on
    and whether it emulates the device (``emulated``).

    Raises:
        CliError: the report lacks either figure (an older selfcheck, or the checks skipped).
    """
    checks = {c.get("name"): c for c in report.get("checks", [])}
    replay = (checks.get("aicpu_replay") or {}).get("replay_host")
    update = (checks.get("host_time") or {}).get("update_per_layer")
    if not replay or replay.get("replay_host_us") is None or not update:
        raise CliError("the selfcheck JSON has no replay host cost (aicpu_replay) or no "
                       "per-layer update cost (host_time): run aicpu-tiling selfcheck with "
                       "both checks")
    return {"replay_host_us": replay["replay_host_us"],
            "update_per_layer_us": update["update_per_layer_us"],
            "backend": replay["backend"], "emulated": bool(replay["emulated"]
                                                          or update["emulated"])}


def projection(result: dict | None, selfcheck: dict | None = None) -> dict:
    """The table as data: assumptions, measured figures and one row per (mode, R, L); with
    `selfcheck` (`from_selfcheck`), also one row per (mode, L) at the R and per-layer cost
    it measured (``selfcheck_rows``)."""
    measured = _measured(result)
    extras = measured["extra_us"] or {"device_tiling": 0.0, "pre_replay": 0.0}
    rows = []
    for mode, extra in extras.items():
        for replay in REPLAY_US:
            for layers in LAYERS:
                host_update = replay + layers * REAL_PER_LAYER_US
                ours = replay + extra
                rows.append({"mode": mode, "replay_us": replay, "layers": layers,
                             "extra_us": extra, "saving_us": host_update - ours,
                             "ratio": host_update / ours})
    selfcheck_rows = []
    if selfcheck is not None:
        replay, per_layer = selfcheck["replay_host_us"], selfcheck["update_per_layer_us"]
        for mode, extra in extras.items():
            for layers in LAYERS:
                host_update, ours = replay + layers * per_layer, replay + extra
                selfcheck_rows.append({"mode": mode, "replay_us": replay, "layers": layers,
                                       "per_layer_us": per_layer, "extra_us": extra,
                                       "saving_us": host_update - ours,
                                       "ratio": host_update / ours})
    return {"real": {"updates_us": REAL_UPDATES_US, "layers": REAL_LAYERS,
                     "replay_us": REAL_REPLAY_US, "per_layer_us": REAL_PER_LAYER_US,
                     "source": REAL_SOURCE},
            "measured": measured, "rows": rows, "selfcheck": selfcheck,
            "selfcheck_rows": selfcheck_rows}


def render(table: dict) -> str:
    """Plain text, one block: assumptions, measured here, then the projection rows."""
    real, measured = table["real"], table["measured"]
    lines = [(f"real: {real['updates_us'] / 1000:.2f} ms of host updates per step for "
              f"{real['layers']} layers on a 910B3 = {real['per_layer_us']:.0f} us/layer "
              f"(replay {real['replay_us'] / 1000:.2f} ms; {real['source']})")]
    per_layer = measured["host_update_per_layer_us"]
    if per_layer is None:
        lines.append("here: no bench JSON (--from): host_update's per-layer cost not measured")
    else:
        lines.append(f"here ({measured['method']} method, CPU backend): host_update "
                     f"{per_layer:.1f} us/layer = {per_layer / real['per_layer_us']:.2f}x "
                     "the real figure")
    inv = measured["invariants"]
    if inv:
        for mode, by_l in inv.items():
            top = max(by_l, key=int)
            lines.append(f"invariants {mode} at L={top}: "
                         + ", ".join(f"{k} {v}" for k, v in sorted(by_l[top].items())))
    else:
        lines.append("invariants: not in this JSON")
    lines.append("projection on an NPU: host_update step = R + L x "
                 f"{real['per_layer_us']:.0f} us; ours = R + E (E: our extra host work per "
                 "step over the floor, from the JSON, else 0)")
    lines.append(f"{'mode':<14}{'R (us)':>8}{'L':>5}{'E (us)':>9}{'saving (us)':>13}"
                 f"{'ratio':>8}")
    for r in table["rows"]:
        lines.append(f"{r['mode']:<14}{r['replay_us']:>8.0f}{r['layers']:>5}"
                     f"{r['extra_us']:>9.1f}{r['saving_us']:>13.0f}{r['ratio']:>7.1f}x")
    check = table.get("selfcheck")
    if check is not None:
        kind = ("emulated: not an NPU figure" if check["emulated"]
                else "measured on the device")
        lines.append(f"with selfcheck's figures ({check['backend']}, {kind}): R = "
                     f"{check['replay_host_us']:.1f} us per replay, u = "
                     f"{check['update_per_layer_us']:.1f} us per layer; host_update step = "
                     "R + L x u, ours = R + E")
        lines.append(f"{'mode':<14}{'R (us)':>8}{'L':>5}{'u (us)':>9}{'E (us)':>9}"
                     f"{'saving (us)':>13}{'ratio':>8}")
        for r in table["selfcheck_rows"]:
            lines.append(f"{r['mode']:<14}{r['replay_us']:>8.1f}{r['layers']:>5}"
                         f"{r['per_layer_us']:>9.1f}{r['extra_us']:>9.1f}"
                         f"{r['saving_us']:>13.0f}{r['ratio']:>7.1f}x")
    return "\n".join(lines)


def _read_report(path: Path | None, option: str, kind: str) -> dict | None:
    """The aicpu-tiling `kind` JSON (``bench``, ``selfcheck``) that `option` names, or None
    when the option was not given.

    Raises:
        CliError: the file cannot be read, is not JSON or is not an aicpu-tiling `kind` JSON
            (the message names the option and the file).
    """
    if path is None:
        return None
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CliError(f"{option} {path}: {exc}") from exc
    if report.get("schema") != f"aicpu-tiling/{kind}":
        raise CliError(f"{option} {path}: not an aicpu-tiling {kind} JSON")
    return report


def run(args: argparse.Namespace) -> int:
    result = _read_report(args.source, "--from", "bench")
    report = _read_report(args.selfcheck, "--selfcheck", "selfcheck")
    selfcheck = None if report is None else from_selfcheck(report)
    table = projection(result, selfcheck)
    if args.json:
        emit_json(table)
    else:
        print(render(table))
    return 0
