"""Work partitioners charged by one cost model: ours and faithful models of the anchors'.

``ANCHORS`` maps a variant name to an :class:`Anchor`: the function ``Workload -> Partition``,
a table label and the source it follows (repository, file, function). All partitions are
charged by the :class:`CostModel` of the workload, so ``Partition.balance()`` (busiest core
over ``W / P + cost_segment``, segment count) is comparable across them. An anchor whose
kernel cannot run a batch raises :class:`NotApplicableError`.

    >>> from pyruntime.partitioners import ANCHORS, CostModel, Workload
    >>> w = Workload(CostModel(num_q_heads=8, num_kv_heads=1, num_cores=4), [0, 1, 2], [300, 5000])
    >>> part = ANCHORS["fia_v3"].run(w)
    >>> part.validate()
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .fia_v2_sink import fia_v2_sink_metadata, fia_v2_sink_metadata_mla
from .fia_v3 import fia_mla, fia_v3
from .flashinfer import flashinfer, flashinfer_persistent
from .flashmla import flashmla
from .ifa import ifa_even, ifa_weighted
from .ours_abi import TilingUnavailableError, ours
from .workload import (
    Balance,
    CostModel,
    NotApplicableError,
    Partition,
    Segment,
    Workload,
    WorkloadError,
)

Partitioner = Callable[[Workload], Partition]

FIA_V3_SOURCE = (
    "ops-transformer attention/common/op_host/split_core.cpp SplitCore, called from "
    "attention/common/op_host/arch32/fia_tiling_nonquant.cpp FiaTilingNonQuant::Split"
)
IFA_SOURCE = (
    "ops-transformer attention/incre_flash_attention/op_host/incre_flash_attention_tiling.cpp "
    "IFATiling::{SetCoreNum, IsFlashDecode, SplitBN_V0, SplitBN, SetSparseStartIdx, "
    "BalanceLoad, SplitBNS}"
)
FLASHMLA_SOURCE = (
    "deepseek-ai/FlashMLA csrc/kernels/get_mla_metadata.cu get_mla_metadata_kernel, grid from "
    "csrc/flash_api.cpp get_mla_metadata"
)
FLASHINFER_SOURCE = (
    "flashinfer-ai/flashinfer include/flashinfer/attention/scheduler.cuh "
    "BatchDecodeWithPagedKVCacheWorkEstimationDispatched, "
    "PartitionPagedKVCacheBinarySearchMinNumPagePerBatch, PrefillSplitQOKVIndptr"
)
FLASHINFER_PERSISTENT_SOURCE = (
    "flashinfer-ai/flashinfer include/flashinfer/attention/scheduler.cuh TwoStageHolisticPlan"
)
FIA_MLA_SOURCE = (
    "ops-transformer attention/common/op_host/split_core.cpp SplitCore, called from "
    "attention/common/op_host/arch32/fia_tiling_nonquant_mla.cpp FiaTilingNonQuantMla::Split"
)
FIA_V2_SINK_SOURCE = (
    "vllm-project/vllm-ascend csrc/attention/fused_infer_attention_score_v2_sink_metadata/"
    "op_kernel_aicpu/fused_infer_attention_score_v2_sink_metadata_aicpu.cpp (79e5f65) "
    "CalcInnerSizeGqa, CalcMBaseSizeGqa, CalcS2Range, CalcSplitPlan, SplitCore; caller "
    "vllm_ascend/ops/fia_v2_sink.py build_fia_v2_sink_metadata"
)
FIA_V2_SINK_MLA_SOURCE = FIA_V2_SINK_SOURCE.replace(
    "CalcInnerSizeGqa, CalcMBaseSizeGqa", "CheckIsMla, CalcInnerSizeMla, CalcMBaseSizeMla"
)
FLASHMLA_SWEEP = (0, 1, 2, 3, 8)  # F in 64-token blocks, beside FlashMLA's own 5


@dataclass(frozen=True)
class Anchor:
    """One anchor variant: how to run it, its table label, the source it follows."""

    name: str
    label: str
    run: Partitioner
    source: str
    family: str


def _flashmla_tuned(workload: Workload) -> Partition:
    """FlashMLA with its overhead set to our ``cost_segment``."""
    return flashmla(workload, overhead_cost=workload.model.cost_segment)


def _anchors() -> dict[str, Anchor]:
    out = [
        Anchor("fia_v3", "FIA V3", fia_v3, FIA_V3_SOURCE, "FIA V3"),
        Anchor("fia_v2_sink_metadata", "FIA v2 sink meta", fia_v2_sink_metadata,
               FIA_V2_SINK_SOURCE, "FIA v2 sink metadata (AI-CPU)"),
        Anchor("ifa_even_aiv", "IFA even 48v", partial(ifa_even, vector_cores=True),
               IFA_SOURCE, "IFA"),
        Anchor("ifa_weighted_aiv", "IFA 48v", partial(ifa_weighted, vector_cores=True),
               IFA_SOURCE, "IFA"),
        Anchor("ifa_even_aic", "IFA even 24c", partial(ifa_even, vector_cores=False),
               IFA_SOURCE, "IFA"),
        Anchor("ifa_weighted_aic", "IFA 24c", partial(ifa_weighted, vector_cores=False),
               IFA_SOURCE, "IFA"),
        Anchor("flashmla", "FlashMLA F=5", flashmla, FLASHMLA_SOURCE, "FlashMLA"),
        Anchor("flashmla_tuned", "FlashMLA F=seg", _flashmla_tuned, FLASHMLA_SOURCE, "FlashMLA"),
    ]  # fmt: skip
    out += [
        Anchor(f"flashmla_f{f}", f"FlashMLA F={f}", partial(flashmla, fixed_overhead=f),
               FLASHMLA_SOURCE, "FlashMLA sweep")
        for f in FLASHMLA_SWEEP
    ]  # fmt: skip
    out += [
        Anchor(f"flashinfer_{k}x", f"FlashInfer {k}x", partial(flashinfer, budget=k),
               FLASHINFER_SOURCE, "FlashInfer")
        for k in (1, 2, 4)
    ]  # fmt: skip
    out.append(Anchor("flashinfer_persistent", "FlashInfer persistent", flashinfer_persistent,
                      FLASHINFER_PERSISTENT_SOURCE, "FlashInfer"))  # fmt: skip
    return {a.name: a for a in out}


ANCHORS: dict[str, Anchor] = _anchors()

# The anchors of MLA decode (absorbed, one latent kv head): FIA routes rope-split fp16/bf16
# MLA to FiaTilingNonQuantMla (ops-transformer fused_infer_attention_score_tiling_v3.cpp
# RouteToFia), so IFA and FIA V3's GQA sizes do not apply; FlashInfer's MLA planner is a
# different scheduler from the one modelled here and is not included.
MLA_ANCHORS: dict[str, Anchor] = {
    "fia_mla": Anchor("fia_mla", "FIA MLA", fia_mla, FIA_MLA_SOURCE, "FIA MLA"),
    "fia_v2_sink_metadata": Anchor("fia_v2_sink_metadata", "FIA v2 sink meta",
                                   fia_v2_sink_metadata_mla, FIA_V2_SINK_MLA_SOURCE,
                                   "FIA v2 sink metadata (AI-CPU)"),
    **{n: a for n, a in ANCHORS.items() if a.family.startswith("FlashMLA")},
}

__all__ = [
    "ANCHORS",
    "MLA_ANCHORS",
    "Anchor",
    "Balance",
    "CostModel",
    "NotApplicableError",
    "Partition",
    "Partitioner",
    "Segment",
    "TilingUnavailableError",
    "Workload",
    "WorkloadError",
    "ours",
]
