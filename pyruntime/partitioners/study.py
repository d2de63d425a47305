"""The balance study: ours and every anchor variant on the same batches, under two cost models.

Cost models (both are ``CostModel`` weights of our kernel, so ours is planned with the same
weights it is scored by):

* ``ours``: the defaults of ``aicpu_tiling.h``: 128-token blocks, ``cost_kv_load = 4``,
  ``cost_qk_tile = 1``, ``cost_segment = 32``.
* ``fia_v3``: FIA V3's own block cost, ``6 * ceil(M / 16) + 10 * ceil(S2 / 64)`` per
  (M rows x S2 kv tokens) block (``CalcCost`` in ops-transformer ``split_core.cpp``), written
  in our weights: 64-token blocks, ``cost_kv_load = 40``, ``cost_qk_tile = 3``,
  ``cost_segment = 0`` and FIA's 512-row tile as our query tile (``q_tile = 512 / G``). A
  64-token block of a unit of ``M`` rows then costs
  ``4 * (40 + 3 * ceil(M / 16)) = 16 * (10 + 6 * ceil(M / 16) / 8)``: 16 times FIA's own
  cost per 64 kv tokens (FIA prices the M term per 512-token block, this model per 64).

The result is plain data (dicts of numbers) so the CLI can print it as tables or JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict

import numpy as np

from . import ANCHORS
from .minmax import minmax, minmax_best_order
from .ours_abi import ours
from .workload import CostModel, NotApplicableError, Workload

Batch = tuple[Sequence[int], Sequence[int]]  # (cu_seqlens_q, seqlens_kv)

COST_MODELS: dict[str, dict[str, int]] = {
    "ours": {"block_size": 128, "cost_kv_load": 4, "cost_qk_tile": 1, "cost_segment": 32,
             "tile_rows": 128},
    "fia_v3": {"block_size": 64, "cost_kv_load": 40, "cost_qk_tile": 3, "cost_segment": 0,
               "tile_rows": 512},
}  # fmt: skip
GEOMETRIES = ((16, 1), (32, 8), (64, 8))
SOURCES = ("trace", "spec-decode", "chunked-prefill")
STATISTICS = (("ratio_mean", "mean"), ("ratio_max", "worst"))
REFERENCES = {"minmax": minmax, "minmax_best_order": minmax_best_order}
TOLERANCE = 1e-9


def cost_model(name: str, num_q_heads: int, num_kv_heads: int, num_cores: int = 24) -> CostModel:
    """The named cost model (:data:`COST_MODELS`) for one head geometry.

    Raises:
        KeyError: unknown name. WorkloadError: an invalid geometry.
    """
    weights = dict(COST_MODELS[name])
    group = num_q_heads // num_kv_heads if num_kv_heads else 1
    q_tile = max(1, weights.pop("tile_rows") // max(group, 1))
    return CostModel(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, num_cores=num_cores,
                     q_tile=q_tile, **weights)  # fmt: skip


def _summary(ratios: list[float], segments: list[int], units: list[int]) -> dict:
    return {
        "ratio_mean": float(np.mean(ratios)),
        "ratio_max": float(np.max(ratios)),
        "segments_mean": float(np.mean(segments)),
        "segments_max": int(np.max(segments)),
        "units_mean": float(np.mean(units)),
    }


def run_case(
    samples: list[Batch],
    model: CostModel,
    names: Iterable[str],
    engine: str = "kernel",
    references: Iterable[str] = (),
) -> tuple[dict, list[str]]:
    """Every partitioner (and reference, after the anchors) on every sample of one case.

    Returns:
        ``({name: summary}, not_applicable_names)``; ``"ours"`` first.

    Raises:
        WorkloadError: a sample's lengths are invalid.
        AssertionError: a partition does not cover the work exactly once, or the kernel's
            reported costs differ from the cost model.
    """
    names = list(names)
    ratios: dict[str, list[float]] = {n: [] for n in ["ours", *names, *references]}
    segs: dict[str, list[int]] = {n: [] for n in ratios}
    units: list[int] = []
    skipped: set[str] = set()
    for cu, kv in samples:
        workload = Workload(model, cu, kv)
        units.append(workload.num_units)
        for name in list(ratios):
            if name in skipped:
                continue
            try:
                if name == "ours":
                    part = ours(workload, engine)
                elif name in REFERENCES:
                    part = REFERENCES[name](workload)
                else:
                    part = ANCHORS[name].run(workload)
            except NotApplicableError:
                skipped.add(name)
                continue
            part.validate()
            bal = part.balance()
            ratios[name].append(bal.ratio)
            segs[name].append(bal.segments)
    out = {n: _summary(ratios[n], segs[n], units) for n in ratios if n not in skipped}
    return out, sorted(skipped)


def balance_study(
    batches: dict[str, dict[int, list[Batch]]],
    geometries: Iterable[tuple[int, int]] = GEOMETRIES,
    cost_models: Iterable[str] = tuple(COST_MODELS),
    *,
    num_cores: int = 24,
    engine: str = "kernel",
    names: Iterable[str] = tuple(ANCHORS),
    references: Iterable[str] = (),
    on_case: Callable[[], None] | None = None,
) -> dict:
    """Run ours and every anchor variant on every (geometry, source, batch size, cost model).

    Args:
        batches: per length source, per batch size, the sampled steps' lengths.
        geometries: (query heads, kv heads) pairs.
        cost_models: names in :data:`COST_MODELS`.
        num_cores: AI Cores.
        engine: how ours is computed, ``"kernel"`` or ``"oracle"``.
        names: anchor variants to run (all by default).
        references: names in :data:`REFERENCES` (exact min-max bounds, slow) to add to each
            case under ``"references"``; they take no part in the verdict.
        on_case: called after each case (progress).

    Returns:
        ``{"cost_models", "anchors", "cases": [{"geometry", "num_q_heads", "num_kv_heads",
        "source", "cost_model", "batch", "samples", "partitioners": {name: {"ratio_mean",
        "ratio_max", "segments_mean", "segments_max", "units_mean"}}, "not_applicable"}],
        "verdict": {"ours_at_or_below_all", "variants", "variants_missing", "losses",
        "ties"}}``. A loss or tie names the case, the anchor, the statistic (``mean`` or
        ``worst``) and both values; ours is at or below all when there is no loss and every
        variant ran somewhere.

    Raises:
        WorkloadError, AssertionError: as :func:`run_case`.
    """
    names = list(names)
    cases, losses, ties = [], [], []
    ran: set[str] = set()
    for q_heads, kv_heads in geometries:
        for source, sizes in batches.items():
            for size, samples in sizes.items():
                for cm in cost_models:
                    model = cost_model(cm, q_heads, kv_heads, num_cores)
                    parts, skipped = run_case(samples, model, names, engine, references)
                    refs = {n: parts.pop(n) for n in references if n in parts}
                    case = {
                        "geometry": f"{q_heads}/{kv_heads}", "num_q_heads": q_heads,
                        "num_kv_heads": kv_heads, "source": source, "cost_model": cm,
                        "batch": size, "samples": len(samples), "partitioners": parts,
                        "not_applicable": skipped,
                    }  # fmt: skip
                    if refs:
                        case["references"] = refs
                    cases.append(case)
                    ran.update(n for n in parts if n != "ours")
                    for n in parts:
                        if n == "ours":
                            continue
                        for stat, label in STATISTICS:
                            mine, theirs = parts["ours"][stat], parts[n][stat]
                            record = {k: case[k] for k in ("geometry", "source", "cost_model",
                                                           "batch")}  # fmt: skip
                            record |= {"anchor": n, "statistic": label, "ours": mine,
                                       "anchor_value": theirs}  # fmt: skip
                            if mine > theirs + TOLERANCE:
                                losses.append(record)
                            elif mine >= theirs - TOLERANCE:
                                ties.append(record)
                    if on_case:
                        on_case()
    missing = [n for n in names if n not in ran]
    return {
        "cost_models": {
            n: asdict(cost_model(n, 1, 1, num_cores))
            | {"num_q_heads": None, "num_kv_heads": None, "q_tile": None,
               "tile_rows": COST_MODELS[n]["tile_rows"]}
            for n in cost_models
        },
        "anchors": {
            n: {"label": ANCHORS[n].label, "source": ANCHORS[n].source,
                "family": ANCHORS[n].family}
            for n in names
        },
        "cases": cases,
        "verdict": {
            "ours_at_or_below_all": not losses and not missing,
            "variants": names,
            "variants_missing": missing,
            "losses": losses,
            "ties": ties,
        },
    }
