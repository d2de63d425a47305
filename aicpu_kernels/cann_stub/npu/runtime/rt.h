/*
 * NOT CANN. A declaration-compatible stand-in for the CANN runtime's kernel-loading
 * interfaces that aicpu_kernels/npu_ext/ uses (see cann_stub/npu/README.md); no CANN code.
 * Names, fields and signatures follow the public runtime/rts/rts_kernel.h and
 * runtime/kernel.h (CANN 8.x/9.x). Field order matters: rtCpuKernelArgs_t is passed by
 * pointer to the real runtime.
 */
#ifndef AICPU_TILING_STUB_RT_H
#define AICPU_TILING_STUB_RT_H

#include <cstddef>
#include <cstdint>

extern "C" {
typedef int32_t rtError_t;
typedef void *rtStream_t;
typedef void *rtBinHandle;
typedef void *rtFuncHandle;
#define RT_ERROR_NONE 0

typedef enum {
    RT_LOAD_BINARY_OPT_LAZY_LOAD = 1,
    RT_LOAD_BINARY_OPT_MAGIC = 2,
    /* value.cpuKernelMode: 0 the JSON only (the .so is already on the device),
     * 1 the JSON and the .so it names, 2 from data */
    RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE = 3,
    RT_LOAD_BINARY_OPT_MAX
} rtLoadBinaryOption;

typedef union {
    uint32_t isLazyLoad;
    uint32_t magic;
    int32_t cpuKernelMode;
    uint32_t rsv[4];
} rtLoadBinaryOptionValue_t;

typedef struct {
    rtLoadBinaryOption optionId;
    rtLoadBinaryOptionValue_t value;
} rtLoadBinaryOption_t;

typedef struct {
    rtLoadBinaryOption_t *options;
    size_t numOpt;
} rtLoadBinaryConfig_t;

typedef struct tagRtHostInputInfo {
    uint32_t addrOffset;
    uint32_t dataOffset;
} rtHostInputInfo_t;

typedef struct tagRtAicpuArgsEx {
    void *args; /* host copy of the argument block; the runtime copies it to the device */
    rtHostInputInfo_t *hostInputInfoPtr;
    rtHostInputInfo_t *kernelOffsetInfoPtr;
    uint32_t argsSize;
    uint16_t hostInputInfoNum;
    uint16_t kernelOffsetInfoNum;
    uint32_t soNameAddrOffset;
    uint32_t kernelNameAddrOffset;
    bool isNoNeedH2DCopy;
    uint16_t timeout;
    uint8_t reserved;
} rtAicpuArgsEx_t;

typedef struct {
    rtAicpuArgsEx_t baseArgs;
    size_t cpuParamHeadOffset;
    uint32_t rsv[4];
} rtCpuKernelArgs_t;

typedef enum { RT_LAUNCH_KERNEL_ATTR_SCHEM_MODE = 1 } rtLaunchKernelAttrId;

typedef union {
    uint8_t schemMode;
    uint32_t rsv[4];
} rtLaunchKernelAttrVal_t;

typedef struct {
    rtLaunchKernelAttrId id;
    rtLaunchKernelAttrVal_t value;
} rtLaunchKernelAttr_t;

typedef struct {
    rtLaunchKernelAttr_t *attrs;
    size_t numAttrs;
} rtKernelLaunchCfg_t;

rtError_t rtsBinaryLoadFromFile(const char *const binPath,
                                const rtLoadBinaryConfig_t *const optionalCfg,
                                rtBinHandle *handle);
rtError_t rtsBinaryUnload(const rtBinHandle binHandle);
rtError_t rtsFuncGetByName(const rtBinHandle binHandle, const char *kernelName,
                           rtFuncHandle *funcHandle);
rtError_t rtsLaunchCpuKernel(const rtFuncHandle funcHandle, uint32_t blockDim, rtStream_t stm,
                             const rtKernelLaunchCfg_t *cfg, rtCpuKernelArgs_t *argsInfo);
}

#endif
