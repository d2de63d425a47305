/*
 * aicpu_tiling.h -- attention tiling computed on the device, from lengths in device memory.
 *
 * This header is the documentation and the ABI. The same C99 source builds for the host
 * (cffi, tests, the CPU backend) and for the Ascend AI-CPU (both CANN programming models).
 *
 * WHAT IT DOES
 *   Given static parameters fixed at graph capture (aicpu_tiling_params) and the dynamic
 *   per-step inputs cu_seqlens_q[batch + 1], seqlens_kv[batch] and a step epoch,
 *   aicpu_tiling_plan()
 *   validates the inputs and writes a fixed-size tiling into a caller-owned buffer: which
 *   emulated or real AI Core does which part of the attention work, where split-KV pieces
 *   put their partial results, and what the combine step must merge.
 *
 * THE WORK ORDER (head-major)
 *   Work is laid out in one linear order over units and kv blocks:
 *       kv head h (0..num_kv_heads-1), request r (0..batch-1), query tile t, kv block k.
 *   A unit is (r, h, t): the query tokens [t*q_tile, min((t+1)*q_tile, q_len)) of request r
 *   times the group = num_q_heads / num_kv_heads query heads sharing kv head h (GQA). Its
 *   rows = tokens * group. When causal, the query rows are the last q_len positions of the
 *   KV: the unit's rows are the absolute positions [p0, p1) with
 *       p0 = kv_len - q_len + t*q_tile,   p1 = kv_len - q_len + min((t+1)*q_tile, q_len).
 *   A unit reads the kv positions [kv_begin, kv_end) of its request, where
 *       kv_end   = p1 when causal, kv_len otherwise;
 *       kv_begin = max(0, p0 - W + 1) with a sliding window W = params.sliding_window > 0
 *                  (ABI v5; the window start of the unit's first row), 0 otherwise.
 *   With a window W, a row at position p sees the keys j with p - W < j <= p (W keys, the
 *   model's definition: Hugging Face's sliding-window masks, vLLM's FlashAttention path with
 *   window (W - 1, 0)); a window needs causal attention. The consumers mask, per row, the keys
 *   of the unit's blocks that lie outside the row's window.
 *   The kv positions are read in kv blocks of block_size tokens (the paged KV cache's block):
 *   the unit's blocks are the block-table columns [first, last) with
 *       first = floor(kv_begin / block_size),   last = ceil(kv_end / block_size),
 *   so a unit has last - first blocks (first = 0 without a window). Requests with q_len == 0
 *   (padded slots) have no units.
 *
 * THE COST MODEL (all integers; the weights are static parameters with documented defaults)
 *   block cost   w(rows) = ceil(block_size / 16) * (cost_kv_load + cost_qk_tile * ceil(rows / 16))
 *                  loading 16 kv tokens (K and V) costs cost_kv_load; each 16x16 tile of
 *                  scores (QK^T, softmax, PV) costs cost_qk_tile. Decode is load bound
 *                  (rows = group <= 16); prefill tiles grow with rows.
 *   segment cost cost_segment: the fixed overhead of one contiguous piece of a unit on one
 *                  core (load the query tile, init and write the output or partial, plus
 *                  its share of the combine). FlashMLA's F, FIA V3's per-row constant.
 *   unit cost    cost_segment + blocks * w(rows), blocks = last - first (see THE WORK ORDER):
 *                  a window counts only the blocks it reads (a window of 128 over a 32k
 *                  context is one or two blocks of work, not 256).
 *   W, the total cost, is the sum of unit costs. A core's cost is the sum of its segments'.
 *
 * THE PARTITION (deterministic; one O(batch) pass, then O(log((cost_segment + w) / g))
 * probes of O(parts * log(batch)) unit searches each, g as below; kv heads and query tiles
 * are handled arithmetically, never walked. A window keeps these bounds: a causal request's
 * windowed block count over its first k tiles is a difference of two floor sums, O(log
 * block_size) each, and a decode request's is ceil(kv/bs) - floor(max(0, kv - W) / bs), O(1))
 *   Units occupy consecutive intervals of a position axis [0, W) in work order: unit u
 *   occupies [U, U + cost_segment + blocks * w). Legal cut positions are unit starts and the
 *   block boundaries inside a unit, U + cost_segment + k * w for 1 <= k < blocks (a piece
 *   always holds at least one block). A core takes a range [s, e) of legal cuts; a core whose
 *   start is inside a unit (a continuation piece) pays cost_segment once more.
 *   Every kv head has the same units (lengths do not depend on the head), so each head's
 *   work is one interval of cost W_h = W / H, head h on [h * W_h, (h + 1) * W_h).
 *   Which cores take what:
 *     - P a multiple of H (Q = P / H cores per head, as FlashMLA's per-head grid): cores
 *       h*Q .. h*Q + Q - 1 take head h, and every head is cut at the same offsets: the
 *       min-max partition of one head's interval [0, W_h) into Q ranges.
 *     - otherwise: the min-max partition of [0, W) into P ranges.
 *   The min-max of an interval into n ranges: greedy filling with budget X lets each core
 *   take work up to X and stop at the last legal cut that fits, a core that cannot take a
 *   whole block stalls, and the work fits when it is placed on at most n cores (cores left
 *   over are idle at the interval's end). X is the smallest budget that fits. Greedy filling
 *   is optimal for a given X (starting further along never costs more), so this is the best
 *   partition these cuts allow: the busiest core costs the least possible. Every core's cost
 *   is a sum of segment and block costs, so X is a multiple of
 *   g = gcd(cost_segment, ceil(block_size / 16)), and X lies between the interval's cost
 *   over n and the nearest-cut bound below, so the bisection needs few probes.
 *   Bound: cuts aimed at equal cumulative cost (B = ceil((W + (n - 1) * cost_segment) / n)
 *   per range, each cut snapped to the nearest legal one) leave every range within one
 *   segment and one block of B; the min-max is never worse, so the busiest core costs at most
 *       W / P + 2 * cost_segment + w_max + 1,
 *   one segment and one block above the ideal W / P + cost_segment.
 *   Each cut inside a unit adds one segment: segments <= units + P - 1.
 *
 * THE BUFFER (int32 words; little-endian on every Ascend and host target we build for)
 *   [0, 24)                      header, see AICPU_TILING_HDR_*; words 17..23 are 0
 *   [24, 24 + 12 P)              core table: P records of 12 words, AICPU_TILING_CORE_*
 *   next 6 (P - 1) words         combine table: one record per split unit, AICPU_TILING_COMB_*
 *   then padding to a multiple of 16 words (64 bytes).
 *   Every word of the buffer is written on every call (success or input error), so two
 *   calls with equal inputs give byte-identical buffers.
 *
 *   Core record: [begin_r, begin_h, begin_t, begin_k, end_r, end_h, end_t, end_k,
 *                 first_slot, last_slot, num_segments, cost]. begin and end are positions
 *   in the work order, end exclusive, compared lexicographically in work order, that is as
 *   (h, r, t, k) (the words keep the r, h, t, k layout). k is an absolute block-table column
 *   (ABI v5), in [first, last) of the unit. A position at a unit boundary names the start of
 *   the next unit in work order (k = that unit's first): the next query tile, else the next
 *   request with q_len > 0 under the same head, else the first such request under the next
 *   head; at the end of the work it is (0, num_kv_heads, 0, 0). A core whose end names the
 *   unit of its last segment stops inside it, at column end_k; otherwise its last segment
 *   runs to its unit's last column. Without a window first = 0, so a consumer that reads k
 *   as absolute serves both v4 and v5 tilings. An idle core has begin == end.
 *   first_slot / last_slot are the partial slots of the core's first / last segment when
 *   that segment is a piece of a split unit, else -1.
 *   A segment that is the whole unit writes its output rows directly; a piece writes its
 *   partial output and log-sum-exp to its slot and the combine step merges them.
 *
 *   Combine record: [request, kv_head, q_tile, first_slot, num_pieces, 0]. Pieces of one
 *   unit have consecutive slots in work order.
 *
 *   The epoch word (AICPU_TILING_HDR_EPOCH) echoes the epoch given to aicpu_tiling_plan(),
 *   whatever the status. The host writes a new epoch beside each step's lengths; a consumer
 *   that reads the lengths and the tiling of one step compares the two and treats a
 *   mismatch like a failed status (no work, zero output). This is how a tiling that was not
 *   recomputed for this step (a captured AI-CPU task that a graph replay did not re-run)
 *   is detected instead of being used. The header is 24 words so that the core table
 *   starts 32-byte aligned, the unit of AI Core data moves.
 *
 *   Partial workspace (aicpu_tiling_workspace_bytes): slots <= 2 (P - 1), each
 *   q_tile * group * (head_dim + 1) float32 values: partial_out [slots][q_tile][group][dim]
 *   followed by partial_lse [slots][q_tile][group].
 *
 * VALIDATION (docs/design.md, section 3: stricter where it must be, looser than FIA where safe)
 *   Before any input: E_PARAMS when aicpu_tiling_params_check fails or when
 *   params.sliding_window > 0 and flags lack AICPU_TILING_CAUSAL (then only the header is
 *   written, see aicpu_tiling_plan; the window does not change any input check).
 *   cu_seqlens_q[batch] < max_tokens is valid: the rows past it are padding. Each invalid
 *   class has its own status; the header names the first offending request in request
 *   order and the offending value and limit; the core table assigns no work. The kernel
 *   reads cu_seqlens_q[0..batch] and seqlens_kv[0..batch-1] only, and only when
 *   0 <= batch <= max_batch; it writes only inside the buffer.
 *   Order: E_BATCH first (request -1, value batch, limit max_batch; nothing is read), then
 *   E_QUERY_START (request 0, value cu_seqlens_q[0], limit 0; checked even when batch is 0),
 *   then each live request r in turn (see TRAILING PADDING), its checks in status-code
 *   order, where q_len is
 *   cu_seqlens_q[r+1] - cu_seqlens_q[r]:
 *       E_QUERY_DECREASING  value cu_seqlens_q[r+1], limit cu_seqlens_q[r]
 *       E_QUERY_OVERFLOW    value cu_seqlens_q[r+1], limit max_tokens
 *       E_KV_NEGATIVE       value seqlens_kv[r],     limit 0
 *       E_KV_SHORT          value seqlens_kv[r],     limit q_len          (causal only)
 *       E_KV_CAPACITY       value seqlens_kv[r],     limit max_blocks_per_req * block_size
 *       E_KV_EMPTY          value 0,                 limit 1              (not causal, q_len > 0)
 *   A request with q_len == 0 is valid with any kv length in [0, capacity], and gets no
 *   work. On an input error every core is idle at (0, 0, 0, 0) with slots -1, and the
 *   combine table is zero.
 *
 * TRAILING PADDING (ABI v4)
 *   Before anything else is read, the slots after the last request whose seqlens_kv is not
 *   0 are dropped: the live batch is batch less its trailing kv_len == 0 slots, and only
 *   cu_seqlens_q[0..live] and seqlens_kv[0..batch-1] are read. Those slots are padding
 *   whatever their query offsets (vLLM-Ascend's FULL_DECODE_ONLY batches pad with slots of
 *   q_len = the uniform decode length and kv_len 0, and its FIA dummy request, which takes
 *   the padding tokens, has kv_len 0 in the device buffer): they are not validated, their
 *   query rows lie past cu_seqlens_q[live] and are written as zeros like every padding row.
 *   The header's BATCH is the live batch and NUM_TOKENS is cu_seqlens_q[live]. A real
 *   request always has kv_len >= 1 (causal: kv_len >= q_len; not causal: E_KV_EMPTY), so no
 *   live request is lost. A kv_len == 0 slot before a live request is validated as before.
 *
 * FREESTANDING BUILDS
 *   The kernel calls no library function. Build with -std=c99 -pedantic -ffreestanding.
 */
#ifndef AICPU_TILING_H
#define AICPU_TILING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AICPU_TILING_MAGIC 0x4C495441 /* "ATIL" read as little-endian int32 */
#define AICPU_TILING_VERSION 5 /* 2: the epoch word, a 24-word header; 3: head-major order,
                                  * no split prefix; 4: trailing kv_len == 0 slots are padding;
                                  * 5: params.sliding_window (was reserved[0]), kv block words
                                  * of core records are absolute block-table columns */

/* Status codes. 0 is success; every other value is one class of failure. */
#define AICPU_TILING_OK 0
#define AICPU_TILING_E_PARAMS 1           /* static parameters out of range */
#define AICPU_TILING_E_BUFFER 2           /* buffer NULL, misaligned or too small */
#define AICPU_TILING_E_BATCH 3            /* batch < 0 or batch > max_batch */
#define AICPU_TILING_E_QUERY_START 4      /* cu_seqlens_q[0] != 0 */
#define AICPU_TILING_E_QUERY_DECREASING 5 /* cu_seqlens_q[r+1] < cu_seqlens_q[r] */
#define AICPU_TILING_E_QUERY_OVERFLOW 6   /* cu_seqlens_q[r+1] > max_tokens */
#define AICPU_TILING_E_KV_NEGATIVE 7      /* seqlens_kv[r] < 0 */
#define AICPU_TILING_E_KV_SHORT 8         /* causal and seqlens_kv[r] < q_len */
#define AICPU_TILING_E_KV_CAPACITY 9      /* seqlens_kv[r] > max_blocks_per_req * block_size */
#define AICPU_TILING_E_KV_EMPTY 10        /* not causal, q_len > 0 and seqlens_kv[r] == 0 */
#define AICPU_TILING_NUM_STATUS 11

/* Flags for aicpu_tiling_plan(). */
#define AICPU_TILING_CAUSAL 1

/* Header word indices. */
#define AICPU_TILING_HDR_MAGIC 0
#define AICPU_TILING_HDR_VERSION 1
#define AICPU_TILING_HDR_STATUS 2
#define AICPU_TILING_HDR_BAD_REQUEST 3  /* first offending request, -1 if none or global */
#define AICPU_TILING_HDR_BAD_VALUE 4    /* the offending value */
#define AICPU_TILING_HDR_BAD_LIMIT 5    /* the limit it broke (see aicpu_tiling_strerror) */
#define AICPU_TILING_HDR_BATCH 6        /* live batch: as given, less trailing padding */
#define AICPU_TILING_HDR_NUM_TOKENS 7   /* cu_seqlens_q[batch]: real query tokens */
#define AICPU_TILING_HDR_NUM_CORES 8    /* P */
#define AICPU_TILING_HDR_NUM_UNITS 9    /* (request, kv head, query tile) units */
#define AICPU_TILING_HDR_NUM_SEGMENTS 10
#define AICPU_TILING_HDR_NUM_SLOTS 11   /* partial slots used */
#define AICPU_TILING_HDR_NUM_COMBINE 12 /* split units (combine records) */
#define AICPU_TILING_HDR_MAX_CORE_COST 13 /* saturated at INT32_MAX */
#define AICPU_TILING_HDR_TOTAL_COST 14    /* W, saturated at INT32_MAX */
#define AICPU_TILING_HDR_FLAGS 15
#define AICPU_TILING_HDR_EPOCH 16     /* the epoch argument, echoed */
#define AICPU_TILING_HDR_WORDS 24     /* words 17..23 reserved, written 0 */

/* Core record word indices. */
#define AICPU_TILING_CORE_BEGIN 0 /* 4 words: request, kv head, query tile, kv block */
#define AICPU_TILING_CORE_END 4   /* 4 words, exclusive */
#define AICPU_TILING_CORE_FIRST_SLOT 8
#define AICPU_TILING_CORE_LAST_SLOT 9
#define AICPU_TILING_CORE_NUM_SEGMENTS 10
#define AICPU_TILING_CORE_COST 11 /* saturated at INT32_MAX */
#define AICPU_TILING_CORE_WORDS 12

/* Combine record word indices. */
#define AICPU_TILING_COMB_REQUEST 0
#define AICPU_TILING_COMB_KV_HEAD 1
#define AICPU_TILING_COMB_Q_TILE 2
#define AICPU_TILING_COMB_FIRST_SLOT 3
#define AICPU_TILING_COMB_NUM_PIECES 4
#define AICPU_TILING_COMB_WORDS 6 /* the last word is padding, always 0 */

/* Parameter limits, chosen so that every cost fits in int64 with room to spare. */
#define AICPU_TILING_MAX_HEADS 1024
#define AICPU_TILING_MAX_HEAD_DIM 1024
#define AICPU_TILING_MAX_BLOCK_SIZE 4096
#define AICPU_TILING_MAX_BATCH (1 << 20)
#define AICPU_TILING_MAX_TOKENS (1 << 22)
#define AICPU_TILING_MAX_KV_TOKENS (1 << 26) /* max_blocks_per_req * block_size */
#define AICPU_TILING_MAX_CORES 1024
#define AICPU_TILING_MAX_TILE_ROWS 4096 /* q_tile * group */
#define AICPU_TILING_MAX_COST_WEIGHT 1024

/* Default cost weights, used by the Python layer when the caller gives none. */
#define AICPU_TILING_DEFAULT_COST_KV_LOAD 4
#define AICPU_TILING_DEFAULT_COST_QK_TILE 1
#define AICPU_TILING_DEFAULT_COST_SEGMENT 32

/* Static parameters, fixed at capture. 16 int32 words, no padding. A tiling plans one window:
 * layers with different windows need one params struct and one tiling buffer each. */
typedef struct aicpu_tiling_params {
    int32_t num_q_heads;        /* query heads, a multiple of num_kv_heads */
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t block_size;         /* kv tokens per paged-cache block */
    int32_t max_batch;          /* requests the buffers hold */
    int32_t max_tokens;         /* T: query rows (query dim 0) */
    int32_t max_blocks_per_req; /* block-table columns */
    int32_t num_cores;          /* P: AI Cores the attention kernel is launched on */
    int32_t q_tile;             /* query tokens per unit */
    int32_t cost_kv_load;       /* see THE COST MODEL */
    int32_t cost_qk_tile;
    int32_t cost_segment;
    int32_t sliding_window;     /* W: 0 = none, else a row at p sees keys (p - W, p]; needs
                                 * AICPU_TILING_CAUSAL (ABI v5, was reserved[0]) */
    int32_t reserved[3];        /* must be 0 */
} aicpu_tiling_params;

/* Compile-time bound on the buffer size in bytes, for static allocation. */
#define AICPU_TILING_BYTES_BOUND(num_cores)                                              \
    ((size_t)4 * ((size_t)AICPU_TILING_HDR_WORDS + (size_t)AICPU_TILING_CORE_WORDS * (num_cores) \
                  + (size_t)AICPU_TILING_COMB_WORDS * (num_cores) + 15))

/*
 * aicpu_tiling_params_check: AICPU_TILING_OK when every field is in range, else
 * AICPU_TILING_E_PARAMS. Ranges: heads, head_dim, block_size, max_batch, max_tokens,
 * max_blocks_per_req, num_cores, q_tile >= 1 and at most the AICPU_TILING_MAX_* limits;
 * num_q_heads % num_kv_heads == 0; q_tile * group <= AICPU_TILING_MAX_TILE_ROWS;
 * cost weights in [0, AICPU_TILING_MAX_COST_WEIGHT] with cost_kv_load + cost_qk_tile >= 1;
 * 0 <= sliding_window <= AICPU_TILING_MAX_KV_TOKENS; reserved words 0. (That a window needs
 * AICPU_TILING_CAUSAL is checked by aicpu_tiling_plan, which sees the flags.)
 *     if (aicpu_tiling_params_check(&p) != AICPU_TILING_OK) ...
 */
int aicpu_tiling_params_check(const aicpu_tiling_params *params);

/*
 * aicpu_tiling_bytes: the tiling buffer size in bytes for valid params (a multiple of 64),
 * or 0 when params are invalid.
 */
size_t aicpu_tiling_bytes(const aicpu_tiling_params *params);

/*
 * aicpu_tiling_max_slots: the number of partial slots the workspace must hold,
 * 2 * (num_cores - 1); 0 when params are invalid.
 */
int32_t aicpu_tiling_max_slots(const aicpu_tiling_params *params);

/*
 * aicpu_tiling_workspace_bytes: bytes of the split partials workspace (see THE BUFFER),
 * or 0 when params are invalid or no split is possible (num_cores == 1).
 */
size_t aicpu_tiling_workspace_bytes(const aicpu_tiling_params *params);

/*
 * aicpu_tiling_plan: validate the inputs and write the tiling.
 *   params        static parameters (checked on every call; cheap)
 *   cu_seqlens_q  [batch + 1] int32 query offsets (query_start_loc), cu_seqlens_q[0] == 0
 *   seqlens_kv    [batch] int32 kv lengths including this step's tokens
 *   batch         requests in the arrays, 0 <= batch <= max_batch; slots with q_len == 0
 *                 are padding and get no work, and so are the trailing slots with
 *                 kv_len == 0 whatever their q_len (see TRAILING PADDING)
 *   epoch         any value; written to the header's epoch word on every written header
 *                 (see THE BUFFER), never interpreted
 *   flags         AICPU_TILING_CAUSAL or 0
 *   buffer        caller-owned, 4-byte aligned, at least aicpu_tiling_bytes(params) bytes
 *   buffer_bytes  its size
 * Returns AICPU_TILING_OK, or the status also written to the header. On
 * AICPU_TILING_E_BUFFER nothing is written; on AICPU_TILING_E_PARAMS (params out of range, or
 * params.sliding_window > 0 without AICPU_TILING_CAUSAL) only the header is written, and only
 * when the buffer holds it. On an input error the whole buffer is
 * written: the header names the offence and every core is idle.
 *     status = aicpu_tiling_plan(&p, cu, kv, batch, epoch, AICPU_TILING_CAUSAL, buf, sizeof buf);
 */
int aicpu_tiling_plan(const aicpu_tiling_params *params, const int32_t *cu_seqlens_q,
                      const int32_t *seqlens_kv, int32_t batch, int32_t epoch, uint32_t flags,
                      void *buffer, size_t buffer_bytes);

/* aicpu_tiling_strerror: a static message for a status code; never NULL. */
const char *aicpu_tiling_strerror(int status);

#ifdef __cplusplus
}
#endif

#endif /* AICPU_TILING_H */
