"""Our tiling, run through the kernel (``pyruntime.tiling``) and read back as a partition.

The core table is read with ``pyruntime.tiling``'s decoder (the one reader of the ABI in
``aicpu_kernels/aicpu_tiling.h``); the segments are then rebuilt here from the workload's own
units, so the balance report also cross-checks the kernel: every core's cost as recomputed
from the cost model must equal the cost the kernel wrote.
"""

from __future__ import annotations

from .workload import Partition, Segment, Workload


class TilingUnavailableError(RuntimeError):
    """``pyruntime.tiling`` (the kernel's Python binding) cannot be imported."""


def core_segments(workload: Workload, record) -> list[Segment]:
    """The segments of one core record (``pyruntime.tiling.CoreRange``), in work order.

    Record positions are ``(request, kv head, query tile, kv block)`` in the kernel's
    head-major work order, the end of the work being ``(0, num_kv_heads, 0, 0)``; the
    segments name the workload's (request-major) unit indices. The kv block is an absolute
    block-table column (ABI v5); segments count blocks from the unit's first column, which
    a workload with a sliding window gives as ``first_blocks`` (0 for every unit without).
    """
    first_blocks = getattr(workload, "first_blocks", None)

    def locate(pos: tuple[int, int, int, int]) -> tuple[int, int]:
        if pos[1] >= workload.model.num_kv_heads:
            return workload.num_units, 0
        at = workload.work_position(*pos[:3])
        first = 0 if first_blocks is None else int(first_blocks[int(workload.work_order[at])])
        return at, pos[3] - first

    (pb, kb), (pe, ke) = locate(record.begin), locate(record.end)
    if (pb, kb) == (pe, ke):
        return []
    order = workload.work_order
    if pb == pe:
        return [Segment(int(order[pb]), kb, ke)]
    first = int(order[pb])
    segs = [Segment(first, kb, int(workload.blocks[first]))]
    segs += [Segment(u, 0, int(workload.blocks[u])) for u in order[pb + 1 : pe].tolist()]
    if ke > 0:
        segs.append(Segment(int(order[pe]), 0, ke))
    return segs


def _param_fields(workload: Workload, head_dim: int = 128) -> dict[str, int | None]:
    """Tiling parameters (C struct field names) sized for this workload."""
    model = workload.model
    max_kv = max(workload.seqlens_kv, default=1)
    return {
        "num_q_heads": model.num_q_heads,
        "num_kv_heads": model.num_kv_heads,
        "head_dim": head_dim,
        "block_size": model.block_size,
        "max_batch": max(workload.batch, 1),
        "max_tokens": max(workload.cu_seqlens_q[-1], 1),
        "max_blocks_per_req": max(-(-max_kv // model.block_size), 1),
        "num_cores": model.num_cores,
        "q_tile": model.q_tile,
        "cost_kv_load": model.cost_kv_load,
        "cost_qk_tile": model.cost_qk_tile,
        "cost_segment": model.cost_segment,
        # a WindowedWorkload (windowed.py) plans its window (ABI v5)
        "sliding_window": getattr(workload, "sliding_window", None),
    }


def run_kernel(workload: Workload, engine: str = "kernel", head_dim: int = 128):
    """Plan ``workload``; returns a ``pyruntime.tiling.Tiling``.

    Args:
        engine: ``"kernel"`` runs the C kernel; ``"oracle"`` runs the slow pure-Python
            oracle of the same algorithm, which must give the same bytes.
        head_dim: the tiling parameter (576 for absorbed MLA: ``kv_lora_rank + rope``); it
            sizes the workspace only, not the partition.

    Raises:
        TilingUnavailableError: ``pyruntime.tiling`` cannot be imported.
        ValueError: unknown engine.
    """
    if engine not in ("kernel", "oracle"):
        raise ValueError(f"unknown tiling engine {engine!r}; use 'kernel' or 'oracle'")
    try:
        from pyruntime import tiling
    except ImportError as exc:
        raise TilingUnavailableError(f"pyruntime.tiling is not available: {exc}") from exc
    planner = tiling.plan if engine == "kernel" else tiling.reference_plan
    return planner(tiling.TilingParams(**_param_fields(workload, head_dim)), workload.cu_seqlens_q,
                   workload.seqlens_kv, causal=workload.model.causal)  # fmt: skip


def ours(workload: Workload, engine: str = "kernel", head_dim: int = 128) -> Partition:
    """Our tiling as a partition (``head_dim``: as :func:`run_kernel`).

    Raises:
        TilingUnavailableError: the engine cannot be imported.
        AssertionError: the kernel's per-core costs disagree with the cost model here.
    """
    decoded = run_kernel(workload, engine, head_dim)
    if decoded.status != 0:
        raise ValueError(f"tiling status {decoded.status} for a workload the model accepted")
    records = decoded.cores()
    cores = [core_segments(workload, rec) for rec in records]
    part = Partition("ours", workload, cores)
    recomputed = part.core_costs()
    reported = [rec.cost for rec in records]
    if recomputed != reported:
        raise AssertionError(f"kernel core costs {reported} != cost model {recomputed}")
    return part
