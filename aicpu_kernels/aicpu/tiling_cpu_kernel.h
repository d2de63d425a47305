/*
 * tiling_cpu_kernel.h -- classic AI-CPU custom operator (aicpu::CpuKernel) that runs the
 * tiling kernel. A thin wrapper around aicpu_tiling_plan().
 *
 * Operator "AicpuTilingPlan" (op info: aicpu_tiling_plan.json; registered with
 * REGISTER_CPU_KERNEL; launched through aclnn or a graph like any CUSTAICPUKernel op):
 *   input 0   cu_seqlens_q  int32[n + 1]     query offsets (query_start_loc)
 *   input 1   seqlens_kv    int32[n]         kv lengths
 *   input 2   batch         int32[1]         optional: the live batch. When present the
 *                                            arrays must hold max_batch requests
 *                                            (n >= max_batch); when absent, batch = n.
 *   input 3   step_epoch    int32[1]         optional: the step epoch, echoed in the
 *                                            tiling header (0 when absent).
 *   output 0  tiling        int32[aicpu_tiling_bytes(params) / 4]
 *   attributes (int): num_q_heads, num_kv_heads, head_dim, block_size, max_batch,
 *             max_tokens, max_blocks_per_req, num_cores, q_tile (required);
 *             cost_kv_load, cost_qk_tile, cost_segment (optional, default
 *             AICPU_TILING_DEFAULT_COST_*); sliding_window (optional, default 0: no
 *             window; ABI v5, needs causal); causal (optional, default 1).
 * Compute() returns KERNEL_STATUS_OK when the tiling buffer was written, input errors
 * included (the header carries them to the host's check()), and
 * KERNEL_STATUS_PARAM_INVALID for plumbing or static configuration errors (missing or
 * mis-sized tensors, missing or out-of-range attributes, AICPU_TILING_E_PARAMS,
 * AICPU_TILING_E_BUFFER). On PARAM_INVALID nothing is written, except that
 * AICPU_TILING_E_PARAMS writes the header as aicpu_tiling_plan() documents.
 */
#ifndef AICPU_TILING_CPU_KERNEL_H
#define AICPU_TILING_CPU_KERNEL_H

#include "cpu_kernel.h"

namespace aicpu {

/* The op type; must equal the key of aicpu_tiling_plan.json. */
extern const char *const kAicpuTilingPlan;

class AicpuTilingPlanCpuKernel : public CpuKernel {
public:
    AicpuTilingPlanCpuKernel() = default;
    ~AicpuTilingPlanCpuKernel() override = default;
    uint32_t Compute(CpuKernelContext &ctx) override;
};

} // namespace aicpu

#endif /* AICPU_TILING_CPU_KERNEL_H */
