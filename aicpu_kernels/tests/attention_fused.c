/*
 * attention_fused.c -- the fused calls against aicpu_attention_core run on each of their cores,
 * for random tilings and every instruction-set variant (tests/test_attention_fused.py builds
 * it plainly and under ASan+UBSan): aicpu_attention_core_siblings on every sibling set, and
 * aicpu_attention_core_span on a random partition of the cores into spans.
 *
 *   cc -std=c99 -pedantic -Wall -Wextra -Werror -I aicpu_kernels \
 *      aicpu_kernels/tests/attention_fused.c aicpu_kernels/attention_ref.c \
 *      aicpu_kernels/attention_x86.c aicpu_kernels/aicpu_tiling.c -lm -o /tmp/fused
 *   /tmp/fused [problems]   prints "siblings: <names>; <n> runs, <f> fused-shape problems;
 *                           spans: <s> multi-core spans, <x> across kv heads; faults ..."
 *
 * A problem draws kv heads (1, 2, 4, 8), group (1, 2, 4), head_dim (128, 64, 96, 13), block
 * size, q_tile, dtype, causal or not, a batch of decode, speculative decode or chunked-prefill
 * requests (with padded q_len == 0 slots), the logits soft cap (on, C = 0.5, for every third
 * problem), attention sinks (on, 2 + h / 4 for q head h, for every other problem, so with and
 * without the cap), num_cores either a multiple of the kv heads (1 to 4
 * cores per head: splits and idle cores) or any count, and a partition of the cores into spans
 * (lengths 1 to P). Then one of: nothing wrong, an out-of-range block id, a record whose slot
 * or end no longer matches (a tiling the fused walks must refuse), a core whose range is
 * emptied (its end set to its begin: the other ranges no longer join), a failed tiling status,
 * the wrong causal flag, lengths changed after planning (a stale tiling), a NULL argument.
 * Each fused call is compared with the per-core loop over the same cores in the same order
 * (the sets' order for siblings, core order for spans), both starting from the same garbage in
 * out and the partial workspace: its status must equal that loop's first non-OK status, and
 * out, partial_out and partial_lse must agree element by element (before finalize, so that
 * rows a stopped core left unwritten are compared too): within 1e-5 relative for fp32 storage
 * and partials, one rounding (1e-2) for fp16/bf16 outputs.
 * Exit status 1 on the first failure, with the problem printed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_ref.h"
#include "attention_test_values.h"

/* A contiguous cache's block stride, in elements: one block after the other. */
#define PAGE_OF(p) ((int64_t)(p)->block_size * (p)->num_kv_heads * (p)->head_dim)

#define MAX_BATCH 5
#define MAX_TOKENS 40
#define MBPR 12

static uint32_t rng_state = 2463534242u;

static uint32_t next_u32(void) { /* xorshift32 */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static int32_t pick(int32_t n) { return (int32_t)(next_u32() % (uint32_t)n); }

static float uniform(void) { return (float)(next_u32() >> 8) / 8388608.0f - 1.0f; }

/* a == b within rel * |b| + abs_tol; equal infinities and equal NaN-ness agree. */
static int close(double a, double b, double rel, double abs_tol) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs(a - b) <= rel * fabs(b) + abs_tol;
}

enum { OK_CASE, BAD_BLOCK, BAD_SLOT, BAD_END, DROPPED_CORE, FAILED_TILING, WRONG_FLAG,
       STALE_LENS, NULL_ARG, NUM_CASES };
static const char *const case_names[NUM_CASES] = {
    "ok", "bad-block", "bad-slot", "bad-end", "dropped-core", "failed-tiling", "wrong-flag",
    "stale-lengths", "null-arg"};

typedef struct {
    aicpu_tiling_params p;
    int32_t dtype, causal, batch, num_blocks, kind, fault;
    uint32_t call_flags;
    float soft_cap; /* 0: off */
    const float *sinks; /* NULL: off */
    int32_t window;     /* sliding window, 0: off */
    int32_t cu[MAX_BATCH + 1], kv[MAX_BATCH], bt[MAX_BATCH * MBPR];
    int32_t *tiling;
    void *q, *k, *v;
} problem;

/* How a run calls the cores: per-core loops as the reference of either fused call. */
enum { SIBLINGS_REF, SIBLINGS, SPANS_REF, SPANS };

/* One run from garbage; statuses per group (sibling set or span) into st. Spans: span i is
 * cores span_at[i] .. span_at[i + 1] - 1. */
static void run(const problem *pb, int how, const int32_t *span_at, int32_t nspans, void *out,
                float *po, float *pl, int *st) {
    const aicpu_tiling_params *p = &pb->p;
    int32_t sets = aicpu_attention_num_sibling_sets(p), groups, j, c;
    size_t esize = pb->dtype == AICPU_ATTENTION_FP32 ? 4 : 2;
    size_t out_bytes = (size_t)p->max_tokens * p->num_q_heads * p->head_dim * esize;
    size_t ws = aicpu_tiling_workspace_bytes(p);
    const void *q = pb->fault == NULL_ARG ? NULL : pb->q;
    float scale = 1.0f / sqrtf((float)p->head_dim);
    memset(out, 0x3c, out_bytes); /* finite garbage for every dtype */
    if (ws > 0) {
        memset(po, 0x3c, ws);
        memset(pl, 0x3c, ws);
    }
    groups = how == SIBLINGS || how == SIBLINGS_REF ? sets : nspans;
    for (j = 0; j < groups; j++) {
        if (how == SIBLINGS) {
            st[j] = aicpu_attention_core_siblings(p, pb->tiling, j, pb->call_flags, pb->dtype,
                                                  scale, pb->soft_cap, pb->sinks, pb->window,
                                                  NULL, q, pb->k, pb->v,
                                                  pb->num_blocks, PAGE_OF(p), PAGE_OF(p), pb->bt,
                                                  pb->cu, pb->kv, out, ws ? po : NULL,
                                                  ws ? pl : NULL);
            continue;
        }
        if (how == SPANS) {
            st[j] = aicpu_attention_core_span(p, pb->tiling, span_at[j],
                                              span_at[j + 1] - span_at[j], pb->call_flags,
                                              pb->dtype, scale, pb->soft_cap, pb->sinks,
                                              pb->window, NULL, q, pb->k, pb->v,
                                              pb->num_blocks, PAGE_OF(p), PAGE_OF(p), pb->bt,
                                              pb->cu, pb->kv, out, ws ? po : NULL, ws ? pl : NULL);
            continue;
        }
        st[j] = AICPU_TILING_OK;
        for (c = how == SIBLINGS_REF ? j : span_at[j];
             how == SIBLINGS_REF ? c < p->num_cores : c < span_at[j + 1];
             c += how == SIBLINGS_REF ? sets : 1) {
            int s = aicpu_attention_core(p, pb->tiling, c, pb->call_flags, pb->dtype, scale,
                                         pb->soft_cap, pb->sinks, pb->window, NULL, q, pb->k,
                                         pb->v,
                                         pb->num_blocks, PAGE_OF(p), PAGE_OF(p), pb->bt, pb->cu,
                                         pb->kv, out, ws ? po : NULL, ws ? pl : NULL);
            if (st[j] == AICPU_TILING_OK) st[j] = s;
        }
    }
}

/* A random partition of the cores into spans: span_at[0] = 0 < ... < span_at[n] = P. */
static int32_t draw_spans(int32_t num_cores, int32_t *span_at) {
    int32_t n = 0, c = 0, most = 1 + pick(num_cores);
    span_at[0] = 0;
    while (c < num_cores) {
        c += 1 + pick(most);
        if (c > num_cores) c = num_cores;
        span_at[++n] = c;
    }
    return n;
}

static void draw(problem *pb) {
    static const int32_t heads[] = {1, 2, 4, 8}, groups[] = {1, 2, 4}, dims[] = {128, 64, 96, 13};
    aicpu_tiling_params *p = &pb->p;
    int32_t r, tokens = 0, capacity;
    memset(p, 0, sizeof *p);
    p->num_kv_heads = heads[pick(4)];
    p->num_q_heads = p->num_kv_heads * groups[pick(3)];
    p->head_dim = dims[pick(4)];
    p->block_size = pick(2) ? 16 : 8;
    p->max_batch = MAX_BATCH;
    p->max_tokens = MAX_TOKENS;
    p->max_blocks_per_req = MBPR;
    p->num_cores = pick(3) ? p->num_kv_heads * (1 + pick(4)) : 1 + pick(12);
    p->q_tile = 1 << pick(3);
    p->cost_kv_load = AICPU_TILING_DEFAULT_COST_KV_LOAD;
    p->cost_qk_tile = AICPU_TILING_DEFAULT_COST_QK_TILE;
    p->cost_segment = AICPU_TILING_DEFAULT_COST_SEGMENT;
    pb->dtype = pick(3);
    pb->causal = pick(4) != 0;
    pb->kind = pick(3); /* decode, speculative decode, chunked prefill */
    pb->batch = pick(MAX_BATCH + 1);
    capacity = MBPR * p->block_size;
    pb->cu[0] = 0;
    for (r = 0; r < pb->batch; r++) {
        int32_t q_len = pb->kind == 0 ? 1 : pb->kind == 1 ? 1 + pick(4) : 1 + pick(8);
        if (pick(6) == 0) q_len = 0; /* a padded slot */
        if (tokens + q_len > MAX_TOKENS) q_len = 0;
        tokens += q_len;
        pb->cu[r + 1] = tokens;
        pb->kv[r] = q_len + pick(capacity - q_len + 1);
        if (pb->kv[r] == 0 && q_len > 0) pb->kv[r] = 1;
    }
    pb->num_blocks = MAX_BATCH * MBPR;
    for (r = 0; r < MAX_BATCH * MBPR; r++) pb->bt[r] = pick(pb->num_blocks);
}

/* The first difference between a fused run and its per-core reference: "status" (group
 * *at), "out" or "partials" (element *at), or NULL. */
static const char *first_difference(const problem *pb, int32_t groups, const int *st,
                                    const int *st_ref, const void *out, const void *ref,
                                    const float *po, const float *po_ref, const float *pl,
                                    const float *pl_ref, size_t *at) {
    const aicpu_tiling_params *p = &pb->p;
    size_t out_elems = (size_t)MAX_TOKENS * p->num_q_heads * p->head_dim, i;
    size_t ws = aicpu_tiling_workspace_bytes(p);
    double rel = pb->dtype == AICPU_ATTENTION_FP32 ? 1e-5 : 1e-2;
    int32_t j;
    for (j = 0; j < groups; j++)
        if (st[j] != st_ref[j]) return *at = (size_t)j, "status";
    for (i = 0; i < out_elems; i++)
        if (!close(value_at(out, i, pb->dtype), value_at(ref, i, pb->dtype), rel, 1e-6))
            return *at = i, "out";
    for (i = 0; i < ws / 8; i++) /* po and pl: ws / 4 floats each */
        if (!close(po[i], po_ref[i], 1e-5, 1e-6) || !close(pl[i], pl_ref[i], 1e-5, 1e-5))
            return *at = i, "partials";
    return NULL;
}

int main(int argc, char **argv) {
    int32_t nproblems = argc > 1 ? atoi(argv[1]) : 300, n, isa, runs = 0, fused_shape = 0;
    int32_t multi_spans = 0, cross_head_spans = 0, soft_capped = 0, sunk = 0;
    int32_t windowed = 0;
    float sink_values[32]; /* up to 8 kv heads x group 4 */
    int32_t per_case[NUM_CASES];
    char names[64] = "";
    memset(per_case, 0, sizeof per_case);
    for (n = 0; n < 32; n++) sink_values[n] = 2.0f + 0.25f * (float)n;
    for (isa = 0; isa < AICPU_ATTENTION_NUM_ISA; isa++)
        if (aicpu_attention_isa_supported(isa)) {
            strcat(names, names[0] ? " " : "");
            strcat(names, aicpu_attention_isa_name(isa));
        }

    for (n = 0; n < nproblems; n++) {
        problem pb;
        aicpu_tiling_params *p = &pb.p;
        size_t esize, out_elems, cache_elems, ws;
        void *ref, *out;
        float *po_ref, *pl_ref, *po, *pl;
        int st_ref[AICPU_TILING_MAX_CORES], st[AICPU_TILING_MAX_CORES];
        int32_t span_at[AICPU_TILING_MAX_CORES + 1];
        int32_t sets, nspans, j;
        uint32_t plan_flags;

        draw(&pb);
        nspans = draw_spans(pb.p.num_cores, span_at);
        pb.fault = n < NUM_CASES ? n : pick(2) ? OK_CASE : pick(NUM_CASES);
        pb.soft_cap = n % 3 == 2 ? 0.5f : 0.0f; /* not drawn: the other draws stay as they were */
        soft_capped += pb.soft_cap > 0.0f;
        pb.sinks = n % 2 == 1 ? sink_values : NULL; /* not drawn either */
        sunk += pb.sinks != NULL;
        /* a sliding window (causal only) for every fourth problem, 1 to 37 tokens: smaller than,
         * equal to and larger than a block; the tilings know no window (ABI v4), so some pieces
         * have no block in it. Not drawn either. */
        pb.window = pb.causal && n % 4 == 3 ? 1 + n % 37 : 0;
        windowed += pb.window > 0;
        plan_flags = pb.causal ? AICPU_TILING_CAUSAL : 0;
        pb.call_flags = pb.fault == WRONG_FLAG ? plan_flags ^ AICPU_TILING_CAUSAL : plan_flags;
        esize = pb.dtype == AICPU_ATTENTION_FP32 ? 4 : 2;
        out_elems = (size_t)MAX_TOKENS * p->num_q_heads * p->head_dim;
        cache_elems = (size_t)pb.num_blocks * p->block_size * p->num_kv_heads * p->head_dim;
        ws = aicpu_tiling_workspace_bytes(p);
        pb.q = malloc(out_elems * esize);
        pb.k = malloc(cache_elems * esize);
        pb.v = malloc(cache_elems * esize);
        pb.tiling = malloc(aicpu_tiling_bytes(p));
        ref = malloc(out_elems * esize);
        out = malloc(out_elems * esize);
        po_ref = malloc(ws + 4);
        pl_ref = malloc(ws + 4);
        po = malloc(ws + 4);
        pl = malloc(ws + 4);
        if (!pb.q || !pb.k || !pb.v || !pb.tiling || !ref || !out || !po_ref || !pl_ref || !po ||
            !pl)
            return 2;
        fill_values(pb.q, out_elems, pb.dtype, uniform);
        fill_values(pb.k, cache_elems, pb.dtype, uniform);
        fill_values(pb.v, cache_elems, pb.dtype, uniform);
        if (aicpu_tiling_plan(p, pb.cu, pb.kv, pb.batch, 0, plan_flags, pb.tiling,
                              aicpu_tiling_bytes(p)) != AICPU_TILING_OK) {
            printf("FAIL problem %d: the tiling failed\n", (int)n);
            return 1;
        }
        sets = aicpu_attention_num_sibling_sets(p);
        if (sets * p->num_kv_heads == p->num_cores && p->num_kv_heads > 1) fused_shape++;
        for (j = 0; j < nspans; j++) { /* spans whose cores' ranges reach over a kv head */
            const int32_t *first = pb.tiling + AICPU_TILING_HDR_WORDS +
                                   span_at[j] * AICPU_TILING_CORE_WORDS;
            const int32_t *last = pb.tiling + AICPU_TILING_HDR_WORDS +
                                  (span_at[j + 1] - 1) * AICPU_TILING_CORE_WORDS;
            if (span_at[j + 1] - span_at[j] < 2) continue;
            multi_spans++;
            if (last[AICPU_TILING_CORE_END + 1] > first[AICPU_TILING_CORE_BEGIN + 1] + 1)
                cross_head_spans++;
        }
        { /* the fault */
            int32_t *core_tab = pb.tiling + AICPU_TILING_HDR_WORDS;
            int32_t last = (p->num_cores - 1) * AICPU_TILING_CORE_WORDS;
            if (pb.fault == BAD_BLOCK && pb.batch > 0)
                pb.bt[pick(pb.batch * MBPR)] = pick(2) ? -1 - pick(3) : pb.num_blocks + pick(3);
            if (pb.fault == BAD_SLOT) /* the last core's slot, or its cost */
                core_tab[last + (core_tab[last + AICPU_TILING_CORE_LAST_SLOT] >= 0
                                     ? AICPU_TILING_CORE_LAST_SLOT
                                     : AICPU_TILING_CORE_COST)] += 1;
            if (pb.fault == BAD_END) { /* core 0 ends one block or one unit later */
                int32_t *e = core_tab + AICPU_TILING_CORE_END;
                if (e[1] == 0) e[3] += 1;
                else e[1] += 1;
            }
            if (pb.fault == DROPPED_CORE) { /* a core's range emptied: the neighbours' ranges
                                              * no longer join, and its units stay unwritten */
                int32_t *rec = core_tab + pick(p->num_cores) * AICPU_TILING_CORE_WORDS;
                memcpy(rec + AICPU_TILING_CORE_END, rec + AICPU_TILING_CORE_BEGIN,
                       4 * sizeof(int32_t));
            }
            if (pb.fault == FAILED_TILING) pb.tiling[AICPU_TILING_HDR_STATUS] = AICPU_TILING_E_BATCH;
            if (pb.fault == STALE_LENS) /* the first live request's kv length moves by one */
                for (j = 0; j < pb.batch; j++)
                    if (pb.cu[j + 1] > pb.cu[j]) {
                        int32_t q_len = pb.cu[j + 1] - pb.cu[j];
                        pb.kv[j] += pb.kv[j] > q_len ? -1 : 1;
                        break;
                    }
        }
        per_case[pb.fault]++;

        for (isa = 0; isa < AICPU_ATTENTION_NUM_ISA; isa++) {
            int how;
            if (aicpu_attention_set_isa(isa) != AICPU_TILING_OK) continue;
            runs++;
            for (how = SIBLINGS_REF; how <= SPANS_REF; how += 2) {
                int32_t groups = how == SIBLINGS_REF ? sets : nspans;
                size_t at_bad = 0;
                const char *what;
                run(&pb, how, span_at, nspans, ref, po_ref, pl_ref, st_ref);
                run(&pb, how + 1, span_at, nspans, out, po, pl, st);
                what = first_difference(&pb, groups, st, st_ref, out, ref, po, po_ref, pl, pl_ref,
                                        &at_bad);
                if (what == NULL) continue;
                printf("FAIL problem %d (%s, %s, %s): %s differ at %d; kv heads %d q heads %d "
                       "dim %d block %d q_tile %d cores %d spans %d dtype %d causal %d batch %d "
                       "kind %d soft cap %g sinks %d window %d",
                       (int)n, case_names[pb.fault], aicpu_attention_isa_name(isa),
                       how == SIBLINGS_REF ? "siblings" : "spans", what, (int)at_bad,
                       (int)p->num_kv_heads, (int)p->num_q_heads, (int)p->head_dim,
                       (int)p->block_size, (int)p->q_tile, (int)p->num_cores, (int)nspans,
                       (int)pb.dtype, (int)pb.causal, (int)pb.batch, (int)pb.kind,
                       (double)pb.soft_cap, pb.sinks != NULL, (int)pb.window);
                if (what[0] == 's')
                    printf(": status %d, per-core %d", st[at_bad], st_ref[at_bad]);
                printf("\n");
                return 1;
            }
        }
        free(pb.q);
        free(pb.k);
        free(pb.v);
        free(pb.tiling);
        free(ref);
        free(out);
        free(po_ref);
        free(pl_ref);
        free(po);
        free(pl);
    }
    printf("siblings: %s; %d runs, %d fused-shape problems; spans: %d multi-core spans, %d "
           "across kv heads; %d soft-capped problems, %d with sinks, %d with a window; faults",
           names, (int)runs, (int)fused_shape, (int)multi_spans, (int)cross_head_spans,
           (int)soft_capped, (int)sunk, (int)windowed);
    for (n = 0; n < NUM_CASES; n++) printf(" %s %d", case_names[n], (int)per_case[n]);
    printf("\n");
    return 0;
}
