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

At MLA geometry (absorbed MLA decode: one latent kv head, a 576-wide key row
``[kv_lora_rank | rope]`` whose first 512 dims are the value, all q heads of a rank per kv
block; :data:`MLA_PRESETS`) the study takes :data:`MLA_COST_MODELS` and
:data:`~pyruntime.partitioners.MLA_ANCHORS`:

* ``mla``: the kernel defaults rescaled by what each term moves or computes at MLA width,
  times 4 to stay integer. ``cost_kv_load`` (16 kv tokens) by the bytes of a kv row: one
  576-wide row, the value being its first 512 dims, against K + V of 128 each (576 / 256 =
  2.25): 4 * 2.25 * 4 = 36. ``cost_qk_tile`` (a 16 x 16 score tile) by the matmul width: QK^T
  over 576 and PV over 512 against 128 + 128 (1088 / 256 = 4.25): 1 * 4.25 * 4 = 17 (the
  softmax part does not grow with the width, so this is the high end). ``cost_segment`` by
  the width of the query row loaded and of the fp32 partial written and combined (~4x:
  576 / 128 and 513 / 129): 32 * 4 * 4 = 512. 128-token blocks, 128-row query tiles.
* ``fia_mla``: FIA's own ``CalcCost``, unchanged in the MLA tiling, written in our weights as
  ``fia_v3`` is, with the MLA tiling's 256-row tile (``mBaseSize_``) as our query tile.

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
MLA_COST_MODELS: dict[str, dict[str, int]] = {
    "mla": {"block_size": 128, "cost_kv_load": 36, "cost_qk_tile": 17, "cost_segment": 512,
            "tile_rows": 128},
    "fia_mla": {"block_size": 64, "cost_kv_load": 40, "cost_qk_tile": 3, "cost_segment": 0,
                "tile_rows": 256},
}  # fmt: skip
# Per model: q heads per rank (128 / TP for TP 1, 2, 4, 8), the latent and rope widths.
MLA_PRESETS: dict[str, dict] = {
    "deepseek-v3": {"heads": (128, 64, 32, 16), "kv_lora_rank": 512, "qk_rope_head_dim": 64},
}
MLA_Q_LENS = (1, 2, 3, 4)  # decode, and MTP with 1-3 draft tokens
GEOMETRIES = ((16, 1), (32, 8), (64, 8))
SOURCES = ("trace", "spec-decode", "chunked-prefill")
STATISTICS = (("ratio_mean", "mean"), ("ratio_max", "worst"))
REFERENCES = {"minmax": minmax, "minmax_best_order": minmax_best_order}
TOLERANCE = 1e-9


def cost_model(
    name: str, num_q_heads: int, num_kv_heads: int, num_cores: int = 24,
    table: dict[str, dict[str, int]] | None = None,
) -> CostModel:  # fmt: skip
    """The named cost model (in ``table``, default :data:`COST_MODELS`) for one head geometry.

    Raises:
        KeyError: unknown name. WorkloadError: an invalid geometry.
    """
    weights = dict((COST_MODELS if table is None else table)[name])
    group = num_q_heads // num_kv_heads if num_kv_heads else 1
    q_tile = max(1, weights.pop("tile_rows") // max(group, 1))
    return CostModel(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, num_cores=num_cores,
                     q_tile=q_tile, **weights)  # fmt: skip


def _summary(ratios: list[float], segments: list[int], units: list[int],
             work: list[float] | None = None, own: list[float] | None = None) -> dict:  # fmt: skip
    out = {
        "ratio_mean": float(np.mean(ratios)),
        "ratio_max": float(np.max(ratios)),
        "segments_mean": float(np.mean(segments)),
        "segments_max": int(np.max(segments)),
        "units_mean": float(np.mean(units)),
    }
    if work:  # the partitioner ran its own units (FlashMLA's m blocks): its W over ours,
        # and its busiest core over its own ideal (the split's balance, its extra work aside)
        out["work_mean"] = float(np.mean(work))
        out["own_ratio_mean"] = float(np.mean(own))
        out["own_ratio_max"] = float(np.max(own))
    return out


def run_case(
    samples: list[Batch],
    model: CostModel,
    names: Iterable[str],
    engine: str = "kernel",
    references: Iterable[str] = (),
    anchors: dict | None = None,
    head_dim: int = 128,
) -> tuple[dict, list[str]]:
    """Every partitioner (and reference, after the anchors) on every sample of one case.

    Args:
        anchors: the table ``names`` are looked up in (default ``ANCHORS``).
        head_dim: our tiling's ``head_dim`` parameter (576 at MLA geometry).

    Returns:
        ``({name: summary}, not_applicable_names)``; ``"ours"`` first. A summary has
        ``work_mean`` when the partitioner ran units of its own (FlashMLA's m blocks): their
        total cost over the workload's; and ``own_ratio_mean``/``own_ratio_max``: its busiest
        core over the ideal of its own units.

    Raises:
        WorkloadError: a sample's lengths are invalid.
        AssertionError: a partition does not cover the work exactly once, or the kernel's
            reported costs differ from the cost model.
    """
    names = list(names)
    anchors = ANCHORS if anchors is None else anchors
    ratios: dict[str, list[float]] = {n: [] for n in ["ours", *names, *references]}
    segs: dict[str, list[int]] = {n: [] for n in ratios}
    work: dict[str, list[float]] = {n: [] for n in ratios}
    own_ratios: dict[str, list[float]] = {n: [] for n in ratios}
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
                    part = ours(workload, engine, head_dim)
                elif name in REFERENCES:
                    part = REFERENCES[name](workload)
                else:
                    part = anchors[name].run(workload)
            except NotApplicableError:
                skipped.add(name)
                continue
            part.validate()
            bal = part.balance()
            ratios[name].append(bal.ratio)
            segs[name].append(bal.segments)
            if part.workload is not workload:
                own = part.workload
                work[name].append(own.total_cost / workload.total_cost)
                own_ratios[name].append(bal.max_core_cost / own.ideal())
    out = {n: _summary(ratios[n], segs[n], units, work[n], own_ratios[n])
           for n in ratios if n not in skipped}  # fmt: skip
    return out, sorted(skipped)


def balance_study(
    batches: dict[str, dict[int, list[Batch]]],
    geometries: Iterable[tuple[int, int]] = GEOMETRIES,
    cost_models: Iterable[str] = tuple(COST_MODELS),
    *,
    num_cores: int = 24,
    engine: str = "kernel",
    names: Iterable[str] | None = None,
    references: Iterable[str] = (),
    on_case: Callable[[], None] | None = None,
    anchors: dict | None = None,
    cost_table: dict[str, dict[str, int]] | None = None,
    head_dim: int = 128,
) -> dict:
    """Run ours and every anchor variant on every (geometry, source, batch size, cost model).

    Args:
        batches: per length source, per batch size, the sampled steps' lengths.
        geometries: (query heads, kv heads) pairs.
        cost_models: names in :data:`COST_MODELS`.
        num_cores: AI Cores.
        engine: how ours is computed, ``"kernel"`` or ``"oracle"``.
        names: anchor variants to run (all of ``anchors`` by default).
        references: names in :data:`REFERENCES` (exact min-max bounds, slow) to add to each
            case under ``"references"``; they take no part in the verdict.
        on_case: called after each case (progress).
        anchors: the anchor table (default ``ANCHORS``; MLA: ``MLA_ANCHORS``).
        cost_table: where ``cost_models`` are looked up (default :data:`COST_MODELS`; MLA:
            :data:`MLA_COST_MODELS` with ``"ours"``).
        head_dim: our tiling's ``head_dim`` parameter (576 at MLA geometry).

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
    anchors = ANCHORS if anchors is None else anchors
    table = COST_MODELS if cost_table is None else cost_table
    names = list(anchors if names is None else names)
    cases, losses, ties = [], [], []
    ran: set[str] = set()
    for q_heads, kv_heads in geometries:
        for source, sizes in batches.items():
            for size, samples in sizes.items():
                for cm in cost_models:
                    model = cost_model(cm, q_heads, kv_heads, num_cores, table)
                    parts, skipped = run_case(samples, model, names, engine, references,
                                              anchors, head_dim)  # fmt: skip
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
            n: asdict(cost_model(n, 1, 1, num_cores, table))
            | {"num_q_heads": None, "num_kv_heads": None, "q_tile": None,
               "tile_rows": table[n]["tile_rows"]}
            for n in cost_models
        },
        "anchors": {
            n: {"label": anchors[n].label, "source": anchors[n].source,
                "family": anchors[n].family}
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


def mla_cost_table() -> dict[str, dict[str, int]]:
    """The cost models an MLA study may use: :data:`MLA_COST_MODELS`, ``"ours"`` (the GQA
    defaults, unchanged: a sensitivity check of the MLA weights) and ``"mla_runtime"``: the
    weights and query tile `pyruntime.mla_attention.StaticMLAAttention` plans with (a
    64-row unit, FlashMLA's block), which are not the study's ``mla`` weights: with it the
    study measures our tiling exactly as the runtime plans it."""
    from pyruntime import mla_attention  # torch: imported only when an MLA study asks

    runtime = {"block_size": 128, "cost_kv_load": mla_attention.MLA_COST_KV_LOAD,
               "cost_qk_tile": mla_attention.MLA_COST_QK_TILE,
               "cost_segment": mla_attention.MLA_COST_SEGMENT, "tile_rows": 64}
    return {**MLA_COST_MODELS, "ours": COST_MODELS["ours"], "mla_runtime": runtime}


def mla_balance_study(
    batches: dict[str, dict[int, list[Batch]]],
    preset: str = "deepseek-v3",
    cost_models: Iterable[str] = tuple(MLA_COST_MODELS),
    *,
    heads: Iterable[int] | None = None,
    num_cores: int = 24,
    engine: str = "kernel",
    on_case: Callable[[], None] | None = None,
) -> dict:
    """:func:`balance_study` at MLA geometry: ``(h, 1)`` heads for each q-head count ``h`` of
    the preset (or ``heads``), ``head_dim = kv_lora_rank + qk_rope_head_dim`` for our tiling,
    the MLA anchors and cost models.

    Args:
        batches: per source label (``"decode"``, ``"mtp2"``, ...), per batch size, the steps.
        preset: a key of :data:`MLA_PRESETS`.
        cost_models: names in :func:`mla_cost_table`.
        heads: q heads per rank (default the preset's).

    Returns:
        :func:`balance_study`'s result with ``"mla": {"preset", "kv_lora_rank",
        "qk_rope_head_dim", "head_dim", "heads"}``.

    Raises:
        KeyError: unknown preset or cost model. WorkloadError, AssertionError: as
            :func:`run_case`.
    """
    from . import MLA_ANCHORS

    spec = MLA_PRESETS[preset]
    table = mla_cost_table()
    cost_models = list(cost_models)
    for name in cost_models:
        table[name]  # a KeyError for an unknown name, before any work
    heads = list(spec["heads"] if heads is None else heads)
    head_dim = spec["kv_lora_rank"] + spec["qk_rope_head_dim"]
    result = balance_study(
        batches, [(h, 1) for h in heads], cost_models, num_cores=num_cores, engine=engine,
        on_case=on_case, anchors=MLA_ANCHORS, cost_table=table, head_dim=head_dim,
    )  # fmt: skip
    result["mla"] = {"preset": preset, "kv_lora_rank": spec["kv_lora_rank"],
                     "qk_rope_head_dim": spec["qk_rope_head_dim"], "head_dim": head_dim,
                     "heads": heads}  # fmt: skip
    return result
