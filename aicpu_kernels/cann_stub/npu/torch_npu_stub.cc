/*
 * NOT torch_npu. Host definitions of the torch_npu functions npu_ext/plan_tiling_op.cpp
 * calls (see torch_npu/csrc/... beside this file), so tests can link the extension into a
 * CPU-only torch and load it: one device (0) whose guard only tracks the index, the current
 * stream is one fixed handle and RunOpApiV2 runs the launch at once. Also registers the host build of the entry point with the recording
 * runtime, so npu_load_tiling_kernel finds it. No torch_npu code.
 */
#include <stdexcept>

#include "recording_runtime.h"
#include "torch_npu/csrc/core/npu/NPUFunctions.h"
#include "torch_npu/csrc/core/npu/NPUGuard.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

extern "C" uint32_t aicpu_tiling_kernel(void *args);

namespace c10_npu {
namespace {
int g_current_stream;
c10::DeviceIndex g_current_device = 0;
}
c10::DeviceIndex current_device() { return g_current_device; }
NPUGuard::NPUGuard(c10::DeviceIndex device_index) : original_device_(g_current_device)
{
    g_current_device = device_index;
}
NPUGuard::~NPUGuard() { g_current_device = original_device_; }
aclrtStream NPUStream::stream() const { return &g_current_stream; }
c10::DeviceIndex NPUStream::device_index() const { return 0; }
NPUStream getCurrentNPUStream(c10::DeviceIndex) { return NPUStream(); }
} // namespace c10_npu

namespace at_npu {
namespace native {
void OpCommand::RunOpApiV2(const std::string &op_name, const PROC_FUNC &func, bool)
{
    if (func() != 0) throw std::runtime_error(op_name + " failed");
}
} // namespace native
} // namespace at_npu

namespace {
const bool g_registered = [] {
    stub_runtime::RegisterCpuFunction("AicpuTilingKernel", aicpu_tiling_kernel);
    return true;
}();
} // namespace
