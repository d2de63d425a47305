/*
 * NOT CANN. This file is part of a declaration-compatible stand-in for the few public
 * CANN interfaces that aicpu_kernels/aicpu/ uses, written for this repository so that CI
 * can compile and test the AI-CPU wrappers on a host without CANN. It contains no CANN
 * code; only the names and signatures match the public CANN headers. Real builds
 * (tools/build_aicpu_kernel.sh) never see this directory.
 */
#ifndef CPU_KERNEL_H
#define CPU_KERNEL_H

#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>

#include "cpu_context.h"

namespace aicpu {
class AICPU_VISIBILITY CpuKernel {
public:
    virtual uint32_t Compute(CpuKernelContext &ctx) = 0;
    virtual ~CpuKernel() {}
};

using KERNEL_CREATOR_FUN = std::function<std::shared_ptr<CpuKernel>(void)>;

AICPU_VISIBILITY bool RegistCpuKernel(const std::string &type, const KERNEL_CREATOR_FUN &fun);

template <typename T, typename... Args>
static inline std::shared_ptr<T> MakeShared(Args &&...args)
{
    return std::shared_ptr<T>(new (std::nothrow) T(std::forward<Args>(args)...));
}

/* Same use as the public macro: REGISTER_CPU_KERNEL(kOpTypeVariable, KernelClass); at
 * namespace aicpu scope, where kOpTypeVariable names the op type string. */
#define REGISTER_CPU_KERNEL(type, clazz)                                                  \
    std::shared_ptr<CpuKernel> Creator_##type##_Kernel()                                   \
    {                                                                                     \
        return MakeShared<clazz>();                                                       \
    }                                                                                     \
    bool g_##type##_Kernel_Creator __attribute__((unused)) =                              \
        RegistCpuKernel(type, Creator_##type##_Kernel)
} // namespace aicpu

#endif
