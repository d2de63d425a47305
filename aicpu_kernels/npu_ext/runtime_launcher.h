/*
 * runtime_launcher.h -- launches the AI-CPU tiling kernel on an NPU stream by the runtime
 * route of launch_route.h. Plain C++14 against CANN's ACL and runtime headers; no torch,
 * so the launch sequence can be tested on a host with a recording stand-in runtime.
 *
 * Usage (the torch op in plan_tiling_op.cpp does this):
 *     aicpu_tiling_npu::RuntimeLauncher launcher;
 *     int rc = launcher.Load("/opt/aicpu_tiling/aicpu_tiling_runtime.json");  // before capture
 *     aicpu_tiling_kernel_args args;  ... device addresses ...
 *     rc = launcher.Launch(args, caller_stream);                             // eager or captured
 * Every call returns 0 or the failing ACL/runtime code; LastError() names the step.
 * Not thread-safe: one launcher per device, used from the thread that launches.
 */
#ifndef AICPU_TILING_NPU_EXT_RUNTIME_LAUNCHER_H
#define AICPU_TILING_NPU_EXT_RUNTIME_LAUNCHER_H

#include <string>

#include "acl/acl.h"
#include "runtime/rt.h"

#include "launch_route.h"
#include "tiling_kernel_args.h"

namespace aicpu_tiling_npu {

class RuntimeLauncher {
public:
    RuntimeLauncher() = default;
    RuntimeLauncher(const RuntimeLauncher &) = delete;
    RuntimeLauncher &operator=(const RuntimeLauncher &) = delete;
    ~RuntimeLauncher();

    /* Load the op-info JSON and the .so beside it, look the function up, and create the
     * flag-0 stream and the two sync events. Must run before any capture that launches;
     * idempotent for the same path, an error for a different one. */
    int Load(const std::string &op_info_json);
    bool Loaded() const { return func_ != nullptr; }

    /* Enqueue the kernel on the launcher's stream, ordered after everything already on
     * `caller` and before anything `caller` gets next. `args` is copied at launch.
     * Returns -1 (LastError says why) when not loaded or when aicpu_tiling_kernel_check()
     * refuses the block, so a bad block never reaches the device. */
    int Launch(const aicpu_tiling_kernel_args &args, aclrtStream caller);

    const std::string &LastError() const { return error_; }

private:
    int Fail(int code, const char *step);
    void Release();

    std::string path_;
    std::string error_;
    rtBinHandle binary_ = nullptr;
    rtFuncHandle func_ = nullptr;
    aclrtStream stream_ = nullptr;
    aclrtEvent ev_in_ = nullptr;
    aclrtEvent ev_out_ = nullptr;
};

} // namespace aicpu_tiling_npu

#endif /* AICPU_TILING_NPU_EXT_RUNTIME_LAUNCHER_H */
