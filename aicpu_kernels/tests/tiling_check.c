/* tiling_check.c -- see tiling_check.h. Walks every segment in global (head-major) work order. */
#include "tiling_check.h"

#include <stdlib.h>

#define W(i) buf[(i)]

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int32_t tiling_live_batch(const int32_t *kv, int32_t batch) {
    int32_t live = 0, r;
    for (r = 0; r < batch; ++r)
        if (kv[r] != 0) live = r + 1;
    return live;
}

int tiling_expected_status(const aicpu_tiling_params *p, const int32_t *cu, const int32_t *kv,
                           int32_t batch, int causal, int32_t *bad_request) {
    int32_t r;
    int64_t cap = (int64_t)p->max_blocks_per_req * p->block_size;
    *bad_request = -1;
    if (batch < 0 || batch > p->max_batch) return AICPU_TILING_E_BATCH;
    batch = tiling_live_batch(kv, batch);
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

/* The walk position is (r, h, t) in head-major order; (0, num_kv_heads, 0) is the end. */
typedef struct walker {
    const aicpu_tiling_params *p;
    const int32_t *cu, *kv;
    int32_t batch;
    int causal;
    int64_t window;    /* sliding_window, 0 for none */
    int32_t r, h, t;   /* the unit the next segment must belong to */
    int64_t kv_next;   /* the kv token (a multiple of block_size) its next piece starts at */
    int32_t pieces;    /* pieces of the current unit so far */
} walker;

static int32_t q_len(const walker *w, int32_t r) { return w->cu[r + 1] - w->cu[r]; }

static int64_t unit_kv_end(const walker *w, int32_t r, int32_t t) {
    int64_t q = q_len(w, r), end = (int64_t)(t + 1) * w->p->q_tile;
    if (!w->causal) return w->kv[r];
    return (int64_t)w->kv[r] - q + (end < q ? end : q);
}

/* The block-table column of a unit's first block: floor(kv_begin / block_size), kv_begin the
 * window start max(0, p0 - W + 1) of its first row p0 = kv - q + t * q_tile (ABI v5). */
static int64_t unit_first_column(const walker *w, int32_t r, int32_t t) {
    int64_t begin;
    if (w->window == 0) return 0;
    begin = (int64_t)w->kv[r] - q_len(w, r) + (int64_t)t * w->p->q_tile - w->window + 1;
    return begin > 0 ? begin / w->p->block_size : 0;
}

static int64_t block_weight(const walker *w, int32_t r, int32_t t) {
    int64_t q = q_len(w, r), tokens = q - (int64_t)t * w->p->q_tile;
    int64_t rows, group = w->p->num_q_heads / w->p->num_kv_heads;
    if (tokens > w->p->q_tile) tokens = w->p->q_tile;
    rows = tokens * group;
    return ceil_div(w->p->block_size, 16) *
           (w->p->cost_kv_load + w->p->cost_qk_tile * ceil_div(rows, 16));
}

static int64_t unit_cost(const walker *w, int32_t r, int32_t t, int64_t blocks) {
    return blocks * block_weight(w, r, t);
}

static int32_t first_live_from(const walker *w, int32_t r) {
    while (r < w->batch && q_len(w, r) == 0) r++;
    return r;
}

/* The first unit of head h (or the end of the work). */
static void head_start(walker *w, int32_t h) {
    int32_t r = first_live_from(w, 0);
    if (r == w->batch || h >= w->p->num_kv_heads) w->r = 0, w->h = w->p->num_kv_heads;
    else w->r = r, w->h = h;
    w->t = 0;
    w->kv_next = w->h < w->p->num_kv_heads ? unit_first_column(w, w->r, 0) * w->p->block_size : 0;
}

static void advance_unit(walker *w) {
    int32_t next;
    w->kv_next = 0;
    w->pieces = 0;
    if ((int64_t)(w->t + 1) * w->p->q_tile < q_len(w, w->r)) {
        w->t++;
        w->kv_next = unit_first_column(w, w->r, w->t) * w->p->block_size;
        return;
    }
    next = first_live_from(w, w->r + 1);
    if (next < w->batch) {
        w->r = next, w->t = 0;
        w->kv_next = unit_first_column(w, w->r, 0) * w->p->block_size;
    } else head_start(w, w->h + 1);
}

static int at_end(const walker *w) { return w->h == w->p->num_kv_heads; }

/*
 * Greedy filling (THE PARTITION) with a budget over `parts` cores, on a sequence of units
 * given by their blocks and block weights, each unit costing seg + blocks * weight. Returns
 * 1 when the work fits on `parts` cores. Used as the optimality certificate: the busiest
 * core's cost X is optimal when budget X - 1 does not fit (greedy is optimal per budget).
 */
static int greedy_fits(const int64_t *blocks, const int64_t *weight, int64_t units, int64_t seg,
                       int64_t parts, int64_t budget) {
    int64_t u = 0, k = 0, core;
    for (core = 0; core < parts && u < units; ++core) {
        int64_t used = k > 0 ? seg : 0;
        for (;;) {
            int64_t avail = budget - used, take;
            if (u == units) break;
            if (k == 0) {
                if (avail >= seg + blocks[u] * weight[u]) {
                    used += seg + blocks[u] * weight[u];
                    u++;
                    continue;
                }
                take = avail >= seg ? (avail - seg) / weight[u] : 0;
                if (take > 0) k = take;
                break;
            }
            if (avail >= (blocks[u] - k) * weight[u]) {
                used += (blocks[u] - k) * weight[u];
                u++, k = 0;
                continue;
            }
            take = avail > 0 ? avail / weight[u] : 0;
            k += take;
            break;
        }
    }
    return u == units;
}

/* Core c's expected position given core j's (same offsets, head shifted by h). */
static int shifted_equal(const int32_t *pos0, int32_t h, int32_t heads, const int32_t *pos) {
    int32_t head = pos0[1] + h;
    if (head >= heads) return pos[0] == 0 && pos[1] == heads && pos[2] == 0 && pos[3] == 0;
    return pos[0] == pos0[0] && pos[1] == head && pos[2] == pos0[2] && pos[3] == pos0[3];
}

const char *tiling_check(const aicpu_tiling_params *p, const int32_t *cu, const int32_t *kv,
                         int32_t batch, int causal, const int32_t *buf) {
    walker w;
    int32_t core, next_slot = 0, num_combine = 0, r, heads = p->num_kv_heads;
    int64_t units = 0, head_units = 0, segments = 0, total = 0, max_cost = 0, w_max = 0, i;
    const int32_t *combine = buf + AICPU_TILING_HDR_WORDS + AICPU_TILING_CORE_WORDS * p->num_cores;
    /* THE BUFFER: header, core table, combine table, padding to 16 words. */
    int64_t words = (AICPU_TILING_HDR_WORDS + (int64_t)AICPU_TILING_CORE_WORDS * p->num_cores +
                     (int64_t)AICPU_TILING_COMB_WORDS * (p->num_cores - 1) + 15) / 16 * 16;
    int64_t *blocks_of = NULL, *weight_of = NULL;
    const char *err = NULL;
#define FAIL(msg) do { err = (msg); goto done; } while (0)

    if (W(AICPU_TILING_HDR_MAGIC) != AICPU_TILING_MAGIC) FAIL("bad magic");
    if (W(AICPU_TILING_HDR_VERSION) != AICPU_TILING_VERSION) FAIL("bad version");
    if (W(AICPU_TILING_HDR_STATUS) != AICPU_TILING_OK) FAIL("status not OK");
    batch = tiling_live_batch(kv, batch);
    if (W(AICPU_TILING_HDR_BATCH) != batch) FAIL("batch is not the live batch");
    if (W(AICPU_TILING_HDR_NUM_TOKENS) != cu[batch]) FAIL("num_tokens");

    w.p = p, w.cu = cu, w.kv = kv, w.batch = batch, w.causal = causal;
    w.window = p->sliding_window;
    w.kv_next = 0, w.pieces = 0;
    for (r = 0; r < batch; ++r) head_units += ceil_div(q_len(&w, r), p->q_tile);
    units = head_units * heads;
    blocks_of = malloc(sizeof(int64_t) * (size_t)(head_units + 1));
    weight_of = malloc(sizeof(int64_t) * (size_t)(head_units + 1));
    if (!blocks_of || !weight_of) FAIL("out of memory");
    /* One head's units in work order (every head has the same ones). */
    for (r = 0, i = 0; r < batch; ++r) {
        int64_t tiles = ceil_div(q_len(&w, r), p->q_tile), t;
        for (t = 0; t < tiles; ++t, ++i) {
            /* The unit's columns [floor(kv_begin / bs), ceil(kv_end / bs)): only those count. */
            blocks_of[i] = ceil_div(unit_kv_end(&w, r, (int32_t)t), p->block_size) -
                           unit_first_column(&w, r, (int32_t)t);
            weight_of[i] = block_weight(&w, r, (int32_t)t);
            total += heads * (p->cost_segment + blocks_of[i] * weight_of[i]);
            if (weight_of[i] > w_max) w_max = weight_of[i];
        }
    }

    head_start(&w, 0);
    for (core = 0; core < p->num_cores; ++core) {
        const int32_t *rec = buf + AICPU_TILING_HDR_WORDS + (int64_t)core * AICPU_TILING_CORE_WORDS;
        const int32_t *b = rec + AICPU_TILING_CORE_BEGIN, *e = rec + AICPU_TILING_CORE_END;
        int32_t n = rec[AICPU_TILING_CORE_NUM_SEGMENTS], s;
        int64_t cost = 0;
        if (b[0] != w.r || b[1] != w.h || b[2] != w.t)
            FAIL("core does not begin where the previous one ended");
        if ((int64_t)b[3] * p->block_size != w.kv_next) FAIL("core begins at the wrong block");
        for (s = 0; s < n; ++s) {
            int64_t kv_end, blocks, first, last, slot, unit_first;
            int end_inside;
            if (at_end(&w)) FAIL("segment past the end of the work");
            kv_end = unit_kv_end(&w, w.r, w.t);
            /* Absolute block-table columns (ABI v5): the unit is [unit_first, blocks). */
            blocks = ceil_div(kv_end, p->block_size);
            unit_first = unit_first_column(&w, w.r, w.t);
            first = w.kv_next / p->block_size;
            /* The core stops inside its last segment's unit exactly when its end names it. */
            end_inside = s == n - 1 && e[0] == w.r && e[1] == w.h && e[2] == w.t;
            last = end_inside ? e[3] : blocks;
            if (first < unit_first) FAIL("segment starts before its unit's first column");
            if (last <= first || last > blocks) FAIL("empty or overlong segment");
            if (kv_end > kv[w.r] || kv_end < 1) FAIL("unit kv range outside [1, kv_len]");
            if (w.window > 0 && (first + 1) * p->block_size <=
                                    (int64_t)kv[w.r] - q_len(&w, w.r) +
                                        (int64_t)w.t * p->q_tile - w.window + 1)
                FAIL("segment's first block lies before every row's window");
            slot = s == 0 ? rec[AICPU_TILING_CORE_FIRST_SLOT]
                          : (s == n - 1 ? rec[AICPU_TILING_CORE_LAST_SLOT] : -1);
            if (first > unit_first || last < blocks) { /* a piece of a split unit */
                if (slot != next_slot) FAIL("split piece has the wrong slot");
                if (w.pieces == 0) {
                    const int32_t *c = combine + (int64_t)num_combine * AICPU_TILING_COMB_WORDS;
                    if (num_combine >= p->num_cores - 1) FAIL("too many combine records");
                    if (c[0] != w.r || c[1] != w.h || c[2] != w.t || c[3] != slot || c[5] != 0)
                        FAIL("combine record does not match its unit");
                    num_combine++;
                }
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
        if (n == 0 &&
            (rec[AICPU_TILING_CORE_FIRST_SLOT] != -1 || rec[AICPU_TILING_CORE_LAST_SLOT] != -1))
            FAIL("idle core with a slot");
        if (e[0] != w.r || e[1] != w.h || e[2] != w.t ||
            (int64_t)e[3] * p->block_size != w.kv_next)
            FAIL("core end is not where its segments stop");
        if (rec[AICPU_TILING_CORE_COST] != cost) FAIL("core cost does not match its segments");
        if (cost > max_cost) max_cost = cost;
    }
    if (!at_end(&w) || w.r != 0 || w.t != 0 || w.kv_next != 0) FAIL("work left unassigned");
    if (W(AICPU_TILING_HDR_NUM_SLOTS) != next_slot) FAIL("slot count");
    if (next_slot > 2 * (p->num_cores - 1)) FAIL("more slots than the workspace holds");
    if (W(AICPU_TILING_HDR_NUM_COMBINE) != num_combine) FAIL("combine count");
    i = (int64_t)(combine - buf) + (int64_t)num_combine * AICPU_TILING_COMB_WORDS;
    for (; i < words; ++i)
        if (W(i) != 0) FAIL("unused combine records or padding not zero");
    if (W(AICPU_TILING_HDR_NUM_SEGMENTS) != segments) FAIL("segment count");
    if (segments > units + p->num_cores - 1) FAIL("more segments than units + cores - 1");
    if (W(AICPU_TILING_HDR_NUM_UNITS) != units) FAIL("unit count");
    if (W(AICPU_TILING_HDR_TOTAL_COST) != total) FAIL("total cost");
    if (W(AICPU_TILING_HDR_MAX_CORE_COST) != max_cost) FAIL("max core cost");
    /* The header's balance promise: W / P + 2 * cost_segment + w_max + 1. */
    if (max_cost - (2 * (int64_t)p->cost_segment + w_max + 1) > total / p->num_cores)
        FAIL("busiest core above the documented bound");

    if (p->num_cores % heads == 0) {
        /* Per head: cores h*Q .. h*Q + Q - 1 take head h, at head 0's offsets. */
        int32_t q = p->num_cores / heads, h, j;
        for (h = 1; h < heads; ++h)
            for (j = 0; j < q; ++j) {
                const int32_t *rec0 =
                    buf + AICPU_TILING_HDR_WORDS + (int64_t)j * AICPU_TILING_CORE_WORDS;
                const int32_t *rec = rec0 + (int64_t)h * q * AICPU_TILING_CORE_WORDS;
                if (!shifted_equal(rec0 + AICPU_TILING_CORE_BEGIN, h, heads,
                                   rec + AICPU_TILING_CORE_BEGIN) ||
                    !shifted_equal(rec0 + AICPU_TILING_CORE_END, h, heads,
                                   rec + AICPU_TILING_CORE_END) ||
                    rec[AICPU_TILING_CORE_COST] != rec0[AICPU_TILING_CORE_COST] ||
                    rec[AICPU_TILING_CORE_NUM_SEGMENTS] != rec0[AICPU_TILING_CORE_NUM_SEGMENTS])
                    FAIL("a head is not cut at head 0's offsets");
            }
        if (max_cost > 0 &&
            greedy_fits(blocks_of, weight_of, head_units, p->cost_segment, q, max_cost - 1))
            FAIL("busiest core above the per-head min-max");
    } else if (max_cost > 0) {
        /* The whole axis: the head's units repeated for every head. */
        int64_t *all_blocks = malloc(sizeof(int64_t) * (size_t)(units + 1));
        int64_t *all_weight = malloc(sizeof(int64_t) * (size_t)(units + 1));
        int fits;
        if (!all_blocks || !all_weight) {
            free(all_blocks);
            free(all_weight);
            FAIL("out of memory");
        }
        for (i = 0; i < units; ++i) {
            all_blocks[i] = blocks_of[i % head_units];
            all_weight[i] = weight_of[i % head_units];
        }
        fits = greedy_fits(all_blocks, all_weight, units, p->cost_segment, p->num_cores,
                           max_cost - 1);
        free(all_blocks);
        free(all_weight);
        if (fits) FAIL("busiest core above the min-max");
    }
done:
    free(blocks_of);
    free(weight_of);
    return err;
#undef FAIL
}
