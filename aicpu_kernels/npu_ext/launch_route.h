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
 *     before capture, once:
 *       rtsBinaryLoadFromFile(<dir>/aicpu_tiling_runtime.json,
 *                             {RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE: 1})   JSON + the .so it names
 *       rtsFuncGetByName(bin, "AicpuTilingKernel")                         the JSON's op type
 *       aclrtCreateStreamWithConfig(&aicpu_stream, 0, 0)   flags 0: CANN refuses streams made
 *                                                          with the AI-CPU flag (and the default
 *                                                          stream) inside a capture
 *       aclrtCreateEventExWithFlag(&ev, ACL_EVENT_SYNC)    x2, usable across captured streams
 *     per launch (captured or eager):
 *       aclrtRecordEvent(ev_in, caller); aclrtStreamWaitEvent(aicpu_stream, ev_in)
 *       rtsLaunchCpuKernel(func, 1, aicpu_stream, &cfg, &{args, sizeof args})
 *       aclrtRecordEvent(ev_out, aicpu_stream); aclrtStreamWaitEvent(caller, ev_out)
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

/* The op type (JSON key) and device function of the runtime route; must match
 * aicpu_tiling_runtime.json and tiling_ascendc_aicpu.cpp. */
#define AICPU_TILING_RUNTIME_OP_TYPE "AicpuTilingKernel"
#define AICPU_TILING_RUNTIME_JSON "aicpu_tiling_runtime.json"
/* RT_LOAD_BINARY_OPT_CPU_KERNEL_MODE value: load the JSON and the .so it names. */
#define AICPU_TILING_RUNTIME_CPU_KERNEL_MODE 1

#endif /* AICPU_TILING_NPU_EXT_LAUNCH_ROUTE_H */
