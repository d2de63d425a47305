/*
 * NOT torch_npu. A declaration-compatible stand-in for the torch_npu interface that queues
 * a launch in order with other NPU ops (see cann_stub/npu/README.md); no torch_npu code.
 */
#ifndef AICPU_TILING_STUB_OP_COMMAND_H
#define AICPU_TILING_STUB_OP_COMMAND_H

#include <functional>
#include <string>

namespace at_npu {
namespace native {
using PROC_FUNC = std::function<int()>;
class OpCommand {
public:
    /* Run `func` on torch_npu's task queue (or at once when the queue is off). */
    static void RunOpApiV2(const std::string &op_name, const PROC_FUNC &func, bool sync = false);
};
} // namespace native
} // namespace at_npu

#endif
