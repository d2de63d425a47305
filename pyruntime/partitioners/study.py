"""The balance study: every partitioner on the same trace batches, summarised per size.

The result is plain data (dicts of numbers) so the CLI can print it as a table or JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict

import numpy as np

from . import PARTITIONERS
from .ours_abi import ours
from .workload import CostModel, Workload

Batch = tuple[Sequence[int], Sequence[int]]  # (cu_seqlens_q, seqlens_kv)


def balance_study(
    batches: dict[int, list[Batch]],
    model: CostModel,
    *,
    engine: str = "kernel",
    names: Iterable[str] = tuple(PARTITIONERS),
    on_batch: Callable[[], None] | None = None,
) -> dict:
    """Run every partitioner on every batch and summarise per batch size.

    Args:
        batches: for each batch size, the sampled steps' lengths.
        model: geometry, core count and cost weights shared by all partitioners.
        engine: how ours is computed, ``"kernel"`` or ``"oracle"``.
        names: partitioners to run, ``"ours"`` first in reports.
        on_batch: called after each batch (progress).

    Returns:
        ``{"model": {...}, "sizes": [{"batch": b, "samples": n, "partitioners":
        {name: {"ratio_mean", "ratio_max", "segments_mean", "segments_max",
        "units_mean"}}}], "verdict": {"ours_at_or_below_all": bool,
        "violations": [...]}}``. A violation names the batch size, the anchor, the
        statistic and both values.

    Raises:
        WorkloadError: a batch's lengths are invalid.
        AssertionError: a partition does not cover the work exactly once, or the kernel's
            reported costs differ from the cost model.
    """
    names = list(names)
    sizes = []
    violations = []
    for size, samples in batches.items():
        ratios: dict[str, list[float]] = {n: [] for n in names}
        segs: dict[str, list[int]] = {n: [] for n in names}
        units = []
        for cu, kv in samples:
            workload = Workload(model, cu, kv)
            units.append(workload.num_units)
            for name in names:
                fn = PARTITIONERS[name]
                part = ours(workload, engine) if name == "ours" else fn(workload)
                part.validate()
                bal = part.balance()
                ratios[name].append(bal.ratio)
                segs[name].append(bal.segments)
            if on_batch:
                on_batch()
        summary = {
            n: {
                "ratio_mean": float(np.mean(ratios[n])),
                "ratio_max": float(np.max(ratios[n])),
                "segments_mean": float(np.mean(segs[n])),
                "segments_max": int(np.max(segs[n])),
                "units_mean": float(np.mean(units)),
            }
            for n in names
        }
        sizes.append({"batch": size, "samples": len(samples), "partitioners": summary})
        if "ours" in summary:
            for n in names:
                if n == "ours":
                    continue
                for stat in ("ratio_mean", "ratio_max"):
                    if summary["ours"][stat] > summary[n][stat] + 1e-12:
                        violations.append({
                            "batch": size, "anchor": n, "statistic": stat,
                            "ours": summary["ours"][stat], "anchor_value": summary[n][stat],
                        })  # fmt: skip
    return {
        "model": asdict(model),
        "sizes": sizes,
        "verdict": {"ours_at_or_below_all": not violations, "violations": violations},
    }
