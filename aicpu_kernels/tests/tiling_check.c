/* tiling_check.c -- see tiling_check.h. Walks every segment in global work order. */
#include "tiling_check.h"

#include <stdlib.h>

#define W(i) buf[(i)]

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int tiling_expected_status(const aicpu_tiling_params *p, const int32_t *cu, const int32_t *kv,
                           int32_t batch, int causal, int32_t *bad_request) {
    int32_t r;
    int64_t cap = (int64_t)p->max_blocks_per_req * p->block_size;
    *bad_request = -1;
    if (batch < 0 || batch > p->max_batch) return AICPU_TILING_E_BATCH;
    *bad_request = 0;
    if (cu[0] != 0) return AICPU_TILING_E_QUERY_START;
    for (r = 0; r < batch; ++r) {
        int64_t q = (int64_t)cu[r + 1] - cu[r];
        *bad_request = r;
        if (q < 0) return AICPU_TILING_E_QUERY_DECREASING;
        if (cu[r + 1] > p->max_tokens) return AICPU_TILING_E_QUERY_OVERFLOW;
        if (kv[r] < 0) return AICPU_TILING_E_KV_NEGATIVE;
        if (causal && kv[r] < q) return AICPU_TILING_E_KV_SHORT;
        if (kv[r] > cap) return AICPU_TILING_E_KV_CAPACITY;
        if (!causal && q > 0 && kv[r] == 0) return AICPU_TILING_E_KV_EMPTY;
    }
    *bad_request = -1;
    return AICPU_TILING_OK;
}

typedef struct walker {
    const aicpu_tiling_params *p;
    const int32_t *cu, *kv;
    int32_t batch;
    int causal;
    int32_t r, h, t;   /* the unit the next segment must belong to */
    int64_t kv_next;   /* the kv token its next piece must start at */
    int32_t pieces;    /* pieces of the current unit so far */
} walker;

static int32_t q_len(const walker *w, int32_t r) { return w->cu[r + 1] - w->cu[r]; }

static int64_t unit_kv_end(const walker *w, int32_t r, int32_t t) {
    int64_t q = q_len(w, r), end = (int64_t)(t + 1) * w->p->q_tile;
    if (!w->causal) return w->kv[r];
    return (int64_t)w->kv[r] - q + (end < q ? end : q);
}

static int64_t unit_cost(const walker *w, int32_t r, int32_t t, int64_t blocks) {
    int64_t q = q_len(w, r), tokens = q - (int64_t)t * w->p->q_tile;
    int64_t rows, group = w->p->num_q_heads / w->p->num_kv_heads;
    if (tokens > w->p->q_tile) tokens = w->p->q_tile;
    rows = tokens * group;
    return blocks * ceil_div(w->p->block_size, 16) *
           (w->p->cost_kv_load + w->p->cost_qk_tile * ceil_div(rows, 16));
}

static void skip_empty(walker *w) {
    while (w->r < w->batch && q_len(w, w->r) == 0) w->r++;
}

static void advance_unit(walker *w) {
    if ((int64_t)(w->t + 1) * w->p->q_tile < q_len(w, w->r)) w->t++;
    else if (w->h + 1 < w->p->num_kv_heads) w->h++, w->t = 0;
    else {
        w->r++, w->h = 0, w->t = 0;
        skip_empty(w);
    }
    w->kv_next = 0;
    w->pieces = 0;
}

const char *tiling_check(const aicpu_tiling_params *p, const int32_t *cu, const int32_t *kv,
                         int32_t batch, int causal, const int32_t *buf) {
    walker w;
    int32_t core, next_slot = 0, num_combine = 0, r;
    int64_t units = 0, segments = 0, total = 0, max_cost = 0, bound, w_max = 0;
    const int32_t *prefix = buf + AICPU_TILING_HDR_WORDS + AICPU_TILING_CORE_WORDS * p->num_cores;
    const int32_t *combine = prefix + p->max_batch + 1;
    int32_t *slots_of_request = calloc((size_t)p->max_batch + 1, sizeof(int32_t));
    const char *err = NULL;
    if (!slots_of_request) return "out of memory";
#define FAIL(msg) do { err = (msg); goto done; } while (0)

    if (W(AICPU_TILING_HDR_MAGIC) != AICPU_TILING_MAGIC) FAIL("bad magic");
    if (W(AICPU_TILING_HDR_VERSION) != AICPU_TILING_VERSION) FAIL("bad version");
    if (W(AICPU_TILING_HDR_STATUS) != AICPU_TILING_OK) FAIL("status not OK");
    if (W(AICPU_TILING_HDR_NUM_TOKENS) != cu[batch]) FAIL("num_tokens");

    w.p = p, w.cu = cu, w.kv = kv, w.batch = batch, w.causal = causal;
    w.r = 0, w.h = 0, w.t = 0, w.kv_next = 0, w.pieces = 0;
    skip_empty(&w);
    for (r = 0; r < batch; ++r) {
        int64_t tiles = ceil_div(q_len(&w, r), p->q_tile), t;
        units += tiles * p->num_kv_heads;
        for (t = 0; t < tiles; ++t) {
            int64_t blocks = ceil_div(unit_kv_end(&w, r, (int32_t)t), p->block_size);
            int64_t cost = unit_cost(&w, r, (int32_t)t, blocks);
            total += p->num_kv_heads * (p->cost_segment + cost);
            if (blocks && cost / blocks > w_max) w_max = cost / blocks;
        }
    }

    for (core = 0; core < p->num_cores; ++core) {
        const int32_t *rec = buf + AICPU_TILING_HDR_WORDS + (int64_t)core * AICPU_TILING_CORE_WORDS;
        const int32_t *b = rec + AICPU_TILING_CORE_BEGIN, *e = rec + AICPU_TILING_CORE_END;
        int32_t n = rec[AICPU_TILING_CORE_NUM_SEGMENTS], i;
        int64_t cost = 0;
        if (b[0] != w.r || b[1] != w.h || b[2] != w.t)
            FAIL("core does not begin where the previous one ended");
        if ((int64_t)b[3] * p->block_size != w.kv_next) FAIL("core begins at the wrong block");
        for (i = 0; i < n; ++i) {
            int64_t kv_end, blocks, first, last, slot;
            if (w.r >= batch) FAIL("segment past the last request");
            kv_end = unit_kv_end(&w, w.r, w.t);
            blocks = ceil_div(kv_end, p->block_size);
            first = w.kv_next / p->block_size;
            last = (i == n - 1 && e[3] > 0) ? e[3] : blocks;
            if (i == n - 1 && e[3] > 0 && (e[0] != w.r || e[1] != w.h || e[2] != w.t))
                FAIL("core end inside a unit that is not its last segment's");
            if (last <= first || last > blocks) FAIL("empty or overlong segment");
            if (kv_end > kv[w.r] || kv_end < 1) FAIL("unit kv range outside [1, kv_len]");
            slot = i == 0 ? rec[AICPU_TILING_CORE_FIRST_SLOT]
                          : (i == n - 1 ? rec[AICPU_TILING_CORE_LAST_SLOT] : -1);
            if (first > 0 || last < blocks) { /* a piece of a split unit */
                if (slot != next_slot) FAIL("split piece has the wrong slot");
                if (w.pieces == 0) {
                    const int32_t *c = combine + (int64_t)num_combine * AICPU_TILING_COMB_WORDS;
                    if (num_combine >= p->num_cores - 1) FAIL("too many combine records");
                    if (c[0] != w.r || c[1] != w.h || c[2] != w.t || c[3] != slot)
                        FAIL("combine record does not match its unit");
                    num_combine++;
                }
                slots_of_request[w.r]++;
                next_slot++;
            } else if (slot != -1) FAIL("whole unit given a slot");
            w.pieces++;
            cost += p->cost_segment + unit_cost(&w, w.r, w.t, last - first);
            segments++;
            if (last == blocks) {
                if (w.pieces > 1 &&
                    combine[(int64_t)(num_combine - 1) * AICPU_TILING_COMB_WORDS + 4] != w.pieces)
                    FAIL("combine record has the wrong piece count");
                advance_unit(&w);
            } else w.kv_next = last * p->block_size;
        }
        if (n == 0 && (b[0] != e[0] || b[1] != e[1] || b[2] != e[2] || b[3] != e[3]))
            FAIL("idle core with begin != end");
        if (e[0] != w.r || e[1] != w.h || e[2] != w.t ||
            (int64_t)e[3] * p->block_size != w.kv_next)
            FAIL("core end is not where its segments stop");
        if (rec[AICPU_TILING_CORE_COST] != cost) FAIL("core cost does not match its segments");
        if (cost > max_cost) max_cost = cost;
    }
    if (w.r != batch) FAIL("work left unassigned");
    for (r = 0; r <= p->max_batch; ++r) {
        int32_t want = 0, j;
        for (j = 0; j < r && j < batch; ++j) want += slots_of_request[j];
        if (prefix[r] != want) FAIL("split prefix wrong");
    }
    if (W(AICPU_TILING_HDR_NUM_SLOTS) != next_slot) FAIL("slot count");
    if (next_slot > 2 * (p->num_cores - 1)) FAIL("more slots than the workspace holds");
    if (W(AICPU_TILING_HDR_NUM_COMBINE) != num_combine) FAIL("combine count");
    if (W(AICPU_TILING_HDR_NUM_SEGMENTS) != segments) FAIL("segment count");
    if (segments > units + p->num_cores - 1) FAIL("more segments than units + cores - 1");
    if (W(AICPU_TILING_HDR_NUM_UNITS) != units) FAIL("unit count");
    if (W(AICPU_TILING_HDR_TOTAL_COST) != total) FAIL("total cost");
    if (W(AICPU_TILING_HDR_MAX_CORE_COST) != max_cost) FAIL("max core cost");
    /* The header's balance promise: B + cost_segment + w_max. */
    bound = (total + (int64_t)(p->num_cores - 1) * p->cost_segment + p->num_cores - 1) /
                p->num_cores + p->cost_segment + w_max;
    if (max_cost > bound) FAIL("busiest core above the documented bound");
done:
    free(slots_of_request);
    return err;
#undef FAIL
}
