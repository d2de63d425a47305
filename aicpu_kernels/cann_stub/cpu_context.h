/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
#ifndef CPU_KERNELS_CONTEXT_H
#define CPU_KERNELS_CONTEXT_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu_attr_value.h"
#include "cpu_tensor.h"
#include "cpu_types.h"

namespace aicpu {
class AICPU_VISIBILITY CpuKernelContext {
    friend class CpuKernelUtils;

public:
    explicit CpuKernelContext(DeviceType type);
    CpuKernelContext() = delete;
    ~CpuKernelContext() = default;
    CpuKernelContext(const CpuKernelContext &) = delete;
    CpuKernelContext &operator=(const CpuKernelContext &) = delete;

    std::string GetOpType() const;
    Tensor *Input(uint32_t index) const;   /* nullptr when absent */
    Tensor *Output(uint32_t index) const;  /* nullptr when absent */
    AttrValue *GetAttr(std::string name) const; /* nullptr when absent */
    uint32_t GetInputsSize() const;
    uint32_t GetOutputsSize() const;

private:
    std::string op_;
    std::vector<std::shared_ptr<Tensor> > inputs_;
    std::vector<std::shared_ptr<Tensor> > outputs_;
    std::map<std::string, std::shared_ptr<AttrValue> > attrs_;
};
} // namespace aicpu

#endif
