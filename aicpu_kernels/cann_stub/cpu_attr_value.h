/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
#ifndef CPU_KERNEL_ATTR_VALUE_H
#define CPU_KERNEL_ATTR_VALUE_H

#include <cstdint>
#include <vector>

#include "cpu_types.h"

namespace aicpu {
class AICPU_VISIBILITY AttrValue {
    friend class CpuKernelUtils;

public:
    AttrValue() = delete;
    ~AttrValue() = default;
    AttrValue(const AttrValue &) = delete;
    AttrValue &operator=(const AttrValue &) = delete;

    int64_t GetInt() const;
    /* A list(int) attribute's values; empty for a scalar attribute. The real declaration:
     * CANN's AI-CPU context, e.g. leideng/CANN-8.1.RC1 .../AICPU/Onnx/cpukernel/context/
     * cpu_proto/attr_value.cc (AttrValue::GetListInt). */
    std::vector<int64_t> GetListInt() const;

private:
    explicit AttrValue(int64_t value);
    explicit AttrValue(const std::vector<int64_t> &list);
    int64_t value_;
    std::vector<int64_t> list_;
};
} // namespace aicpu

#endif
