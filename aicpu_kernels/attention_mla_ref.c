/*
 * attention_mla_ref.c -- the reference MLA decode attention (AI Core role); see
 * attention_mla_ref.h.
 *
 * Shape of the work: the core walks its range of the tiling segment by segment in work order
 * (one kv head, so (request, query tile, kv block)), with the GQA reference's walk
 * (attention_walk.h; no window, no head fusion): this file is only the MLA segment. A segment
 * runs in row blocks that fit the scratch; within a row block, in chunks of kv tokens
 * (walk_chunks): the chunk's cache rows [kv_c | k_pe]
 * are widened to fp32 once, each row's scores are dot products over L + R values, the online
 * softmax updates once per chunk, and the probability-weighted sum runs over the first L values
 * of the same fp32 rows (V is K's latent part: one read serves both). Plain C loops; the GQA
 * reference's SIMD variants are not used here (its inner kernels take one K and one V row of
 * one width; MLA's key is two tensors and its value a prefix of the key).
 */
#include "attention_mla_ref.h"
#include "attention_storage.h"
#include "attention_walk.h"

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
/* Inner loop                                                                                 */
/* ------------------------------------------------------------------------------------------ */

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
/* The MLA geometry                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* An MLA call: the walk's view first (attention_walk.h: run_segment below gets the walk and
 * casts it back to this), then what the MLA geometry adds. */
typedef struct {
    tiling_walk w;
    int32_t lora, rope, dim, heads, dtype;
    float scale;
    const void *q_nope, *q_pe, *kv_c, *k_pe;
    void *out;
} mla_ctx;

/* Chunk rows [kv_c | k_pe] of n tokens from position `from` of cache block `block`, in fp32. */
static void load_chunk(const mla_ctx *c, float *kbuf, int32_t block, int32_t from, int32_t n) {
    const size_t es = storage_dtype_bytes(c->dtype);
    int32_t j;
    for (j = 0; j < n; j++) {
        size_t token = (size_t)block * c->w.p->block_size + (size_t)(from + j);
        float *row = kbuf + (size_t)j * c->dim;
        storage_load_row(row, (const char *)c->kv_c + token * c->lora * es, c->dtype, c->lora,
                         1.0f);
        if (c->rope > 0)
            storage_load_row(row + c->lora, (const char *)c->k_pe + token * c->rope * es,
                             c->dtype, c->rope, 1.0f);
    }
}

/* Rows of a segment are (token in tile, head); a piece writes slot rows in the same order. */
static void write_row(const mla_ctx *c, const segment *sg, int32_t row, const float *acc,
                      float l, float m, int poisoned) {
    int32_t tok = row / c->heads, head = row % c->heads;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (sg->slot < 0) {
        size_t at = ((size_t)(sg->rl.q_start + sg->t * c->w.p->q_tile + tok) * c->heads + head) *
                    c->lora;
        storage_store_row((char *)c->out + at * storage_dtype_bytes(c->dtype), acc, c->dtype,
                          c->lora, inv);
    } else {
        size_t at = ((size_t)sg->slot * c->w.p->q_tile + tok) * c->heads + head;
        storage_store_row(c->w.partial_out + at * c->lora, acc, AICPU_ATTENTION_FP32, c->lora,
                          inv);
        c->w.partial_lse[at] = poisoned ? INFINITY : l > 0.0f ? m + logf(l) : -INFINITY;
    }
}

/* A row block of a segment in flight (walk_chunks' argument): its rows' scaled queries
 * [q_nope | q_pe], latent accumulators and online-softmax state (running max m, sum l), the
 * kv positions [0, limit) each row sees, and the chunk's fp32 cache rows and scores. */
typedef struct {
    const mla_ctx *c;
    const float *qs;
    float *acc, *kbuf, *s, *m, *l;
    const int32_t *limit;
    int32_t nr;
} row_block_state;

/* One chunk: its cache rows widened once, then for each row the scores over L + R values, the
 * online softmax and the probability-weighted sum of the rows' first L values. */
static void row_block_chunk(void *arg, const kv_chunk *ch) {
    const row_block_state *rb = (const row_block_state *)arg;
    const mla_ctx *c = rb->c;
    float *s = rb->s, *m = rb->m, *l = rb->l;
    const int32_t n = ch->n, c0 = ch->c0;
    int32_t i;
    load_chunk(c, rb->kbuf, ch->block, c0 - ch->b * c->w.p->block_size, n);
    for (i = 0; i < rb->nr; i++) {
        const float *q = rb->qs + (size_t)i * c->dim;
        float *o = rb->acc + (size_t)i * c->lora;
        int32_t nv = rb->limit[i] - c0, j, x;
        float mx = -INFINITY;
        if (nv <= 0) continue;
        if (nv > n) nv = n;
        for (j = 0; j < nv; j++) {
            s[j] = dot(q, rb->kbuf + (size_t)j * c->dim, c->dim);
            mx = s[j] > mx ? s[j] : mx;
        }
        if (mx > m[i]) { /* online softmax: rescale what came before */
            float corr = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
            for (x = 0; x < c->lora; x++) o[x] *= corr;
            l[i] *= corr;
            m[i] = mx;
        }
        for (j = 0; j < nv; j++) {
            const float *v = rb->kbuf + (size_t)j * c->dim; /* V: the kv_c part */
            float pj = expf(s[j] - m[i]);
            l[i] += pj;
            for (x = 0; x < c->lora; x++) o[x] += pj * v[x];
        }
    }
}

/* The MLA geometry's segment (tiling_walk.run_segment): one kv head, the latent one. */
static void run_segment(const tiling_walk *w, const segment *sg, int blocks_ok) {
    const mla_ctx *c = (const mla_ctx *)w;
    const aicpu_tiling_params *p = c->w.p;
    const int32_t tok0 = sg->t * p->q_tile, rows = sg->ntok * c->heads;
    const size_t es = storage_dtype_bytes(c->dtype);
    int32_t row_block = MAX_ROWS, chunk = KV_FLOATS / c->dim, r0;
    float qs[Q_FLOATS], acc[ACC_FLOATS], kbuf[KV_FLOATS], s[MAX_CHUNK];
    float m[MAX_ROWS], l[MAX_ROWS];
    int32_t limit[MAX_ROWS];
    row_block_state rb;

    if (row_block > Q_FLOATS / c->dim) row_block = Q_FLOATS / c->dim;
    if (row_block > ACC_FLOATS / c->lora) row_block = ACC_FLOATS / c->lora;
    if (chunk > MAX_CHUNK) chunk = MAX_CHUNK;
    rb.c = c;
    rb.qs = qs;
    rb.acc = acc;
    rb.kbuf = kbuf;
    rb.s = s;
    rb.m = m;
    rb.l = l;
    rb.limit = limit;
    for (r0 = 0; r0 < rows; r0 += row_block) {
        const int32_t nr = rows - r0 < row_block ? rows - r0 : row_block;
        int32_t i, kv_hi = 0;
        for (i = 0; i < nr; i++) {
            int32_t tok = (r0 + i) / c->heads, head = (r0 + i) % c->heads, lower;
            size_t q_row = (size_t)(sg->rl.q_start + tok0 + tok) * c->heads + head;
            float *q = qs + (size_t)i * c->dim;
            storage_load_row(q, (const char *)c->q_nope + q_row * c->lora * es, c->dtype,
                             c->lora, c->scale);
            if (c->rope > 0)
                storage_load_row(q + c->lora, (const char *)c->q_pe + q_row * c->rope * es,
                                 c->dtype, c->rope, c->scale);
            memset(acc + (size_t)i * c->lora, 0, (size_t)c->lora * sizeof(float));
            m[i] = -INFINITY;
            l[i] = 0.0f;
            row_positions(&c->w, sg, tok, &lower, &limit[i]); /* lower: 0, no window */
            if (limit[i] > kv_hi) kv_hi = limit[i];
        }
        rb.nr = nr;
        if (blocks_ok) walk_chunks(&c->w, sg, 0, kv_hi, chunk, &rb, NULL, row_block_chunk);
        for (i = 0; i < nr; i++)
            write_row(c, sg, r0 + i, acc + (size_t)i * c->lora, l[i], m[i], !blocks_ok);
    }
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

int aicpu_mla_core(const aicpu_tiling_params *params, int32_t kv_lora_rank, const int32_t *tiling,
                   int32_t core, uint32_t flags, int32_t dtype, float scale, const void *q_nope,
                   const void *q_pe, const void *kv_c_cache, const void *k_pe_cache,
                   int32_t num_blocks, const int32_t *block_table, const int32_t *cu_seqlens_q,
                   const int32_t *seqlens_kv, void *out, float *partial_out,
                   float *partial_lse) {
    mla_ctx c;
    walk_mode mode;
    const int32_t *rec;
    int32_t rope, batch;

    if (aicpu_mla_params_check(params, kv_lora_rank) != AICPU_TILING_OK || tiling == NULL ||
        core < 0 || core >= params->num_cores || !storage_dtype_ok(dtype) || num_blocks < 0)
        return AICPU_ATTENTION_E_ARGS;
    if (!header_ok(params, tiling)) return AICPU_ATTENTION_E_TILING;
    if (tiling[AICPU_TILING_HDR_STATUS] != AICPU_TILING_OK) return tiling[AICPU_TILING_HDR_STATUS];
    batch = tiling[AICPU_TILING_HDR_BATCH];
    if ((uint32_t)tiling[AICPU_TILING_HDR_FLAGS] != (flags & AICPU_TILING_CAUSAL) || batch < 0 ||
        batch > params->max_batch)
        return AICPU_ATTENTION_E_TILING;
    rec = core_record(tiling, core);
    if (core_idle(rec)) return AICPU_TILING_OK;
    rope = params->head_dim - kv_lora_rank;
    if (q_nope == NULL || kv_c_cache == NULL || block_table == NULL || cu_seqlens_q == NULL ||
        seqlens_kv == NULL || out == NULL || (rope > 0 && (q_pe == NULL || k_pe_cache == NULL)))
        return AICPU_ATTENTION_E_ARGS;
    /* no sliding window, no head fusion (one kv head): the walk's core walk, run as it goes */
    walk_init(&c.w, params, flags, 0, num_blocks, block_table, cu_seqlens_q, seqlens_kv,
              partial_out, partial_lse, run_segment, NULL);
    c.lora = kv_lora_rank;
    c.rope = rope;
    c.dim = params->head_dim;
    c.heads = params->num_q_heads;
    c.dtype = dtype;
    c.scale = scale;
    c.q_nope = q_nope;
    c.q_pe = q_pe;
    c.kv_c = kv_c_cache;
    c.k_pe = k_pe_cache;
    c.out = out;
    mode.heads = 0;
    mode.slot_step = 0;
    mode.run = 1;
    mode.skip_whole = 0;
    return walk_range(&c.w, rec, batch, &mode);
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
