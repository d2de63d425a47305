/*
 * launch_route.h -- how the torch_npu extension launches the AI-CPU tiling kernel: the
 * one place the route is chosen. Nothing here has run on an NPU.
 *
 * THE ROUTE IN USE: runtime (AICPU_TILING_ROUTE_RUNTIME)
 *   Chosen because it is the only route with evidence of replaying inside a captured ACL
 *   graph (docs/design.md section 7): hw-native-sys/simpler's hardware probe
 *   (tests/st/a2a3/kernel_capture/native/driver.cpp) captures an AI-CPU task launched
 *   this way with aclmdlRICaptureBegin, replays it 100 times with fresh inputs and checks
 *   a value only the AI-CPU task writes. The pattern, as runtime_launcher.cpp does it:
 *     before capture, once (with the device context of the calling thread set):
 *       aclrtBinaryLoadFromFile(<dir>/libaicpu_tiling_runtime.json,
 *           {ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE: 1})   mode 1: the JSON and <its stem>.so
 *       aclrtBinaryGetFunction(bin, "AicpuTilingKernel")      the JSON's op type
 *       aclrtCreateStreamWithConfig(&aicpu_stream, 0, 0)   flags 0: CANN refuses streams made
 *                                                          with the AI-CPU flag (and the default
 *                                                          stream) inside a capture
 *       aclrtCreateEventExWithFlag(&ev, ACL_EVENT_SYNC)    x2, usable across captured streams
 *     per launch (captured or eager):
 *       aclrtRecordEvent(ev_in, caller); aclrtStreamWaitEvent(aicpu_stream, ev_in)
 *       aclrtLaunchKernelWithHostArgs(func, 1, aicpu_stream, &cfg, &args, sizeof args, NULL, 0)
 *       aclrtRecordEvent(ev_out, aicpu_stream); aclrtStreamWaitEvent(caller, ev_out)
 *   All of these are public ACL calls declared in the acl_rt.h shipped in the torch_npu
 *   wheel (runtime_launcher.cpp cites each line); ACL maps them onto the runtime's CPU-kernel
 *   path (rtsBinaryLoadFromFile, rtsFuncGetByName, the CPU branch of
 *   rtsLaunchKernelWithHostArgs), so no CANN-internal header or libruntime is needed.
 *   Names: in mode 1 the runtime replaces the JSON's extension with .so and sends that file
 *   to the device under its basename, while the task names the JSON's kernelSo; so the JSON
 *   is libaicpu_tiling_runtime.json, beside libaicpu_tiling_runtime.so, and its kernelSo is
 *   "libaicpu_tiling_runtime.so" (hicann/runtime binary_loader.cc SetCpuBinInfo).
 *   The argument block (aicpu/tiling_kernel_args.h) is copied to the device at launch (at
 *   capture, for a captured launch), so it holds only device addresses of static buffers;
 *   every per-step value (lengths, live batch) is read from those buffers by the kernel.
 *   No stream is synchronised or queried inside the launch. The device side is
 *   libaicpu_tiling_runtime.so: aicpu/tiling_ascendc_aicpu.cpp built as a plain AArch64 .so
 *   with npu_ext/device/aicpu_api.h (its function aicpu_tiling_kernel(void *args) is the
 *   one the emulator runs in CI, see pyruntime/aarch64).
 *
 * THE ALTERNATIVES (documented, not built into the extension)
 *   Ascend C (AICPU_TILING_ROUTE_ASCENDC): CANN >= 9.0 compiles tiling_ascendc_aicpu.cpp
 *     with its AI-CPU compiler (tools/build_aicpu_kernel.sh ascendc) and a host .asc file
 *     launches it with aicpu_tiling_kernel<<<1, nullptr, stream>>>(&args, sizeof args);
 *     the same argument block. Needs the bisheng host compiler for the launching file, and
 *     no public evidence yet says whether such a launch replays under capture.
 *   classic (AICPU_TILING_ROUTE_CLASSIC): the aicpu::CpuKernel "AicpuTilingPlan"
 *     (tiling_cpu_kernel.cc, op info aicpu/aicpu_tiling_plan.json) launched as a custom
 *     AI-CPU op through aclnn / aclopExecute. A design note says graph replay does not
 *     re-execute AI-CPU custom-op nodes, so it would only serve the pre-replay placement.
 *   To move the extension to another route, change AICPU_TILING_LAUNCH_ROUTE (or pass
 *   -DAICPU_TILING_LAUNCH_ROUTE=...) and give runtime_launcher.cpp that route's Launch();
 *   nothing else in the extension knows the route.
 */
#ifndef AICPU_TILING_NPU_EXT_LAUNCH_ROUTE_H
#define AICPU_TILING_NPU_EXT_LAUNCH_ROUTE_H

#define AICPU_TILING_ROUTE_RUNTIME 1
#define AICPU_TILING_ROUTE_ASCENDC 2
#define AICPU_TILING_ROUTE_CLASSIC 3

#ifndef AICPU_TILING_LAUNCH_ROUTE
#define AICPU_TILING_LAUNCH_ROUTE AICPU_TILING_ROUTE_RUNTIME
#endif

#if AICPU_TILING_LAUNCH_ROUTE != AICPU_TILING_ROUTE_RUNTIME
#error "only the runtime route is implemented in the extension; see launch_route.h"
#endif

/* The op type (JSON key) and op-info JSON of the runtime route; must match
 * libaicpu_tiling_runtime.json and tiling_ascendc_aicpu.cpp. The JSON's stem must be the
 * .so's (libaicpu_tiling_runtime.so): see the naming note above. */
#define AICPU_TILING_RUNTIME_OP_TYPE "AicpuTilingKernel"
#define AICPU_TILING_RUNTIME_JSON "libaicpu_tiling_runtime.json"
/* The value of the ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE option: 1 loads the JSON and the
 * .so of the same stem beside it (0 would load the JSON only). */
#define AICPU_TILING_RUNTIME_CPU_KERNEL_MODE 1

#endif /* AICPU_TILING_NPU_EXT_LAUNCH_ROUTE_H */
