/*
 * NOT torch_npu. A declaration-compatible stand-in for c10_npu::current_device (torch_npu
 * 2.10.0.post4: torch_npu/include/torch_npu/csrc/core/npu/NPUFunctions.h:76), only for the
 * host link test of tests/test_npu_ext.py (see NPUGuard.h beside it). No torch_npu code.
 */
#ifndef AICPU_TILING_STUB_NPU_FUNCTIONS_H
#define AICPU_TILING_STUB_NPU_FUNCTIONS_H

#include <c10/core/Device.h>

namespace c10_npu {
c10::DeviceIndex current_device();
} // namespace c10_npu

#endif
