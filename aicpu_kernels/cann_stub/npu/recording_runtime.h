/*
 * NOT CANN. Test-only API of the recording stand-in runtime (recording_runtime.cc): host
 * definitions of the few ACL functions the launcher calls, compiled against the REAL
 * declarations in the torch_npu wheel's acl/acl_rt.h (so a signature that drifts from the
 * real header fails to compile), so the launcher's call sequence can be checked and its
 * launches run. No CANN code, no CANN counterpart.
 *
 * What it models (and nothing more):
 *   - streams, events and binaries are opaque non-null handles; every call is logged as
 *     one line "name arg arg ..." with handles shown as stream#N / event#N / func#N;
 *   - aclrtLaunchKernelWithHostArgs copies the argument block (as the runtime copies it to device
 *     memory) and runs the host build of the function the JSON names, at once, or, while
 *     a capture is open on the stream the launch is ordered after, at each replay;
 *   - injected failures: StubFailNext("aclrtBinaryGetFunction", code) makes that call fail once;
 *   - built with -DRECORDING_RUNTIME_OLD_CANN: a CANN before the host-args launch (no
 *     aclrtLaunchKernelWithHostArgs; aclsysGetCANNVersion reads
 *     $ASCEND_HOME_PATH/share/info/runtime/version.info as CANN's does), and with
 *     -DRECORDING_RUNTIME_NO_VERSION_QUERY as well, one without that query either.
 * Capture is modelled per launcher stream, not per event graph: enough to show that a
 * captured launch re-runs its frozen block at every replay, reading fresh device data.
 */
#ifndef AICPU_TILING_STUB_RECORDING_RUNTIME_H
#define AICPU_TILING_STUB_RECORDING_RUNTIME_H

#include <cstdint>
#include <string>
#include <vector>

namespace stub_runtime {
/* The host function a launch runs: the entry point the JSON's functionName names. */
typedef uint32_t (*CpuFunction)(void *args);
void RegisterCpuFunction(const std::string &op_type, CpuFunction fn);

std::vector<std::string> &CallLog();
void StubFailNext(const std::string &call, int code);
/* Launches enqueued between Begin and End are kept instead of run; Replay runs them. */
void BeginCapture();
void EndCapture();
void Replay();
/* Return values of the host functions run so far, in order. */
std::vector<uint32_t> &Results();
} // namespace stub_runtime

#endif
