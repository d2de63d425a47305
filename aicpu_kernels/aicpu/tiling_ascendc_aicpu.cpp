/*
 * tiling_ascendc_aicpu.cpp -- Ascend C AI-CPU entry point of the tiling kernel
 * (CANN >= 9.0, Atlas A2/A3). A thin wrapper around aicpu_tiling_plan().
 *
 * The host launches it with one argument block (tiling_kernel_args.h):
 *     aicpu_tiling_kernel<<<1, nullptr, aicpu_stream>>>(&args, sizeof(args));
 * It plans every tiling the block names (the first and args.num_more more: ABI v3). It
 * reads the live batch (when given) from device memory, calls aicpu_tiling_plan() on
 * the device addresses in the block, and ends with AscendC::DataStoreBarrier() so the
 * tiling is visible in HBM before the event that releases the AI Core attention kernel.
 *
 * Build: the CANN AI-CPU compiler wants the .aicpu suffix (or -x aicpu); CMakeLists.txt
 * copies this file to <build>/tiling_ascendc_aicpu.aicpu. Define AICPU_TILING_UNITY_BUILD
 * to compile the portable kernel into the same translation unit (the device build does,
 * so the AI-CPU binary needs no separately linked C object). Host tests compile it with
 * g++ against aicpu_kernels/cann_stub/, where aicpu_api.h is a stand-in.
 *
 * Return value: AICPU_TILING_KERNEL_OK or AICPU_TILING_KERNEL_INVALID (see
 * tiling_kernel_args.h). CANN uses it only to report the task's state; input errors are
 * reported in the tiling buffer's header instead and return OK.
 */
#include "aicpu_api.h"

#include "tiling_kernel_args.h"

#ifdef AICPU_TILING_UNITY_BUILD
#include "../aicpu_tiling.c"
#endif

extern "C" __global__ __aicpu__ uint32_t aicpu_tiling_kernel(void *args)
{
    const aicpu_tiling_kernel_args *a = static_cast<const aicpu_tiling_kernel_args *>(args);
    uint32_t result = aicpu_tiling_kernel_check(a);
    if (result == AICPU_TILING_KERNEL_OK) {
        int32_t batch = a->batch;
        if (a->live_batch != 0) {
            /* Any value is passed on: aicpu_tiling_plan() rejects batch < 0 or
             * batch > max_batch (AICPU_TILING_E_BATCH) without reading the arrays, and
             * the arrays hold at least max_batch requests (checked above). */
            batch = *reinterpret_cast<const volatile int32_t *>(
                static_cast<uintptr_t>(a->live_batch));
        }
        int32_t epoch = 0;
        if (a->step_epoch != 0) {
            epoch = *reinterpret_cast<const volatile int32_t *>(
                static_cast<uintptr_t>(a->step_epoch));
        }
        const int status = aicpu_tiling_plan(
            &a->params, reinterpret_cast<const int32_t *>(static_cast<uintptr_t>(a->cu_seqlens_q)),
            reinterpret_cast<const int32_t *>(static_cast<uintptr_t>(a->seqlens_kv)), batch,
            epoch, a->flags, reinterpret_cast<void *>(static_cast<uintptr_t>(a->buffer)),
            static_cast<size_t>(a->buffer_bytes));
        result = aicpu_tiling_kernel_result(status);
        /* The further plans of this launch (one per distinct sliding window): the same
         * lengths, batch, epoch and flags; each its own params and buffer. */
        for (uint32_t i = 0; i < a->num_more; ++i) {
            const aicpu_tiling_kernel_plan &m = a->more[i];
            const int more_status = aicpu_tiling_plan(
                &m.params,
                reinterpret_cast<const int32_t *>(static_cast<uintptr_t>(a->cu_seqlens_q)),
                reinterpret_cast<const int32_t *>(static_cast<uintptr_t>(a->seqlens_kv)),
                batch, epoch, a->flags, reinterpret_cast<void *>(static_cast<uintptr_t>(m.buffer)),
                static_cast<size_t>(m.buffer_bytes));
            if (aicpu_tiling_kernel_result(more_status) != AICPU_TILING_KERNEL_OK) {
                result = AICPU_TILING_KERNEL_INVALID;
            }
        }
    }
    /* Make the tiling (and the header status) globally visible before the task ends. */
    AscendC::DataStoreBarrier();
    return result;
}
