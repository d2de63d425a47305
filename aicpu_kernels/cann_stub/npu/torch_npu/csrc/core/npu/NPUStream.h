/*
 * NOT torch_npu. A declaration-compatible stand-in for the one torch_npu stream interface
 * aicpu_kernels/npu_ext/ uses (see cann_stub/npu/README.md); no torch_npu code.
 */
#ifndef AICPU_TILING_STUB_NPU_STREAM_H
#define AICPU_TILING_STUB_NPU_STREAM_H

#include <c10/core/Device.h>

#include "acl/acl.h"

namespace c10_npu {
class NPUStream {
public:
    /* The ACL stream; waits until torch_npu's task queue has submitted earlier work. */
    aclrtStream stream() const;
    c10::DeviceIndex device_index() const;
};
NPUStream getCurrentNPUStream(c10::DeviceIndex device_index = -1);
} // namespace c10_npu

#endif
