/*
 * NOT torch_npu. A declaration-compatible stand-in for c10_npu::NPUGuard (torch_npu
 * 2.10.0.post4: torch_npu/include/torch_npu/csrc/core/npu/NPUGuard.h:20-25, a guard that sets
 * the thread's NPU device for its lifetime), only for the host link test of
 * tests/test_npu_ext.py, which loads the extension into the installed CPU torch 2.13 (the
 * real torch_npu headers need torch 2.10). The syntax checks use the real header. No
 * torch_npu code.
 */
#ifndef AICPU_TILING_STUB_NPU_GUARD_H
#define AICPU_TILING_STUB_NPU_GUARD_H

#include <c10/core/Device.h>

namespace c10_npu {
struct NPUGuard {
    explicit NPUGuard(c10::DeviceIndex device_index);
    NPUGuard(const NPUGuard &) = delete;
    NPUGuard &operator=(const NPUGuard &) = delete;
    ~NPUGuard();

private:
    c10::DeviceIndex original_device_;
};
} // namespace c10_npu

#endif
