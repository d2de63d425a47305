/*
 * attention_mla_ref.c -- the reference MLA decode attention (AI Core role); see
 * attention_mla_ref.h.
 *
 * Shape of the work: the core walks its range of the tiling segment by segment in work order
 * (one kv head, so (request, query tile, kv block)). A segment runs in row blocks that fit the
 * scratch; within a row block, in chunks of kv tokens: the chunk's cache rows [kv_c | k_pe]
 * are widened to fp32 once, each row's scores are dot products over L + R values, the online
 * softmax updates once per chunk, and the probability-weighted sum runs over the first L values
 * of the same fp32 rows (V is K's latent part: one read serves both). Plain C loops; the GQA
 * reference's SIMD variants are not used here (its inner kernels take one K and one V row of
 * one width; MLA's key is two tensors and its value a prefix of the key).
 */
#include "attention_mla_ref.h"

#include <math.h>
#include <string.h>

/* Scratch sizes in floats; they bound the stack (AICPU_MLA_STACK_BYTES). Q_FLOATS holds 64
 * query rows of DeepSeek-V3's 576 values (16 heads x 4 MTP tokens, or 64 heads, in one pass
 * over the kv), ACC_FLOATS their 512-wide outputs, KV_FLOATS 32 cache rows. */
#define Q_FLOATS 36864
#define ACC_FLOATS 32768
#define KV_FLOATS 18432
#define MAX_ROWS 64
#define MAX_CHUNK 64
#define LANES 8

typedef char mla_stack_bound_check
    [(4 * (Q_FLOATS + ACC_FLOATS + KV_FLOATS + MAX_CHUNK + 4 * MAX_ROWS) <=
      AICPU_MLA_STACK_BYTES) ? 1 : -1];

/* ------------------------------------------------------------------------------------------ */
/* Storage                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static size_t dtype_bytes(int32_t dtype) { return dtype == AICPU_ATTENTION_FP32 ? 4 : 2; }

/* n values from storage to fp32, times mul (conversions: attention_ref.c's exported ones). */
static void load_values(float *dst, const void *src, int32_t dtype, int32_t n, float mul) {
    int32_t x;
    if (dtype == AICPU_ATTENTION_FP32) {
        const float *s = (const float *)src;
        for (x = 0; x < n; x++) dst[x] = s[x] * mul;
    } else if (dtype == AICPU_ATTENTION_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (x = 0; x < n; x++) dst[x] = aicpu_attention_bf16_to_float(s[x]) * mul;
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (x = 0; x < n; x++) dst[x] = aicpu_attention_half_to_float(s[x]) * mul;
    }
}

static void store_values(void *dst, const float *src, int32_t dtype, int32_t n, float mul) {
    int32_t x;
    if (dtype == AICPU_ATTENTION_FP32) {
        float *o = (float *)dst;
        for (x = 0; x < n; x++) o[x] = src[x] * mul;
    } else if (dtype == AICPU_ATTENTION_BF16) {
        uint16_t *o = (uint16_t *)dst;
        for (x = 0; x < n; x++) o[x] = aicpu_attention_float_to_bf16(src[x] * mul);
    } else {
        uint16_t *o = (uint16_t *)dst;
        for (x = 0; x < n; x++) o[x] = aicpu_attention_float_to_half(src[x] * mul);
    }
}

/* q . k with LANES partial sums, which gcc vectorises without -ffast-math. */
static float dot(const float *q, const float *k, int32_t d) {
    float a[LANES] = {0};
    float t = 0.0f;
    int32_t x, i, dv = d - d % LANES;
    for (x = 0; x < dv; x += LANES)
        for (i = 0; i < LANES; i++) a[i] += q[x + i] * k[x + i];
    for (x = dv; x < d; x++) t += q[x] * k[x];
    for (i = 1; i < LANES; i++) a[0] += a[i];
    return a[0] + t;
}

/* ------------------------------------------------------------------------------------------ */
/* The walk                                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    int32_t r, h, t, k;
} work_pos;

static void read_pos(work_pos *p, const int32_t *w) {
    p->r = w[0];
    p->h = w[1];
    p->t = w[2];
    p->k = w[3];
}

/* The head-major work order compares (h, r, t, k). */
static int pos_less(const work_pos *a, const work_pos *b) {
    if (a->h != b->h) return a->h < b->h;
    if (a->r != b->r) return a->r < b->r;
    if (a->t != b->t) return a->t < b->t;
    return a->k < b->k;
}

typedef struct {
    const aicpu_tiling_params *p;
    int32_t lora, rope, dim, heads, causal, dtype, num_blocks, max_slots;
    float scale;
    const void *q_nope, *q_pe, *kv_c, *k_pe;
    const int32_t *block_table, *cu, *kv;
    void *out;
    float *partial_out, *partial_lse;
} mla_ctx;

typedef struct {
    int32_t q_start, q_len, kv_len;
} request_lens;

/* Request r's lengths, re-checked against the static params (the C load_request of the GQA
 * reference): 0 when they could not have been planned. */
static int load_request(const mla_ctx *c, int32_t r, request_lens *rl) {
    int32_t lo = c->cu[r], hi = c->cu[r + 1], kv = c->kv[r];
    int64_t capacity = (int64_t)c->p->max_blocks_per_req * c->p->block_size;
    if (lo < 0 || hi < lo || hi > c->p->max_tokens || kv < 0 || kv > capacity) return 0;
    if (c->causal ? kv < hi - lo : (hi > lo && kv == 0)) return 0;
    rl->q_start = lo;
    rl->q_len = hi - lo;
    rl->kv_len = kv;
    return 1;
}

static int32_t num_tiles(const mla_ctx *c, const request_lens *rl) {
    return (int32_t)(((int64_t)rl->q_len + c->p->q_tile - 1) / c->p->q_tile);
}

static int32_t unit_blocks(const mla_ctx *c, const request_lens *rl, int32_t t) {
    int32_t kv_end = rl->kv_len;
    if (c->causal) {
        int32_t q_end = (t + 1) * c->p->q_tile;
        kv_end = rl->kv_len - rl->q_len + (q_end < rl->q_len ? q_end : rl->q_len);
    }
    return (int32_t)(((int64_t)kv_end + c->p->block_size - 1) / c->p->block_size);
}

static int blocks_valid(const mla_ctx *c, int32_t r, int32_t kb, int32_t ke) {
    const int32_t *row = c->block_table + (size_t)r * c->p->max_blocks_per_req;
    int32_t b;
    for (b = kb; b < ke; b++)
        if (row[b] < 0 || row[b] >= c->num_blocks) return 0;
    return 1;
}

typedef struct {
    int32_t r, t, kb, ke, slot, ntok;
    request_lens rl;
} segment;

/* Chunk rows [kv_c | k_pe] of n tokens from position `from` of cache block `block`, in fp32. */
static void load_chunk(const mla_ctx *c, float *kbuf, int32_t block, int32_t from, int32_t n) {
    const size_t es = dtype_bytes(c->dtype);
    int32_t j;
    for (j = 0; j < n; j++) {
        size_t token = (size_t)block * c->p->block_size + (size_t)(from + j);
        float *row = kbuf + (size_t)j * c->dim;
        load_values(row, (const char *)c->kv_c + token * c->lora * es, c->dtype, c->lora, 1.0f);
        if (c->rope > 0)
            load_values(row + c->lora, (const char *)c->k_pe + token * c->rope * es, c->dtype,
                        c->rope, 1.0f);
    }
}

/* Rows of a segment are (token in tile, head); a piece writes slot rows in the same order. */
static void write_row(const mla_ctx *c, const segment *sg, int32_t row, const float *acc,
                      float l, float m, int poisoned) {
    int32_t tok = row / c->heads, head = row % c->heads;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (sg->slot < 0) {
        size_t at = ((size_t)(sg->rl.q_start + sg->t * c->p->q_tile + tok) * c->heads + head) *
                    c->lora;
        store_values((char *)c->out + at * dtype_bytes(c->dtype), acc, c->dtype, c->lora, inv);
    } else {
        size_t at = ((size_t)sg->slot * c->p->q_tile + tok) * c->heads + head;
        store_values(c->partial_out + at * c->lora, acc, AICPU_ATTENTION_FP32, c->lora, inv);
        c->partial_lse[at] = poisoned ? INFINITY : l > 0.0f ? m + logf(l) : -INFINITY;
    }
}

static void run_segment(const mla_ctx *c, const segment *sg, int blocks_ok) {
    const aicpu_tiling_params *p = c->p;
    const int32_t bs = p->block_size, tok0 = sg->t * p->q_tile, rows = sg->ntok * c->heads;
    const int32_t shift = c->causal ? sg->rl.kv_len - sg->rl.q_len : 0;
    const int32_t *bt_row = c->block_table + (size_t)sg->r * p->max_blocks_per_req;
    const size_t es = dtype_bytes(c->dtype);
    int32_t row_block = MAX_ROWS, chunk = KV_FLOATS / c->dim, r0;
    float qs[Q_FLOATS], acc[ACC_FLOATS], kbuf[KV_FLOATS], s[MAX_CHUNK];
    float m[MAX_ROWS], l[MAX_ROWS];
    int32_t limit[MAX_ROWS];

    if (row_block > Q_FLOATS / c->dim) row_block = Q_FLOATS / c->dim;
    if (row_block > ACC_FLOATS / c->lora) row_block = ACC_FLOATS / c->lora;
    if (chunk > MAX_CHUNK) chunk = MAX_CHUNK;
    for (r0 = 0; r0 < rows; r0 += row_block) {
        const int32_t nr = rows - r0 < row_block ? rows - r0 : row_block;
        int32_t i, b, kv_hi = 0;
        for (i = 0; i < nr; i++) {
            int32_t tok = (r0 + i) / c->heads, head = (r0 + i) % c->heads;
            size_t q_row = (size_t)(sg->rl.q_start + tok0 + tok) * c->heads + head;
            float *q = qs + (size_t)i * c->dim;
            load_values(q, (const char *)c->q_nope + q_row * c->lora * es, c->dtype, c->lora,
                        c->scale);
            if (c->rope > 0)
                load_values(q + c->lora, (const char *)c->q_pe + q_row * c->rope * es, c->dtype,
                            c->rope, c->scale);
            memset(acc + (size_t)i * c->lora, 0, (size_t)c->lora * sizeof(float));
            m[i] = -INFINITY;
            l[i] = 0.0f;
            limit[i] = c->causal ? shift + tok0 + tok + 1 : sg->rl.kv_len;
            if (limit[i] > kv_hi) kv_hi = limit[i];
        }
        if (kv_hi > sg->ke * bs) kv_hi = sg->ke * bs;
        for (b = sg->kb; blocks_ok && b < sg->ke && b * bs < kv_hi; b++) {
            const int32_t p0 = b * bs, p1 = p0 + bs < kv_hi ? p0 + bs : kv_hi;
            int32_t c0;
            for (c0 = p0; c0 < p1; c0 += chunk) {
                const int32_t n = p1 - c0 < chunk ? p1 - c0 : chunk;
                load_chunk(c, kbuf, bt_row[b], c0 - p0, n);
                for (i = 0; i < nr; i++) {
                    const float *q = qs + (size_t)i * c->dim;
                    float *o = acc + (size_t)i * c->lora;
                    int32_t nv = limit[i] - c0, j, x;
                    float mx = -INFINITY;
                    if (nv <= 0) continue;
                    if (nv > n) nv = n;
                    for (j = 0; j < nv; j++) {
                        s[j] = dot(q, kbuf + (size_t)j * c->dim, c->dim);
                        mx = s[j] > mx ? s[j] : mx;
                    }
                    if (mx > m[i]) { /* online softmax: rescale what came before */
                        float corr = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
                        for (x = 0; x < c->lora; x++) o[x] *= corr;
                        l[i] *= corr;
                        m[i] = mx;
                    }
                    for (j = 0; j < nv; j++) {
                        const float *v = kbuf + (size_t)j * c->dim; /* V: the kv_c part */
                        float pj = expf(s[j] - m[i]);
                        l[i] += pj;
                        for (x = 0; x < c->lora; x++) o[x] += pj * v[x];
                    }
                }
            }
        }
        for (i = 0; i < nr; i++)
            write_row(c, sg, r0 + i, acc + (size_t)i * c->lora, l[i], m[i], !blocks_ok);
    }
}

/* The core's range, segment by segment (the walk of the GQA reference with one kv head and
 * no fusion). */
static int walk_range(const mla_ctx *c, const int32_t *rec, int32_t batch) {
    const aicpu_tiling_params *params = c->p;
    work_pos pos, end;
    int32_t first_slot = rec[AICPU_TILING_CORE_FIRST_SLOT];
    int32_t last_slot = rec[AICPU_TILING_CORE_LAST_SLOT];
    int32_t nseg = 0;
    int status = AICPU_TILING_OK;

    read_pos(&pos, rec + AICPU_TILING_CORE_BEGIN);
    read_pos(&end, rec + AICPU_TILING_CORE_END);
    while (pos_less(&pos, &end)) {
        segment sg;
        int32_t nblocks;
        int blocks_ok;
        if (pos.r < 0 || pos.r >= batch || pos.h != 0 || pos.t < 0 ||
            !load_request(c, pos.r, &sg.rl) || pos.t >= num_tiles(c, &sg.rl))
            return AICPU_ATTENTION_E_TILING;
        nblocks = unit_blocks(c, &sg.rl, pos.t);
        sg.r = pos.r;
        sg.t = pos.t;
        sg.kb = pos.k;
        sg.ke = (end.r == pos.r && end.h == pos.h && end.t == pos.t) ? end.k : nblocks;
        if (sg.kb < 0 || sg.ke <= sg.kb || sg.ke > nblocks) return AICPU_ATTENTION_E_TILING;
        sg.slot = -1;
        sg.ntok = sg.rl.q_len - pos.t * params->q_tile;
        if (sg.ntok > params->q_tile) sg.ntok = params->q_tile;
        if (sg.kb > 0 || sg.ke < nblocks) {
            /* only a core's first segment starts inside a unit, only its last ends inside one */
            int last = sg.ke < nblocks || nseg + 1 == rec[AICPU_TILING_CORE_NUM_SEGMENTS];
            sg.slot = nseg == 0 ? first_slot : last_slot;
            if ((nseg > 0 && (sg.kb > 0 || !last)) ||
                (nseg == 0 && last && first_slot != last_slot))
                return AICPU_ATTENTION_E_TILING;
            if (sg.slot < 0 || sg.slot >= c->max_slots || c->partial_out == NULL ||
                c->partial_lse == NULL)
                return AICPU_ATTENTION_E_TILING;
        }
        blocks_ok = blocks_valid(c, sg.r, sg.kb, sg.ke);
        if (!blocks_ok) status = AICPU_ATTENTION_E_BLOCK_ID;
        run_segment(c, &sg, blocks_ok);
        nseg++;
        if (sg.ke < nblocks) { /* a cut inside the unit: only the core's end can be there */
            pos.k = sg.ke;
            if (!(pos.r == end.r && pos.h == end.h && pos.t == end.t && pos.k == end.k))
                return AICPU_ATTENTION_E_TILING;
            break;
        }
        /* the next unit: the next query tile, else the next request with query tokens, else
         * the end of the work (0, 1, 0, 0) */
        pos.k = 0;
        if (++pos.t >= num_tiles(c, &sg.rl)) {
            pos.t = 0;
            for (pos.r++; pos.r < batch && c->cu[pos.r + 1] == c->cu[pos.r]; pos.r++) {
            }
            if (pos.r >= batch) {
                pos.r = 0;
                pos.h = 1;
            }
        }
    }
    if (nseg != rec[AICPU_TILING_CORE_NUM_SEGMENTS]) return AICPU_ATTENTION_E_TILING;
    return status;
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                               */
/* ------------------------------------------------------------------------------------------ */

int aicpu_mla_params_check(const aicpu_tiling_params *params, int32_t kv_lora_rank) {
    if (params == NULL || aicpu_tiling_params_check(params) != AICPU_TILING_OK ||
        params->num_kv_heads != 1 || kv_lora_rank < 1 || kv_lora_rank > params->head_dim)
        return AICPU_ATTENTION_E_ARGS;
    return AICPU_TILING_OK;
}

static int dtype_ok(int32_t dtype) {
    return dtype == AICPU_ATTENTION_FP32 || dtype == AICPU_ATTENTION_FP16 ||
           dtype == AICPU_ATTENTION_BF16;
}

int aicpu_mla_core(const aicpu_tiling_params *params, int32_t kv_lora_rank, const int32_t *tiling,
                   int32_t core, uint32_t flags, int32_t dtype, float scale, const void *q_nope,
                   const void *q_pe, const void *kv_c_cache, const void *k_pe_cache,
                   int32_t num_blocks, const int32_t *block_table, const int32_t *cu_seqlens_q,
                   const int32_t *seqlens_kv, void *out, float *partial_out,
                   float *partial_lse) {
    mla_ctx c;
    const int32_t *rec;
    int32_t rope, batch;
    work_pos begin, end;

    if (aicpu_mla_params_check(params, kv_lora_rank) != AICPU_TILING_OK || tiling == NULL ||
        core < 0 || core >= params->num_cores || !dtype_ok(dtype) || num_blocks < 0)
        return AICPU_ATTENTION_E_ARGS;
    if (tiling[AICPU_TILING_HDR_MAGIC] != AICPU_TILING_MAGIC ||
        tiling[AICPU_TILING_HDR_VERSION] != AICPU_TILING_VERSION ||
        tiling[AICPU_TILING_HDR_NUM_CORES] != params->num_cores)
        return AICPU_ATTENTION_E_TILING;
    if (tiling[AICPU_TILING_HDR_STATUS] != AICPU_TILING_OK) return tiling[AICPU_TILING_HDR_STATUS];
    batch = tiling[AICPU_TILING_HDR_BATCH];
    if ((uint32_t)tiling[AICPU_TILING_HDR_FLAGS] != (flags & AICPU_TILING_CAUSAL) || batch < 0 ||
        batch > params->max_batch)
        return AICPU_ATTENTION_E_TILING;
    rec = tiling + AICPU_TILING_HDR_WORDS + (size_t)core * AICPU_TILING_CORE_WORDS;
    read_pos(&begin, rec + AICPU_TILING_CORE_BEGIN);
    read_pos(&end, rec + AICPU_TILING_CORE_END);
    if (!pos_less(&begin, &end)) return AICPU_TILING_OK; /* an idle core */
    rope = params->head_dim - kv_lora_rank;
    if (q_nope == NULL || kv_c_cache == NULL || block_table == NULL || cu_seqlens_q == NULL ||
        seqlens_kv == NULL || out == NULL || (rope > 0 && (q_pe == NULL || k_pe_cache == NULL)))
        return AICPU_ATTENTION_E_ARGS;
    c.p = params;
    c.lora = kv_lora_rank;
    c.rope = rope;
    c.dim = params->head_dim;
    c.heads = params->num_q_heads;
    c.causal = (flags & AICPU_TILING_CAUSAL) != 0;
    c.dtype = dtype;
    c.num_blocks = num_blocks;
    c.max_slots = aicpu_tiling_max_slots(params);
    c.scale = scale;
    c.q_nope = q_nope;
    c.q_pe = q_pe;
    c.kv_c = kv_c_cache;
    c.k_pe = k_pe_cache;
    c.block_table = block_table;
    c.cu = cu_seqlens_q;
    c.kv = seqlens_kv;
    c.out = out;
    c.partial_out = partial_out;
    c.partial_lse = partial_lse;
    return walk_range(&c, rec, batch);
}

int aicpu_mla_finalize(const aicpu_tiling_params *params, int32_t kv_lora_rank,
                       const int32_t *tiling, int32_t dtype, const int32_t *cu_seqlens_q,
                       void *out, const float *partial_out, const float *partial_lse) {
    aicpu_tiling_params latent;
    if (aicpu_mla_params_check(params, kv_lora_rank) != AICPU_TILING_OK)
        return AICPU_ATTENTION_E_ARGS;
    latent = *params;
    latent.head_dim = kv_lora_rank; /* partial and output rows are L wide */
    return aicpu_attention_finalize(&latent, tiling, dtype, cu_seqlens_q, out, partial_out,
                                    partial_lse, NULL);
}
