/*
 * attention_mla_ref.h -- the reference MLA decode attention: what one AI Core does with its
 * tiling range when the layer is DeepSeek-style multi-head latent attention (absorbed form).
 *
 * WHAT IT COMPUTES
 *   Absorbed MLA decode (DeepSeek-V2/V3/R1, Kimi-K2) is attention with ONE latent kv head
 *   shared by every query head. A cache row is [kv_c (kv_lora_rank = L) | k_pe (rope = R)]; a
 *   query row is [q_nope (L, W_UK already absorbed) | q_pe (R)]. For query head h of query
 *   token i (0 <= i < q_len) of a request with kv_len kv tokens, seeing positions
 *   [0, kv_len - q_len + i + 1) when causal, [0, kv_len) otherwise:
 *       s_j = scale * (q_nope . kv_c_j + q_pe . k_pe_j)
 *       out = sum_j softmax_j(s_j) kv_c_j                   (L values: the latent output)
 *   scale is the caller's (DeepSeek's includes the YaRN mscale). The value is the kv_c part
 *   of the same cache row, so K and V are read once. W_UV is applied by the caller after.
 *
 * HOW IT USES THE TILING (aicpu_tiling.h, unchanged)
 *   The tiling is planned with num_q_heads = H (the rank's query heads), num_kv_heads = 1 and
 *   head_dim = L + R: a unit is (request, query tile) with q_tile * H rows, exactly GQA with
 *   group = H. The cost weights are the caller's choice (pyruntime/mla_attention.py documents
 *   the ones it uses). Split units write partials and lse like the GQA reference, but a
 *   partial row holds L values (the output width), not head_dim:
 *       partial_out float32 [max_slots][q_tile][H][L], partial_lse float32 [max_slots][q_tile][H]
 *   The combine step is then the GQA one read with head_dim = L (aicpu_mla_finalize).
 *
 * TENSORS (row-major, contiguous; "dtype" is the storage type of queries, caches and out)
 *   q_nope       [max_tokens][H][L]
 *   q_pe         [max_tokens][H][R]
 *   kv_c_cache   [num_blocks][block_size][1][L]   (vLLM-Ascend's MLA "nope" cache)
 *   k_pe_cache   [num_blocks][block_size][1][R]   (vLLM-Ascend's MLA "rope" cache)
 *   block_table  int32 [max_batch][max_blocks_per_req]
 *   cu_seqlens_q int32 [batch + 1], seqlens_kv int32 [batch]: the arrays the tiling was planned
 *                from
 *   out          [max_tokens][H][L], dtype
 *   With R == 0 (MLA without rope) q_pe and k_pe_cache may be NULL.
 *
 * ACCURACY. fp32 accumulation (libm expf), outputs rounded to the storage dtype to nearest even.
 * Deterministic: the same inputs give the same bits whatever the order of the core calls.
 *
 * BUILD. Strict ISO C99, like attention_ref.c (not freestanding: <math.h>, <string.h>); it
 * walks the tiling with attention_ref.c's walk (attention_walk.h) and merges with its
 * aicpu_attention_finalize, so link both. A call uses at most about AICPU_MLA_STACK_BYTES of
 * stack and allocates nothing.
 */
#ifndef AICPU_ATTENTION_MLA_REF_H
#define AICPU_ATTENTION_MLA_REF_H

#include <stddef.h>
#include <stdint.h>

#include "aicpu_tiling.h"
#include "attention_ref.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Stack bytes one aicpu_mla_core call uses, roughly (fp32 scratch for queries, accumulators
 * and one chunk of cache rows). */
#define AICPU_MLA_STACK_BYTES 393216

/*
 * aicpu_mla_params_check: AICPU_TILING_OK when params are valid tiling params for MLA
 * (aicpu_tiling_params_check passes, num_kv_heads == 1) and 1 <= kv_lora_rank <= head_dim;
 * AICPU_ATTENTION_E_ARGS otherwise (params NULL included).
 *     if (aicpu_mla_params_check(&p, 512) != AICPU_TILING_OK) ...
 */
int aicpu_mla_params_check(const aicpu_tiling_params *params, int32_t kv_lora_rank);

/*
 * aicpu_mla_core: the work of AI Core `core` for one MLA layer.
 *   params        the static params the tiling was planned with (num_kv_heads 1, head_dim L + R)
 *   kv_lora_rank  L; R = params->head_dim - L
 *   tiling        the buffer aicpu_tiling_plan() wrote, aicpu_tiling_bytes(params) bytes
 *   core          0 <= core < params->num_cores
 *   flags         AICPU_TILING_CAUSAL or 0; must match the flags the tiling was planned with
 *   dtype         AICPU_ATTENTION_FP32, _FP16 or _BF16
 *   scale         softmax scale (the caller's)
 *   q_nope .. out see TENSORS; num_blocks is the caches' dim 0
 *   partial_out, partial_lse
 *                 pieces of split units write their slot here (layout in HOW IT USES THE
 *                 TILING); may be NULL when the core's record has no slot
 * Walks the core's range [begin, end) in work order, as aicpu_attention_core does, and reads
 * only what it does (live requests' lengths, the block-table columns of its blocks, each
 * checked before use).
 * Returns:
 *   AICPU_TILING_OK             the core's segments are written
 *   the tiling's status         when it is not AICPU_TILING_OK; nothing is read or written
 *   AICPU_ATTENTION_E_ARGS      bad arguments (aicpu_mla_params_check, core, dtype, NULL
 *                               tensors); nothing is read or written
 *   AICPU_ATTENTION_E_TILING    the buffer is not a tiling for these params and flags, or the
 *                               lengths differ from those it was planned from; the core stops
 *                               at the first inconsistent segment
 *   AICPU_ATTENTION_E_BLOCK_ID  some segment's block-table entries are out of range: its rows
 *                               are zeros (a piece: zeros with lse = +inf, which makes the
 *                               combine zero the whole unit), the others are computed
 *     for (c = 0; c < params.num_cores; c++) status |= aicpu_mla_core(&params, 512, tiling, c,
 *         AICPU_TILING_CAUSAL, AICPU_ATTENTION_BF16, scale, qn, qp, kvc, kpe, nblk, bt, cu, kv,
 *         out, po, pl);
 */
int aicpu_mla_core(const aicpu_tiling_params *params, int32_t kv_lora_rank, const int32_t *tiling,
                   int32_t core, uint32_t flags, int32_t dtype, float scale, const void *q_nope,
                   const void *q_pe, const void *kv_c_cache, const void *k_pe_cache,
                   int32_t num_blocks, const int32_t *block_table, const int32_t *cu_seqlens_q,
                   const int32_t *seqlens_kv, void *out, float *partial_out,
                   float *partial_lse);

/*
 * aicpu_mla_finalize: the combine step of an MLA layer, run once after every core: merges the
 * pieces of every combine record into out ([max_tokens][H][L]) and zeroes the padding rows;
 * zeroes every row when the tiling is not OK. It is aicpu_attention_finalize (no sinks) on a
 * copy of params whose head_dim is kv_lora_rank, which is the MLA partial layout.
 * Returns what aicpu_attention_finalize returns; AICPU_ATTENTION_E_ARGS (nothing written) when
 * aicpu_mla_params_check fails.
 *     status = aicpu_mla_finalize(&params, 512, tiling, AICPU_ATTENTION_BF16, cu, out, po, pl);
 */
int aicpu_mla_finalize(const aicpu_tiling_params *params, int32_t kv_lora_rank,
                       const int32_t *tiling, int32_t dtype, const int32_t *cu_seqlens_q,
                       void *out, const float *partial_out, const float *partial_lse);

#ifdef __cplusplus
}
#endif

#endif /* AICPU_ATTENTION_MLA_REF_H */
