/*
 * attention_nz.c -- the int8 KV cache in the NZ layout against the same values in the ND
 * layout, in C (tests/test_int8_kv_nz.py builds it plainly and under ASan+UBSan).
 *
 *   cc -std=c99 -pedantic -Wall -Wextra -Werror -I aicpu_kernels \
 *      aicpu_kernels/tests/attention_nz.c aicpu_kernels/attention_ref.c \
 *      aicpu_kernels/attention_x86.c aicpu_kernels/aicpu_tiling.c -lm -o /tmp/attention_nz
 *   /tmp/attention_nz                prints "nz: <variants>; <n> comparisons"
 *
 * The NZ cache is vLLM-Ascend's C8 layout [num_blocks][num_kv_heads][head_dim / 32]
 * [block_size][32] (aicpu_attention_kv_int8). Both layouts dequantise to the same fp32 rows, so
 * every entry point (per core, sibling sets, one span of all cores), instruction-set variant,
 * storage dtype, head_dim (32, 64, 128), group (1, 4), core count (1: whole units; 4 and 5:
 * split pieces, sibling sets fused for 4) and sliding window (off, 20) must give bit-identical
 * outputs, partial workspace included, and status OK. The caches are allocated to their exact
 * size so that a read outside them fails under AddressSanitizer. Also: the NZ cache read with
 * the ND flag gives a different output (the flag is what makes it right), and an unknown layout
 * or NZ with head_dim 48 returns AICPU_ATTENTION_E_ARGS with the output untouched.
 * Exit status 1 on any failure, with the problem printed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"
#include "attention_test_values.h"

/* A contiguous cache's block stride, in elements: one block after the other. */
#define PAGE_OF(p) ((int64_t)(p)->block_size * (p)->num_kv_heads * (p)->head_dim)

#define BS 16
#define HKV 2
#define MAX_BATCH 4
#define MAX_TOKENS 12
#define MBPR 10
#define NUM_BLOCKS (MAX_BATCH * MBPR)
#define W AICPU_ATTENTION_KV_NZ_WIDTH

static uint32_t rng_state = 2718u;

static float uniform(void) { /* in [-1, 1) */
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

/* Which entry point runs the cores. */
enum { PER_CORE, SIBLINGS, SPAN, NUM_ENTRIES };

typedef struct {
    const aicpu_tiling_params *p;
    const int32_t *tiling;
    int32_t dtype, window;
    const aicpu_attention_kv_int8 *kv;
    const void *q, *k, *v;
    const int32_t *bt, *cu, *seqlens;
    void *out;
    float *po, *pl;
} call;

/* Every core through `entry`, then finalize; the first non-OK status. */
static int run(const call *a, int entry) {
    const float scale = 1.0f / sqrtf((float)a->p->head_dim);
    int32_t j, n;
    int status = 0, s;
    if (entry == SPAN) {
        status = aicpu_attention_core_span(a->p, a->tiling, 0, a->p->num_cores,
                                           AICPU_TILING_CAUSAL, a->dtype, scale, 0.0f, NULL,
                                           a->window, a->kv, a->q, a->k, a->v, NUM_BLOCKS,
                                           PAGE_OF(a->p), PAGE_OF(a->p), a->bt,
                                           a->cu, a->seqlens, a->out, a->po, a->pl);
    } else {
        n = entry == SIBLINGS ? aicpu_attention_num_sibling_sets(a->p) : a->p->num_cores;
        for (j = 0; j < n; j++) {
            s = entry == SIBLINGS
                    ? aicpu_attention_core_siblings(a->p, a->tiling, j, AICPU_TILING_CAUSAL,
                                                    a->dtype, scale, 0.0f, NULL, a->window, a->kv,
                                                    a->q, a->k, a->v, NUM_BLOCKS, PAGE_OF(a->p),
                                                    PAGE_OF(a->p), a->bt, a->cu,
                                                    a->seqlens, a->out, a->po, a->pl)
                    : aicpu_attention_core(a->p, a->tiling, j, AICPU_TILING_CAUSAL, a->dtype,
                                           scale, 0.0f, NULL, a->window, a->kv, a->q, a->k, a->v,
                                           NUM_BLOCKS, PAGE_OF(a->p), PAGE_OF(a->p), a->bt,
                                           a->cu, a->seqlens, a->out, a->po, a->pl);
            if (s && !status) status = s;
        }
    }
    if (status) return status;
    return aicpu_attention_finalize(a->p, a->tiling, a->dtype, a->cu, a->out, a->po, a->pl, NULL);
}

/* The NZ copy of an ND int8 cache of head_dim d (d % 32 == 0). */
static void to_nz(int8_t *nz, const int8_t *nd, int32_t d) {
    int32_t b, t, h, x;
    for (b = 0; b < NUM_BLOCKS; b++)
        for (t = 0; t < BS; t++)
            for (h = 0; h < HKV; h++)
                for (x = 0; x < d; x++)
                    nz[((((size_t)b * HKV + h) * (d / W) + x / W) * BS + t) * W + x % W] =
                        nd[(((size_t)b * BS + t) * HKV + h) * d + x];
}

static void fill_int8(int8_t *p, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) p[i] = (int8_t)(int32_t)floorf(uniform() * 128.0f);
}

static int fail_args(const char *what, int status, const void *out, const void *pattern,
                     size_t bytes) {
    if (status != AICPU_ATTENTION_E_ARGS || memcmp(out, pattern, bytes) != 0) {
        printf("FAIL %s: status %d (want %d), output %s\n", what, status,
               AICPU_ATTENTION_E_ARGS, memcmp(out, pattern, bytes) ? "written" : "untouched");
        return 1;
    }
    return 0;
}

int main(void) {
    static const int32_t dims[] = {32, 64, 128}, groups[] = {1, 4}, cores[] = {1, 4, 5};
    static const int32_t windows[] = {0, 20};
    static const int32_t q_lens[] = {1, 5, 1}, kv_lens[] = {150, 40, 67};
    const int32_t batch = 3;
    int32_t cu[MAX_BATCH + 1], seqlens[MAX_BATCH], bt[NUM_BLOCKS];
    int32_t di, gi, ci, wi, dtype, isa, entry, r, comparisons = 0;
    char names[64] = "";

    cu[0] = 0;
    for (r = 0; r < batch; r++) {
        cu[r + 1] = cu[r] + q_lens[r];
        seqlens[r] = kv_lens[r];
    }
    for (r = 0; r < NUM_BLOCKS; r++) bt[r] = (r * 7) % NUM_BLOCKS; /* scattered, in range */
    for (isa = 0; isa < AICPU_ATTENTION_NUM_ISA; isa++)
        if (aicpu_attention_isa_supported(isa)) {
            strcat(names, names[0] ? " " : "");
            strcat(names, aicpu_attention_isa_name(isa));
        }

    for (di = 0; di < 3; di++)
        for (gi = 0; gi < 2; gi++)
            for (ci = 0; ci < 3; ci++)
                for (wi = 0; wi < 2; wi++)
                    for (dtype = 0; dtype < 3; dtype++) {
                        aicpu_tiling_params p;
                        const int32_t d = dims[di];
                        size_t esize = dtype == AICPU_ATTENTION_FP32 ? 4 : 2;
                        size_t out_elems, cache_elems, ws;
                        int8_t *knd, *vnd, *knz, *vnz;
                        float *sc[4], *po, *pl, *po2, *pl2;
                        void *q, *out_nd, *out_nz;
                        int32_t *tiling, i;
                        aicpu_attention_kv_int8 nd, nz;
                        call a;
                        memset(&p, 0, sizeof p);
                        p.num_q_heads = HKV * groups[gi];
                        p.num_kv_heads = HKV;
                        p.head_dim = d;
                        p.block_size = BS;
                        p.max_batch = MAX_BATCH;
                        p.max_tokens = MAX_TOKENS;
                        p.max_blocks_per_req = MBPR;
                        p.num_cores = cores[ci];
                        p.q_tile = 1;
                        p.cost_kv_load = AICPU_TILING_DEFAULT_COST_KV_LOAD;
                        p.cost_qk_tile = AICPU_TILING_DEFAULT_COST_QK_TILE;
                        p.cost_segment = AICPU_TILING_DEFAULT_COST_SEGMENT;
                        p.sliding_window = windows[wi];
                        out_elems = (size_t)MAX_TOKENS * p.num_q_heads * d;
                        cache_elems = (size_t)NUM_BLOCKS * BS * HKV * d;
                        ws = aicpu_tiling_workspace_bytes(&p) + 4;
                        q = malloc(out_elems * esize);
                        out_nd = malloc(out_elems * esize);
                        out_nz = malloc(out_elems * esize);
                        knd = malloc(cache_elems);
                        vnd = malloc(cache_elems);
                        knz = malloc(cache_elems);
                        vnz = malloc(cache_elems);
                        tiling = malloc(aicpu_tiling_bytes(&p));
                        po = malloc(ws);
                        pl = malloc(ws);
                        po2 = malloc(ws);
                        pl2 = malloc(ws);
                        for (i = 0; i < 4; i++) sc[i] = malloc((size_t)HKV * d * sizeof(float));
                        if (!q || !out_nd || !out_nz || !knd || !vnd || !knz || !vnz || !tiling ||
                            !po || !pl || !po2 || !pl2 || !sc[0] || !sc[1] || !sc[2] || !sc[3])
                            return 2;
                        fill_values(q, out_elems, dtype, uniform);
                        fill_int8(knd, cache_elems);
                        fill_int8(vnd, cache_elems);
                        to_nz(knz, knd, d);
                        to_nz(vnz, vnd, d);
                        for (i = 0; i < HKV * d; i++) {
                            sc[0][i] = 0.01f + 0.02f * (uniform() + 1.0f); /* scales > 0 */
                            sc[1][i] = 4.0f * uniform();                   /* offsets */
                            sc[2][i] = 0.01f + 0.02f * (uniform() + 1.0f);
                            sc[3][i] = 4.0f * uniform();
                        }
                        memset(&nd, 0, sizeof nd); /* layout 0: ND */
                        nd.k_scale = sc[0];
                        nd.k_offset = sc[1];
                        nd.v_scale = sc[2];
                        nd.v_offset = sc[3];
                        nz = nd;
                        nz.layout = AICPU_ATTENTION_KV_NZ;
                        if (aicpu_tiling_plan(&p, cu, seqlens, batch, 0, AICPU_TILING_CAUSAL, tiling,
                                              aicpu_tiling_bytes(&p)) != AICPU_TILING_OK)
                            return 3;
                        a.p = &p;
                        a.tiling = tiling;
                        a.dtype = dtype;
                        a.window = windows[wi];
                        a.q = q;
                        a.bt = bt;
                        a.cu = cu;
                        a.seqlens = seqlens;
                        for (isa = 0; isa < AICPU_ATTENTION_NUM_ISA; isa++) {
                            if (aicpu_attention_set_isa(isa) != AICPU_TILING_OK) continue;
                            for (entry = 0; entry < NUM_ENTRIES; entry++) {
                                int s_nd, s_nz;
                                memset(out_nd, 0x7f, out_elems * esize);
                                memset(out_nz, 0x3f, out_elems * esize);
                                memset(po, 0, ws);
                                memset(pl, 0, ws);
                                memset(po2, 0, ws);
                                memset(pl2, 0, ws);
                                a.kv = &nd;
                                a.k = knd;
                                a.v = vnd;
                                a.out = out_nd;
                                a.po = po;
                                a.pl = pl;
                                s_nd = run(&a, entry);
                                a.kv = &nz;
                                a.k = knz;
                                a.v = vnz;
                                a.out = out_nz;
                                a.po = po2;
                                a.pl = pl2;
                                s_nz = run(&a, entry);
                                comparisons++;
                                if (s_nd || s_nz || memcmp(out_nd, out_nz, out_elems * esize) ||
                                    memcmp(po, po2, ws) || memcmp(pl, pl2, ws)) {
                                    printf("FAIL %s entry %d: head_dim %d group %d cores %d "
                                           "window %d dtype %d: status ND %d NZ %d, outputs %s\n",
                                           aicpu_attention_isa_name(isa), entry, (int)d,
                                           (int)groups[gi], (int)p.num_cores, (int)windows[wi],
                                           (int)dtype, s_nd, s_nz,
                                           memcmp(out_nd, out_nz, out_elems * esize)
                                               ? "differ" : "equal (workspace differs)");
                                    return 1;
                                }
                            }
                        }
                        { /* the outputs compared are real results: finite, not all zero */
                            double sum = 0.0;
                            size_t e, live = (size_t)cu[batch] * p.num_q_heads * d;
                            for (e = 0; e < live; e++) sum += fabs(value_at(out_nz, e, dtype));
                            if (!(sum > 0.0) || !(sum < INFINITY)) {
                                printf("FAIL NZ output sum |x| = %g: head_dim %d\n", sum, (int)d);
                                return 1;
                            }
                        }
                        /* the NZ bytes read as ND: another output, so the flag does the work */
                        aicpu_attention_set_isa(AICPU_ATTENTION_ISA_PORTABLE);
                        a.kv = &nd;
                        a.out = out_nd;
                        if (run(&a, PER_CORE) ||
                            !memcmp(out_nd, out_nz, (size_t)cu[batch] * p.num_q_heads * d * esize)) {
                            printf("FAIL the NZ cache read as ND gives the NZ output: head_dim %d\n",
                                   (int)d);
                            return 1;
                        }
                        { /* bad layouts: E_ARGS, nothing written */
                            aicpu_attention_kv_int8 bad = nz;
                            int s;
                            memset(out_nz, 0x5a, out_elems * esize);
                            memcpy(out_nd, out_nz, out_elems * esize);
                            bad.layout = 2;
                            a.kv = &bad;
                            a.out = out_nz;
                            s = aicpu_attention_core(&p, tiling, 0, AICPU_TILING_CAUSAL, dtype,
                                                     1.0f, 0.0f, NULL, windows[wi], &bad, q, knz,
                                                     vnz, NUM_BLOCKS, PAGE_OF(&p), PAGE_OF(&p), bt,
                                                     cu, seqlens, out_nz, po,
                                                     pl);
                            if (fail_args("layout 2", s, out_nz, out_nd, out_elems * esize))
                                return 1;
                            bad.layout = -1;
                            s = aicpu_attention_core_span(&p, tiling, 0, p.num_cores,
                                                          AICPU_TILING_CAUSAL, dtype, 1.0f, 0.0f,
                                                          NULL, windows[wi], &bad, q, knz, vnz,
                                                          NUM_BLOCKS, PAGE_OF(&p), PAGE_OF(&p),
                                                          bt, cu, seqlens, out_nz,
                                                          po, pl);
                            if (fail_args("layout -1 (span)", s, out_nz, out_nd,
                                          out_elems * esize))
                                return 1;
                        }
                        free(q);
                        free(out_nd);
                        free(out_nz);
                        free(knd);
                        free(vnd);
                        free(knz);
                        free(vnz);
                        free(tiling);
                        free(po);
                        free(pl);
                        free(po2);
                        free(pl2);
                        for (i = 0; i < 4; i++) free(sc[i]);
                    }

    { /* NZ needs head_dim % 32 == 0: 48 is refused, ND 48 runs */
        aicpu_tiling_params p;
        static float sc[HKV * 48];
        static int8_t cache[NUM_BLOCKS * BS * HKV * 48];
        static float q[MAX_TOKENS * HKV * 48], out[MAX_TOKENS * HKV * 48], pat[MAX_TOKENS * HKV * 48];
        static float po[4096], pl[4096];
        static int32_t tiling[65536];
        aicpu_attention_kv_int8 kv;
        int s;
        memset(&p, 0, sizeof p);
        p.num_q_heads = HKV;
        p.num_kv_heads = HKV;
        p.head_dim = 48;
        p.block_size = BS;
        p.max_batch = MAX_BATCH;
        p.max_tokens = MAX_TOKENS;
        p.max_blocks_per_req = MBPR;
        p.num_cores = 1;
        p.q_tile = 1;
        p.cost_kv_load = AICPU_TILING_DEFAULT_COST_KV_LOAD;
        p.cost_qk_tile = AICPU_TILING_DEFAULT_COST_QK_TILE;
        p.cost_segment = AICPU_TILING_DEFAULT_COST_SEGMENT;
        if (aicpu_tiling_bytes(&p) > sizeof tiling ||
            aicpu_tiling_workspace_bytes(&p) > sizeof po ||
            aicpu_tiling_plan(&p, cu, seqlens, batch, 0, AICPU_TILING_CAUSAL, tiling,
                              aicpu_tiling_bytes(&p)) != AICPU_TILING_OK)
            return 3;
        memset(&kv, 0, sizeof kv);
        kv.k_scale = kv.k_offset = kv.v_scale = kv.v_offset = sc;
        kv.layout = AICPU_ATTENTION_KV_NZ;
        memset(out, 0x5a, sizeof out);
        memcpy(pat, out, sizeof out);
        s = aicpu_attention_core(&p, tiling, 0, AICPU_TILING_CAUSAL, AICPU_ATTENTION_FP32, 1.0f,
                                 0.0f, NULL, 0, &kv, q, cache, cache, NUM_BLOCKS, PAGE_OF(&p),
                                 PAGE_OF(&p), bt, cu, seqlens, out, po, pl);
        if (fail_args("NZ with head_dim 48", s, out, pat, sizeof out)) return 1;
        kv.layout = AICPU_ATTENTION_KV_ND;
        s = aicpu_attention_core(&p, tiling, 0, AICPU_TILING_CAUSAL, AICPU_ATTENTION_FP32, 1.0f,
                                 0.0f, NULL, 0, &kv, q, cache, cache, NUM_BLOCKS, PAGE_OF(&p),
                                 PAGE_OF(&p), bt, cu, seqlens, out, po, pl);
        if (s != AICPU_TILING_OK) {
            printf("FAIL ND with head_dim 48: status %d\n", s);
            return 1;
        }
    }
    printf("nz: %s; %d comparisons\n", names, (int)comparisons);
    return 0;
}
