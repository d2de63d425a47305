/*
 * NOT CANN. The recording stand-in runtime; see recording_runtime.h. No CANN code: only
 * definitions of functions declared by the real acl/acl_rt.h (torch_npu wheel), which is
 * on the include path instead of any stand-in header.
 */
#include "recording_runtime.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "acl/acl.h"

namespace stub_runtime {
namespace {
struct Launch {
    CpuFunction fn;
    std::vector<unsigned char> block; /* the "device" copy of the argument block */
};
std::map<std::string, CpuFunction> g_functions;
std::map<std::string, int> g_fail;
std::vector<std::string> g_log;
std::vector<uint32_t> g_results;
std::vector<Launch> g_graph;
bool g_capturing = false;
int g_next_handle = 1;
std::map<const void *, std::string> g_names;
std::vector<std::unique_ptr<int>> g_handles;

void *NewHandle(const char *kind)
{
    g_handles.emplace_back(new int(g_next_handle));
    void *h = g_handles.back().get();
    g_names[h] = std::string(kind) + "#" + std::to_string(g_next_handle++);
    return h;
}

std::string Name(const void *h)
{
    auto it = g_names.find(h);
    return it == g_names.end() ? (h == nullptr ? "null" : "unknown") : it->second;
}

int Log(const std::string &line)
{
    g_log.push_back(line);
    const std::string call = line.substr(0, line.find(' '));
    auto it = g_fail.find(call);
    if (it == g_fail.end()) return 0;
    const int code = it->second;
    g_fail.erase(it);
    return code;
}

void Run(const Launch &l)
{
    std::vector<unsigned char> block = l.block; /* the kernel may not change the copy */
    g_results.push_back(l.fn(block.data()));
}
} // namespace

void RegisterCpuFunction(const std::string &op_type, CpuFunction fn) { g_functions[op_type] = fn; }
std::vector<std::string> &CallLog() { return g_log; }
void StubFailNext(const std::string &call, int code) { g_fail[call] = code; }
void BeginCapture() { g_capturing = true; g_graph.clear(); }
void EndCapture() { g_capturing = false; }
void Replay()
{
    for (const Launch &l : g_graph) Run(l);
}
std::vector<uint32_t> &Results() { return g_results; }
} // namespace stub_runtime

using namespace stub_runtime;

extern "C" {
aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag)
{
    const int rc = Log("aclrtCreateStreamWithConfig " + std::to_string(priority) + " " +
                       std::to_string(flag));
    if (rc == 0) *stream = NewHandle("stream");
    return rc;
}
aclError aclrtDestroyStream(aclrtStream stream) { return Log("aclrtDestroyStream " + Name(stream)); }
aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag)
{
    const int rc = Log("aclrtCreateEventExWithFlag " + std::to_string(flag));
    if (rc == 0) *event = NewHandle("event");
    return rc;
}
aclError aclrtDestroyEvent(aclrtEvent event) { return Log("aclrtDestroyEvent " + Name(event)); }
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream)
{
    return Log("aclrtRecordEvent " + Name(event) + " " + Name(stream));
}
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event)
{
    return Log("aclrtStreamWaitEvent " + Name(stream) + " " + Name(event));
}
const char *aclGetRecentErrMsg() { return ""; }

aclError aclrtBinaryLoadFromFile(const char *binPath, aclrtBinaryLoadOptions *options,
                                 aclrtBinHandle *binHandle)
{
    std::ostringstream line;
    line << "aclrtBinaryLoadFromFile " << binPath;
    for (size_t i = 0; options != nullptr && i < options->numOpt; ++i) {
        line << " opt" << static_cast<int>(options->options[i].type) << "="
             << options->options[i].value.cpuKernelMode;
    }
    const int rc = Log(line.str());
    if (rc == 0) *binHandle = NewHandle("binary");
    return rc;
}
aclError aclrtBinaryUnLoad(aclrtBinHandle binHandle) { return Log("aclrtBinaryUnLoad " + Name(binHandle)); }
aclError aclrtBinaryGetFunction(const aclrtBinHandle binHandle, const char *kernelName,
                                aclrtFuncHandle *funcHandle)
{
    int rc = Log("aclrtBinaryGetFunction " + Name(binHandle) + " " + kernelName);
    auto it = g_functions.find(kernelName);
    if (rc == 0 && it == g_functions.end()) rc = 107000; /* no such kernel */
    if (rc == 0) {
        *funcHandle = NewHandle("func");
        g_functions[Name(*funcHandle)] = it->second;
    }
    return rc;
}
#ifndef RECORDING_RUNTIME_OLD_CANN
aclError aclrtLaunchKernelWithHostArgs(aclrtFuncHandle funcHandle, uint32_t numBlocks,
                                       aclrtStream stream, aclrtLaunchKernelCfg *cfg,
                                       void *hostArgs, size_t argsSize,
                                       aclrtPlaceHolderInfo *placeHolderArray,
                                       size_t placeHolderNum)
{
    const int rc = Log("aclrtLaunchKernelWithHostArgs " + Name(funcHandle) + " " +
                       std::to_string(numBlocks) + " " + Name(stream) + " cfg=" +
                       (cfg != nullptr && cfg->attrs != nullptr ? "attrs" : "null") +
                       " attrs=" + std::to_string(cfg != nullptr ? cfg->numAttrs : 0) +
                       " bytes=" + std::to_string(argsSize) + " placeholders=" +
                       (placeHolderArray == nullptr ? "null" : "set") + "/" +
                       std::to_string(placeHolderNum));
    if (rc != 0) return rc;
    const unsigned char *src = static_cast<const unsigned char *>(hostArgs);
    Launch l{g_functions.at(Name(funcHandle)), std::vector<unsigned char>(src, src + argsSize)};
    if (g_capturing) {
        g_graph.push_back(l);
    } else {
        Run(l);
    }
    return 0;
}
#else
/* A CANN older than the host-args launch: no aclrtLaunchKernelWithHostArgs at all. Its
 * version query, unless RECORDING_RUNTIME_NO_VERSION_QUERY, is aclsysGetCANNVersion, reading
 * what hicann/runtime's implementation reads (src/acl/aclrt_impl/acl.cpp,
 * aclsysGetCANNVersionImpl: $ASCEND_HOME_PATH/share/info/<package>/version.info, its
 * "Version=" line); only the runtime package is modelled. */
#ifndef RECORDING_RUNTIME_NO_VERSION_QUERY
aclError aclsysGetCANNVersion(aclCANNPackageName name, aclCANNPackageVersion *version)
{
    const char *home = std::getenv("ASCEND_HOME_PATH");
    if (name != ACL_PKG_NAME_RUNTIME || home == nullptr) return ACL_ERROR_INVALID_FILE;
    std::ifstream in(std::string(home) + "/share/info/runtime/version.info");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Version=", 0) != 0) continue;
        std::memset(version, 0, sizeof(*version));
        std::strncpy(version->version, line.c_str() + 8, sizeof(version->version) - 1);
        return ACL_SUCCESS;
    }
    return ACL_ERROR_INVALID_FILE;
}
#endif
#endif
}
