/*
 * tiling_check.h -- an independent checker of a tiling buffer against the contract in
 * aicpu_tiling.h, shared by the C fuzzer and the C unit tests. Host-only (uses libc).
 *
 * tiling_check() returns NULL when every invariant holds, or a static message naming the
 * first one that fails. It re-derives everything from the inputs; it trusts no count in
 * the buffer without checking it.
 */
#ifndef TILING_CHECK_H
#define TILING_CHECK_H

#include "aicpu_tiling.h"

/* The status the contract demands for these inputs (request order, then status order). */
/* The batch less its trailing kv_len == 0 slots (aicpu_tiling.h, TRAILING PADDING), counted
 * forwards: an independent derivation of what the kernel computes backwards. */
int32_t tiling_live_batch(const int32_t *kv, int32_t batch);

int tiling_expected_status(const aicpu_tiling_params *p, const int32_t *cu, const int32_t *kv,
                           int32_t batch, int causal, int32_t *bad_request);

/* Check an OK tiling: coverage, slots, combine table, costs, the balance bound, the per-head
 * layout when num_cores is a multiple of num_kv_heads, and min-max optimality (greedy filling
 * with one less than the busiest core must not fit). */
const char *tiling_check(const aicpu_tiling_params *p, const int32_t *cu, const int32_t *kv,
                         int32_t batch, int causal, const int32_t *buf);

#endif
