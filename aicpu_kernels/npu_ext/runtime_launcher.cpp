/*
 * runtime_launcher.cpp -- the runtime route (launch_route.h) through the public ACL API.
 *
 * Every signature, type and constant used here is declared in the ACL headers shipped in
 * the torch_npu 2.10.0.post4 wheel, torch_npu/include/third_party/acl/inc/acl/acl_rt.h
 * (cited below as acl_rt.h:<line>); tests/test_npu_ext.py compiles this file against that
 * header with -Wall -Wextra -Werror. How ACL maps these calls for a CPU kernel, read in
 * hicann/runtime 681ef761 (not run): src/acl/aclrt_impl/kernel.cpp forwards
 * aclrtBinaryLoadFromFile to rtsBinaryLoadFromFile (the options struct reinterpreted as
 * rtLoadBinaryConfig_t), aclrtBinaryGetFunction to rtsFuncGetByName, and
 * aclrtLaunchKernelWithHostArgs to rtsLaunchKernelWithHostArgs, which
 * (src/runtime/api/api_c_kernel.cc) builds the rtCpuKernelArgs_t of a CPU-registered kernel
 * with isNoNeedH2DCopy = 0, i.e. the same CPU-kernel launch as rtsLaunchCpuKernel, with the
 * host argument block copied to the device by the runtime. The fork/join around the
 * launch follows the event chain of hw-native-sys/simpler's capture probe
 * (tests/st/a2a3/kernel_capture/native/driver.cpp).
 */
#include "runtime_launcher.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>

namespace aicpu_tiling_npu {

namespace {

/* A symbol of the ACL library that provides the functions this file links (found with
 * dladdr from one of them, aclrtBinaryLoadFromFile), else of the process's global scope;
 * nullptr when neither has it. dlsym on a handle searches that library and its dependencies,
 * so a CANN that moved the implementation behind libascendcl (CANN 8.5.0 deprecates
 * libascendcl.so for libacl_rt.so & co., hicann/runtime's release notes) still resolves.
 * torch_npu resolves its optional ACL functions the same way, by name from libascendcl at
 * run time (Ascend/pytorch torch_npu/csrc/core/npu/interface/AclInterface.cpp,
 * REGISTER_LIBRARY(libascendcl) / GET_FUNC). */
void *AclSymbol(const char *name)
{
    Dl_info info;
    std::memset(&info, 0, sizeof(info));
    void *symbol = nullptr;
    if (dladdr(reinterpret_cast<void *>(&aclrtBinaryLoadFromFile), &info) != 0 &&
        info.dli_fname != nullptr) {
        /* RTLD_NOLOAD: a handle to the library already loaded, never a second copy. */
        void *library = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (library != nullptr) {
            symbol = dlsym(library, name);
            (void)dlclose(library); /* the extension's own dependency keeps it loaded */
        }
    }
    return symbol != nullptr ? symbol : dlsym(RTLD_DEFAULT, name);
}

/* The "Version=" value of a CANN version.info file, or "" (hicann/runtime
 * src/acl/aclrt_impl/acl.cpp GetVersionStringInternal: the first line holding "Version=",
 * the rest of it trimmed). */
std::string VersionInfoValue(const std::string &path)
{
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
        const size_t at = line.find("Version=");
        if (at == std::string::npos) continue;
        std::string value = line.substr(at + std::strlen("Version="));
        const size_t first = value.find_first_not_of(" \t\r");
        const size_t last = value.find_last_not_of(" \t\r");
        return first == std::string::npos ? "" : value.substr(first, last - first + 1);
    }
    return "";
}

} // namespace

/* In the order CANN documents (hicann/runtime docs/zh/dev_guide/11_compatibility_handling.md,
 * "版本查询机制": aclsysGetVersionStr with the package name "runtime"), then its predecessor
 * aclsysGetCANNVersion(ACL_PKG_NAME_RUNTIME) (acl_rt.h:1062, deprecated in favour of the
 * former; torch_npu reads the CANN version through it, GetCANNInfo.cpp), both looked up by
 * name since an older CANN may lack them, then the file both read:
 * $ASCEND_HOME_PATH/share/info/runtime/version.info (acl.cpp: kRelPathInfo "/share/info/",
 * kInfoFileName "/version.info", key "Version="). */
CannVersion CannRuntimeVersion()
{
    CannVersion found;
    using GetVersionStrFn = aclError (*)(char *, char *);
    using GetCannVersionFn = aclError (*)(aclCANNPackageName, aclCANNPackageVersion *);
    if (void *fn = AclSymbol("aclsysGetVersionStr")) {
        char package[] = "runtime";
        char version[ACL_PKG_VERSION_MAX_SIZE] = {0}; /* acl_rt.h:905 */
        if (reinterpret_cast<GetVersionStrFn>(fn)(package, version) == ACL_SUCCESS &&
            version[0] != '\0') {
            found.version.assign(version, strnlen(version, sizeof(version)));
            found.source = "aclsysGetVersionStr(\"runtime\")";
            return found;
        }
    }
    if (void *fn = AclSymbol("aclsysGetCANNVersion")) {
        aclCANNPackageVersion version;
        std::memset(&version, 0, sizeof(version));
        if (reinterpret_cast<GetCannVersionFn>(fn)(ACL_PKG_NAME_RUNTIME, &version) ==
                ACL_SUCCESS &&
            version.version[0] != '\0') {
            found.version.assign(version.version, strnlen(version.version, sizeof(version.version)));
            found.source = "aclsysGetCANNVersion(ACL_PKG_NAME_RUNTIME)";
            return found;
        }
    }
    const char *home = std::getenv("ASCEND_HOME_PATH");
    if (home != nullptr && home[0] != '\0') {
        const std::string path = std::string(home) + "/share/info/runtime/version.info";
        found.version = VersionInfoValue(path);
        if (!found.version.empty()) {
            found.source = path;
            return found;
        }
    }
    found.source = "no aclsysGetVersionStr or aclsysGetCANNVersion, and no "
                   "$ASCEND_HOME_PATH/share/info/runtime/version.info";
    return found;
}

HostArgsLaunchFn ResolveHostArgsLaunch(std::string *why)
{
    static std::mutex mutex;
    static HostArgsLaunchFn resolved = nullptr;
    std::lock_guard<std::mutex> lock(mutex);
    if (resolved == nullptr) {
        resolved = reinterpret_cast<HostArgsLaunchFn>(AclSymbol("aclrtLaunchKernelWithHostArgs"));
    }
    if (resolved == nullptr && why != nullptr) {
        /* One line; the twin says the same (pyruntime/npu_twin/extension.py,
         * missing_launch_message). */
        const CannVersion cann = CannRuntimeVersion();
        *why = "the CANN runtime in this process (" +
               (cann.version.empty() ? "version unknown: " + cann.source
                                     : cann.version + ", read by " + cann.source) +
               ") has no aclrtLaunchKernelWithHostArgs, which launches the AI-CPU tiling "
               "kernel; CANN 8.5.0 has it, and vLLM-Ascend 0.30 requires 9.1.0";
    }
    return resolved;
}

/* The launchers in plan_tiling_op.cpp (one per NPU) live in a function-local static map,
 * destroyed by exit() after
 * Python has finalized. torch_npu shuts ACL down from a Python atexit handler
 * (torch_npu/_init/core/runtime_lifecycle.py:40, atexit.register(_npu_shutdown): reset the
 * devices, aclFinalize), and Py_FinalizeEx runs those handlers before exit() runs any C++
 * static destructor or std::atexit function, so even a std::atexit registered at the first
 * Load would come too late. Calling aclrtDestroyStream & co. then would touch a finalized
 * runtime. So the destructor only forgets the handles: they belong to the device context
 * that torch_npu's shutdown has already reset, and the process is ending. Code that wants
 * the handles back earlier calls Unload() while ACL is up. */
RuntimeLauncher::~RuntimeLauncher() = default;

int RuntimeLauncher::Fail(aclError code, const std::string &step)
{
    /* aclGetRecentErrMsg: acl_rt.h:1050; the runtime's text for this thread's last error. */
    const char *detail = aclGetRecentErrMsg();
    error_ = step + " failed with code " + std::to_string(code);
    if (detail != nullptr && detail[0] != '\0') error_ += ": " + std::string(detail);
    return code == ACL_SUCCESS ? -1 : code;
}

void RuntimeLauncher::Unload()
{
    /* aclrtDestroyEvent: acl_rt.h:1637; aclrtDestroyStream: acl_rt.h:2583;
     * aclrtBinaryUnLoad: acl_rt.h:3085. */
    if (ev_out_ != nullptr) (void)aclrtDestroyEvent(ev_out_);
    if (ev_in_ != nullptr) (void)aclrtDestroyEvent(ev_in_);
    if (stream_ != nullptr) (void)aclrtDestroyStream(stream_);
    if (binary_ != nullptr) (void)aclrtBinaryUnLoad(binary_);
    ev_out_ = ev_in_ = nullptr;
    stream_ = nullptr;
    binary_ = nullptr;
    func_ = nullptr;
    launch_ = nullptr;
    path_.clear();
}

int RuntimeLauncher::Load(const std::string &op_info_json)
{
    if (Loaded()) {
        if (op_info_json == path_) return 0;
        error_ = "already loaded from " + path_ + "; cannot load " + op_info_json;
        return -1;
    }
    launch_ = ResolveHostArgsLaunch(&error_);
    if (launch_ == nullptr) return -1; /* error_ names the CANN version; nothing loaded */
    /* aclrtBinaryLoadOption{type, value}: acl_rt.h:479-482; the option id
     * ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE = 3: acl_rt.h:469; value.cpuKernelMode
     * (int32_t): acl_rt.h:475; aclrtBinaryLoadOptions{options, numOpt}: acl_rt.h:484-487. */
    aclrtBinaryLoadOption option;
    std::memset(&option, 0, sizeof(option));
    option.type = ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE;
    option.value.cpuKernelMode = AICPU_TILING_RUNTIME_CPU_KERNEL_MODE;
    aclrtBinaryLoadOptions options;
    options.options = &option;
    options.numOpt = 1;
    /* aclrtBinaryLoadFromFile(const char *binPath, aclrtBinaryLoadOptions *options,
     *                         aclrtBinHandle *binHandle): acl_rt.h:3290-3291. */
    aclError rc = aclrtBinaryLoadFromFile(op_info_json.c_str(), &options, &binary_);
    if (rc != ACL_SUCCESS) {
        binary_ = nullptr;
        return Fail(rc, "aclrtBinaryLoadFromFile(" + op_info_json + ")");
    }
    /* aclrtBinaryGetFunction(const aclrtBinHandle, const char *kernelName,
     *                        aclrtFuncHandle *): acl_rt.h:3098-3099. For a CPU binary the
     * kernel name is the op type, the JSON's top-level key. */
    aclrtFuncHandle func = nullptr;
    rc = aclrtBinaryGetFunction(binary_, AICPU_TILING_RUNTIME_OP_TYPE, &func);
    if (rc != ACL_SUCCESS) {
        Unload();
        return Fail(rc, "aclrtBinaryGetFunction(" AICPU_TILING_RUNTIME_OP_TYPE ")");
    }
    /* aclrtCreateStreamWithConfig(aclrtStream *, uint32_t priority, uint32_t flag):
     * acl_rt.h:2562. Flags 0: an ordinary stream; captures refuse AI-CPU-flagged and
     * default streams. aclrtCreateEventExWithFlag(aclrtEvent *, uint32_t flag):
     * acl_rt.h:1617, with ACL_EVENT_SYNC (acl_rt.h:28), which a captured stream may wait on. */
    rc = aclrtCreateStreamWithConfig(&stream_, 0, 0);
    if (rc == ACL_SUCCESS) rc = aclrtCreateEventExWithFlag(&ev_in_, ACL_EVENT_SYNC);
    if (rc == ACL_SUCCESS) rc = aclrtCreateEventExWithFlag(&ev_out_, ACL_EVENT_SYNC);
    if (rc != ACL_SUCCESS) {
        Unload();
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
    /* aclrtRecordEvent(aclrtEvent, aclrtStream): acl_rt.h:1649;
     * aclrtStreamWaitEvent(aclrtStream, aclrtEvent): acl_rt.h:2675. */
    aclError rc = aclrtRecordEvent(ev_in_, caller);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtRecordEvent(caller)");
    rc = aclrtStreamWaitEvent(stream_, ev_in_);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtStreamWaitEvent(AI-CPU stream)");

    /* The runtime copies `block` to device memory at launch (at capture time when
     * captured): it may live on this stack frame. It holds only device addresses, so no
     * placeholder entries are needed. */
    aicpu_tiling_kernel_args block = args;
    /* aclrtLaunchKernelCfg{attrs, numAttrs}: acl_rt.h:536-539. Attribute storage is passed
     * even with no attributes, as simpler does for the same CPU-kernel launch. */
    aclrtLaunchKernelAttr attr;
    std::memset(&attr, 0, sizeof(attr));
    aclrtLaunchKernelCfg cfg;
    cfg.attrs = &attr;
    cfg.numAttrs = 0;
    /* aclrtLaunchKernelWithHostArgs(aclrtFuncHandle, uint32_t numBlocks, aclrtStream,
     *     aclrtLaunchKernelCfg *, void *hostArgs, size_t argsSize,
     *     aclrtPlaceHolderInfo *placeHolderArray, size_t placeHolderNum): acl_rt.h:4906-4909,
     * resolved by Load() (ResolveHostArgsLaunch). */
    rc = launch_(func_, 1, stream_, &cfg, &block, sizeof(block), nullptr, 0);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtLaunchKernelWithHostArgs");

    rc = aclrtRecordEvent(ev_out_, stream_);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtRecordEvent(AI-CPU stream)");
    rc = aclrtStreamWaitEvent(caller, ev_out_);
    if (rc != ACL_SUCCESS) return Fail(rc, "aclrtStreamWaitEvent(caller)");
    return 0;
}

} // namespace aicpu_tiling_npu
