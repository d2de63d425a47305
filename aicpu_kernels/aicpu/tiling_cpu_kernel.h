/*
 * tiling_cpu_kernel.h -- classic AI-CPU custom operator (aicpu::CpuKernel) that runs the
 * tiling kernel. A thin wrapper around aicpu_tiling_plan().
 *
 * Operator "AicpuTilingPlan" (op info: aicpu_tiling_plan.json; registered with
 * REGISTER_CPU_KERNEL; launched through aclnn or a graph like any CUSTAICPUKernel op).
 * One launch plans N tilings (1 <= N <= AICPU_TILING_KERNEL_MAX_PLANS, tiling_kernel_args.h)
 * from the same lengths, batch and epoch: one per distinct sliding window of a graph
 * (gpt-oss: none and 128), as the runtime route's argument block plans more[].
 *   input 0   cu_seqlens_q  int32[n + 1]     query offsets (query_start_loc)
 *   input 1   seqlens_kv    int32[n]         kv lengths
 *   input 2   batch         int32[1]         optional: the live batch. When present the
 *                                            arrays must hold the largest max_batch of
 *                                            the N tilings (n >= max_batch); when absent,
 *                                            batch = n.
 *   input 3   step_epoch    int32[1]         optional: the step epoch, echoed in every
 *                                            tiling header (0 when absent).
 *   outputs   tiling        dynamic list of N outputs (op info "dynamic_output0"; the
 *                                            kernel sees them flattened as outputs
 *                                            0 .. N-1), output k int32[aicpu_tiling_bytes(
 *                                            params k) / 4]
 *   attributes:
 *     params (list int, optional): N groups of 13 values, each tiling's static parameters
 *             in aicpu_tiling_params order (num_q_heads, num_kv_heads, head_dim,
 *             block_size, max_batch, max_tokens, max_blocks_per_req, num_cores, q_tile,
 *             cost_kv_load, cost_qk_tile, cost_segment, sliding_window), concatenated:
 *             what torch.ops.aicpu_tiling.plan_tilings takes (pyruntime.kernels.step.
 *             split_params). When given (non-empty), the scalar attributes below are not
 *             read.
 *     without params, the one-tiling form (N = 1), unchanged: int attributes
 *             num_q_heads, num_kv_heads, head_dim, block_size, max_batch, max_tokens,
 *             max_blocks_per_req, num_cores, q_tile (required); cost_kv_load,
 *             cost_qk_tile, cost_segment (optional, default AICPU_TILING_DEFAULT_COST_*);
 *             sliding_window (optional, default 0: no window; ABI v5, needs causal).
 *     causal (int, optional, default 1): for every tiling.
 * Compute() returns KERNEL_STATUS_OK when every tiling buffer was written, input errors
 * included (each header carries them to the host's check()), and
 * KERNEL_STATUS_PARAM_INVALID for plumbing or static configuration errors. Before any
 * tiling is written, with nothing written: missing or mis-sized tensors, missing or
 * out-of-range attributes, `params` not a multiple of 13 values or naming more than
 * AICPU_TILING_KERNEL_MAX_PLANS tilings, N not the number of outputs, a buffer under its
 * tiling's aicpu_tiling_bytes() (AICPU_TILING_E_BUFFER). After planning every tiling:
 * a tiling with invalid static params or a window without causal (AICPU_TILING_E_PARAMS:
 * its buffer holds the header aicpu_tiling_plan() documents, or nothing if it cannot hold
 * a header), while the other buffers hold their tilings, as the Ascend C entry plans
 * more[]. A one-tiling launch therefore behaves exactly as before the list.
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
