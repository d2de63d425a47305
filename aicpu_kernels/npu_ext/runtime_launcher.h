/*
 * runtime_launcher.h -- launches the AI-CPU tiling kernel on an NPU stream by the runtime
 * route of launch_route.h, through the public ACL runtime API only. Plain C++17 against the
 * ACL headers that ship in the torch_npu wheel (torch_npu/include/third_party/acl/inc/acl/);
 * no torch, so the launch sequence can be tested on a host with a recording stand-in that
 * defines those same declared functions (cann_stub/npu/recording_runtime.cc).
 *
 * Usage (the torch op in plan_tiling_op.cpp does this):
 *     aicpu_tiling_npu::RuntimeLauncher launcher;
 *     int rc = launcher.Load("/opt/aicpu_tiling/lib/libaicpu_tiling_runtime.json"); // before capture
 *     aicpu_tiling_kernel_args args;  ... device addresses ...
 *     rc = launcher.Launch(args, caller_stream);                               // eager or captured
 * Every call returns 0 or the failing ACL code; LastError() names the step.
 * Not thread-safe: one launcher per process, used under the caller's lock.
 *
 * aclrtLaunchKernelWithHostArgs is resolved at run time (ResolveHostArgsLaunch), never
 * linked: a CANN whose ACL library lacks it (review 2 item 6: the CANN 8.2.RC1 API list has
 * no such function; hicann/runtime v8.5.0 declares it, include/external/acl/acl_rt.h) still
 * loads the extension, and Load() fails with one line naming the CANN version found.
 */
#ifndef AICPU_TILING_NPU_EXT_RUNTIME_LAUNCHER_H
#define AICPU_TILING_NPU_EXT_RUNTIME_LAUNCHER_H

#include <string>

/* acl/acl.h includes acl/acl_rt.h: every aclrt* name used here is declared there. */
#include "acl/acl.h"

#include "launch_route.h"
#include "tiling_kernel_args.h"

namespace aicpu_tiling_npu {

/* aclrtLaunchKernelWithHostArgs's type, taken from its declaration (acl_rt.h:4906-4909); an
 * unevaluated operand, so the extension holds no reference to the symbol. */
using HostArgsLaunchFn = decltype(&aclrtLaunchKernelWithHostArgs);

/* The CANN runtime version, read the way CANN documents it (runtime_launcher.cpp says
 * where): `version` empty when nothing told it; `source` says what was read. */
struct CannVersion {
    std::string version;
    std::string source;
};
CannVersion CannRuntimeVersion();

/* aclrtLaunchKernelWithHostArgs of the ACL library this process loaded (the one that
 * provides the ACL functions the launcher links), looked up by name once. nullptr when that
 * library has none; then *why (if given) is one line naming the CANN runtime version. */
HostArgsLaunchFn ResolveHostArgsLaunch(std::string *why);

class RuntimeLauncher {
public:
    RuntimeLauncher() = default;
    RuntimeLauncher(const RuntimeLauncher &) = delete;
    RuntimeLauncher &operator=(const RuntimeLauncher &) = delete;
    /* Calls no ACL function, on purpose: see the comment at its definition. */
    ~RuntimeLauncher();

    /* Resolve aclrtLaunchKernelWithHostArgs (ResolveHostArgsLaunch: refused, with nothing
     * loaded, when the runtime lacks it), load the op-info JSON and the .so of the same stem
     * beside it, look the function up, and create the flag-0 stream and the two sync events. The calling thread must have a
     * device context (plan_tiling_op.cpp sets it with an NPUGuard). Must run before any
     * capture that launches; idempotent for the same path, an error for a different one. */
    int Load(const std::string &op_info_json);
    bool Loaded() const { return func_ != nullptr; }

    /* Destroy the events and the stream and unload the binary while ACL is still up;
     * afterwards Loaded() is false and Load() may run again. Teardown errors are ignored
     * (they have nowhere to go). */
    void Unload();

    /* Enqueue the kernel on the launcher's stream, ordered after everything already on
     * `caller` and before anything `caller` gets next. `args` is copied at launch.
     * Returns -1 (LastError says why) when not loaded or when aicpu_tiling_kernel_check()
     * refuses the block, so a bad block never reaches the device. */
    int Launch(const aicpu_tiling_kernel_args &args, aclrtStream caller);

    const std::string &LastError() const { return error_; }

private:
    int Fail(aclError code, const std::string &step);

    std::string path_;
    std::string error_;
    aclrtBinHandle binary_ = nullptr; /* acl_rt.h:387 */
    aclrtFuncHandle func_ = nullptr;  /* acl_rt.h:388 */
    HostArgsLaunchFn launch_ = nullptr; /* resolved by Load() */
    aclrtStream stream_ = nullptr;    /* acl_base_rt.h:46 */
    aclrtEvent ev_in_ = nullptr;      /* acl_base_rt.h:48 */
    aclrtEvent ev_out_ = nullptr;
};

} // namespace aicpu_tiling_npu

#endif /* AICPU_TILING_NPU_EXT_RUNTIME_LAUNCHER_H */
