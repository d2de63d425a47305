/*
 * runtime_launcher.cpp -- the runtime route (launch_route.h). Signatures from CANN's
 * runtime/rts/rts_kernel.h and acl/acl_rt.h; the sequence from hw-native-sys/simpler
 * (src/common/platform/onboard/host/load_aicpu_op.cpp: LoadAicpuOp::Init and
 * AicpuKernelLaunch; tests/st/a2a3/kernel_capture/native/driver.cpp: the event chain).
 */
#include "runtime_launcher.h"

#include <cstring>

namespace aicpu_tiling_npu {

RuntimeLauncher::~RuntimeLauncher() { Release(); }

int RuntimeLauncher::Fail(int code, const char *step)
{
    error_ = std::string(step) + " failed with code " + std::to_string(code);
    return code == 0 ? -1 : code;
}

void RuntimeLauncher::Release()
{
    /* Best effort: teardown errors have nowhere to go. */
    if (ev_out_ != nullptr) (void)aclrtDestroyEvent(ev_out_);
    if (ev_in_ != nullptr) (void)aclrtDestroyEvent(ev_in_);
    if (stream_ != nullptr) (void)aclrtDestroyStream(stream_);
    if (binary_ != nullptr) (void)rtsBinaryUnload(binary_);
    ev_out_ = ev_in_ = nullptr;
    stream_ = nullptr;
    binary_ = nullptr;
    func_ = nullptr;
}

int RuntimeLauncher::Load(const std::string &op_info_json)
{
    if (Loaded()) {
        if (op_info_json == path_) return 0;
        error_ = "already loaded from " + path_ + "; cannot load " + op_info_json;
        return -1;
    }
    rtLoadBinaryOption_t option;
    std::memset(&option, 0, sizeof(option));
    option.optionId = RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE;
    option.value.cpuKernelMode = AICPU_TILING_RUNTIME_CPU_KERNEL_MODE;
    rtLoadBinaryConfig_t config = {&option, 1};
    int rc = rtsBinaryLoadFromFile(op_info_json.c_str(), &config, &binary_);
    if (rc != RT_ERROR_NONE) {
        binary_ = nullptr;
        return Fail(rc, ("rtsBinaryLoadFromFile(" + op_info_json + ")").c_str());
    }
    rtFuncHandle func = nullptr;
    rc = rtsFuncGetByName(binary_, AICPU_TILING_RUNTIME_OP_TYPE, &func);
    if (rc != RT_ERROR_NONE) {
        Release();
        return Fail(rc, "rtsFuncGetByName(" AICPU_TILING_RUNTIME_OP_TYPE ")");
    }
    /* Flags 0: an ordinary stream. Captures refuse AI-CPU-flagged and default streams. */
    rc = aclrtCreateStreamWithConfig(&stream_, 0, 0);
    if (rc == ACL_SUCCESS) rc = aclrtCreateEventExWithFlag(&ev_in_, ACL_EVENT_SYNC);
    if (rc == ACL_SUCCESS) rc = aclrtCreateEventExWithFlag(&ev_out_, ACL_EVENT_SYNC);
    if (rc != ACL_SUCCESS) {
        Release();
        return Fail(rc, "creating the AI-CPU stream and its events");
    }
    func_ = func;
    path_ = op_info_json;
    return 0;
}

int RuntimeLauncher::Launch(const aicpu_tiling_kernel_args &args, aclrtStream caller)
{
    if (!Loaded()) {
        error_ = "the AI-CPU tiling kernel is not loaded: call Load() before capture";
        return -1;
    }
    if (aicpu_tiling_kernel_check(&args) != AICPU_TILING_KERNEL_OK) {
        error_ = "the tiling kernel's argument block is invalid (aicpu_tiling_kernel_check)";
        return -1;
    }
    int rc = aclrtRecordEvent(ev_in_, caller);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtRecordEvent(caller)");
    rc = aclrtStreamWaitEvent(stream_, ev_in_);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtStreamWaitEvent(AI-CPU stream)");

    /* The runtime copies `block` to device memory at launch (at capture time when
     * captured): it may live on this stack frame. */
    aicpu_tiling_kernel_args block = args;
    rtCpuKernelArgs_t cpu_args;
    std::memset(&cpu_args, 0, sizeof(cpu_args));
    cpu_args.baseArgs.args = &block;
    cpu_args.baseArgs.argsSize = static_cast<uint32_t>(sizeof(block));
    /* The runtime wants attribute storage even with no attributes (simpler's note). */
    rtLaunchKernelAttr_t attr;
    std::memset(&attr, 0, sizeof(attr));
    rtKernelLaunchCfg_t cfg = {&attr, 0};
    rc = rtsLaunchCpuKernel(func_, 1, stream_, &cfg, &cpu_args);
    if (rc != RT_ERROR_NONE) return Fail(rc, "rtsLaunchCpuKernel");

    rc = aclrtRecordEvent(ev_out_, stream_);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtRecordEvent(AI-CPU stream)");
    rc = aclrtStreamWaitEvent(caller, ev_out_);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtStreamWaitEvent(caller)");
    return 0;
}

} // namespace aicpu_tiling_npu
