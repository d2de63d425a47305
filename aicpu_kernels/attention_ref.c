/*
 * attention_ref.c -- the reference attention (AI Core role); see attention_ref.h.
 *
 * Shape of the work: the core walks its range of the tiling segment by segment, in the head-major
 * work order (aicpu_tiling.h), with the walk it shares with the MLA reference (attention_walk.h:
 * walk_range, then walk_chunks within a segment); this file is the GQA geometry that walk calls
 * back (run_segment, fuse_cap) and the fused entry points. The whole units of a single-tile request
 * (decode, short speculative decode) that lie in the range are fused across kv heads, so that each
 * token's K and V are read as one contiguous run. When P is a multiple of H a core's range lies in
 * one head, so there is nothing to fuse within it; aicpu_attention_core_siblings then walks the
 * range of a head-0 core once for it and its copies in the other heads, fusing every whole unit
 * across heads (walk_range's sibling mode). For any P and H, aicpu_attention_core_span runs
 * consecutive cores, whose ranges join into one: each core's walk runs its pieces and multi-tile
 * units, and the span's whole single-tile units run request by request with their kv heads fused
 * (run_span_whole). A segment is processed in row blocks that fit the query/output scratch and,
 * within a row block, in chunks of kv tokens. Within a chunk the rows of one kv head (a decode
 * token's `group` query heads) are handled together by the inner kernels (attention_kernels.h):
 * scores by dot products over head_dim, an online-softmax update once per chunk (chunk max, running
 * max m and sum l, the output rescaled when m grows), then the probability-weighted sum of the
 * head's V rows. While a kv head is computed, the next head's cache lines (in this chunk or the
 * next) are prefetched.
 *
 * The inner kernels come in variants chosen at run time (attention_ref.h, INSTRUCTION-SET
 * VARIANTS). The portable ones below are written for gcc's vectoriser in strict IEEE mode (no
 * -ffast-math needed): lane accumulators instead of a single float reduction, restrict
 * pointers, selects written as integer masks (float compares block if-conversion), and a
 * polynomial exp instead of expf; they widen 16-bit K and V into an L1-resident fp32 scratch
 * and "prefetch" by touching one byte per line. Built for the x86-64 baseline they use SSE2
 * only: 4-lane vectors, no FMA, no F16C, which made them compute-bound at about 10% of the
 * memory bandwidth for bf16 with 4 query heads per kv head (tools/bench_attention.py). The
 * AVX2 and AVX-512 kernels (attention_x86.c) fix that on CPUs that have them.
 */
#include "attention_ref.h"

#include "attention_kernels.h"
#include "attention_storage.h"
#include "attention_walk.h"

#include <math.h>
#include <string.h>

/* Scratch sizes in floats; they bound the stack (AICPU_ATTENTION_STACK_BYTES). */
#define QO_FLOATS 8192  /* query rows (scaled, fp32) and output accumulators, each */
#define KV_FLOATS 16384 /* one chunk of K and of V (one kv head) in fp32, each */
#define S_FLOATS 4096   /* scores of one chunk for every row of a row block */
#define MAX_CHUNK 64    /* kv tokens per chunk */
#define MAX_ROWS 256    /* rows per row block */
#define LANES 8         /* accumulator lanes of a dot product (16 is no faster, 32 slower) */

typedef char attention_stack_bound_check
    [(4 * (2 * QO_FLOATS + 2 * KV_FLOATS + S_FLOATS + 4 * MAX_ROWS) <=
      AICPU_ATTENTION_STACK_BYTES) ? 1 : -1];

/* ------------------------------------------------------------------------------------------ */
/* Storage conversions (attention_storage.h), exported for tests                              */
/* ------------------------------------------------------------------------------------------ */

float aicpu_attention_half_to_float(uint16_t h) { return storage_half_to_float(h); }

uint16_t aicpu_attention_float_to_half(float f) { return storage_float_to_half(f); }

float aicpu_attention_bf16_to_float(uint16_t b) { return storage_bf16_to_float(b); }

uint16_t aicpu_attention_float_to_bf16(float f) { return storage_float_to_bf16(f); }

/* n rows of head_dim at a token stride of `stride` elements into contiguous fp32. */
static void load_rows(float *restrict dst, const void *src, int32_t dtype, int32_t n, int32_t d,
                      ptrdiff_t stride) {
    int32_t j;
    if (dtype == AICPU_ATTENTION_FP32) {
        const float *s = (const float *)src;
        for (j = 0; j < n; j++) memcpy(dst + (ptrdiff_t)j * d, s + j * stride, (size_t)d * 4);
    } else if (dtype == AICPU_ATTENTION_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (j = 0; j < n; j++) {
            const uint16_t *restrict row = s + j * stride;
            float *restrict o = dst + (ptrdiff_t)j * d;
            int32_t x;
            for (x = 0; x < d; x++) o[x] = storage_bf16_to_float(row[x]);
        }
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (j = 0; j < n; j++) {
            const uint16_t *restrict row = s + j * stride;
            float *restrict o = dst + (ptrdiff_t)j * d;
            int32_t x;
            for (x = 0; x < d; x++) o[x] = storage_half_to_float(row[x]);
        }
    }
}


/* ------------------------------------------------------------------------------------------ */
/* Inner loops                                                                                */
/* ------------------------------------------------------------------------------------------ */

/*
 * e^x for x <= 0, branch-free so that loops over it vectorise: x = k ln2 + r, |r| <= ln2/2,
 * e^r by its degree-7 Taylor polynomial (relative error < 1e-8 before rounding), 2^k built in
 * the exponent field. Below -87 (where 2^k would leave the normal range) the result is 0.
 */
static float exp_nonpositive(float x) {
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    /* x < -87 by its bits (x <= 0 is given, -inf included): integer masks, not float
     * compares, so that gcc if-converts and vectorises without -ffast-math */
    uint32_t ux = storage_float_to_bits(x);
    uint32_t under = 0u - (uint32_t)(ux > 0xc2ae0000u);
    float xc = storage_bits_to_float((ux & ~under) | (0xc2ae0000u & under));
    float kf = (xc * 1.44269504088896341f + shifter) - shifter;
    float r = (xc - kf * 0.693145751953125f) - kf * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    float scale = storage_bits_to_float((uint32_t)((int32_t)kf + 127) << 23);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return storage_bits_to_float(storage_float_to_bits(p * scale) & ~under);
}

static float lane_sum(const float *a) {
    float b[LANES / 2];
    int32_t i, w;
    for (i = 0; i < LANES / 2; i++) b[i] = a[i] + a[i + LANES / 2];
    for (w = LANES / 4; w >= 1; w /= 2)
        for (i = 0; i < w; i++) b[i] += b[i + w];
    return b[0];
}

/* q . k with LANES independent partial sums (a float reduction gcc vectorises in strict mode). */
static float dot(const float *restrict q, const float *restrict k, int32_t d) {
    float a[LANES] = {0};
    float t = 0.0f;
    int32_t x, i, dv = d - d % LANES;
    for (x = 0; x < dv; x += LANES)
        for (i = 0; i < LANES; i++) a[i] += q[x + i] * k[x + i];
    for (x = dv; x < d; x++) t += q[x] * k[x];
    return lane_sum(a) + t;
}

/* o += p[0] v_0 + ... + p[3] v_3, v_j = v + j * vs: one pass over o for four kv tokens. */
static void accumulate4(float *restrict o, const float *restrict p, const float *restrict v,
                        ptrdiff_t vs, int32_t d) {
    const float *restrict v0 = v;
    const float *restrict v1 = v0 + vs;
    const float *restrict v2 = v1 + vs;
    const float *restrict v3 = v2 + vs;
    float p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3];
    int32_t x;
    for (x = 0; x < d; x++) o[x] += (p0 * v0[x] + p1 * v1[x]) + (p2 * v2[x] + p3 * v3[x]);
}

static void accumulate1(float *restrict o, float p, const float *restrict v, int32_t d) {
    int32_t x;
    for (x = 0; x < d; x++) o[x] += p * v[x];
}

/*
 * o_r += sum_{j < 4} p_r[j] v_j for four rows r (o_r = o + r d, p_r = p + r ps, v_j = v + j vs):
 * one pass over the four output rows for four kv tokens, every V value loaded serving the four
 * rows (the inner loop is elementwise over head_dim, which gcc vectorises in strict mode).
 */
static void accumulate4x4(float *restrict o, const float *restrict p, ptrdiff_t ps,
                          const float *restrict v, ptrdiff_t vs, int32_t d) {
    float *restrict o0 = o;
    float *restrict o1 = o0 + d;
    float *restrict o2 = o1 + d;
    float *restrict o3 = o2 + d;
    const float *restrict v0 = v;
    const float *restrict v1 = v0 + vs;
    const float *restrict v2 = v1 + vs;
    const float *restrict v3 = v2 + vs;
    const float a0 = p[0], a1 = p[1], a2 = p[2], a3 = p[3];
    const float b0 = p[ps], b1 = p[ps + 1], b2 = p[ps + 2], b3 = p[ps + 3];
    const float c0 = p[2 * ps], c1 = p[2 * ps + 1], c2 = p[2 * ps + 2], c3 = p[2 * ps + 3];
    const float e0 = p[3 * ps], e1 = p[3 * ps + 1], e2 = p[3 * ps + 2], e3 = p[3 * ps + 3];
    int32_t x;
    for (x = 0; x < d; x++) {
        const float w0 = v0[x], w1 = v1[x], w2 = v2[x], w3 = v3[x];
        o0[x] += (a0 * w0 + a1 * w1) + (a2 * w2 + a3 * w3);
        o1[x] += (b0 * w0 + b1 * w1) + (b2 * w2 + b3 * w3);
        o2[x] += (c0 * w0 + c1 * w1) + (c2 * w2 + c3 * w3);
        o3[x] += (e0 * w0 + e1 * w1) + (e2 * w2 + e3 * w3);
    }
}

/*
 * s[r sn + j] = q_r . k_j, token-outer so that each K row serves the head's rows from L1. 16-bit
 * K (and fp32 K for four rows or more, where the copy's contiguity pays) is first brought to
 * fp32 once into scratch.
 */
static void portable_scores(float *s, ptrdiff_t sn, const float *q, int32_t nr, const int32_t *nv,
                            const void *k, int32_t dtype, ptrdiff_t ks, int32_t d,
                            float *scratch) {
    const float *kp = (const float *)k;
    int32_t j, r, jmax = 0;
    for (r = 0; r < nr; r++)
        if (nv[r] > jmax) jmax = nv[r];
    if (dtype != AICPU_ATTENTION_FP32 || nr >= 4) {
        load_rows(scratch, k, dtype, jmax, d, ks);
        kp = scratch;
        ks = d;
    }
    for (j = 0; j < jmax; j++)
        for (r = 0; r < nr; r++)
            if (j < nv[r]) s[r * sn + j] = dot(q + (size_t)r * d, kp + j * ks, d);
}

static float portable_row_max(const float *s, int32_t n) {
    float mx = s[0];
    int32_t j;
    for (j = 1; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    return mx;
}

static float portable_exp_sum(float *s, int32_t n, float mx) {
    float sum = 0.0f;
    int32_t j;
    for (j = 0; j < n; j++) s[j] = exp_nonpositive(s[j] - mx);
    for (j = 0; j < n; j++) sum += s[j];
    return sum;
}

/* Four rows by four kv tokens per pass over the output rows where possible. */
static void portable_accumulate(float *o, int32_t nr, const int32_t *nv, const float *p,
                                ptrdiff_t ps, const void *vraw, int32_t dtype, ptrdiff_t vs,
                                int32_t d, float *scratch) {
    const float *v = (const float *)vraw;
    int32_t r, j, jmax = 0;
    for (r = 0; r < nr; r++)
        if (nv[r] > jmax) jmax = nv[r];
    if (dtype != AICPU_ATTENTION_FP32 || nr >= 4) {
        load_rows(scratch, vraw, dtype, jmax, d, vs);
        v = scratch;
        vs = d;
    }
    for (r = 0; r + 4 <= nr; r += 4) {
        int32_t jm = nv[r], rr;
        if (nv[r + 1] < jm) jm = nv[r + 1];
        if (nv[r + 2] < jm) jm = nv[r + 2];
        if (nv[r + 3] < jm) jm = nv[r + 3];
        for (j = 0; j + 4 <= jm; j += 4)
            accumulate4x4(o + (size_t)r * d, p + r * ps + j, ps, v + j * vs, vs, d);
        for (rr = r; rr < r + 4; rr++) {
            int32_t jj;
            for (jj = j; jj < nv[rr]; jj++)
                accumulate1(o + (size_t)rr * d, p[rr * ps + jj], v + jj * vs, d);
        }
    }
    for (; r < nr; r++) {
        float *orow = o + (size_t)r * d;
        const float *pr = p + r * ps;
        for (j = 0; j + 4 <= nv[r]; j += 4) accumulate4(orow, pr + j, v + j * vs, vs, d);
        for (; j < nv[r]; j++) accumulate1(orow, pr[j], v + j * vs, d);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Variant choice                                                                             */
/* ------------------------------------------------------------------------------------------ */

static void portable_prefetch_rows(const void *p, int32_t n, size_t row_bytes, ptrdiff_t stride);

static const attention_kernels portable_kernels = {portable_scores, portable_row_max,
                                                   portable_exp_sum,
                                                   portable_accumulate, portable_prefetch_rows};

/* -1 until the first use picks the best variant. A plain int: the choice is made once per
 * process before cores run concurrently (the Python wrapper sets it at import). */
static int32_t active_isa = -1;

static const attention_kernels *isa_kernels(int32_t isa) {
    if (isa == AICPU_ATTENTION_ISA_PORTABLE) return &portable_kernels;
    if (isa == AICPU_ATTENTION_ISA_AVX2 || isa == AICPU_ATTENTION_ISA_AVX512)
        return attention_x86_kernels(isa);
    return NULL;
}

const char *aicpu_attention_isa_name(int32_t isa) {
    static const char *const names[AICPU_ATTENTION_NUM_ISA] = {"portable", "avx2", "avx512"};
    return isa >= 0 && isa < AICPU_ATTENTION_NUM_ISA ? names[isa] : NULL;
}

int aicpu_attention_isa_supported(int32_t isa) { return isa_kernels(isa) != NULL; }

int32_t aicpu_attention_isa_best(void) {
    int32_t isa;
    for (isa = AICPU_ATTENTION_NUM_ISA - 1; isa > 0; isa--)
        if (aicpu_attention_isa_supported(isa)) return isa;
    return AICPU_ATTENTION_ISA_PORTABLE;
}

int32_t aicpu_attention_isa_active(void) {
    if (active_isa < 0) active_isa = aicpu_attention_isa_best();
    return active_isa;
}

int aicpu_attention_set_isa(int32_t isa) {
    if (!aicpu_attention_isa_supported(isa)) return AICPU_ATTENTION_E_ISA;
    active_isa = isa;
    return AICPU_TILING_OK;
}

/*
 * Read one byte of every 64-byte line of n rows (row_bytes each, stride apart) and return
 * their sum. Portable software prefetch: these independent loads put many cache misses in
 * flight at once, where the dependent work of a chunk would otherwise wait for its lines
 * one page at a time (a kv head's rows are short runs at a stride, which hardware prefetchers
 * cannot follow across 4 KiB pages).
 */
static unsigned touch_rows(const unsigned char *p, int32_t n, size_t row_bytes,
                           ptrdiff_t stride) {
    unsigned sum = 0;
    int32_t j;
    for (j = 0; j < n; j++) {
        const unsigned char *row = p + j * stride;
        size_t x;
        for (x = 0; x < row_bytes; x += 64) sum += row[x];
        sum += row[row_bytes - 1];
    }
    return sum;
}

static void portable_prefetch_rows(const void *p, int32_t n, size_t row_bytes, ptrdiff_t stride) {
    volatile unsigned sink = touch_rows((const unsigned char *)p, n, row_bytes, stride);
    (void)sink;
}

/* ------------------------------------------------------------------------------------------ */
/* The GQA geometry                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* A GQA call: the walk's view first (attention_walk.h: run_segment and fuse_cap below get the
 * walk and cast it back to this), then what the GQA geometry adds. */
typedef struct {
    tiling_walk w;
    int32_t group, dtype;
    float scale;
    float soft_cap; /* > 0: the logits soft cap C; 0: off (soft_cap_of) */
    const float *sinks; /* [num_q_heads] attention-sink logits, or NULL (off) */
    const aicpu_attention_kv_int8 *kv_int8; /* int8 caches and their scales, or NULL (off) */
    size_t kv_bytes;    /* bytes of one cache element: 1 for int8 caches, else the dtype's */
    int32_t nz;         /* 1: the int8 caches are in the NZ layout (aicpu_attention_kv_int8) */
    int32_t head_mul;   /* a kv head's offset in elements is head * head_dim * head_mul:
                         * 1 in ND (heads adjacent in a token), block_size in NZ */
    ptrdiff_t token_stride; /* elements between tokens of one head: num_kv_heads * head_dim in
                             * ND, AICPU_ATTENTION_KV_NZ_WIDTH in NZ */
    const void *query, *key_cache, *value_cache;
    ptrdiff_t k_block_stride, v_block_stride; /* elements from a cache block to the next: the
                                               * block's own size when contiguous, more when
                                               * the blocks lie apart (attention_ref.h) */
    void *out;
    const attention_kernels *k; /* the variant this call runs with */
} core_ctx;

/* ------------------------------------------------------------------------------------------ */
/* One segment                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Rows of a segment are ordered (kv head, token in tile, group member). */
/* A piece that could not run (bad block id) gets lse = +inf: finalize then zeroes the unit's
 * rows instead of merging a result that silently misses some kv blocks. */
static void write_row(const core_ctx *c, const segment *sg, int32_t row, const float *acc,
                      float l, float m, int poisoned) {
    const int32_t d = c->w.p->head_dim, per_head = sg->ntok * c->group;
    int32_t h = sg->h + row / per_head, tok = row % per_head / c->group, g = row % c->group;
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    /* A whole unit is the row's only piece: the sink joins its denominator here, once (a split
     * unit's sink joins in finalize). exp(sink - m) overflowing to +inf gives 0, the limit. */
    if (c->sinks != NULL && sg->slot < 0 && l > 0.0f)
        inv = 1.0f / (l + expf(c->sinks[h * c->group + g] - m));
    if (sg->slot < 0) {
        size_t at = ((size_t)(sg->rl.q_start + sg->t * c->w.p->q_tile + tok) * c->w.p->num_q_heads +
                     (size_t)h * c->group + g) * d;
        storage_store_row((char *)c->out + at * storage_dtype_bytes(c->dtype), acc, c->dtype, d,
                          inv);
    } else {
        size_t at = ((size_t)sg->slot * c->w.p->q_tile + tok) * c->group + g;
        storage_store_row(c->w.partial_out + at * d, acc, AICPU_ATTENTION_FP32, d, inv);
        c->w.partial_lse[at] = poisoned ? INFINITY : l > 0.0f ? m + logf(l) : -INFINITY;
    }
}

/*
 * One chunk of n kv tokens (positions c0..c0+n-1) for nr rows. K and V of the chunk are read
 * from the caches at kraw and vraw (the chunk's first token, head sh of the segment), tokens
 * `stride` elements apart, a row's head at head_at[i] elements further. Rows of one kv head
 * (consecutive, head_at equal) are processed together by the active variant's kernels
 * (attention_kernels.h): scores of the head's rows against the chunk's K rows, the online
 * softmax once per chunk (chunk max, then one exp per score), then the probability-weighted
 * sum of V rows. The portable kernels widen 16-bit K and V into kbuf and vbuf first; the SIMD
 * ones widen in registers.
 */
/* The K and V rows of a chunk (n of them, stride bytes apart; n = 0: none) at k and v, the
 * chunk's first token at the segment's first kv head; head_bytes: one head's row. While a kv
 * head of the current chunk is computed, the rows of the head after it are fetched: the next
 * head of the same chunk, or after the chunk's last head the next chunk's first head (this
 * struct, for the next chunk, comes from run_segment). Each half of that head's K rows goes on
 * either side of the current head's scores, each half of its V rows on either side of its
 * weighted sum, so that no burst of many lines fills the core's few miss buffers at once (the
 * prefetches would stall until lines arrive, and memory and compute would take turns). One
 * head of work is ample time for the lines to arrive, and they are read before a chunk's worth
 * of other K and V (64 KiB for bf16 32/8, more than this machine's 48 KiB L1d) can evict them.
 * Two-thread A/B runs measured this 6-15% faster for bf16 32/8 decode (avx512; avx2 4-8%, fp32
 * 32/32 3-5%) than fetching the same head of the next chunk, which was itself faster than the
 * earlier order, token by token across all fused heads in two parts per head (bf16 3-10%;
 * `tools/bench_attention.py --dtype float32 --kv-heads 32 --clock cpu`, avx512: a 129 ms step
 * became 98 ms, as there most of the old parts were empty and a few carried 16 KiB rows). */
typedef struct {
    const unsigned char *k, *v;
    int32_t n;
    size_t head_bytes;
    ptrdiff_t stride;
} chunk_prefetch;

/* Rows [lo, hi) of chunk pf (K or V: base) for the kv head `head_at` elements into a token's
 * row. */
static void prefetch_head(const core_ctx *c, const chunk_prefetch *pf, const unsigned char *base,
                          int32_t head_at, int32_t lo, int32_t hi) {
    const unsigned char *at;
    if (hi > pf->n) hi = pf->n;
    if (hi <= lo) return;
    at = base + (size_t)head_at * (size_t)c->head_mul * c->kv_bytes + lo * pf->stride;
    if (c->nz) /* NZ: tokens [lo, hi) of the head are one run in each of its head_dim / 32
                * parts, a block's part (block_size * 32 bytes of int8) apart */
        c->k->prefetch_rows(at, c->w.p->head_dim / AICPU_ATTENTION_KV_NZ_WIDTH,
                            (size_t)(hi - lo) * (size_t)pf->stride,
                            (ptrdiff_t)c->w.p->block_size * AICPU_ATTENTION_KV_NZ_WIDTH);
    else
        c->k->prefetch_rows(at, hi - lo, pf->head_bytes, pf->stride);
}

/*
 * The logits soft cap: s[r sn + j] = C tanh(s[r sn + j] / C) for the nv[r] scores of each of
 * nr rows (the scores the variant's kernel wrote, scale already applied through the query
 * rows). Portable C for every variant: tanhf is libm's (it does not vectorise, so a capped
 * layer costs one tanhf per score on top of the SIMD work), and no variant's kernels change.
 */
static void cap_scores(float *s, ptrdiff_t sn, int32_t nr, const int32_t *nv, float cap) {
    int32_t r, j;
    for (r = 0; r < nr; r++) {
        float *row = s + r * sn;
        for (j = 0; j < nv[r]; j++) row[j] = cap * tanhf(row[j] / cap);
    }
}

/*
 * The int8 KV cache: n rows of head_dim int8 values, `stride` elements apart, dequantised into
 * contiguous fp32, dst[j d + x] = (src_j[x] - offset[x]) * scale[x] (vLLM-Ascend's C8: the
 * cache holds round(x / scale + offset), attention_v1.py _quantize_kv_to_int8). The variant's
 * kernels then read fp32 rows, so no variant has int8 code of its own, and both layouts give
 * the same fp32 rows. part_stride 0: a row's values are contiguous (ND); else (NZ) a row is
 * head_dim / 32 parts of 32 values, part_stride elements apart (block_size * 32).
 */
static void dequant_rows(float *restrict dst, const int8_t *src, int32_t n, int32_t d,
                         ptrdiff_t stride, ptrdiff_t part_stride, const float *restrict scale,
                         const float *restrict offset) {
    int32_t j, x, x0;
    for (j = 0; j < n; j++) {
        const int8_t *restrict row = src + j * stride;
        float *restrict o = dst + (ptrdiff_t)j * d;
        if (part_stride == 0) {
            for (x = 0; x < d; x++) o[x] = ((float)row[x] - offset[x]) * scale[x];
            continue;
        }
        for (x0 = 0; x0 < d; x0 += AICPU_ATTENTION_KV_NZ_WIDTH) {
            const int8_t *restrict part = row + (x0 / AICPU_ATTENTION_KV_NZ_WIDTH) * part_stride;
            for (x = 0; x < AICPU_ATTENTION_KV_NZ_WIDTH; x++)
                o[x0 + x] = ((float)part[x] - offset[x0 + x]) * scale[x0 + x];
        }
    }
}

static void process_chunk(const core_ctx *c, const float *qs, float *acc, float *sbuf, float *m,
                          float *l, const int32_t *lower, const int32_t *limit,
                          const int32_t *head_at, int32_t nr,
                          int32_t c0, int32_t n, int32_t h0, const void *kraw,
                          const void *vraw, ptrdiff_t stride, float *kbuf, float *vbuf,
                          const chunk_prefetch *pf) {
    const int32_t d = c->w.p->head_dim;
    const size_t esize = c->kv_bytes;
    /* NZ: a row's 32-wide parts are a block's part apart; ND: 0, contiguous */
    const ptrdiff_t part_stride =
        c->nz ? (ptrdiff_t)c->w.p->block_size * AICPU_ATTENTION_KV_NZ_WIDTH : 0;
    chunk_prefetch this_chunk;
    int32_t nv[MAX_ROWS], below[MAX_ROWS];
    int32_t i, e, x;
    this_chunk.k = (const unsigned char *)kraw;
    this_chunk.v = (const unsigned char *)vraw;
    this_chunk.n = n;
    this_chunk.head_bytes = pf->head_bytes;
    this_chunk.stride = stride * (ptrdiff_t)esize;
    for (i = 0; i < nr; i++) {
        int32_t v = limit[i] - c0, w = lower[i] - c0;
        nv[i] = v < 0 ? 0 : v < n ? v : n;
        /* below the row's sliding window: the chunk's first `below` tokens (scored, then masked
         * to -inf, whose exp is 0 in every variant); a row that sees none of the chunk skips it */
        below[i] = w < 0 ? 0 : w;
        if (below[i] >= nv[i]) nv[i] = 0;
    }
    for (i = 0; i < nr; i = e) {
        const char *kp = (const char *)kraw + (size_t)head_at[i] * (size_t)c->head_mul * esize;
        const char *vp = (const char *)vraw + (size_t)head_at[i] * (size_t)c->head_mul * esize;
        const chunk_prefetch *ahead;
        int32_t r, jmax = 0, ahead_at, half;
        for (e = i; e < nr && head_at[e] == head_at[i]; e++)
            if (nv[e] > jmax) jmax = nv[e];
        ahead = e < nr ? &this_chunk : pf; /* the head after this one */
        ahead_at = e < nr ? head_at[e] : head_at[0];
        half = (ahead->n + 1) / 2;
        prefetch_head(c, ahead, ahead->k, ahead_at, 0, half);
        if (jmax == 0) {
            prefetch_head(c, ahead, ahead->k, ahead_at, half, ahead->n);
            prefetch_head(c, ahead, ahead->v, ahead_at, 0, ahead->n);
            continue;
        }
        if (c->kv_int8 != NULL) {
            /* int8: this head's K rows to fp32 in kbuf, read by the variant as an fp32 cache
             * (its scratch is then vbuf, free until the V rows) */
            const size_t at = (size_t)(h0 + head_at[i] / d) * d;
            dequant_rows(kbuf, (const int8_t *)kp, jmax, d, stride, part_stride,
                         c->kv_int8->k_scale + at,
                         c->kv_int8->k_offset + at);
            c->k->scores(sbuf + (size_t)i * n, n, qs + (size_t)i * d, e - i, nv + i, kbuf,
                         AICPU_ATTENTION_FP32, d, d, vbuf);
        } else {
            c->k->scores(sbuf + (size_t)i * n, n, qs + (size_t)i * d, e - i, nv + i, kp,
                         c->dtype, stride, d, kbuf);
        }
        if (c->soft_cap > 0.0f) cap_scores(sbuf + (size_t)i * n, n, e - i, nv + i, c->soft_cap);
        if (c->w.window > 0) {
            for (r = i; r < e; r++) {
                int32_t j;
                for (j = 0; nv[r] > 0 && j < below[r]; j++) sbuf[(size_t)r * n + j] = -INFINITY;
            }
        }
        prefetch_head(c, ahead, ahead->k, ahead_at, half, ahead->n);
        /* online softmax, once per chunk */
        for (r = i; r < e; r++) {
            float *s = sbuf + (size_t)r * n;
            float mx;
            if (nv[r] == 0) continue;
            mx = c->k->row_max(s, nv[r]);
            if (mx > m[r]) {
                float corr = m[r] == -INFINITY ? 0.0f : exp_nonpositive(m[r] - mx);
                float *o = acc + (size_t)r * d;
                for (x = 0; x < d; x++) o[x] *= corr;
                l[r] *= corr;
                m[r] = mx;
            }
            l[r] += c->k->exp_sum(s, nv[r], m[r]);
        }
        /* probability-weighted V rows */
        prefetch_head(c, ahead, ahead->v, ahead_at, 0, half);
        if (c->kv_int8 != NULL) { /* as for K; kbuf is free now and serves as the scratch */
            const size_t at = (size_t)(h0 + head_at[i] / d) * d;
            dequant_rows(vbuf, (const int8_t *)vp, jmax, d, stride, part_stride,
                         c->kv_int8->v_scale + at,
                         c->kv_int8->v_offset + at);
            c->k->accumulate(acc + (size_t)i * d, e - i, nv + i, sbuf + (size_t)i * n, n, vbuf,
                             AICPU_ATTENTION_FP32, d, d, kbuf);
        } else {
            c->k->accumulate(acc + (size_t)i * d, e - i, nv + i, sbuf + (size_t)i * n, n, vp,
                             c->dtype, stride, d, vbuf);
        }
        prefetch_head(c, ahead, ahead->v, ahead_at, half, ahead->n);
    }
}

/* Element offset inside a cache block of token `tok`, kv head h, dim 0: ND [tok][h][d], NZ
 * [h][d / 32][tok][32] (aicpu_attention_kv_int8). Block blk starts blk * the cache's block
 * stride elements into the cache (its own size when the cache is contiguous). */
static size_t kv_in_block(const core_ctx *c, int32_t tok, int32_t h) {
    const aicpu_tiling_params *p = c->w.p;
    if (c->nz)
        return (size_t)h * p->head_dim * p->block_size + (size_t)tok * AICPU_ATTENTION_KV_NZ_WIDTH;
    return ((size_t)tok * p->num_kv_heads + (size_t)h) * p->head_dim;
}

/* The block log (aicpu_attention_set_block_log): test instrumentation, off when count is NULL. */
static int32_t *block_log;
static int32_t block_log_capacity;
static int32_t *block_log_count;

void aicpu_attention_set_block_log(int32_t *log, int32_t capacity, int32_t *count) {
    block_log = log;
    block_log_capacity = log != NULL && capacity > 0 ? capacity : 0;
    block_log_count = count;
}

/* Records that the segment reads kv block column b, once per kv head of the segment. */
static void log_block(const segment *sg, int32_t b) {
    int32_t hh;
    if (block_log_count == NULL) return;
    for (hh = 0; hh < sg->nh; hh++) {
        int32_t n = *block_log_count;
        if (n < block_log_capacity) {
            int32_t *w = block_log + (size_t)4 * n;
            w[0] = sg->r;
            w[1] = sg->h + hh;
            w[2] = sg->t;
            w[3] = b;
        }
        *block_log_count = n + 1;
    }
}

/* A row block of a segment in flight (walk_chunks' argument): its rows' scaled queries,
 * accumulators and online-softmax state (running max m, sum l), the kv positions each row sees
 * [lower, limit), each row's kv head (head_at: elements into a token's row), and the scratch. */
typedef struct {
    const core_ctx *c;
    const segment *sg;
    const float *qs;
    float *acc, *sbuf, *m, *l, *kbuf, *vbuf;
    const int32_t *lower, *limit, *head_at;
    int32_t nr;
} row_block_state;

static void row_block_log(void *arg, int32_t b) { log_block(((row_block_state *)arg)->sg, b); }

/* One chunk of the row block: its K and V rows in the caches, and the next chunk's to fetch
 * while this one runs. */
static void row_block_chunk(void *arg, const kv_chunk *ch) {
    const row_block_state *rb = (const row_block_state *)arg;
    const core_ctx *c = rb->c;
    const int32_t h0 = rb->sg->h;
    const size_t kvsize = c->kv_bytes;
    const size_t tok_at =
        kv_in_block(c, 0, h0) + (size_t)(ch->c0 - ch->b * c->w.p->block_size) * c->token_stride;
    const size_t k_at = (size_t)ch->block * (size_t)c->k_block_stride + tok_at;
    const size_t v_at = (size_t)ch->block * (size_t)c->v_block_stride + tok_at;
    chunk_prefetch pf;
    pf.n = ch->next_n;
    pf.k = pf.v = NULL;
    pf.head_bytes = (size_t)c->w.p->head_dim * kvsize;
    pf.stride = c->token_stride * (ptrdiff_t)kvsize;
    if (ch->next_n > 0) {
        const size_t at = kv_in_block(c, ch->next_tok, h0);
        const size_t nb = (size_t)ch->next_block;
        pf.k = (const unsigned char *)c->key_cache +
               (nb * (size_t)c->k_block_stride + at) * kvsize;
        pf.v = (const unsigned char *)c->value_cache +
               (nb * (size_t)c->v_block_stride + at) * kvsize;
    }
    process_chunk(c, rb->qs, rb->acc, rb->sbuf, rb->m, rb->l, rb->lower, rb->limit, rb->head_at,
                  rb->nr, ch->c0, ch->n, h0, (const char *)c->key_cache + k_at * kvsize,
                  (const char *)c->value_cache + v_at * kvsize, c->token_stride, rb->kbuf,
                  rb->vbuf, &pf);
}

/* The GQA geometry's segment (tiling_walk.run_segment). */
static void run_segment(const tiling_walk *w, const segment *sg, int blocks_ok) {
    const core_ctx *c = (const core_ctx *)w;
    const aicpu_tiling_params *p = c->w.p;
    const int32_t d = p->head_dim;
    const int32_t tok0 = sg->t * p->q_tile;
    const int32_t ntok = sg->ntok, per_head = ntok * c->group;
    const int32_t rows = sg->nh * per_head, width = sg->nh * d;
    const int32_t row_block = QO_FLOATS / d < MAX_ROWS ? QO_FLOATS / d : MAX_ROWS;
    const size_t esize = storage_dtype_bytes(c->dtype);
    float qs[QO_FLOATS], acc[QO_FLOATS], kbuf[KV_FLOATS], vbuf[KV_FLOATS];
    float sbuf[S_FLOATS], m[MAX_ROWS], l[MAX_ROWS];
    int32_t lower[MAX_ROWS], limit[MAX_ROWS], head_at[MAX_ROWS];
    row_block_state rb;
    int32_t r0;

    rb.c = c;
    rb.sg = sg;
    rb.qs = qs;
    rb.acc = acc;
    rb.sbuf = sbuf;
    rb.m = m;
    rb.l = l;
    rb.kbuf = kbuf;
    rb.vbuf = vbuf;
    rb.lower = lower;
    rb.limit = limit;
    rb.head_at = head_at;
    for (r0 = 0; r0 < rows; r0 += row_block) {
        const int32_t nr = rows - r0 < row_block ? rows - r0 : row_block;
        /* width-bound: the chunk touched ahead stays about KV_FLOATS values of K and of V */
        int32_t chunk = KV_FLOATS / width < MAX_CHUNK ? KV_FLOATS / width : MAX_CHUNK;
        int32_t i, kv_hi = 0, kv_lo = INT32_MAX;
        for (i = 0; i < nr; i++) {
            int32_t hh = (r0 + i) / per_head, tok = (r0 + i) % per_head / c->group;
            int32_t g = (r0 + i) % c->group;
            size_t at = ((size_t)(sg->rl.q_start + tok0 + tok) * p->num_q_heads +
                         (size_t)(sg->h + hh) * c->group + g) * d;
            head_at[i] = hh * d;
            storage_load_row(qs + (size_t)i * d, (const char *)c->query + at * esize, c->dtype,
                             d, c->scale);
            memset(acc + (size_t)i * d, 0, (size_t)d * sizeof(float));
            m[i] = -INFINITY;
            l[i] = 0.0f;
            row_positions(&c->w, sg, tok, &lower[i], &limit[i]);
            if (limit[i] > kv_hi) kv_hi = limit[i];
            if (lower[i] < kv_lo) kv_lo = lower[i];
        }
        if (chunk > S_FLOATS / nr) chunk = S_FLOATS / nr;
        rb.nr = nr;
        if (blocks_ok) walk_chunks(&c->w, sg, kv_lo, kv_hi, chunk, &rb, row_block_log,
                                   row_block_chunk);
        for (i = 0; i < nr; i++)
            write_row(c, sg, r0 + i, acc + (size_t)i * d, l[i], m[i], !blocks_ok);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Kv heads one run_segment call can fuse for a tile of ntok query tokens: the scratch holds
 * cap heads' query rows and (at one token per chunk at least) cap heads' K and V rows. */
static int32_t fuse_cap(const tiling_walk *w, int32_t ntok) {
    const core_ctx *c = (const core_ctx *)w;
    int32_t per_head = ntok * c->group, row_block = QO_FLOATS / c->w.p->head_dim, cap;
    if (row_block > MAX_ROWS) row_block = MAX_ROWS;
    cap = KV_FLOATS / c->w.p->head_dim;
    if (cap > row_block / per_head) cap = row_block / per_head;
    return cap < 1 ? 1 : cap;
}

/* 1 when both caches' block strides (elements from one cache block's start to the next's)
 * leave room for a whole block, block_size * num_kv_heads * head_dim elements in either
 * layout: blocks may lie apart (vLLM 0.30's K and V pages of a block side by side in one
 * allocation, attention_ref.h TENSORS), never overlap. params must be valid. */
static int block_strides_ok(const aicpu_tiling_params *params, int64_t key_block_stride,
                            int64_t value_block_stride) {
    const int64_t block = (int64_t)params->block_size * params->num_kv_heads * params->head_dim;
    return key_block_stride >= block && value_block_stride >= block;
}

/* The checks every entry point makes before reading the core table: AICPU_TILING_OK, or the
 * status to return. */
static int layer_check(const aicpu_tiling_params *params, const int32_t *tiling, uint32_t flags,
                       int32_t dtype, int32_t num_blocks, int64_t key_block_stride,
                       int64_t value_block_stride, int32_t window,
                       const aicpu_attention_kv_int8 *kv_int8) {
    if (params == NULL || tiling == NULL || aicpu_tiling_params_check(params) != AICPU_TILING_OK ||
        !storage_dtype_ok(dtype) || num_blocks < 0 || window < 0 ||
        (window > 0 && (flags & AICPU_TILING_CAUSAL) == 0) ||
        (kv_int8 != NULL && (kv_int8->k_scale == NULL || kv_int8->k_offset == NULL ||
                             kv_int8->v_scale == NULL || kv_int8->v_offset == NULL)) ||
        (kv_int8 != NULL && kv_int8->layout != AICPU_ATTENTION_KV_ND &&
         (kv_int8->layout != AICPU_ATTENTION_KV_NZ ||
          params->head_dim % AICPU_ATTENTION_KV_NZ_WIDTH != 0)))
        return AICPU_ATTENTION_E_ARGS;
    if (!block_strides_ok(params, key_block_stride, value_block_stride))
        return AICPU_ATTENTION_E_ARGS;
    if (!header_ok(params, tiling)) return AICPU_ATTENTION_E_TILING;
    if (tiling[AICPU_TILING_HDR_STATUS] != AICPU_TILING_OK) return tiling[AICPU_TILING_HDR_STATUS];
    if ((uint32_t)tiling[AICPU_TILING_HDR_FLAGS] != (flags & AICPU_TILING_CAUSAL))
        return AICPU_ATTENTION_E_TILING;
    if (tiling[AICPU_TILING_HDR_BATCH] < 0 || tiling[AICPU_TILING_HDR_BATCH] > params->max_batch)
        return AICPU_ATTENTION_E_TILING;
    return AICPU_TILING_OK;
}

/* The cap a call runs with: soft_cap when it is > 0 and finite, else 0 (off: NaN, +inf and
 * the non-positive values; C * tanh(s / C) tends to s as C grows). */
static float soft_cap_of(float soft_cap) {
    return soft_cap > 0.0f && soft_cap < INFINITY ? soft_cap : 0.0f;
}

static void ctx_init(core_ctx *c, const aicpu_tiling_params *params, uint32_t flags,
                     int32_t dtype, float scale, float soft_cap, const float *sinks,
                     int32_t window, const aicpu_attention_kv_int8 *kv_int8,
                     const void *query, const void *key_cache,
                     const void *value_cache, int32_t num_blocks, int64_t key_block_stride,
                     int64_t value_block_stride, const int32_t *block_table,
                     const int32_t *cu_seqlens_q, const int32_t *seqlens_kv, void *out,
                     float *partial_out, float *partial_lse) {
    walk_init(&c->w, params, flags, window, num_blocks, block_table, cu_seqlens_q, seqlens_kv,
              partial_out, partial_lse, run_segment, fuse_cap);
    c->group = params->num_q_heads / params->num_kv_heads;
    c->dtype = dtype;
    c->scale = scale;
    c->soft_cap = soft_cap_of(soft_cap);
    c->sinks = sinks;
    c->kv_int8 = kv_int8;
    c->kv_bytes = kv_int8 != NULL ? 1 : storage_dtype_bytes(dtype);
    c->nz = kv_int8 != NULL && kv_int8->layout == AICPU_ATTENTION_KV_NZ;
    c->head_mul = c->nz ? params->block_size : 1;
    c->token_stride = c->nz ? (ptrdiff_t)AICPU_ATTENTION_KV_NZ_WIDTH
                            : (ptrdiff_t)params->num_kv_heads * params->head_dim;
    c->k = isa_kernels(aicpu_attention_isa_active());
    c->query = query;
    c->key_cache = key_cache;
    c->value_cache = value_cache;
    c->k_block_stride = (ptrdiff_t)key_block_stride;
    c->v_block_stride = (ptrdiff_t)value_block_stride;
    c->out = out;
}

/* 1 when every tensor a core reads or writes (other than the partial workspace) is given. */
static int tensors_given(const void *query, const void *key_cache, const void *value_cache,
                         const int32_t *block_table, const int32_t *cu_seqlens_q,
                         const int32_t *seqlens_kv, const void *out) {
    return query != NULL && key_cache != NULL && value_cache != NULL && block_table != NULL &&
           cu_seqlens_q != NULL && seqlens_kv != NULL && out != NULL;
}

int aicpu_attention_core(const aicpu_tiling_params *params, const int32_t *tiling, int32_t core,
                         uint32_t flags, int32_t dtype, float scale, float soft_cap,
                         const float *sinks, int32_t sliding_window,
                         const aicpu_attention_kv_int8 *kv_int8, const void *query,
                         const void *key_cache, const void *value_cache, int32_t num_blocks,
                         int64_t key_block_stride, int64_t value_block_stride,
                         const int32_t *block_table, const int32_t *cu_seqlens_q,
                         const int32_t *seqlens_kv, void *out, float *partial_out,
                         float *partial_lse) {
    core_ctx c;
    const int32_t *rec;
    walk_mode mode;
    int status;

    if (params != NULL && aicpu_tiling_params_check(params) == AICPU_TILING_OK &&
        (core < 0 || core >= params->num_cores))
        return AICPU_ATTENTION_E_ARGS;
    status = layer_check(params, tiling, flags, dtype, num_blocks, key_block_stride,
                         value_block_stride, sliding_window, kv_int8);
    if (status != AICPU_TILING_OK) return status;
    rec = core_record(tiling, core);
    if (core_idle(rec)) return AICPU_TILING_OK;
    if (!tensors_given(query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv, out))
        return AICPU_ATTENTION_E_ARGS;
    ctx_init(&c, params, flags, dtype, scale, soft_cap, sinks, sliding_window, kv_int8, query,
             key_cache, value_cache, num_blocks, key_block_stride, value_block_stride, block_table,
             cu_seqlens_q, seqlens_kv, out, partial_out, partial_lse);
    mode.heads = 0;
    mode.slot_step = 0;
    mode.run = 1;
    mode.skip_whole = 0;
    return walk_range(&c.w, rec, tiling[AICPU_TILING_HDR_BATCH], &mode);
}

int32_t aicpu_attention_num_sibling_sets(const aicpu_tiling_params *params) {
    if (params == NULL || aicpu_tiling_params_check(params) != AICPU_TILING_OK) return 0;
    return params->num_cores % params->num_kv_heads == 0
               ? params->num_cores / params->num_kv_heads
               : params->num_cores;
}

/* Position word w of core j (head 0) as core j + h Q's copy names it (aicpu_tiling.h, THE
 * PARTITION): head 0 becomes head h, the start of head 1 becomes the start of head h + 1 or,
 * for the last head, the end of the work (0, H, 0, 0). */
static void shifted_pos(const int32_t *w, int32_t h, int32_t heads, int32_t *out) {
    out[0] = w[0];
    out[1] = w[1] == 0 ? h : h + 1;
    out[2] = w[2];
    out[3] = w[3];
    if (w[1] != 0 && h + 1 >= heads) {
        out[0] = 0;
        out[1] = heads;
    }
}

/* A position word in head 0, or at a unit start of head 1 (the end of head 0's work). */
static int in_head0(const int32_t *w) {
    return w[1] == 0 || (w[1] == 1 && w[2] == 0 && w[3] == 0);
}

/* 1 when the records of cores j + h Q (1 <= h < H) are core j's moved to head h, with slots
 * moved by h * slot_step, and core j's begin and end are in head 0 (in_head0); the walk checks
 * that a non-idle range does not reach into head 1. */
static int siblings_match(const aicpu_tiling_params *params, const int32_t *tiling, int32_t j,
                          int32_t q, int32_t slot_step) {
    const int32_t *base = core_record(tiling, j);
    const int32_t heads = params->num_kv_heads;
    int32_t h, w;
    if (!in_head0(base + AICPU_TILING_CORE_BEGIN) || !in_head0(base + AICPU_TILING_CORE_END))
        return 0;
    for (h = 1; h < heads; h++) {
        const int32_t *rec = core_record(tiling, j + h * q);
        int32_t want[AICPU_TILING_CORE_WORDS];
        for (w = 0; w < AICPU_TILING_CORE_WORDS; w++) want[w] = base[w];
        shifted_pos(base + AICPU_TILING_CORE_BEGIN, h, heads, want + AICPU_TILING_CORE_BEGIN);
        shifted_pos(base + AICPU_TILING_CORE_END, h, heads, want + AICPU_TILING_CORE_END);
        if (want[AICPU_TILING_CORE_FIRST_SLOT] >= 0)
            want[AICPU_TILING_CORE_FIRST_SLOT] += h * slot_step;
        if (want[AICPU_TILING_CORE_LAST_SLOT] >= 0)
            want[AICPU_TILING_CORE_LAST_SLOT] += h * slot_step;
        for (w = 0; w < AICPU_TILING_CORE_WORDS; w++)
            if (rec[w] != want[w]) return 0;
    }
    return 1;
}

int aicpu_attention_core_siblings(const aicpu_tiling_params *params, const int32_t *tiling,
                                  int32_t first_core, uint32_t flags, int32_t dtype, float scale,
                                  float soft_cap, const float *sinks, int32_t sliding_window,
                                  const aicpu_attention_kv_int8 *kv_int8, const void *query,
                                  const void *key_cache, const void *value_cache,
                                  int32_t num_blocks, int64_t key_block_stride,
                                  int64_t value_block_stride, const int32_t *block_table,
                                  const int32_t *cu_seqlens_q, const int32_t *seqlens_kv,
                                  void *out, float *partial_out,
                                  float *partial_lse) {
    int32_t sets = aicpu_attention_num_sibling_sets(params), heads, q, h, slot_step;
    int status = AICPU_TILING_OK;
    int fusable;

    if (tiling == NULL || sets == 0 || first_core < 0 || first_core >= sets)
        return AICPU_ATTENTION_E_ARGS;
    heads = sets == params->num_cores ? 1 : params->num_kv_heads;
    q = sets;
    slot_step = 0;
    fusable = heads > 1 && layer_check(params, tiling, flags, dtype, num_blocks,
                                       key_block_stride, value_block_stride, sliding_window,
                                       kv_int8) == AICPU_TILING_OK;
    if (fusable) {
        int32_t num_slots = tiling[AICPU_TILING_HDR_NUM_SLOTS];
        fusable = num_slots >= 0 && num_slots % heads == 0;
        slot_step = num_slots / heads;
    }
    fusable = fusable && siblings_match(params, tiling, first_core, q, slot_step) &&
              tensors_given(query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv,
                            out);
    if (fusable) {
        core_ctx c;
        walk_mode mode;
        const int32_t *rec = core_record(tiling, first_core);
        int32_t batch = tiling[AICPU_TILING_HDR_BATCH];
        if (core_idle(rec)) return AICPU_TILING_OK; /* and so are its siblings (checked) */
        ctx_init(&c, params, flags, dtype, scale, soft_cap, sinks, sliding_window, kv_int8, query,
                 key_cache, value_cache, num_blocks, key_block_stride, value_block_stride,
                 block_table, cu_seqlens_q, seqlens_kv, out, partial_out, partial_lse);
        mode.heads = heads;
        mode.slot_step = slot_step;
        mode.run = 0; /* check the whole range first: a bad one falls back to the cores */
        mode.skip_whole = 0;
        status = walk_range(&c.w, rec, batch, &mode);
        if (status == AICPU_TILING_OK || status == AICPU_ATTENTION_E_BLOCK_ID) {
            mode.run = 1;
            return walk_range(&c.w, rec, batch, &mode);
        }
        status = AICPU_TILING_OK;
    }
    /* not fusable: each core of the set on its own, as the per-core loop would run them */
    for (h = 0; h < heads; h++) {
        int s = aicpu_attention_core(params, tiling, first_core + h * q, flags, dtype, scale,
                                     soft_cap, sinks, sliding_window, kv_int8, query, key_cache,
                                     value_cache, num_blocks, key_block_stride,
                                     value_block_stride, block_table, cu_seqlens_q, seqlens_kv,
                                     out, partial_out, partial_lse);
        if (status == AICPU_TILING_OK) status = s;
    }
    return status;
}

/* 1 when the begin and end words of two records name the same position. */
static int same_pos(const int32_t *a, const int32_t *b) {
    return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* 1 when unit (h, r, 0) -- with h < 0, any unit of request r -- is cut inside by the end of a
 * non-idle core of the span other than the last one (that end is the next non-idle core's
 * begin, which begins_inside the unit: the unit is two pieces); kw: window_first_block of
 * request r's units. */
static int span_cuts_unit(const int32_t *tiling, int32_t first_core, int32_t last_live,
                          int32_t h, int32_t r, int32_t kw) {
    int32_t core, next;
    for (core = first_core; core < last_live; core++) {
        const int32_t *rec = core_record(tiling, core), *e = rec + AICPU_TILING_CORE_END;
        if (e[0] != r || (h >= 0 && e[1] != h) || e[3] == 0 || core_idle(rec)) continue;
        for (next = core + 1; next < last_live && core_idle(core_record(tiling, next)); next++) {
        }
        if (begins_inside(e[3], kw, core_record(tiling, next)[AICPU_TILING_CORE_FIRST_SLOT]))
            return 1;
    }
    return 0;
}

/*
 * The whole units of single-tile requests in the span's range [begin, end) that no core
 * boundary cuts, request by request: for request r the heads [lo, hi] whose unit lies inside
 * the range (whole_heads with the span's begin and end), less the cut ones, in
 * runs of up to fuse_cap heads. These are exactly the units the cores' walks leave with
 * skip_whole; ranges and lengths were checked by those walks.
 */
static void run_span_whole(const core_ctx *c, const int32_t *tiling, int32_t first_core,
                           int32_t last_live, const work_pos *begin, const work_pos *end,
                           int32_t batch) {
    const int32_t begin_slot = core_record(tiling, first_core)[AICPU_TILING_CORE_FIRST_SLOT];
    int32_t r;
    for (r = 0; r < batch; r++) {
        segment sg;
        int32_t lo, hi, h, cap, kw;
        int any_cut, blocks_ok;
        if (!load_request(&c->w, r, &sg.rl) || sg.rl.q_len == 0 || num_tiles(&c->w, &sg.rl) != 1)
            continue;
        kw = window_first_block(&c->w, &sg.rl, 0);
        whole_heads(&c->w, begin, end, r, !begins_inside(begin->k, kw, begin_slot), &lo, &hi);
        if (lo > hi) continue;
        sg.r = r;
        sg.t = 0;
        sg.kb = 0; /* run_segment reads from the window's first block */
        sg.ke = unit_blocks(&c->w, &sg.rl, 0);
        blocks_ok = blocks_valid(&c->w, r, kw, sg.ke);
        sg.slot = -1;
        sg.ntok = sg.rl.q_len;
        cap = fuse_cap(&c->w, sg.ntok);
        /* per-head checks only for a request some core boundary cuts */
        any_cut = span_cuts_unit(tiling, first_core, last_live, -1, r, kw);
        for (h = lo; h <= hi;) {
            if (any_cut && span_cuts_unit(tiling, first_core, last_live, h, r, kw)) {
                h++;
                continue;
            }
            for (sg.h = h, sg.nh = 1;
                 sg.nh < cap && h + sg.nh <= hi &&
                 !(any_cut && span_cuts_unit(tiling, first_core, last_live, h + sg.nh, r, kw));
                 sg.nh++) {
            }
            run_segment(&c->w, &sg, blocks_ok);
            h += sg.nh;
        }
    }
}

int aicpu_attention_core_span(const aicpu_tiling_params *params, const int32_t *tiling,
                              int32_t first_core, int32_t num_cores, uint32_t flags,
                              int32_t dtype, float scale, float soft_cap, const float *sinks,
                              int32_t sliding_window, const aicpu_attention_kv_int8 *kv_int8,
                              const void *query, const void *key_cache,
                              const void *value_cache, int32_t num_blocks,
                              int64_t key_block_stride, int64_t value_block_stride,
                              const int32_t *block_table, const int32_t *cu_seqlens_q,
                              const int32_t *seqlens_kv, void *out, float *partial_out,
                              float *partial_lse) {
    int status = AICPU_TILING_OK;
    int32_t core;
    if (params == NULL || aicpu_tiling_params_check(params) != AICPU_TILING_OK ||
        first_core < 0 || num_cores < 1 || first_core > params->num_cores - num_cores)
        return AICPU_ATTENTION_E_ARGS;
    if (num_cores > 1 && tiling != NULL &&
        layer_check(params, tiling, flags, dtype, num_blocks, key_block_stride,
                         value_block_stride, sliding_window, kv_int8) ==
            AICPU_TILING_OK &&
        tensors_given(query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv, out)) {
        core_ctx c;
        walk_mode mode;
        const int32_t *live = NULL; /* the last non-idle record so far */
        int32_t batch = tiling[AICPU_TILING_HDR_BATCH], first_live = -1, last_live = -1;
        int fusable = 1;
        ctx_init(&c, params, flags, dtype, scale, soft_cap, sinks, sliding_window, kv_int8, query,
                 key_cache, value_cache, num_blocks, key_block_stride, value_block_stride,
                 block_table, cu_seqlens_q, seqlens_kv, out, partial_out, partial_lse);
        mode.heads = 0;
        mode.slot_step = 0;
        mode.run = 0; /* check every range first: a bad one falls back to the cores */
        mode.skip_whole = 1;
        for (core = first_core; fusable && core < first_core + num_cores; core++) {
            const int32_t *rec = core_record(tiling, core);
            int s;
            if (core_idle(rec)) continue;
            /* the live ranges must join up: then the span's range is one [begin, end) */
            if (live != NULL &&
                !same_pos(live + AICPU_TILING_CORE_END, rec + AICPU_TILING_CORE_BEGIN))
                fusable = 0;
            s = walk_range(&c.w, rec, batch, &mode);
            if (s != AICPU_TILING_OK && s != AICPU_ATTENTION_E_BLOCK_ID) fusable = 0;
            if (first_live < 0) first_live = core;
            last_live = core;
            live = rec;
        }
        if (fusable && first_live < 0) return AICPU_TILING_OK; /* every core idle */
        if (fusable) {
            work_pos begin, end;
            read_pos(&begin, core_record(tiling, first_live) + AICPU_TILING_CORE_BEGIN);
            read_pos(&end, core_record(tiling, last_live) + AICPU_TILING_CORE_END);
            mode.run = 1;
            for (core = first_live; core <= last_live; core++) {
                const int32_t *rec = core_record(tiling, core);
                int s = core_idle(rec) ? AICPU_TILING_OK : walk_range(&c.w, rec, batch, &mode);
                if (status == AICPU_TILING_OK) status = s;
            }
            run_span_whole(&c, tiling, first_live, last_live, &begin, &end, batch);
            return status;
        }
    }
    /* not fusable: each core on its own, as the per-core loop would run them */
    for (core = first_core; core < first_core + num_cores; core++) {
        int s = aicpu_attention_core(params, tiling, core, flags, dtype, scale, soft_cap, sinks,
                                     sliding_window, kv_int8, query,
                                     key_cache, value_cache, num_blocks, key_block_stride,
                                     value_block_stride, block_table, cu_seqlens_q, seqlens_kv,
                                     out, partial_out, partial_lse);
        if (status == AICPU_TILING_OK) status = s;
    }
    return status;
}

static void zero_rows(const aicpu_tiling_params *p, int32_t dtype, void *out, int32_t from) {
    size_t row_bytes = (size_t)p->num_q_heads * p->head_dim * storage_dtype_bytes(dtype);
    if (from < p->max_tokens)
        memset((char *)out + (size_t)from * row_bytes, 0,
               (size_t)(p->max_tokens - from) * row_bytes);
}

int aicpu_attention_finalize(const aicpu_tiling_params *params, const int32_t *tiling,
                             int32_t dtype, const int32_t *cu_seqlens_q, void *out,
                             const float *partial_out, const float *partial_lse,
                             const float *sinks) {
    const int32_t *comb;
    int32_t batch, num_tokens, ncomb, max_slots, group, d, i;
    int status;

    if (params == NULL || aicpu_tiling_params_check(params) != AICPU_TILING_OK ||
        !storage_dtype_ok(dtype) || out == NULL)
        return AICPU_ATTENTION_E_ARGS;
    if (tiling == NULL || !header_ok(params, tiling)) {
        zero_rows(params, dtype, out, 0);
        return AICPU_ATTENTION_E_TILING;
    }
    status = tiling[AICPU_TILING_HDR_STATUS];
    if (status != AICPU_TILING_OK) {
        zero_rows(params, dtype, out, 0);
        return status;
    }
    batch = tiling[AICPU_TILING_HDR_BATCH];
    num_tokens = tiling[AICPU_TILING_HDR_NUM_TOKENS];
    ncomb = tiling[AICPU_TILING_HDR_NUM_COMBINE];
    max_slots = aicpu_tiling_max_slots(params);
    group = params->num_q_heads / params->num_kv_heads;
    d = params->head_dim;
    comb = tiling + AICPU_TILING_HDR_WORDS + (size_t)AICPU_TILING_CORE_WORDS * params->num_cores;

    /* Check everything before writing anything, so a bad buffer cannot leave half a merge. */
    status = AICPU_TILING_OK;
    if (batch < 0 || batch > params->max_batch || num_tokens < 0 ||
        num_tokens > params->max_tokens || ncomb < 0 || ncomb > params->num_cores - 1 ||
        (ncomb > 0 && (cu_seqlens_q == NULL || partial_out == NULL || partial_lse == NULL)) ||
        (cu_seqlens_q != NULL && cu_seqlens_q[batch] != num_tokens))
        status = AICPU_ATTENTION_E_TILING;
    for (i = 0; status == AICPU_TILING_OK && i < ncomb; i++) {
        const int32_t *cr = comb + (size_t)i * AICPU_TILING_COMB_WORDS;
        int32_t r = cr[AICPU_TILING_COMB_REQUEST], h = cr[AICPU_TILING_COMB_KV_HEAD];
        int32_t t = cr[AICPU_TILING_COMB_Q_TILE], s0 = cr[AICPU_TILING_COMB_FIRST_SLOT];
        int32_t np = cr[AICPU_TILING_COMB_NUM_PIECES];
        if (r < 0 || r >= batch || h < 0 || h >= params->num_kv_heads || t < 0 || s0 < 0 ||
            np < 2 || np > max_slots || s0 > max_slots - np ||
            cu_seqlens_q[r] < 0 || cu_seqlens_q[r + 1] > num_tokens ||
            (int64_t)t * params->q_tile >= (int64_t)cu_seqlens_q[r + 1] - cu_seqlens_q[r])
            status = AICPU_ATTENTION_E_TILING;
    }
    if (status != AICPU_TILING_OK) {
        zero_rows(params, dtype, out, 0);
        return status;
    }

    for (i = 0; i < ncomb; i++) {
        const int32_t *cr = comb + (size_t)i * AICPU_TILING_COMB_WORDS;
        int32_t r = cr[AICPU_TILING_COMB_REQUEST], h = cr[AICPU_TILING_COMB_KV_HEAD];
        int32_t t = cr[AICPU_TILING_COMB_Q_TILE], s0 = cr[AICPU_TILING_COMB_FIRST_SLOT];
        int32_t np = cr[AICPU_TILING_COMB_NUM_PIECES];
        int32_t q_len = cu_seqlens_q[r + 1] - cu_seqlens_q[r];
        int32_t ntok = q_len - t * params->q_tile;
        int32_t tok, g, piece, x;
        float merged[AICPU_TILING_MAX_HEAD_DIM];
        if (ntok > params->q_tile) ntok = params->q_tile;
        for (tok = 0; tok < ntok; tok++) {
            for (g = 0; g < group; g++) {
                size_t row = (size_t)tok * group + g;
                size_t slot_rows = (size_t)params->q_tile * group;
                size_t at = ((size_t)(cu_seqlens_q[r] + t * params->q_tile + tok) *
                                 params->num_q_heads + (size_t)h * group + g) * d;
                float mx = -INFINITY, wsum = 0.0f, sink = 0.0f;
                for (piece = 0; piece < np; piece++) {
                    float lse = partial_lse[(size_t)(s0 + piece) * slot_rows + row];
                    mx = lse > mx ? lse : mx;
                }
                for (x = 0; x < d; x++) merged[x] = 0.0f;
                if (mx > -INFINITY && mx < INFINITY) { /* +inf: a poisoned piece */
                    /* the sink: one more piece, lse = sink and a zero output (the row's only
                     * sink term: the pieces of a split unit never add it) */
                    if (sinks != NULL) {
                        sink = sinks[h * group + g];
                        mx = sink > mx ? sink : mx;
                        wsum = expf(sink - mx);
                    }
                    for (piece = 0; piece < np; piece++) {
                        size_t srow = (size_t)(s0 + piece) * slot_rows + row;
                        const float *po = partial_out + srow * d;
                        float w = partial_lse[srow] > -INFINITY ? expf(partial_lse[srow] - mx)
                                                                : 0.0f;
                        wsum += w;
                        for (x = 0; x < d; x++) merged[x] += w * po[x];
                    }
                }
                storage_store_row((char *)out + at * storage_dtype_bytes(dtype), merged, dtype,
                                  d, wsum > 0.0f ? 1.0f / wsum : 0.0f);
            }
        }
    }
    zero_rows(params, dtype, out, num_tokens);
    return AICPU_TILING_OK;
}

const char *aicpu_attention_strerror(int status) {
    switch (status) {
    case AICPU_ATTENTION_E_ARGS:
        return "attention: invalid argument (NULL pointer, dtype, core index, params or a "
               "cache block stride below a block's elements)";
    case AICPU_ATTENTION_E_TILING:
        return "attention: the tiling buffer does not match the params, flags or lengths";
    case AICPU_ATTENTION_E_BLOCK_ID:
        return "attention: a block-table entry is outside [0, num_blocks)";
    default:
        return aicpu_tiling_strerror(status);
    }
}
