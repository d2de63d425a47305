/*
 * plan_tiling_op.cpp -- the NPU (PrivateUse1) kernel of torch.ops.aicpu_tiling.plan_tiling:
 * launches the AI-CPU tiling kernel on the current NPU stream. A thin layer: checks the
 * tensors, fills the argument block with their device addresses, and hands it to the
 * route-specific launcher (launch_route.h; today RuntimeLauncher).
 *
 * The schema is defined in Python (pyruntime/kernels/custom_ops.py, torch.library
 * custom_op); this file only registers the PrivateUse1 implementation:
 *     aicpu_tiling::plan_tiling(Tensor cu_seqlens_q, Tensor seqlens_kv, Tensor batch,
 *                               Tensor step_epoch, Tensor(a!) tiling_out, SymInt[] params,
 *                               bool causal) -> ()
 *   cu_seqlens_q  int32 [n + 1] on the NPU, contiguous
 *   seqlens_kv    int32 [n]     on the NPU, contiguous
 *   batch         int32 [1]     on the NPU: the live batch the kernel reads (n >= max_batch)
 *   step_epoch    int32 [1]     on the NPU: the epoch the host wrote beside the lengths; the
 *                               kernel echoes it in the tiling header (ABI v2)
 *   tiling_out    any dtype, >= aicpu_tiling_bytes(params) bytes on the NPU, contiguous,
 *                               written (every caller allocates it as uint8 bytes)
 *   params        the 13 aicpu_tiling_params fields in header order, sliding_window last
 *                               (ABI v5; reserved words 0)
 * Its array form, one AI-CPU launch planning several tilings from the same lengths, live
 * batch and epoch (one per distinct sliding window of a graph; argument block ABI v3):
 *     aicpu_tiling::plan_tilings(Tensor cu_seqlens_q, Tensor seqlens_kv, Tensor batch,
 *                                Tensor step_epoch, Tensor(a!)[] tiling_outs, SymInt[] params,
 *                                bool causal) -> ()
 *   tiling_outs   1 .. AICPU_TILING_KERNEL_MAX_PLANS tiling buffers, each as tiling_out
 *   params        13 fields per tiling_outs entry, concatenated in its order
 * and one more op, defined here, naming the AI-CPU binary before capture:
 *     aicpu_tiling::npu_load_tiling_kernel(str op_info_json, int? device=None) -> ()
 *   op_info_json  <dir>/libaicpu_tiling_runtime.json (its .so beside it), once per process
 *   device        None: load nothing now; k: load the binary on NPU k now (self-check)
 *   Refused, with one line naming the CANN runtime version, when the loaded ACL library has
 *   no aclrtLaunchKernelWithHostArgs (resolved at run time, never linked: runtime_launcher.h).
 * One launcher per NPU (binary, AI-CPU stream, events: all bound to that device's context),
 * loaded at the first launch on the tiling buffer's device, under an NPUGuard on it. Never
 * at library load: vLLM-Ascend's worker imports the modules our hook patches before it sets
 * its device (worker.py:108 import, :433 torch.npu.set_device), so a launcher made then would
 * sit on NPU 0 in every worker, and the runtime refuses a stream outside the current context
 * (hicann/runtime api_impl.cc StreamWaitEvent/EventRecord: ACL_ERROR_RT_STREAM_CONTEXT,
 * 107003) at the first capture on ranks >= 1 (review 2 item 1).
 * Errors are c10::Error (RuntimeError in Python) naming the offending argument.
 * Never run on an NPU. CI compiles it with -fsyntax-only against torch 2.10's headers
 * (from the downloaded, never installed, wheel) and the torch_npu 2.10.0.post4 wheel's own
 * headers (tests/test_npu_ext.py).
 */
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

/* c10_npu::NPUGuard(c10::DeviceIndex): torch_npu/csrc/core/npu/NPUGuard.h:25;
 * c10_npu::getCurrentNPUStream: NPUStream.h:127; OpCommand::RunOpApiV2: OpCommand.h:129
 * (all under torch_npu/include/ in the torch_npu 2.10.0.post4 wheel). */
#include "torch_npu/csrc/core/npu/NPUGuard.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

#include "launch_route.h"
#include "runtime_launcher.h"

namespace {

constexpr int64_t kParamFields = 13; /* num_q_heads .. sliding_window */

/* Device index -> its launcher; the JSON every launcher loads. Both under LauncherMutex. */
std::map<c10::DeviceIndex, std::unique_ptr<aicpu_tiling_npu::RuntimeLauncher>> &Launchers()
{
    static std::map<c10::DeviceIndex, std::unique_ptr<aicpu_tiling_npu::RuntimeLauncher>> m;
    return m;
}

std::string &KernelJson()
{
    static std::string path;
    return path;
}

std::mutex &LauncherMutex()
{
    static std::mutex m;
    return m;
}

void CheckInt32Npu(const at::Tensor &t, const char *name, int64_t min_numel)
{
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "plan_tiling: ", name,
                " must be on the NPU, got ", t.device());
    TORCH_CHECK(t.scalar_type() == at::kInt, "plan_tiling: ", name, " must be int32, got ",
                t.scalar_type());
    TORCH_CHECK(t.is_contiguous(), "plan_tiling: ", name, " must be contiguous");
    TORCH_CHECK(t.numel() >= min_numel, "plan_tiling: ", name, " holds ", t.numel(),
                " values, needs at least ", min_numel);
}

/* The tiling buffer is raw bytes to the kernel, and every caller allocates it as uint8:
 * any dtype, counted in bytes. */
void CheckTilingBuffer(const at::Tensor &t, const char *name, int64_t min_bytes)
{
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "plan_tiling: ", name,
                " must be on the NPU, got ", t.device());
    TORCH_CHECK(t.is_contiguous(), "plan_tiling: ", name, " must be contiguous");
    TORCH_CHECK(static_cast<int64_t>(t.nbytes()) >= min_bytes, "plan_tiling: ", name, " holds ",
                t.nbytes(), " bytes, needs at least ", min_bytes);
}

/* The launcher of `device` is loaded (once). The caller holds an NPUGuard on `device`: the
 * runtime looks the function up and creates the stream and events in the calling thread's
 * current context, with no implicit set-device. */
void EnsureLoaded(c10::DeviceIndex device)
{
    std::lock_guard<std::mutex> lock(LauncherMutex());
    auto &slot = Launchers()[device];
    if (!slot) slot.reset(new aicpu_tiling_npu::RuntimeLauncher());
    if (slot->Loaded()) return;
    const int rc = slot->Load(KernelJson());
    TORCH_CHECK(rc == 0, "aicpu_tiling: loading the AI-CPU tiling kernel on NPU ",
                static_cast<int>(device), ": ", slot->LastError());
}

void NpuLoadTilingKernel(c10::string_view op_info_json, std::optional<int64_t> device)
{
    const std::string path(op_info_json.data(), op_info_json.size());
    {
        std::lock_guard<std::mutex> lock(LauncherMutex());
        TORCH_CHECK(KernelJson().empty() || KernelJson() == path,
                    "npu_load_tiling_kernel: already loaded from ", KernelJson(),
                    "; cannot load ", path);
        TORCH_CHECK(std::ifstream(path).good(), "npu_load_tiling_kernel: cannot read ", path);
        /* Before anything is named: a CANN without the host-args launch fails here, in one
         * line naming its version, not at library load ("undefined symbol") nor at the first
         * capture (runtime_launcher.h; review 2 item 6). */
        std::string why;
        TORCH_CHECK(aicpu_tiling_npu::ResolveHostArgsLaunch(&why) != nullptr,
                    "npu_load_tiling_kernel: ", why);
        KernelJson() = path;
    }
    if (device.has_value()) {
        const auto index = static_cast<c10::DeviceIndex>(*device);
        c10_npu::NPUGuard device_guard(index);
        EnsureLoaded(index);
    }
}

/* One tiling's 13 params fields (starting at `first`) into the C struct, checked. */
void ReadParams(c10::IntArrayRef params, int64_t first, aicpu_tiling_params &p)
{
    int32_t *fields = &p.num_q_heads; /* 16 int32 words, no padding (aicpu_tiling.h) */
    for (int64_t i = 0; i < 16; ++i) {
        const int64_t v = i < kParamFields ? params[first + i] : 0;
        TORCH_CHECK(v >= INT32_MIN && v <= INT32_MAX, "plan_tiling: params[", first + i,
                    "] = ", v, " is outside int32");
        fields[i] = static_cast<int32_t>(v);
    }
    TORCH_CHECK(aicpu_tiling_params_check(&p) == AICPU_TILING_OK,
                "plan_tiling: invalid tiling params (see pyruntime.tiling.TilingParams)");
}

/* Both ops: check every tensor, fill one argument block with every plan, launch it once. */
void PlanTilings(const at::Tensor &cu_seqlens_q, const at::Tensor &seqlens_kv,
                 const at::Tensor &batch, const at::Tensor &step_epoch,
                 at::TensorList tiling_outs, c10::IntArrayRef params, bool causal)
{
    const int64_t plans = static_cast<int64_t>(tiling_outs.size());
    TORCH_CHECK(plans >= 1 && plans <= AICPU_TILING_KERNEL_MAX_PLANS, "plan_tiling: ", plans,
                " tiling buffers, one launch plans 1 to ", AICPU_TILING_KERNEL_MAX_PLANS);
    TORCH_CHECK(static_cast<int64_t>(params.size()) == kParamFields * plans,
                "plan_tiling: params has ", params.size(), " values, expected ", kParamFields,
                " per tiling buffer");
    aicpu_tiling_params p[AICPU_TILING_KERNEL_MAX_PLANS];
    int32_t max_batch = 0; /* the arrays must hold every plan's max_batch */
    for (int64_t k = 0; k < plans; ++k) {
        ReadParams(params, k * kParamFields, p[k]);
        max_batch = p[k].max_batch > max_batch ? p[k].max_batch : max_batch;
    }
    const int64_t n = seqlens_kv.numel();
    CheckInt32Npu(cu_seqlens_q, "cu_seqlens_q", n + 1);
    CheckInt32Npu(seqlens_kv, "seqlens_kv", max_batch);
    CheckInt32Npu(batch, "batch", 1);
    CheckInt32Npu(step_epoch, "step_epoch", 1);
    aicpu_tiling_kernel_args args;
    aicpu_tiling_kernel_args_init(&args, &p[0], causal ? AICPU_TILING_CAUSAL : 0u);
    for (int64_t k = 0; k < plans; ++k) {
        const at::Tensor &tiling_out = tiling_outs[k];
        CheckTilingBuffer(tiling_out, "tiling_out",
                          static_cast<int64_t>(aicpu_tiling_bytes(&p[k])));
        TORCH_CHECK(cu_seqlens_q.device() == tiling_out.device() &&
                        seqlens_kv.device() == tiling_out.device() &&
                        batch.device() == tiling_out.device() &&
                        step_epoch.device() == tiling_out.device(),
                    "plan_tiling: every tensor must be on the same NPU");
        aicpu_tiling_kernel_args_set_plan(&args, static_cast<uint32_t>(k), &p[k],
                                          AICPU_TILING_ADDR(tiling_out.data_ptr()),
                                          static_cast<uint64_t>(tiling_out.nbytes()));
    }
    args.cu_seqlens_q = AICPU_TILING_ADDR(cu_seqlens_q.data_ptr());
    args.seqlens_kv = AICPU_TILING_ADDR(seqlens_kv.data_ptr());
    args.live_batch = AICPU_TILING_ADDR(batch.data_ptr());
    args.step_epoch = AICPU_TILING_ADDR(step_epoch.data_ptr());
    args.batch = static_cast<int32_t>(n);
    TORCH_CHECK(aicpu_tiling_kernel_check(&args) == AICPU_TILING_KERNEL_OK,
                "plan_tiling: the argument block is invalid (arrays shorter than max_batch?)");
    bool named = false;
    {
        std::lock_guard<std::mutex> lock(LauncherMutex());
        named = !KernelJson().empty();
    }
    TORCH_CHECK(named, "plan_tiling: the AI-CPU tiling kernel is not loaded; "
                "call torch.ops.aicpu_tiling.npu_load_tiling_kernel(<dir>/"
                AICPU_TILING_RUNTIME_JSON ") before capturing");

    /* Every runtime call below happens in the context of the tensors' NPU: the launcher of
     * that device (loaded now if this is its first launch), the caller stream of that
     * device. A custom op gets no device guard from the dispatcher, and the thread's current
     * device may be another one. */
    const c10::DeviceIndex device = tiling_outs[0].device().index();
    c10_npu::NPUGuard device_guard(device);
    EnsureLoaded(device);
    /* The caller stream, read here (it waits for torch_npu's queue to submit earlier work);
     * the launch itself goes through the queue so it stays in order with other NPU ops. */
    aclrtStream caller = c10_npu::getCurrentNPUStream(device).stream();
    at_npu::native::OpCommand::RunOpApiV2("AicpuTilingPlan", [args, caller, device]() -> int {
        c10_npu::NPUGuard launch_guard(device);
        std::lock_guard<std::mutex> lock(LauncherMutex());
        auto &launcher = *Launchers().at(device);
        const int rc = launcher.Launch(args, caller);
        TORCH_CHECK(rc == 0, "plan_tiling: ", launcher.LastError());
        return rc;
    });
}

void PlanTilingNpu(const at::Tensor &cu_seqlens_q, const at::Tensor &seqlens_kv,
                   const at::Tensor &batch, const at::Tensor &step_epoch,
                   const at::Tensor &tiling_out, c10::IntArrayRef params, bool causal)
{
    PlanTilings(cu_seqlens_q, seqlens_kv, batch, step_epoch, at::TensorList(tiling_out), params,
                causal);
}

void PlanTilingsNpu(const at::Tensor &cu_seqlens_q, const at::Tensor &seqlens_kv,
                    const at::Tensor &batch, const at::Tensor &step_epoch,
                    at::TensorList tiling_outs, c10::IntArrayRef params, bool causal)
{
    PlanTilings(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_outs, params, causal);
}

} // namespace

/* No tensor argument, so no dispatch key: defined with its one (catch-all) kernel. */
TORCH_LIBRARY_FRAGMENT(aicpu_tiling, m)
{
    m.def("npu_load_tiling_kernel(str op_info_json, int? device=None) -> ()",
          &NpuLoadTilingKernel);
}

TORCH_LIBRARY_IMPL(aicpu_tiling, PrivateUse1, m)
{
    m.impl("plan_tiling", &PlanTilingNpu);
    m.impl("plan_tilings", &PlanTilingsNpu);
}
