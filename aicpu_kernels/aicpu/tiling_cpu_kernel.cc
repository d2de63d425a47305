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
#include <vector>

#include "cpu_kernel.h"
#include "status.h"

#include "../aicpu_tiling.h"
#include "tiling_kernel_args.h"

namespace aicpu {

const char *const kAicpuTilingPlan = "AicpuTilingPlan";

namespace {

constexpr uint32_t kInputCuSeqlensQ = 0;
constexpr uint32_t kInputSeqlensKv = 1;
constexpr uint32_t kInputLiveBatch = 2;
constexpr uint32_t kInputStepEpoch = 3;

/* The static parameters, in the order of aicpu_tiling_params, of pyruntime.tiling's
 * TilingParams and of each group of the `params` list attribute. Each is also a scalar
 * attribute of the same name (the one-tiling form). */
struct ParamField {
    const char *name;
    int32_t aicpu_tiling_params::*field;
    bool required;      /* as a scalar attribute */
    int32_t fallback;   /* when an optional scalar attribute is absent */
};

const ParamField kParamFields[] = {
    {"num_q_heads", &aicpu_tiling_params::num_q_heads, true, 0},
    {"num_kv_heads", &aicpu_tiling_params::num_kv_heads, true, 0},
    {"head_dim", &aicpu_tiling_params::head_dim, true, 0},
    {"block_size", &aicpu_tiling_params::block_size, true, 0},
    {"max_batch", &aicpu_tiling_params::max_batch, true, 0},
    {"max_tokens", &aicpu_tiling_params::max_tokens, true, 0},
    {"max_blocks_per_req", &aicpu_tiling_params::max_blocks_per_req, true, 0},
    {"num_cores", &aicpu_tiling_params::num_cores, true, 0},
    {"q_tile", &aicpu_tiling_params::q_tile, true, 0},
    {"cost_kv_load", &aicpu_tiling_params::cost_kv_load, false,
     AICPU_TILING_DEFAULT_COST_KV_LOAD},
    {"cost_qk_tile", &aicpu_tiling_params::cost_qk_tile, false,
     AICPU_TILING_DEFAULT_COST_QK_TILE},
    {"cost_segment", &aicpu_tiling_params::cost_segment, false,
     AICPU_TILING_DEFAULT_COST_SEGMENT},
    {"sliding_window", &aicpu_tiling_params::sliding_window, false, 0},
};

constexpr size_t kNumParamFields = sizeof(kParamFields) / sizeof(kParamFields[0]);
/* Every int32 field before reserved[]: a new field must be added to the table. */
static_assert(kNumParamFields * sizeof(int32_t)
                  == offsetof(aicpu_tiling_params, reserved),
              "kParamFields must list every field of aicpu_tiling_params before reserved");

bool FitsInt32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

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
    if (!FitsInt32(v)) {
        return false;
    }
    *out = static_cast<int32_t>(v);
    return true;
}

/* The one-tiling form: one scalar attribute per field. */
bool ReadScalarParams(const CpuKernelContext &ctx, aicpu_tiling_params *p)
{
    *p = aicpu_tiling_params();
    for (const ParamField &f : kParamFields) {
        if (!ReadIntAttr(ctx, f.name, f.required, f.fallback, &(p->*f.field))) {
            return false;
        }
    }
    return true;
}

/*
 * The static parameters of every tiling of this launch, into plans[0 .. *count).
 * The list attribute `params` (AttrValue::GetListInt(), as in CANN's AI-CPU context:
 * leideng/CANN-8.1.RC1 Ascend/ascend-toolkit/8.1.RC1/tools/msopgen/template/
 * custom_operator_sample/AICPU/Onnx/cpukernel/context/cpu_proto/attr_value.cc), when present
 * and non-empty, holds kNumParamFields values per tiling, concatenated; the scalar field
 * attributes are then not read (a graph's IR fills optional attributes with their
 * defaults, so their presence means nothing). Absent or empty: one tiling from the scalar
 * attributes, exactly the one-tiling operator. Returns false, writing nothing anywhere, when
 * the list is not a whole number of groups, names more than AICPU_TILING_KERNEL_MAX_PLANS
 * tilings or holds a value outside int32, or a scalar attribute is missing or out of range.
 */
bool ReadPlans(const CpuKernelContext &ctx, aicpu_tiling_params *plans, uint32_t *count)
{
    auto list_attr = ctx.GetAttr("params");
    const std::vector<int64_t> values =
        list_attr != nullptr ? list_attr->GetListInt() : std::vector<int64_t>();
    if (values.empty()) {
        *count = 1;
        return ReadScalarParams(ctx, &plans[0]);
    }
    if (values.size() % kNumParamFields != 0
        || values.size() / kNumParamFields > AICPU_TILING_KERNEL_MAX_PLANS) {
        return false;
    }
    *count = static_cast<uint32_t>(values.size() / kNumParamFields);
    for (uint32_t k = 0; k < *count; ++k) {
        plans[k] = aicpu_tiling_params();
        for (size_t i = 0; i < kNumParamFields; ++i) {
            const int64_t v = values[k * kNumParamFields + i];
            if (!FitsInt32(v)) {
                return false;
            }
            plans[k].*kParamFields[i].field = static_cast<int32_t>(v);
        }
    }
    return true;
}

bool ReadFlags(const CpuKernelContext &ctx, uint32_t *flags)
{
    int32_t causal = 1;
    if (!ReadIntAttr(ctx, "causal", false, 1, &causal) || (causal != 0 && causal != 1)) {
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
    aicpu_tiling_params plans[AICPU_TILING_KERNEL_MAX_PLANS];
    uint32_t count = 0;
    uint32_t flags = 0;
    if (!ReadPlans(ctx, plans, &count) || !ReadFlags(ctx, &flags)) {
        return KERNEL_STATUS_PARAM_INVALID;
    }

    /* The dynamic output list `tiling`, flattened: output k is tiling k (one per group of
     * `params`). CANN lays a dynamic output out this way (hicann/ops-math
     * conversion/split_v/op_kernel_aicpu/split_v.json declares "dynamic_output0" and
     * split_v_aicpu.cpp reads ctx.Output(i) for each element). */
    if (ctx.GetOutputsSize() != count) {
        return KERNEL_STATUS_PARAM_INVALID;
    }
    Tensor *outs[AICPU_TILING_KERNEL_MAX_PLANS];
    int32_t max_batch = 0;
    for (uint32_t k = 0; k < count; ++k) {
        outs[k] = ctx.Output(k);
        if (outs[k] == nullptr || outs[k]->GetData() == nullptr) {
            return KERNEL_STATUS_PARAM_INVALID;
        }
        /* A buffer too small for usable params (AICPU_TILING_E_BUFFER) is refused before
         * any tiling is written, so no launch is half written on this error. Invalid
         * params (size 0) and a window without causal are left to aicpu_tiling_plan(),
         * which writes their E_PARAMS header, as the one-tiling operator always did. */
        const size_t need = aicpu_tiling_bytes(&plans[k]);
        const bool window_without_causal =
            plans[k].sliding_window > 0 && (flags & AICPU_TILING_CAUSAL) == 0;
        if (need > 0 && !window_without_causal && outs[k]->GetDataSize() < need) {
            return KERNEL_STATUS_PARAM_INVALID;
        }
        if (plans[k].max_batch > max_batch) {
            max_batch = plans[k].max_batch;
        }
    }

    Tensor *cu = ctx.Input(kInputCuSeqlensQ);
    Tensor *kv = ctx.Input(kInputSeqlensKv);
    const int64_t cu_cap = Int32Capacity(cu);
    const int64_t kv_cap = Int32Capacity(kv);
    if (cu_cap < 1 || kv_cap < 0) {
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
        /* Static check: every live value <= max_batch of every tiling must be in bounds.
         * Values outside [0, max_batch] are reported by aicpu_tiling_plan() as
         * AICPU_TILING_E_BATCH, before it reads the arrays. */
        if (Int32Capacity(live) < 1 || capacity < max_batch) {
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

    /* Every tiling from the same lengths, batch, epoch and flags, as the Ascend C entry
     * plans more[] (tiling_kernel_args.h). */
    uint32_t result = KERNEL_STATUS_OK;
    for (uint32_t k = 0; k < count; ++k) {
        const int status = aicpu_tiling_plan(
            &plans[k], static_cast<const int32_t *>(cu->GetData()),
            static_cast<const int32_t *>(kv->GetData()), batch, epoch, flags,
            outs[k]->GetData(), static_cast<size_t>(outs[k]->GetDataSize()));
        /* AICPU_TILING_OK or an input error: the buffer holds the tiling or the offence. */
        if (status == AICPU_TILING_E_PARAMS || status == AICPU_TILING_E_BUFFER) {
            result = KERNEL_STATUS_PARAM_INVALID;
        }
    }
    return result;
}

REGISTER_CPU_KERNEL(kAicpuTilingPlan, AicpuTilingPlanCpuKernel);

} // namespace aicpu
