/*
 * tiling_cpu_kernel.cc -- classic AI-CPU custom operator "AicpuTilingPlan".
 * See tiling_cpu_kernel.h for its inputs, attributes and return values.
 *
 * Built for the device with CANN's aarch64-target-linux-gnu-g++ into the kernelSo named
 * in aicpu_tiling_plan.json (tools/build_aicpu_kernel.sh). Host tests build it with g++
 * against aicpu_kernels/cann_stub/, a declaration-compatible stand-in for the CANN
 * headers.
 */
#include "tiling_cpu_kernel.h"

#include <cstddef>
#include <cstdint>
#include <string>

#include "cpu_kernel.h"
#include "status.h"

#include "../aicpu_tiling.h"

namespace aicpu {

const char *const kAicpuTilingPlan = "AicpuTilingPlan";

namespace {

constexpr uint32_t kInputCuSeqlensQ = 0;
constexpr uint32_t kInputSeqlensKv = 1;
constexpr uint32_t kInputLiveBatch = 2;
constexpr uint32_t kInputStepEpoch = 3;
constexpr uint32_t kOutputTiling = 0;

/* An int attribute that must fit in int32. Missing: `fallback` when `required` is
 * false, else an error. Returns false on error. */
bool ReadIntAttr(const CpuKernelContext &ctx, const char *name, bool required,
                 int32_t fallback, int32_t *out)
{
    auto attr = ctx.GetAttr(name);
    if (attr == nullptr) {
        *out = fallback;
        return !required;
    }
    const int64_t v = attr->GetInt();
    if (v < INT32_MIN || v > INT32_MAX) {
        return false;
    }
    *out = static_cast<int32_t>(v);
    return true;
}

bool ReadParams(const CpuKernelContext &ctx, aicpu_tiling_params *p, uint32_t *flags)
{
    *p = aicpu_tiling_params();
    int32_t causal = 1;
    const bool ok =
        ReadIntAttr(ctx, "num_q_heads", true, 0, &p->num_q_heads)
        && ReadIntAttr(ctx, "num_kv_heads", true, 0, &p->num_kv_heads)
        && ReadIntAttr(ctx, "head_dim", true, 0, &p->head_dim)
        && ReadIntAttr(ctx, "block_size", true, 0, &p->block_size)
        && ReadIntAttr(ctx, "max_batch", true, 0, &p->max_batch)
        && ReadIntAttr(ctx, "max_tokens", true, 0, &p->max_tokens)
        && ReadIntAttr(ctx, "max_blocks_per_req", true, 0, &p->max_blocks_per_req)
        && ReadIntAttr(ctx, "num_cores", true, 0, &p->num_cores)
        && ReadIntAttr(ctx, "q_tile", true, 0, &p->q_tile)
        && ReadIntAttr(ctx, "cost_kv_load", false, AICPU_TILING_DEFAULT_COST_KV_LOAD,
                       &p->cost_kv_load)
        && ReadIntAttr(ctx, "cost_qk_tile", false, AICPU_TILING_DEFAULT_COST_QK_TILE,
                       &p->cost_qk_tile)
        && ReadIntAttr(ctx, "cost_segment", false, AICPU_TILING_DEFAULT_COST_SEGMENT,
                       &p->cost_segment)
        && ReadIntAttr(ctx, "sliding_window", false, 0, &p->sliding_window)
        && ReadIntAttr(ctx, "causal", false, 1, &causal);
    if (!ok || (causal != 0 && causal != 1)) {
        return false;
    }
    *flags = causal ? AICPU_TILING_CAUSAL : 0u;
    return true;
}

/* The int32 elements a tensor's memory holds, or -1 when the tensor is missing, has
 * bytes but no data, or its element count contradicts 4-byte elements (the op info
 * allows DT_INT32 only). An empty tensor may have no data. */
int64_t Int32Capacity(const Tensor *t)
{
    if (t == nullptr) {
        return -1;
    }
    const uint64_t bytes = t->GetDataSize();
    if (bytes > 0 && t->GetData() == nullptr) {
        return -1;
    }
    const int64_t n = t->NumElements();
    if (n >= 0 && static_cast<uint64_t>(n) * sizeof(int32_t) != bytes) {
        return -1;
    }
    return static_cast<int64_t>(bytes / sizeof(int32_t));
}

} // namespace

uint32_t AicpuTilingPlanCpuKernel::Compute(CpuKernelContext &ctx)
{
    aicpu_tiling_params params;
    uint32_t flags = 0;
    if (!ReadParams(ctx, &params, &flags)) {
        return KERNEL_STATUS_PARAM_INVALID;
    }

    Tensor *cu = ctx.Input(kInputCuSeqlensQ);
    Tensor *kv = ctx.Input(kInputSeqlensKv);
    Tensor *out = ctx.Output(kOutputTiling);
    const int64_t cu_cap = Int32Capacity(cu);
    const int64_t kv_cap = Int32Capacity(kv);
    if (cu_cap < 1 || kv_cap < 0 || out == nullptr || out->GetData() == nullptr) {
        return KERNEL_STATUS_PARAM_INVALID;
    }
    /* Requests both arrays hold. */
    const int64_t capacity = (cu_cap - 1 < kv_cap) ? cu_cap - 1 : kv_cap;
    if (capacity > INT32_MAX) {
        return KERNEL_STATUS_PARAM_INVALID;
    }

    int32_t batch = 0;
    Tensor *live = (ctx.GetInputsSize() > kInputLiveBatch) ? ctx.Input(kInputLiveBatch)
                                                           : nullptr;
    if (live != nullptr && live->GetData() != nullptr) {
        /* Static check: every live value <= max_batch must be in bounds. Values outside
         * [0, max_batch] are reported by aicpu_tiling_plan() as AICPU_TILING_E_BATCH,
         * before it reads the arrays. */
        if (Int32Capacity(live) < 1 || capacity < params.max_batch) {
            return KERNEL_STATUS_PARAM_INVALID;
        }
        batch = *static_cast<const volatile int32_t *>(live->GetData());
    } else {
        /* No live batch: the tensors' shape is the batch; both must agree. */
        if (cu_cap - 1 != kv_cap) {
            return KERNEL_STATUS_PARAM_INVALID;
        }
        batch = static_cast<int32_t>(kv_cap);
    }

    /* Optional input 3: the step epoch, echoed in the tiling header (0 when absent). */
    int32_t epoch = 0;
    Tensor *step = (ctx.GetInputsSize() > kInputStepEpoch) ? ctx.Input(kInputStepEpoch)
                                                           : nullptr;
    if (step != nullptr && step->GetData() != nullptr) {
        if (Int32Capacity(step) < 1) {
            return KERNEL_STATUS_PARAM_INVALID;
        }
        epoch = *static_cast<const volatile int32_t *>(step->GetData());
    }

    const int status = aicpu_tiling_plan(
        &params, static_cast<const int32_t *>(cu->GetData()),
        static_cast<const int32_t *>(kv->GetData()), batch, epoch, flags, out->GetData(),
        static_cast<size_t>(out->GetDataSize()));
    if (status == AICPU_TILING_E_PARAMS || status == AICPU_TILING_E_BUFFER) {
        return KERNEL_STATUS_PARAM_INVALID;
    }
    /* AICPU_TILING_OK or an input error: the buffer holds the tiling or the offence. */
    return KERNEL_STATUS_OK;
}

REGISTER_CPU_KERNEL(kAicpuTilingPlan, AicpuTilingPlanCpuKernel);

} // namespace aicpu
