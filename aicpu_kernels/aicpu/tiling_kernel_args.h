/*
 * tiling_kernel_args.h -- the argument block of the Ascend C AI-CPU tiling kernel.
 *
 * Shared, byte for byte, by the host launcher and the device kernel
 * (tiling_ascendc_aicpu.cpp). Plain C99, fixed layout: every address is a uint64_t so
 * the layout does not depend on the compiler of either side.
 *
 * LAUNCH (host side, an .asc file compiled by CANN >= 9.0; A2/A3)
 *     extern "C" __global__ __aicpu__ uint32_t aicpu_tiling_kernel(void *args);
 *
 *     aicpu_tiling_kernel_args args;
 *     aicpu_tiling_kernel_args_init(&args, &params, AICPU_TILING_CAUSAL);
 *     args.cu_seqlens_q = AICPU_TILING_ADDR(dev_cu);      int32[max_batch + 1] on device
 *     args.seqlens_kv   = AICPU_TILING_ADDR(dev_kv);      int32[max_batch] on device
 *     args.live_batch   = AICPU_TILING_ADDR(dev_batch);   one int32 on device, or 0
 *     args.step_epoch   = AICPU_TILING_ADDR(dev_epoch);   one int32 on device, or 0
 *     args.batch        = max_batch;                      see `batch` below
 *     args.buffer       = AICPU_TILING_ADDR(dev_tiling);
 *     args.buffer_bytes = aicpu_tiling_bytes(&params);
 *     aicpu_tiling_kernel<<<1, nullptr, aicpu_stream>>>(&args, sizeof(args));
 *     aclrtRecordEvent(ev, aicpu_stream);  aclrtStreamWaitEvent(aicore_stream, ev);
 *
 *   More plans in the same launch (ABI v3: one tiling per distinct sliding window of a
 *   graph, gpt-oss's full and 128-token layers): args.num_more = k (k < MAX_PLANS) and
 *   args.more[i] = {buffer, buffer_bytes, params} for each further tiling; they read the
 *   same lengths, live batch and epoch as the first.
 *
 *   The AI-CPU kernel and the AI Core attention kernel must not share a stream: order
 *   them with an event record / wait (docs/design.md section 1). `args` itself is copied at
 *   launch, so it may live on the host stack; under graph capture the device addresses
 *   in it are frozen, so they must name static buffers that the host refills each step.
 *
 * WHAT THE KERNEL DOES WITH IT
 *   batch_used = live_batch ? *(const int32_t *)live_batch : batch
 *   epoch      = step_epoch ? *(const int32_t *)step_epoch : 0
 *   aicpu_tiling_plan(&params, cu_seqlens_q, seqlens_kv, batch_used, epoch, flags,
 *                     buffer, buffer_bytes)
 *   then the same for each more[i] (its params, buffer, buffer_bytes; the same lengths,
 *   batch_used, epoch and flags), then AscendC::DataStoreBarrier(). See aicpu_tiling_kernel_check() for the plumbing
 *   checks made before the call, and AICPU_TILING_KERNEL_* for its return values.
 */
#ifndef AICPU_TILING_KERNEL_ARGS_H
#define AICPU_TILING_KERNEL_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "../aicpu_tiling.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An address as stored in the argument block. */
#define AICPU_TILING_ADDR(p) ((uint64_t)(uintptr_t)(p))

/* Version of this argument block's layout; bump on any change. */
#define AICPU_TILING_KERNEL_ARGS_VERSION 3 /* 2: step_epoch; 3: more plans */

/* Tilings one launch can plan (the first plus AICPU_TILING_KERNEL_MAX_PLANS - 1 in `more`):
 * a graph needs one per distinct sliding window of its layers (gpt-oss: 2, Gemma 2/3: 2). */
#define AICPU_TILING_KERNEL_MAX_PLANS 4

/*
 * Return values of both AI-CPU entry points (the classic kernel returns the matching
 * KERNEL_STATUS_* codes: 0 OK, 1 PARAM_INVALID).
 *   AICPU_TILING_KERNEL_OK      the tiling buffer was written. This includes every
 *                               INPUT error (bad lengths, batch over capacity): those are
 *                               reported in the buffer header for the host's check() and
 *                               must not fail the captured graph.
 *   AICPU_TILING_KERNEL_INVALID a plumbing or configuration error fixed at capture: bad
 *                               argument block, missing or mis-sized tensors, invalid
 *                               static params (AICPU_TILING_E_PARAMS) or a tiling buffer
 *                               that is too small (AICPU_TILING_E_BUFFER).
 */
#define AICPU_TILING_KERNEL_OK 0u
#define AICPU_TILING_KERNEL_INVALID 1u

/* One further plan of a launch: its tiling buffer and its static parameters. */
typedef struct aicpu_tiling_kernel_plan {
    uint64_t buffer;        /* device address of its tiling buffer, 4-byte aligned */
    uint64_t buffer_bytes;  /* its size in bytes */
    aicpu_tiling_params params; /* its static parameters, by value */
} aicpu_tiling_kernel_plan;

typedef struct aicpu_tiling_kernel_args {
    uint32_t args_bytes;    /* sizeof(aicpu_tiling_kernel_args) */
    uint32_t args_version;  /* AICPU_TILING_KERNEL_ARGS_VERSION */
    uint32_t flags;         /* AICPU_TILING_CAUSAL or 0 */
    int32_t batch;          /* requests the two arrays hold (cu_seqlens_q holds batch + 1).
                               Without live_batch: the batch planned. With live_batch:
                               must be >= params.max_batch, so that every live value the
                               kernel accepts is in bounds. */
    uint64_t cu_seqlens_q;  /* device address of int32[batch + 1] */
    uint64_t seqlens_kv;    /* device address of int32[batch] */
    uint64_t live_batch;    /* device address of one int32 (the live batch), or 0 */
    uint64_t buffer;        /* device address of the tiling buffer, 4-byte aligned */
    uint64_t buffer_bytes;  /* its size in bytes */
    uint64_t step_epoch;    /* device address of one int32 (the step epoch the host wrote
                               beside the lengths, echoed in the tiling header), or 0 */
    aicpu_tiling_params params; /* static parameters, by value */
    uint32_t num_more;      /* further plans in more[], 0 .. AICPU_TILING_KERNEL_MAX_PLANS - 1 */
    uint32_t reserved;      /* 0 */
    aicpu_tiling_kernel_plan more[AICPU_TILING_KERNEL_MAX_PLANS - 1];
} aicpu_tiling_kernel_args;

/* Layout checks (C99 has no static_assert: a negative array size fails the build). */
typedef char aicpu_tiling_kernel_plan_size_check
    [(sizeof(aicpu_tiling_kernel_plan) == 16 + sizeof(aicpu_tiling_params)) ? 1 : -1];
typedef char aicpu_tiling_kernel_args_size_check
    [(sizeof(aicpu_tiling_kernel_args) == 64 + sizeof(aicpu_tiling_params) + 8
                                              + (AICPU_TILING_KERNEL_MAX_PLANS - 1)
                                                    * sizeof(aicpu_tiling_kernel_plan))
         ? 1 : -1];
typedef char aicpu_tiling_kernel_args_params_check
    [(offsetof(aicpu_tiling_kernel_args, params) == 64 && sizeof(aicpu_tiling_params) == 64)
         ? 1 : -1];

/* Fill the fixed fields; addresses and batch are left 0 for the caller to set. */
static inline void aicpu_tiling_kernel_args_init(aicpu_tiling_kernel_args *args,
                                                 const aicpu_tiling_params *params,
                                                 uint32_t flags)
{
    unsigned char *p = (unsigned char *)args;
    size_t i;
    for (i = 0; i < sizeof(*args); ++i) {
        p[i] = 0;
    }
    args->args_bytes = (uint32_t)sizeof(*args);
    args->args_version = AICPU_TILING_KERNEL_ARGS_VERSION;
    args->flags = flags;
    args->params = *params;
}

/*
 * The plumbing checks of the Ascend C entry, shared so the host launcher can run the
 * same checks before capture. Returns AICPU_TILING_KERNEL_OK when the kernel will call
 * aicpu_tiling_plan(), else AICPU_TILING_KERNEL_INVALID. Reads no device memory.
 */
static inline uint32_t aicpu_tiling_kernel_check(const aicpu_tiling_kernel_args *args)
{
    if (args == NULL || args->args_bytes != (uint32_t)sizeof(*args)
        || args->args_version != AICPU_TILING_KERNEL_ARGS_VERSION) {
        return AICPU_TILING_KERNEL_INVALID;
    }
    /* cu_seqlens_q[0] is read even when the batch is 0. */
    if (args->batch < 0 || args->buffer == 0 || args->cu_seqlens_q == 0) {
        return AICPU_TILING_KERNEL_INVALID;
    }
    if ((args->batch > 0 || args->live_batch != 0) && args->seqlens_kv == 0) {
        return AICPU_TILING_KERNEL_INVALID;
    }
    if (args->live_batch != 0 && args->batch < args->params.max_batch) {
        return AICPU_TILING_KERNEL_INVALID;
    }
    if (args->num_more > AICPU_TILING_KERNEL_MAX_PLANS - 1) {
        return AICPU_TILING_KERNEL_INVALID;
    }
    {
        uint32_t i;
        for (i = 0; i < args->num_more; ++i) {
            const aicpu_tiling_kernel_plan *m = &args->more[i];
            if (m->buffer == 0
                || (args->live_batch != 0 && args->batch < m->params.max_batch)) {
                return AICPU_TILING_KERNEL_INVALID;
            }
        }
    }
    return AICPU_TILING_KERNEL_OK;
}

/* Set plan `index` (0: the block's own fields, else more[index - 1]) of a launch; returns
 * AICPU_TILING_KERNEL_INVALID when index is out of range. Grows num_more to cover it. */
static inline uint32_t aicpu_tiling_kernel_args_set_plan(aicpu_tiling_kernel_args *args,
                                                         uint32_t index,
                                                         const aicpu_tiling_params *params,
                                                         uint64_t buffer, uint64_t buffer_bytes)
{
    if (index >= AICPU_TILING_KERNEL_MAX_PLANS) {
        return AICPU_TILING_KERNEL_INVALID;
    }
    if (index == 0) {
        args->params = *params;
        args->buffer = buffer;
        args->buffer_bytes = buffer_bytes;
    } else {
        args->more[index - 1].params = *params;
        args->more[index - 1].buffer = buffer;
        args->more[index - 1].buffer_bytes = buffer_bytes;
        if (args->num_more < index) {
            args->num_more = index;
        }
    }
    return AICPU_TILING_KERNEL_OK;
}

/* Map an aicpu_tiling_plan() status to an entry point's return value (see above). */
static inline uint32_t aicpu_tiling_kernel_result(int status)
{
    return (status == AICPU_TILING_E_PARAMS || status == AICPU_TILING_E_BUFFER)
               ? AICPU_TILING_KERNEL_INVALID
               : AICPU_TILING_KERNEL_OK;
}

#ifdef __cplusplus
}
#endif

#endif /* AICPU_TILING_KERNEL_ARGS_H */
