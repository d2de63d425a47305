/*
 * attention_ref.h -- the reference attention: what one AI Core does with its tiling range.
 *
 * This is the AI Core role of docs/design.md section 4, in portable C99: paged KV cache, grouped
 * query attention (GQA), causal masking with a KV cache, split-KV partial results merged by
 * log-sum-exp, fp32 accumulation over fp32, fp16 or bf16 storage. It reads only the tiling
 * (aicpu_tiling.h) to decide its work, so running aicpu_attention_core() for every core
 * 0..P-1 (in any order, or concurrently) and then aicpu_attention_finalize() once computes
 * the whole layer.
 *
 * NOT FREESTANDING. Unlike the tiling kernel, this file is a host emulation of the AI Core
 * kernel and uses <math.h> (logf, expf in the combine step, INFINITY) and <string.h>: link with
 * -lm where libm is separate. It allocates nothing; a call uses at most about
 * AICPU_ATTENTION_STACK_BYTES of stack (fine for glibc's 8 MiB thread stacks; size threads
 * created with a small explicit stack accordingly). Calls share no state: cores may run
 * concurrently on one layer, writing disjoint output rows and partial slots.
 *
 * BUILD. Strict ISO C99 (-std=c99 -pedantic -Wall -Wextra -Werror clean), no extensions. The
 * inner loops vectorise at -O3 without -ffast-math; -march=native (AVX2/FMA with
 * -ffp-contract=fast) helps little, the decode loop being bound by memory latency and the
 * per-token work of the group's rows (tools/bench_attention.py measures it).
 *
 * TENSORS (all row-major, contiguous; "dtype" is the storage type of query, caches and out)
 *   query        [max_tokens][num_q_heads][head_dim]
 *   key_cache    [num_blocks][block_size][num_kv_heads][head_dim]
 *   value_cache  [num_blocks][block_size][num_kv_heads][head_dim]
 *   block_table  int32 [max_batch][max_blocks_per_req]; entry (r, b) holds the cache block of
 *                kv positions [b * block_size, (b + 1) * block_size) of request r
 *   cu_seqlens_q int32 [batch + 1], seqlens_kv int32 [batch]: the arrays the tiling was
 *                planned from (batch is the tiling header's AICPU_TILING_HDR_BATCH)
 *   out          [max_tokens][num_q_heads][head_dim], dtype
 *   partial_out  float32 [max_slots][q_tile][group][head_dim]  (max_slots = 2 (P - 1),
 *   partial_lse  float32 [max_slots][q_tile][group]             group = num_q_heads /
 *                                                               num_kv_heads)
 *   Query head h * group + g (0 <= g < group) attends with kv head h.
 *
 * WHAT A ROW COMPUTES
 *   Query token i (0 <= i < q_len) of a request with q_len query tokens and kv_len kv tokens
 *   sees the kv positions [0, kv_len - q_len + i + 1) when causal, [0, kv_len) otherwise:
 *       out = sum_j softmax_j(scale * q . k_j) v_j
 *   A piece of a split unit covers only some kv blocks; with s_j = scale * q . k_j it stores,
 *   per row, the normalised partial output o_p = sum_j e^(s_j - m) v_j / l and the natural-log
 *   lse_p = m + ln(l), l = sum_j e^(s_j - m), m = max_j s_j, over the positions the piece covers
 *   and the row sees (o_p = 0, lse_p = -inf when it sees none; +inf marks a poisoned piece). The finalize step merges the pieces: out = sum_p e^(lse_p - M) o_p / sum_p
 *   e^(lse_p - M), M = max_p lse_p. Rows of a partial slot are [token in tile][g].
 *
 * ACCURACY. fp32 accumulation, an exp accurate to about 1e-7 relative, outputs rounded to the
 * storage dtype to nearest even: relative error ~1e-7 for fp32 storage, one rounding of the
 * output for fp16/bf16. Results are deterministic: the same inputs give the same bits whatever
 * the order or concurrency of the core calls.
 *
 * STATUS
 *   0 (AICPU_TILING_OK) on success. The tiling's own status (1..AICPU_TILING_NUM_STATUS-1)
 *   when it is not OK: the core then does nothing. Otherwise one of AICPU_ATTENTION_E_*,
 *   which do not collide with the tiling's codes; aicpu_attention_strerror() names them all.
 */
#ifndef AICPU_ATTENTION_REF_H
#define AICPU_ATTENTION_REF_H

#include <stddef.h>
#include <stdint.h>

#include "aicpu_tiling.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage dtypes of query, caches and output. Accumulation is always fp32. */
#define AICPU_ATTENTION_FP32 0
#define AICPU_ATTENTION_FP16 1 /* IEEE binary16 */
#define AICPU_ATTENTION_BF16 2 /* bfloat16 */

/* Status codes beyond the tiling's (which are 0..AICPU_TILING_NUM_STATUS-1). */
#define AICPU_ATTENTION_E_ARGS 32     /* NULL pointer, bad dtype, core or params out of range */
#define AICPU_ATTENTION_E_TILING 33   /* bad magic/version, or tiling not made for these params,
                                       * flags, or lengths (a corrupt or mismatched buffer) */
#define AICPU_ATTENTION_E_BLOCK_ID 34 /* a block-table entry read is not in [0, num_blocks) */

/* Stack bytes one call uses, roughly (scratch for fp32 copies of query, K, V, scores). */
#define AICPU_ATTENTION_STACK_BYTES 229376

/*
 * aicpu_attention_core: the work of AI Core `core` for one layer.
 *   params        the static params the tiling was planned with (checked)
 *   tiling        the buffer aicpu_tiling_plan() wrote, aicpu_tiling_bytes(params) bytes
 *   core          0 <= core < params->num_cores
 *   flags         AICPU_TILING_CAUSAL or 0; must match the flags the tiling was planned with
 *   dtype         AICPU_ATTENTION_FP32, _FP16 or _BF16
 *   scale         softmax scale, usually 1 / sqrt(head_dim)
 *   query, key_cache, value_cache, num_blocks, block_table, cu_seqlens_q, seqlens_kv
 *                 see TENSORS; num_blocks is the caches' dim 0
 *   out           whole units write their rows here, converted to dtype (round to nearest even)
 *   partial_out, partial_lse
 *                 pieces of split units write their slot here; may be NULL when the core's
 *                 record has no slot (first_slot == last_slot == -1)
 * Walks the core's range [begin, end) in work order. Reads cu_seqlens_q[r], cu_seqlens_q[r + 1],
 * seqlens_kv[r] and block-table row r only for live requests r < batch, and of that row only the
 * columns of the blocks a segment covers; checks every entry it reads before use.
 * Returns:
 *   AICPU_TILING_OK             the core's segments are written
 *   the tiling's status         when it is not AICPU_TILING_OK; nothing is read or written
 *   AICPU_ATTENTION_E_ARGS      bad arguments; nothing is read or written
 *   AICPU_ATTENTION_E_TILING    the buffer is not a tiling for these params and flags, or the
 *                               lengths differ from those it was planned from; the core stops
 *                               at the first inconsistent segment
 *   AICPU_ATTENTION_E_BLOCK_ID  some segment's block-table entries are out of range: that
 *                               segment's rows are written as zeros (a piece writes zeros with
 *                               lse = +inf, which makes finalize zero the whole unit), the other
 *                               segments are computed, and this status is returned
 *     for (c = 0; c < params.num_cores; c++) status |= aicpu_attention_core(&params, tiling, c,
 *         AICPU_TILING_CAUSAL, AICPU_ATTENTION_BF16, scale, q, k, v, nblk, bt, cu, kv, out, po, pl);
 */
int aicpu_attention_core(const aicpu_tiling_params *params, const int32_t *tiling, int32_t core,
                         uint32_t flags, int32_t dtype, float scale, const void *query,
                         const void *key_cache, const void *value_cache, int32_t num_blocks,
                         const int32_t *block_table, const int32_t *cu_seqlens_q,
                         const int32_t *seqlens_kv, void *out, float *partial_out,
                         float *partial_lse);

/*
 * aicpu_attention_finalize: the combine step, run once after every core of the layer.
 *   params, tiling, dtype, out, partial_out, partial_lse   as for aicpu_attention_core
 *   cu_seqlens_q  the query offsets the tiling was planned from (locates a unit's rows)
 * Merges the pieces of every combine record into its output rows, and writes zeros to the
 * padding rows [num_tokens, max_tokens). When the tiling's status is not OK (or the buffer is
 * not a valid tiling) it writes zeros to ALL max_tokens rows, so a failed step never leaves
 * stale results. partial_out and partial_lse may be NULL when there is no combine record.
 * Returns AICPU_TILING_OK, the tiling's status (after zeroing), AICPU_ATTENTION_E_ARGS (params,
 * dtype or out invalid: nothing written) or AICPU_ATTENTION_E_TILING (after zeroing all rows).
 *     status = aicpu_attention_finalize(&params, tiling, AICPU_ATTENTION_BF16, cu, out, po, pl);
 */
int aicpu_attention_finalize(const aicpu_tiling_params *params, const int32_t *tiling,
                             int32_t dtype, const int32_t *cu_seqlens_q, void *out,
                             const float *partial_out, const float *partial_lse);

/* aicpu_attention_strerror: a static message for any status above; never NULL. */
const char *aicpu_attention_strerror(int status);

/*
 * Storage conversions used by the kernel, exported for tests. Integer bit manipulation only,
 * round to nearest even; NaN stays NaN (quiet), infinities and overflow to infinity are kept.
 */
float aicpu_attention_half_to_float(uint16_t h);
uint16_t aicpu_attention_float_to_half(float f);
float aicpu_attention_bf16_to_float(uint16_t b);
uint16_t aicpu_attention_float_to_bf16(float f);

#ifdef __cplusplus
}
#endif

#endif /* AICPU_ATTENTION_REF_H */
