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
 * BUILD. attention_ref.c is strict ISO C99 (-std=c99 -pedantic -Wall -Wextra -Werror clean), no
 * extensions; link it with attention_x86.c, which holds the x86 SIMD variants of the inner
 * kernels (GCC/Clang target attributes and intrinsics; on other architectures it compiles to
 * nothing). No -march flag is needed: the variant is chosen at run time (see INSTRUCTION-SET
 * VARIANTS below; tools/bench_attention.py measures each).
 *
 * TENSORS (all row-major and contiguous, but for the caches' block axis; "dtype" is the storage
 * type of query, caches and out)
 *   query        [max_tokens][num_q_heads][head_dim]
 *   key_cache    [num_blocks][block_size][num_kv_heads][head_dim]
 *   value_cache  [num_blocks][block_size][num_kv_heads][head_dim]; int8 caches may instead be
 *                [num_blocks][num_kv_heads][head_dim / 32][block_size][32] (NZ, see
 *                aicpu_attention_kv_int8.layout)
 *                Each cache block is one dense run of block_size * num_kv_heads * head_dim
 *                elements; block b of the key cache starts key_block_stride * b elements in
 *                (value_block_stride for the value cache): the block's own size when the cache
 *                is contiguous, more when blocks lie apart. vLLM 0.30 + vLLM-Ascend 0.30.0rc2
 *                hand a full-attention layer (bf16/fp16 ND, and C8's int8 NZ view of it) K and
 *                V views of one allocation with the K and V pages of a block side by side:
 *                both strides 2 * block_size * num_kv_heads * head_dim, V starting one page
 *                after K (vllm_ascend/worker/model_runner_v1.py:5720-5744, v2/attn_utils.py:
 *                687-719). The caches are read in place with those strides, never copied.
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
 *       out = sum_j softmax_j(s_j) v_j,   s_j = scale * q . k_j
 *   With a logits soft cap C (soft_cap > 0, finite) every score is capped before the softmax,
 *   s_j = C * tanh(scale * q . k_j / C), as vLLM's FlashAttention, FlashInfer and Triton paths
 *   define logits_soft_cap (Gemma 2): the cap applies after the scale. Off (soft_cap <= 0, NaN
 *   or +inf, the limit C -> inf being the identity): the scores are not touched, and the
 *   results are bit-for-bit those of a build without the soft cap.
 *   A piece of a split unit covers only some kv blocks; with s_j the (capped) score it stores,
 *   per row, the normalised partial output o_p = sum_j e^(s_j - m) v_j / l and the natural-log
 *   lse_p = m + ln(l), l = sum_j e^(s_j - m), m = max_j s_j, over the positions the piece covers
 *   and the row sees (o_p = 0, lse_p = -inf when it sees none; +inf marks a poisoned piece).
 *   The finalize step merges the pieces: out = sum_p e^(lse_p - M) o_p / sum_p e^(lse_p - M),
 *   M = max_p lse_p (the soft cap changes nothing there). Rows of a partial slot are
 *   [token in tile][g].
 *   With attention sinks (gpt-oss; sinks != NULL) q head hq's softmax gains one term in its
 *   denominator and none in its numerator: out = sum_j e^(s_j - m) v_j / (e^(sink[hq] - m) +
 *   sum_j e^(s_j - m)), m = max(max_j s_j, sink[hq]) (vLLM's `sinks`: its Triton unified
 *   attention starts the online softmax at M = sink, L = 1 in a row's first segment only). The
 *   sink enters each row exactly once: a whole unit adds it when it normalises its row; pieces
 *   store lse_p without it and finalize merges the sink as one more piece (lse = sink[hq], o = 0).
 *   The soft cap caps the scores, never the sink. A row that sees no key stays zero.
 *   With a sliding window W (sliding_window > 0, causal only) the query row at position
 *   p = kv_len - q_len + i sees only the keys j with p - W < j <= p: W keys, or p + 1 when
 *   p < W (Hugging Face's masks; vLLM's FlashAttention window (W - 1, 0)). Rows of one unit
 *   start their windows at different positions, so the mask is per row. A unit reads no kv
 *   block below first = floor(max(0, p0 - W + 1) / block_size), p0 its first row's position,
 *   whatever blocks the tiling gives its segments: an ABI v4 tiling knows no window and starts
 *   every unit at block 0; from ABI v5 a unit's blocks are [first, last), in absolute
 *   block-table columns. Both work: where a block index alone is ambiguous (0 < k <= first)
 *   the core record tells a cut from a unit's start (a continuation has a slot; an end there
 *   is a cut only while segments remain). A piece left with no block in the window writes
 *   lse = -inf and a zero output, which finalize merges with weight 0. Sinks and the soft cap
 *   combine with it.
 *
 * ACCURACY. fp32 accumulation, an exp accurate to about 1e-7 relative, outputs rounded to the
 * storage dtype to nearest even: relative error ~1e-7 for fp32 storage, one rounding of the
 * output for fp16/bf16; the soft cap uses libm's tanhf (about 1 ulp). Results are
 * deterministic: the same inputs give the same bits whatever the order or concurrency of the
 * core calls.
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
/* AICPU_ATTENTION_E_ISA (35) is returned only by aicpu_attention_set_isa, see below. */

/*
 * The int8 KV cache (vLLM's kv_cache_dtype "int8"; vLLM-Ascend's C8). With kv_int8 != NULL the
 * caches hold int8 values (TENSORS, with int8 for dtype) and K value x of kv head h, dim d
 * means (x - k_offset[h][d]) * k_scale[h][d] (V likewise): per-channel scale and offset, each
 * fp32 [num_kv_heads][head_dim]. That is vLLM-Ascend 0.30.0rc2's convention
 * (vllm_ascend/attention/attention_v1.py: _quantize_kv_to_int8 stores
 * clamp(round(x / scale + offset), -128, 127), the dense path dequantises (x - offset) * scale;
 * its FIA path passes the scale only, which a zero offset covers). The kernel dequantises in
 * fp32 and accumulates in fp32; query, output and dtype are unchanged. All four pointers must
 * be given (AICPU_ATTENTION_E_ARGS otherwise). NULL: the caches are dtype, and the results are
 * bit-for-bit those of a build without the int8 cache.
 */
/*
 * layout: how the int8 caches lie in memory (both caches alike).
 *   AICPU_ATTENTION_KV_ND (0, what a zero-initialised struct has): as TENSORS,
 *       [num_blocks][block_size][num_kv_heads][head_dim].
 *   AICPU_ATTENTION_KV_NZ: vLLM-Ascend's C8 cache, [num_blocks][num_kv_heads][head_dim / 32]
 *       [block_size][32]: token t of block b, kv head h, dim d at element
 *       (((b * num_kv_heads + h) * (head_dim / 32) + d / 32) * block_size + t) * 32 + d % 32
 *       (vllm-ascend 0.30.0rc2 vllm_ascend/attention/attention_v1.py,
 *       AscendC8AttentionBackendImpl._nz_5d_view, written by torch_npu.npu_scatter_pa_kv_cache).
 *       Needs head_dim % 32 == 0. The dequantised rows, hence the results, are bit-for-bit those
 *       of the same values in the ND layout.
 * Any other value, or NZ with head_dim % 32 != 0, is AICPU_ATTENTION_E_ARGS.
 */
#define AICPU_ATTENTION_KV_ND 0
#define AICPU_ATTENTION_KV_NZ 1
#define AICPU_ATTENTION_KV_NZ_WIDTH 32 /* values of one NZ part: dims 32 k .. 32 k + 31 */

typedef struct {
    const float *k_scale, *k_offset, *v_scale, *v_offset; /* [num_kv_heads][head_dim] each */
    int32_t layout; /* AICPU_ATTENTION_KV_ND or AICPU_ATTENTION_KV_NZ */
} aicpu_attention_kv_int8;

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
 *   soft_cap      logits soft cap C (WHAT A ROW COMPUTES): > 0 and finite caps every score to
 *                 C * tanh(s / C); 0, negative, NaN or +inf: off
 *   sinks         NULL (off: the results are bit-for-bit those of a build without sinks) or
 *                 num_q_heads fp32 attention-sink logits (WHAT A ROW COMPUTES); whole units
 *                 add the sink to their denominator, pieces of split units do not (finalize
 *                 does, given the same array)
 *   sliding_window  0 (off) or W >= 1: each row sees its last W kv positions (WHAT A ROW
 *                 COMPUTES); only with AICPU_TILING_CAUSAL. Block-table entries below a unit's
 *                 window are neither read nor checked
 *   kv_int8       NULL (the caches are dtype) or the scales and offsets of int8 caches (see
 *                 aicpu_attention_kv_int8): each chunk of K and V rows is dequantised to fp32
 *                 before the variant's kernels read it
 *   query, key_cache, value_cache, num_blocks, block_table, cu_seqlens_q, seqlens_kv
 *                 see TENSORS; num_blocks is the caches' dim 0
 *   key_block_stride, value_block_stride
 *                 elements (of the cache's type: dtype, or int8) from the start of one cache
 *                 block to the next, each >= block_size * num_kv_heads * head_dim (that value:
 *                 a contiguous cache; see TENSORS)
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
 *   AICPU_ATTENTION_E_ARGS      bad arguments (sliding_window < 0, or > 0 without
 *                               AICPU_TILING_CAUSAL; kv_int8 with a NULL pointer, an unknown
 *                               layout, or NZ with head_dim % 32 != 0; a block stride below
 *                               a block's elements); nothing is read or written
 *   AICPU_ATTENTION_E_TILING    the buffer is not a tiling for these params and flags, or the
 *                               lengths differ from those it was planned from; the core stops
 *                               at the first inconsistent segment
 *   AICPU_ATTENTION_E_BLOCK_ID  some segment's block-table entries are out of range: that
 *                               segment's rows are written as zeros (a piece writes zeros with
 *                               lse = +inf, which makes finalize zero the whole unit), the other
 *                               segments are computed, and this status is returned
 *     for (c = 0; c < params.num_cores; c++) status |= aicpu_attention_core(&params, tiling, c,
 *         AICPU_TILING_CAUSAL, AICPU_ATTENTION_BF16, scale, 0.0f, NULL, 0, NULL, q, k, v, nblk,
 *         page, page, bt, cu, kv, out, po, pl);   (page = block_size * num_kv_heads * head_dim:
 *                                                 contiguous caches)
 */
int aicpu_attention_core(const aicpu_tiling_params *params, const int32_t *tiling, int32_t core,
                         uint32_t flags, int32_t dtype, float scale, float soft_cap,
                         const float *sinks, int32_t sliding_window,
                         const aicpu_attention_kv_int8 *kv_int8, const void *query,
                         const void *key_cache, const void *value_cache,
                         int32_t num_blocks, int64_t key_block_stride,
                         int64_t value_block_stride, const int32_t *block_table,
                         const int32_t *cu_seqlens_q, const int32_t *seqlens_kv,
                         void *out, float *partial_out,
                         float *partial_lse);

/*
 * SIBLING CORES. When num_cores P is a multiple of num_kv_heads H, the tiling gives head h to
 * cores h*Q .. h*Q+Q-1 (Q = P / H) and cuts every head at the same offsets (aicpu_tiling.h,
 * THE PARTITION): core j + h*Q's record is core j's with the kv head moved to h and its slots
 * moved by h * (slots of one head). Cores j, j+Q, ..., j+(H-1)Q are the sibling set j. Run one
 * by one, each reads head_dim values per kv token at a stride of H * head_dim; run together,
 * the set reads each token's K and V row ([token][kv head][dim]) as one contiguous run again.
 *
 * aicpu_attention_num_sibling_sets: Q = P / H when P % H == 0, else P (every set is one core);
 * 0 when params are NULL or invalid. The sets 0..Q-1 hold every core exactly once.
 *
 * aicpu_attention_core_siblings: the work of every core of sibling set `first_core`
 * (0 <= first_core < aicpu_attention_num_sibling_sets(params)); the other arguments, tensors
 * and outputs are aicpu_attention_core's.
 *   Fused when P % H == 0, H > 1, the tiling is OK for these params, flags and lengths, every
 *   sibling's record is core first_core's moved to its head as above (checked word by word,
 *   slots of one head = the header's AICPU_TILING_HDR_NUM_SLOTS / H), and core first_core's
 *   range checks out (walked once without computing first): core first_core's segments are
 *   walked once; each whole unit runs for all H heads, up to as many heads per pass as the
 *   scratch holds (KV_FLOATS / head_dim, and MAX_ROWS query rows); each piece of a split unit
 *   runs once per head h with slot first_slot (or last_slot) + h * (slots of one head).
 *   Otherwise (P % H != 0, H == 1, a failed or stale tiling, records that are not copies, any
 *   inconsistency) it calls aicpu_attention_core for each core of the set in order, so it
 *   reads and writes exactly what they would.
 *   Outputs equal those of aicpu_attention_core on each core of the set up to rounding: fusing
 *   changes the kv chunk length and so the order of the online softmax's updates (fp32
 *   accumulation; about 1e-6 relative). Deterministic for a given set.
 * Returns AICPU_ATTENTION_E_ARGS for params invalid or first_core out of range (nothing read or
 * written), else what the per-core loop gives: the first status other than AICPU_TILING_OK
 * in core order (all siblings return the same one when fused), or AICPU_TILING_OK.
 *     for (j = 0; j < aicpu_attention_num_sibling_sets(&params); j++)
 *         if ((s = aicpu_attention_core_siblings(&params, tiling, j, ...)) != 0) status = s;
 */
int32_t aicpu_attention_num_sibling_sets(const aicpu_tiling_params *params);

int aicpu_attention_core_siblings(const aicpu_tiling_params *params, const int32_t *tiling,
                                  int32_t first_core, uint32_t flags, int32_t dtype, float scale,
                                  float soft_cap, const float *sinks, int32_t sliding_window,
                                  const aicpu_attention_kv_int8 *kv_int8, const void *query,
                                  const void *key_cache, const void *value_cache,
                                  int32_t num_blocks, int64_t key_block_stride,
                                  int64_t value_block_stride, const int32_t *block_table,
                                  const int32_t *cu_seqlens_q, const int32_t *seqlens_kv,
                                  void *out, float *partial_out,
                                  float *partial_lse);

/*
 * CORE SPANS. When P is not a multiple of H the tiling cuts the whole work axis into P ranges
 * in head-major order (aicpu_tiling.h, THE PARTITION), so a core holds one or two kv heads of
 * every request and, run alone, reads head_dim values per kv token at a stride of H * head_dim
 * (for fp32 with 32 kv heads, a 4 KiB page per token). Consecutive cores hold consecutive
 * ranges: run together, a span of cores reads each token's K and V rows for all the heads of
 * its range as one contiguous run.
 *
 * aicpu_attention_core_span: the work of cores first_core .. first_core + num_cores - 1
 * (num_cores >= 1, all < P); the other arguments, tensors and outputs are aicpu_attention_core's.
 *   Fused when num_cores > 1, the tiling is OK for these params and flags, no tensor is NULL,
 *   the ranges of the span's non-idle cores join up (each one's end is the next one's begin)
 *   and every one checks out (walked once without computing first): each core's walk then runs
 *   its pieces and its units of multi-tile requests as aicpu_attention_core would, and the
 *   whole units of single-tile requests (decode, short speculative decode) run request by
 *   request over the span's range, the kv heads of a request together, up to as many per pass
 *   as the scratch holds (as for sibling sets). Any P, any H.
 *   Otherwise (num_cores == 1, a failed or stale tiling, ranges that do not join, any
 *   inconsistency) it calls aicpu_attention_core for each core of the span in order, so it
 *   reads and writes exactly what they would.
 *   Outputs equal those of aicpu_attention_core on each core of the span up to rounding (as for
 *   sibling sets: fusing changes the kv chunk length). Deterministic for a given span.
 * Returns AICPU_ATTENTION_E_ARGS for params invalid or a span outside 0..P-1 (nothing read or
 * written), else what the per-core loop gives: the first status other than AICPU_TILING_OK in
 * core order, or AICPU_TILING_OK. Spans that together hold every core once run every core:
 *     for (c = 0; c < params.num_cores; c += n)   (n = P / threads, say, the last one shorter)
 *         if ((s = aicpu_attention_core_span(&params, tiling, c, min(n, P - c), ...)) != 0)
 *             status = s;
 */
int aicpu_attention_core_span(const aicpu_tiling_params *params, const int32_t *tiling,
                              int32_t first_core, int32_t num_cores, uint32_t flags,
                              int32_t dtype, float scale, float soft_cap, const float *sinks,
                              int32_t sliding_window, const aicpu_attention_kv_int8 *kv_int8,
                              const void *query, const void *key_cache,
                              const void *value_cache, int32_t num_blocks,
                              int64_t key_block_stride, int64_t value_block_stride,
                              const int32_t *block_table, const int32_t *cu_seqlens_q,
                              const int32_t *seqlens_kv, void *out, float *partial_out,
                              float *partial_lse);

/*
 * aicpu_attention_finalize: the combine step, run once after every core of the layer.
 *   params, tiling, dtype, out, partial_out, partial_lse   as for aicpu_attention_core
 *   cu_seqlens_q  the query offsets the tiling was planned from (locates a unit's rows)
 *   sinks         NULL or the attention-sink logits the cores were given: each merged row's
 *                 denominator gains its q head's sink, once (a piece with lse = sink, output 0)
 * Merges the pieces of every combine record into its output rows, and writes zeros to the
 * padding rows [num_tokens, max_tokens). When the tiling's status is not OK (or the buffer is
 * not a valid tiling) it writes zeros to ALL max_tokens rows, so a failed step never leaves
 * stale results. partial_out and partial_lse may be NULL when there is no combine record.
 * Returns AICPU_TILING_OK, the tiling's status (after zeroing), AICPU_ATTENTION_E_ARGS (params,
 * dtype or out invalid: nothing written) or AICPU_ATTENTION_E_TILING (after zeroing all rows).
 *     status = aicpu_attention_finalize(&params, tiling, AICPU_ATTENTION_BF16, cu, out, po, pl,
 *                                       NULL);
 */
int aicpu_attention_finalize(const aicpu_tiling_params *params, const int32_t *tiling,
                             int32_t dtype, const int32_t *cu_seqlens_q, void *out,
                             const float *partial_out, const float *partial_lse,
                             const float *sinks);

/*
 * aicpu_attention_set_block_log: test instrumentation of the kv blocks the core calls read.
 *   count  NULL: off (the default). Else every kv block a core, sibling or span call reads is
 *          counted in *count (the caller zeroes it) and, while *count < capacity, appended to
 *          log as 4 int32 (request, kv head, q tile, block-table column); a row block of a
 *          large unit that reads a block again logs it again.
 * Process-wide state, not thread-safe: set it, run the calls one at a time, then set NULL.
 *     aicpu_attention_set_block_log(log, 4096, &n); ...core calls...; set_block_log(NULL, 0, NULL);
 */
void aicpu_attention_set_block_log(int32_t *log, int32_t capacity, int32_t *count);

/* aicpu_attention_strerror: a static message for any status above; never NULL. */
const char *aicpu_attention_strerror(int status);

/*
 * INSTRUCTION-SET VARIANTS. The inner kernels (K.q dot products over a chunk of kv tokens, the
 * exp of the online softmax, the probability-weighted sum of V rows, fp16/bf16 -> fp32) exist
 * in variants; one build runs on any CPU of its architecture and, unless told otherwise, uses
 * the best variant the CPU supports (checked with the compiler's CPU-feature builtins the first
 * time a kernel runs). Variants agree to rounding (FMA contraction and summation order differ);
 * each is deterministic. On non-x86 builds only the portable variant exists. No variant has
 * its own soft cap: the cap is one portable pass over a chunk's scores, between the variant's
 * dot products and its softmax, so every variant caps alike and the SIMD kernels are unchanged.
 *   PORTABLE  plain C99 loops, vectorised by the compiler for the build's baseline ISA
 *   AVX2      AVX2 + FMA + F16C (x86-64, e.g. Haswell, Zen 1 and later)
 *   AVX512    AVX-512 F/BW/VL + FMA + F16C (e.g. Skylake-SP, Ice Lake, Zen 4 and later)
 */
#define AICPU_ATTENTION_ISA_PORTABLE 0
#define AICPU_ATTENTION_ISA_AVX2 1
#define AICPU_ATTENTION_ISA_AVX512 2
#define AICPU_ATTENTION_NUM_ISA 3
#define AICPU_ATTENTION_E_ISA 35 /* variant unknown, or not supported by this build and CPU */

/* aicpu_attention_isa_name: "portable", "avx2", "avx512" for 0..AICPU_ATTENTION_NUM_ISA-1,
 * else NULL. */
const char *aicpu_attention_isa_name(int32_t isa);

/* aicpu_attention_isa_supported: 1 when this build has the variant and this CPU can run it. */
int aicpu_attention_isa_supported(int32_t isa);

/* aicpu_attention_isa_best: the best supported variant (the default). */
int32_t aicpu_attention_isa_best(void);

/* aicpu_attention_isa_active: the variant the next aicpu_attention_core call uses. */
int32_t aicpu_attention_isa_active(void);

/*
 * aicpu_attention_set_isa: use variant `isa` from the next aicpu_attention_core call on (a call
 * already running keeps the variant it started with). Returns AICPU_TILING_OK, or
 * AICPU_ATTENTION_E_ISA (unknown or unsupported variant; the active one is unchanged). Process-
 * wide state: set it before starting concurrent cores, not while they run.
 *     if (aicpu_attention_set_isa(AICPU_ATTENTION_ISA_PORTABLE) != AICPU_TILING_OK) ...
 */
int aicpu_attention_set_isa(int32_t isa);

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
