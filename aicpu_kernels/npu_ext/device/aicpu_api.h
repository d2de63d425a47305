/*
 * NOT CANN. The definitions that let aicpu/tiling_ascendc_aicpu.cpp build as a plain
 * AArch64 shared object for the runtime launch route (npu_ext/launch_route.h): the AI-CPU
 * loads it beside its op-info JSON of the same stem (aclrtBinaryLoadFromFile, CPU kernel
 * mode 1: libaicpu_tiling_runtime.json + libaicpu_tiling_runtime.so) and calls
 *     uint32_t aicpu_tiling_kernel(void *args)
 * with `args` pointing at the device copy of the argument block, the same contract as the
 * Ascend C <<<>>> launch. The CANN Ascend C compiler uses its own aicpu_api.h instead; the
 * host tests use aicpu_kernels/cann_stub/aicpu_api.h (a counting stand-in). The same
 * header also serves the emulated build (pyruntime/aarch64), which runs this exact code.
 *
 * Where the shape comes from: hw-native-sys/simpler, tests/st/a2a3/kernel_capture/native/
 * cpu.cpp (an AI-CPU function `extern "C" int f(void *args)` launched with
 * rtsLaunchCpuKernel, ending its stores with `dsb sy`).
 */
#ifndef AICPU_TILING_DEVICE_AICPU_API_H
#define AICPU_TILING_DEVICE_AICPU_API_H

/* Execution-space keywords of the CANN AI-CPU compiler: nothing in a plain .so. */
#define __global__
#define __aicpu__

namespace AscendC {
/* Make every earlier store visible to the other agents (the AI Cores read the tiling
 * from HBM once the task's completion event fires): a full-system data barrier. */
inline void DataStoreBarrier()
{
#if defined(__aarch64__)
    __asm__ volatile("dsb sy" ::: "memory");
#else
#error "the runtime-route build of the AI-CPU entry targets AArch64 only"
#endif
}
} // namespace AscendC

#endif
