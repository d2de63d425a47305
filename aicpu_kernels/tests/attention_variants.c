/*
 * attention_variants.c -- every instruction-set variant of the reference attention against
 * the portable one, in C (tests/test_attention_c.py builds it plainly and under ASan+UBSan).
 *
 *   cc -std=c99 -pedantic -Wall -Wextra -Werror -I aicpu_kernels \
 *      aicpu_kernels/tests/attention_variants.c aicpu_kernels/attention_ref.c \
 *      aicpu_kernels/attention_x86.c aicpu_kernels/aicpu_tiling.c -lm -o /tmp/attention_variants
 *   /tmp/attention_variants          prints "variants: <names>; <n> problems, worst <e>"
 *
 * Problems: decode and causal prefill together, head_dim with and without a vector tail
 * (128, 96, 72, 13; the AVX-512 bf16 scores need head_dim % 32 == 0), groups of 1, 3 and 4
 * query heads per kv head (the SIMD kernels block rows by four), every storage dtype, 1 and 5
 * cores (whole units and split pieces), the logits soft cap off and on (C = 0.5, where tanh
 * bends the scores, which are about N(0, 1/3) here), attention sinks off and on (2 + h / 4
 * for q head h: as large as a row's summed weights, so they matter), alone and with the cap. Each variant's output must be within a
 * relative error of 1e-5 (fp32) or 1e-2 (fp16, bf16: one rounding) of the portable output,
 * every status OK, and the padding rows zero. The portable output with the cap off must be
 * bit-identical whichever off value is passed (0, -1, NaN, +inf), and with the cap on it must
 * differ from the uncapped one by more than 5% (relative): the cap was applied; likewise sinks
 * (finalize given the sinks too) must move the output by more than 5%.
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
#define MAX_BATCH 4
#define MAX_TOKENS 12

static uint32_t rng_state = 12345u;

static float uniform(void) { /* in [-1, 1) */
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

/* Relative (L2) difference of two outputs of n elements. */
static double rel_diff(const void *a, const void *b, size_t n, int32_t dtype) {
    double num = 0.0, den = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double x = value_at(a, i, dtype), y = value_at(b, i, dtype);
        num += (x - y) * (x - y);
        den += y * y;
    }
    return sqrt(num / (den > 0.0 ? den : 1.0));
}

/* Runs every core then finalize with the active variant into out; returns the first non-OK
 * status. */
static int run(const aicpu_tiling_params *p, const int32_t *tiling, int32_t dtype, float cap,
               const float *sinks, const void *q, const void *k, const void *v, int32_t num_blocks,
               const int32_t *bt, const int32_t *cu, const int32_t *kv, void *out, float *po,
               float *pl) {
    int32_t c;
    int status;
    for (c = 0; c < p->num_cores; c++) {
        status = aicpu_attention_core(p, tiling, c, AICPU_TILING_CAUSAL, dtype,
                                      1.0f / sqrtf((float)p->head_dim), cap, sinks, 0, NULL, q, k,
                                      v,
                                      num_blocks, PAGE_OF(p), PAGE_OF(p), bt, cu, kv, out, po, pl);
        if (status) return status;
    }
    return aicpu_attention_finalize(p, tiling, dtype, cu, out, po, pl, sinks);
}

int main(void) {
    static const int32_t dims[] = {128, 96, 72, 13}, groups[] = {1, 3, 4}, cores[] = {1, 5};
    /* settings: off, soft cap, sinks, soft cap and sinks */
    static const float caps[] = {0.0f, 0.5f, 0.0f, 0.5f};
    static const int use_sinks[] = {0, 0, 1, 1};
    float sink_values[8];
    static const int32_t q_lens[] = {1, 5, 1}, kv_lens[] = {150, 40, 67};
    const int32_t batch = 3, hkv = 2, mbpr = 10, num_blocks = MAX_BATCH * mbpr;
    int32_t cu[MAX_BATCH + 1], kv[MAX_BATCH], bt[MAX_BATCH * 10];
    int32_t di, gi, ci, si, dtype, isa, r, problems = 0;
    double worst = 0.0;
    char names[64] = "";

    for (r = 0; r < 8; r++) sink_values[r] = 2.0f + 0.25f * (float)r;
    cu[0] = 0;
    for (r = 0; r < batch; r++) {
        cu[r + 1] = cu[r] + q_lens[r];
        kv[r] = kv_lens[r];
    }
    for (r = 0; r < MAX_BATCH * mbpr; r++) bt[r] = (r * 7) % num_blocks; /* scattered, in range */
    for (isa = 0; isa < AICPU_ATTENTION_NUM_ISA; isa++)
        if (aicpu_attention_isa_supported(isa)) {
            strcat(names, names[0] ? " " : "");
            strcat(names, aicpu_attention_isa_name(isa));
        }

    for (di = 0; di < 4; di++)
        for (gi = 0; gi < 3; gi++)
            for (ci = 0; ci < 2; ci++)
                /* every (setting, dtype) pair: dtype runs fastest */
                for (si = 0, dtype = 0; si < 4; dtype = (dtype + 1) % 3, si += dtype == 0) {
                    const float *sinks = use_sinks[si] ? sink_values : NULL;
                    aicpu_tiling_params p;
                    size_t esize = dtype == AICPU_ATTENTION_FP32 ? 4 : 2, out_elems, cache_elems;
                    void *q, *k, *v, *ref, *out;
                    float *po, *pl;
                    int32_t *tiling;
                    memset(&p, 0, sizeof p);
                    p.num_q_heads = hkv * groups[gi];
                    p.num_kv_heads = hkv;
                    p.head_dim = dims[di];
                    p.block_size = BS;
                    p.max_batch = MAX_BATCH;
                    p.max_tokens = MAX_TOKENS;
                    p.max_blocks_per_req = mbpr;
                    p.num_cores = cores[ci];
                    p.q_tile = 1;
                    p.cost_kv_load = AICPU_TILING_DEFAULT_COST_KV_LOAD;
                    p.cost_qk_tile = AICPU_TILING_DEFAULT_COST_QK_TILE;
                    p.cost_segment = AICPU_TILING_DEFAULT_COST_SEGMENT;
                    out_elems = (size_t)MAX_TOKENS * p.num_q_heads * p.head_dim;
                    cache_elems = (size_t)num_blocks * BS * hkv * p.head_dim;
                    q = malloc(out_elems * esize);
                    ref = malloc(out_elems * esize);
                    out = malloc(out_elems * esize);
                    k = malloc(cache_elems * esize);
                    v = malloc(cache_elems * esize);
                    tiling = malloc(aicpu_tiling_bytes(&p));
                    po = malloc(aicpu_tiling_workspace_bytes(&p) + 4);
                    pl = malloc(aicpu_tiling_workspace_bytes(&p) + 4);
                    if (!q || !ref || !out || !k || !v || !tiling || !po || !pl) return 2;
                    fill_values(q, out_elems, dtype, uniform);
                    fill_values(k, cache_elems, dtype, uniform);
                    fill_values(v, cache_elems, dtype, uniform);
                    if (aicpu_tiling_plan(&p, cu, kv, batch, 0, AICPU_TILING_CAUSAL, tiling,
                                          aicpu_tiling_bytes(&p)) != AICPU_TILING_OK)
                        return 3;
                    aicpu_attention_set_isa(AICPU_ATTENTION_ISA_PORTABLE);
                    if (run(&p, tiling, dtype, caps[si], sinks, q, k, v, num_blocks, bt, cu, kv,
                            ref, po, pl))
                        return 4;
                    if (si == 0) { /* every off value: the very same bits */
                        static const float off[] = {-1.0f, NAN, INFINITY};
                        int oi;
                        for (oi = 0; oi < 3; oi++) {
                            if (run(&p, tiling, dtype, off[oi], NULL, q, k, v, num_blocks, bt,
                                    cu, kv, out, po, pl) ||
                                memcmp(out, ref, out_elems * esize) != 0) {
                                printf("FAIL soft cap %g is not bit-identical to 0 (off): head_dim "
                                       "%d group %d cores %d dtype %d\n", (double)off[oi],
                                       (int)p.head_dim, (int)groups[gi], (int)p.num_cores,
                                       (int)dtype);
                                return 1;
                            }
                        }
                    } else { /* the cap and the sinks must each change the result */
                        double effect;
                        if (run(&p, tiling, dtype, use_sinks[si] ? caps[si] : 0.0f, NULL, q, k,
                                v, num_blocks, bt, cu, kv, out, po, pl))
                            return 4;
                        effect = rel_diff(ref, out, out_elems, dtype);
                        if (!(effect > 0.05)) {
                            printf("FAIL setting %d (soft cap %g, sinks %d) changes the output by "
                                   "only %g: head_dim %d group %d cores %d dtype %d\n", (int)si,
                                   (double)caps[si], use_sinks[si], effect, (int)p.head_dim,
                                   (int)groups[gi], (int)p.num_cores, (int)dtype);
                            return 1;
                        }
                    }
                    for (isa = 1; isa < AICPU_ATTENTION_NUM_ISA; isa++) {
                        double num = 0.0, den = 0.0, err;
                        size_t i, first_pad = (size_t)cu[batch] * p.num_q_heads * p.head_dim;
                        int status;
                        if (aicpu_attention_set_isa(isa) != AICPU_TILING_OK) continue;
                        memset(out, 0x7f, out_elems * esize); /* garbage, must be overwritten */
                        status = run(&p, tiling, dtype, caps[si], sinks, q, k, v, num_blocks, bt,
                                     cu, kv, out, po, pl);
                        for (i = 0; i < out_elems; i++) {
                            double a = value_at(out, i, dtype), b = value_at(ref, i, dtype);
                            num += (a - b) * (a - b);
                            den += b * b;
                            if (i >= first_pad && a != 0.0) status = -1;
                        }
                        err = sqrt(num / (den > 0.0 ? den : 1.0));
                        if (err > worst) worst = err;
                        problems++;
                        double tol = dtype == AICPU_ATTENTION_FP32 ? 1e-5 : 1e-2;
                        if (status != 0 || !(err <= tol)) {
                            printf("FAIL %s: head_dim %d group %d cores %d soft cap %g sinks %d "
                                   "dtype %d: status %d, relative error %g\n",
                                   aicpu_attention_isa_name(isa), (int)p.head_dim,
                                   (int)groups[gi], (int)p.num_cores, (double)caps[si],
                                   use_sinks[si], (int)dtype, status, err);
                            return 1;
                        }
                    }
                    free(q);
                    free(ref);
                    free(out);
                    free(k);
                    free(v);
                    free(tiling);
                    free(po);
                    free(pl);
                }
    printf("variants: %s; %d problems, worst relative error %.3g\n", names, (int)problems, worst);
    return 0;
}
