"""Our tiling, run through the kernel (``pyruntime.tiling``), read back through its ABI.

The buffer is decoded from the layout documented in ``aicpu_kernels/aicpu_tiling.h``
(header, core table, split prefix, combine table), independently of the decoded view in
``pyruntime.tiling``, so the balance report also cross-checks the kernel: every core's
cost as recomputed here must equal the cost the kernel wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .workload import Partition, Segment, Workload

# Word indices from aicpu_tiling.h (tests/cli/test_partitioners.py checks them against it).
HDR_MAGIC, HDR_VERSION, HDR_STATUS, HDR_BAD_REQUEST = 0, 1, 2, 3
HDR_BAD_VALUE, HDR_BAD_LIMIT, HDR_BATCH, HDR_NUM_TOKENS = 4, 5, 6, 7
HDR_NUM_CORES, HDR_NUM_UNITS, HDR_NUM_SEGMENTS, HDR_NUM_SLOTS = 8, 9, 10, 11
HDR_NUM_COMBINE, HDR_MAX_CORE_COST, HDR_TOTAL_COST, HDR_FLAGS = 12, 13, 14, 15
HDR_WORDS = 16
CORE_WORDS = 12
COMB_WORDS = 6
MAGIC = 0x4C495441

HEADER_FIELDS = (
    "magic", "version", "status", "bad_request", "bad_value", "bad_limit", "batch",
    "num_tokens", "num_cores", "num_units", "num_segments", "num_slots", "num_combine",
    "max_core_cost", "total_cost", "flags",
)  # fmt: skip


class TilingUnavailableError(RuntimeError):
    """``pyruntime.tiling`` (the kernel's Python binding) cannot be imported."""


@dataclass(frozen=True)
class CoreRecord:
    """One core's work range and figures as the kernel wrote them."""

    begin: tuple[int, int, int, int]
    end: tuple[int, int, int, int]
    first_slot: int
    last_slot: int
    num_segments: int
    cost: int


@dataclass(frozen=True)
class DecodedTiling:
    """A tiling buffer decoded through the ABI."""

    header: dict[str, int]
    cores: list[CoreRecord]
    split_prefix: list[int]
    combine: list[tuple[int, int, int, int, int]]

    @property
    def status(self) -> int:
        """The kernel's status code (0 is OK)."""
        return self.header["status"]


def as_words(buffer: Any) -> np.ndarray:
    """The buffer as a flat little-endian int32 array (bytes, memoryview, numpy or torch)."""
    if hasattr(buffer, "detach"):  # a torch tensor
        buffer = buffer.detach().cpu().numpy()
    if isinstance(buffer, np.ndarray):
        return np.ascontiguousarray(buffer).view("<i4").reshape(-1)
    return np.frombuffer(bytes(buffer), dtype="<i4")


def decode(buffer: Any, max_batch: int) -> DecodedTiling:
    """Decode a tiling buffer written for ``max_batch`` requests.

    Raises:
        ValueError: the magic word is wrong or the buffer is shorter than its header says.
    """
    words = as_words(buffer)
    if words.size < HDR_WORDS or int(words[HDR_MAGIC]) != MAGIC:
        raise ValueError("not a tiling buffer: bad magic word")
    header = {name: int(words[i]) for i, name in enumerate(HEADER_FIELDS)}
    cores_n = header["num_cores"]
    need = HDR_WORDS + CORE_WORDS * cores_n + max_batch + 1 + COMB_WORDS * max(cores_n - 1, 0)
    if words.size < need:
        raise ValueError(f"tiling buffer has {words.size} words, its header needs {need}")
    table = words[HDR_WORDS : HDR_WORDS + CORE_WORDS * cores_n].reshape(cores_n, CORE_WORDS)
    cores = [
        CoreRecord(tuple(int(x) for x in row[0:4]), tuple(int(x) for x in row[4:8]),
                   int(row[8]), int(row[9]), int(row[10]), int(row[11]))
        for row in table
    ]  # fmt: skip
    at = HDR_WORDS + CORE_WORDS * cores_n
    prefix = [int(x) for x in words[at : at + max_batch + 1]]
    at += max_batch + 1
    combine = [
        tuple(int(x) for x in words[at + i * COMB_WORDS : at + i * COMB_WORDS + 5])
        for i in range(header["num_combine"])
    ]
    return DecodedTiling(header, cores, prefix, combine)  # type: ignore[arg-type]


def core_segments(workload: Workload, record: CoreRecord) -> list[Segment]:
    """The segments of one core record, in work order."""
    index = {
        (int(r), int(h), int(t)): u
        for u, (r, h, t) in enumerate(zip(workload.request, workload.head, workload.tile))
    }

    def locate(pos: tuple[int, int, int, int]) -> tuple[int, int]:
        if pos[0] >= workload.batch:
            return workload.num_units, 0
        return index[pos[:3]], pos[3]

    (ub, kb), (ue, ke) = locate(record.begin), locate(record.end)
    if (ub, kb) == (ue, ke):
        return []
    if ub == ue:
        return [Segment(ub, kb, ke)]
    segs = [Segment(ub, kb, int(workload.blocks[ub]))]
    segs += [Segment(u, 0, int(workload.blocks[u])) for u in range(ub + 1, ue)]
    if ke > 0:
        segs.append(Segment(ue, 0, ke))
    return segs


def _param_fields(workload: Workload, head_dim: int = 128) -> dict[str, int]:
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
    }


def run_kernel(workload: Workload, engine: str = "kernel") -> DecodedTiling:
    """Plan ``workload`` and decode the buffer.

    Args:
        engine: ``"kernel"`` runs the C kernel through ``pyruntime.tiling``; ``"oracle"``
            runs the slow pure-Python oracle of the same algorithm
            (``pyruntime.tiling_oracle``), which must give the same bytes.

    Raises:
        TilingUnavailableError: the chosen engine cannot be imported.
        ValueError: unknown engine.
    """
    batch = workload.batch
    if engine == "oracle":
        from types import SimpleNamespace

        try:
            from pyruntime import tiling_oracle
        except ImportError as exc:  # pragma: no cover - depends on the checkout
            raise TilingUnavailableError(f"pyruntime.tiling_oracle is not available: {exc}")
        params = SimpleNamespace(**_param_fields(workload))
        words = tiling_oracle.oracle_plan(
            params, workload.cu_seqlens_q, workload.seqlens_kv, batch, workload.model.causal
        )
        return decode(words, params.max_batch)
    if engine != "kernel":
        raise ValueError(f"unknown tiling engine {engine!r}; use 'kernel' or 'oracle'")
    try:
        from pyruntime import tiling
    except ImportError as exc:
        raise TilingUnavailableError(f"pyruntime.tiling is not available: {exc}") from exc
    fields = _param_fields(workload)
    result = tiling.plan(
        tiling.TilingParams(**fields),
        workload.cu_seqlens_q,
        workload.seqlens_kv,
        causal=workload.model.causal,
    )
    return decode(result.buffer, fields["max_batch"])


def ours(workload: Workload, engine: str = "kernel") -> Partition:
    """Our tiling as a partition.

    Raises:
        TilingUnavailableError: the engine cannot be imported.
        AssertionError: the kernel's per-core costs disagree with the cost model here.
    """
    decoded = run_kernel(workload, engine)
    if decoded.status != 0:
        raise ValueError(f"tiling status {decoded.status} for a workload the model accepted")
    cores = [core_segments(workload, rec) for rec in decoded.cores]
    part = Partition("ours", workload, cores)
    recomputed = part.core_costs()
    reported = [rec.cost for rec in decoded.cores]
    if recomputed != reported:
        raise AssertionError(f"kernel core costs {reported} != cost model {recomputed}")
    return part
