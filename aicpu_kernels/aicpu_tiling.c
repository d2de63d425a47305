/*
 * aicpu_tiling.c -- the portable tiling kernel. The header documents the contract; the
 * comments here say why the code is shaped the way it is.
 *
 * No library calls, no allocation, no recursion: the same file runs on the AI-CPU, in a
 * freestanding build, and under the sanitizers.
 */
#include "aicpu_tiling.h"

#ifdef AICPU_TILING_DEBUG
#include <assert.h>
#define TILING_ASSERT(x) assert(x)
#else
#define TILING_ASSERT(x) ((void)0)
#endif

/* Keeps a hot loop out of its caller so that the loop gets the registers to itself. */
#if defined(__GNUC__)
#define TILING_NOINLINE __attribute__((noinline))
#else
#define TILING_NOINLINE
#endif

/* Non-overlapping pointers, so copies vectorise; the Ascend C entry includes this file in C++,
 * which spells it differently. */
#if !defined(__cplusplus)
#define TILING_RESTRICT restrict
#elif defined(__GNUC__)
#define TILING_RESTRICT __restrict__
#else
#define TILING_RESTRICT
#endif

/* C99 static assert: a negative array size fails the build. Pins the ABI. */
#define TILING_STATIC_ASSERT(name, cond) typedef char tiling_static_assert_##name[(cond) ? 1 : -1]
TILING_STATIC_ASSERT(params_size, sizeof(aicpu_tiling_params) == 16 * sizeof(int32_t));
TILING_STATIC_ASSERT(params_q_tile, offsetof(aicpu_tiling_params, q_tile) == 8 * sizeof(int32_t));
TILING_STATIC_ASSERT(params_window,
                     offsetof(aicpu_tiling_params, sliding_window) == 12 * sizeof(int32_t));
TILING_STATIC_ASSERT(params_reserved,
                     offsetof(aicpu_tiling_params, reserved) == 13 * sizeof(int32_t));
TILING_STATIC_ASSERT(int32_width, sizeof(int32_t) == 4);

/* Costs and counts are int64 inside and int32 in the buffer. */
static int32_t int32_saturate(int64_t x) { return x > (int64_t)INT32_MAX ? INT32_MAX : (int32_t)x; }
#define INT32_SATURATE(x) int32_saturate(x)
/* Worst-case total cost allowed by the parameter check; keeps every sum below 2^62. */
#define TILING_COST_LIMIT ((int64_t)1 << 60)

static int64_t div_ceil64(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* a / b for 0 <= a and 0 < b. Positions are int64, but in practice both fit in 32 bits, and
 * a 32-bit divide is several times faster than a 64-bit one on common x86 and ARM cores. */
static int64_t div_pos(int64_t a, int64_t b) {
    if ((a | b) <= (int64_t)UINT32_MAX) return (int64_t)((uint32_t)a / (uint32_t)b);
    return a / b;
}

/*
 * The validation pass records one head's running cost and unit count at TILING_CHUNKS evenly
 * spaced requests (every head has the same units), so locating a cut afterwards is a binary
 * search over the chunks plus a walk of at most one chunk of requests:
 * O(batch + searches * (log TILING_CHUNKS + batch / TILING_CHUNKS)). 4 KiB of stack, fine on
 * the AI-CPU.
 */
#define TILING_CHUNKS 256

/* Everything derived from the static parameters once per call. */
typedef struct plan_ctx {
    const aicpu_tiling_params *p;
    const int32_t *cu;
    const int32_t *kv;
    int32_t batch;
    int32_t epoch;
    int causal;
    int64_t window;        /* sliding_window W; 0 = none (then every unit starts at column 0) */
    int32_t group;
    int64_t seg;           /* cost_segment */
    int64_t block_units;   /* ceil(block_size / 16) */
    int block_shift;       /* log2(block_size) when a power of two, else -1 */
    int64_t w_decode;      /* block cost of a one-token tile, the common case */
    int32_t chunk_shift;   /* requests per checkpoint chunk = 1 << chunk_shift */
    int32_t num_chunks;
    int decode;            /* decode_pass covered the batch: every unit is one decode tile */
    int64_t head_total;    /* W_h: the cost of one kv head's units */
    int64_t head_units;    /* one kv head's units */
    int32_t first_live;    /* the first request with q_len > 0 (batch when none) */
    int64_t first_column;  /* the block-table column of that request's first unit */
    int64_t chunk_cost[TILING_CHUNKS];  /* one head's cost up to the end of each chunk */
    int64_t chunk_units[TILING_CHUNKS]; /* one head's units up to the end of each chunk */
} plan_ctx;

/* One request's shape on the position axis. */
typedef struct request_info {
    int32_t q_len;
    int32_t kv_len;
    int32_t num_tiles;
    int32_t num_full;    /* tiles of exactly q_tile tokens */
    int64_t w_full;      /* block cost of a full tile */
    int64_t w_last;      /* block cost of the last tile (== w_full when it is full) */
    int64_t head_cost;   /* cost of all tiles of one kv head */
} request_info;

/* The unit containing a position, or the end of the work. */
typedef struct unit_at {
    int32_t r, h, t;
    int64_t start;  /* U */
    int64_t first;  /* the block-table column of its first block */
    int64_t blocks; /* n */
    int64_t w;
    int64_t index;  /* global unit index in work order */
} unit_at;

/* Position tuple as written to the core table: k counts blocks from the unit's first column,
 * which write_pos adds (ABI v5: the words hold absolute block-table columns). */
typedef struct work_pos {
    int32_t r, h, t, k;
    int32_t first;
    int64_t unit_index; /* of the unit it names; num_units at the end */
} work_pos;

static int64_t kv_blocks(const plan_ctx *c, int64_t tokens) {
    if (c->block_shift >= 0) return (tokens + c->p->block_size - 1) >> c->block_shift;
    return div_ceil64(tokens, c->p->block_size);
}

/* The block-table column holding the window start of the row at position p0,
 * floor(max(0, p0 - W + 1) / block_size); 0 without a window. */
static int64_t window_first(const plan_ctx *c, int64_t p0) {
    int64_t begin;
    if (c->window == 0) return 0;
    begin = p0 - c->window + 1;
    if (begin <= 0) return 0;
    if (c->block_shift >= 0) return begin >> c->block_shift;
    return begin / c->p->block_size;
}

/* Blocks of a decode unit (its one row at position kv - 1):
 * ceil(kv / bs) - floor(max(0, kv - W) / bs). */
static int64_t decode_blocks(const plan_ctx *c, int64_t kv) {
    return kv_blocks(c, kv) - window_first(c, kv - 1);
}

static int64_t block_cost(const plan_ctx *c, int64_t tokens) {
    int64_t rows = tokens * c->group;
    return c->block_units * (c->p->cost_kv_load + c->p->cost_qk_tile * ((rows + 15) >> 4));
}

/*
 * sum_{i=0}^{n-1} floor((a*i + b) / m) for a, b >= 0, m > 0, without walking i: the
 * classic floor-sum reduction, which swaps the roles of a and m like Euclid's algorithm
 * and so takes O(log m) rounds. Causal tiles see kv lengths growing by q_tile per tile,
 * so their block counts are such a sum.
 */
static int64_t floor_sum(int64_t n, int64_t m, int64_t a, int64_t b) {
    int64_t total = 0;
    for (;;) {
        if (a >= m) {
            total += (n * (n - 1) / 2) * (a / m);
            a %= m;
        }
        if (b >= m) {
            total += n * (b / m);
            b %= m;
        }
        {
            int64_t y_max = a * n + b;
            int64_t next_a;
            if (y_max < m) break;
            n = y_max / m;
            b = y_max % m;
            next_a = m;
            m = a;
            a = next_a;
        }
    }
    return total;
}

/* Blocks of full causal tiles 0..k-1: ceil((kv - q + (t + 1) * q_tile) / bs) summed. */
static int64_t causal_full_blocks(const plan_ctx *c, const request_info *ri, int64_t k) {
    int64_t bs = c->p->block_size, qt = c->p->q_tile;
    return floor_sum(k, bs, qt, (int64_t)ri->kv_len - ri->q_len + qt + bs - 1);
}

/* First columns of causal tiles 0..k-1 under a window: floor(max(0, a + t * q_tile) / bs)
 * summed, a = kv - q - W + 1 the window start of row 0. The terms clipped at 0 are the first
 * t0 tiles; the rest are one floor sum. */
static int64_t window_first_sum(const plan_ctx *c, const request_info *ri, int64_t k) {
    int64_t qt = c->p->q_tile, a, t0;
    if (c->window == 0) return 0;
    a = (int64_t)ri->kv_len - ri->q_len - c->window + 1;
    t0 = a >= 0 ? 0 : (-a + qt - 1) / qt;
    if (t0 >= k) return 0;
    return floor_sum(k - t0, c->p->block_size, qt, a + t0 * qt);
}

/* Cost of tiles 0..k-1 of one head, k <= num_full. */
static int64_t full_tiles_cost(const plan_ctx *c, const request_info *ri, int64_t k) {
    int64_t blocks = c->causal ? causal_full_blocks(c, ri, k) - window_first_sum(c, ri, k)
                               : k * kv_blocks(c, ri->kv_len);
    return k * c->seg + blocks * ri->w_full;
}

static void request_load(const plan_ctx *c, int32_t r, request_info *ri) {
    int32_t qt = c->p->q_tile;
    ri->q_len = c->cu[r + 1] - c->cu[r];
    ri->kv_len = c->kv[r];
    if (ri->q_len == 0) {
        ri->num_tiles = ri->num_full = 0;
        ri->w_full = ri->w_last = 0;
        ri->head_cost = 0;
        return;
    }
    if (ri->q_len <= qt) {
        /* Decode and short speculative steps: one tile that sees the whole kv (or window). */
        ri->num_tiles = 1;
        ri->num_full = ri->q_len == qt;
        ri->w_full = ri->w_last = ri->q_len == 1 ? c->w_decode : block_cost(c, ri->q_len);
        ri->head_cost = c->seg + (kv_blocks(c, ri->kv_len) -
                                  window_first(c, (int64_t)ri->kv_len - ri->q_len)) * ri->w_full;
        return;
    }
    ri->num_full = ri->q_len / qt;
    ri->num_tiles = ri->num_full + (ri->q_len % qt != 0);
    ri->w_full = block_cost(c, qt);
    ri->w_last = block_cost(c, ri->q_len - (int64_t)(ri->num_tiles - 1) * qt);
    ri->head_cost = full_tiles_cost(c, ri, ri->num_full);
    if (ri->num_tiles > ri->num_full) { /* the partial last tile sees the whole kv */
        int64_t p0 = (int64_t)ri->kv_len - ri->q_len + (int64_t)ri->num_full * qt;
        ri->head_cost += c->seg + (kv_blocks(c, ri->kv_len) - window_first(c, p0)) * ri->w_last;
    }
}

/* Blocks of tile t, and in *first its first column. The last tile (full or not) and every
 * non-causal tile see all kv (a window needs causal). */
static int64_t tile_blocks(const plan_ctx *c, const request_info *ri, int32_t t, int64_t *first) {
    int64_t end = ri->kv_len;
    if (c->causal && t < ri->num_tiles - 1)
        end = (int64_t)ri->kv_len - ri->q_len + (int64_t)(t + 1) * c->p->q_tile;
    *first = window_first(c, (int64_t)ri->kv_len - ri->q_len + (int64_t)t * c->p->q_tile);
    return kv_blocks(c, end) - *first;
}

/* The tile of one head whose interval holds offset o (0 <= o < head_cost); *start = S(t). */
static int32_t tile_at(const plan_ctx *c, const request_info *ri, int64_t o, int64_t *start) {
    int64_t lo = 0, hi = ri->num_full;
    if (ri->num_tiles == 1) {
        *start = 0;
        return 0;
    }
    if (!c->causal) {
        int64_t tile_cost = c->seg + kv_blocks(c, ri->kv_len) * ri->w_full;
        int64_t t = o / tile_cost;
        if (t > ri->num_full) t = ri->num_full;
        *start = t * tile_cost;
        return (int32_t)t;
    }
    /* Largest k in [0, num_full] with S(k) <= o; S grows strictly, so binary search. */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (full_tiles_cost(c, ri, mid) <= o) lo = mid;
        else hi = mid - 1;
    }
    if (lo == ri->num_tiles) lo = ri->num_tiles - 1; /* o in the last full tile */
    *start = full_tiles_cost(c, ri, lo);
    return (int32_t)lo;
}

/*
 * Where each search of a greedy walk ended, kept across the walks of the min-max search: the
 * i-th stop of one budget lies close to the i-th stop of the previous budget (budgets differ
 * by less than a segment and a block once the first walk is done), so a search that starts
 * from there walks a request or two instead of searching the chunks and walking within one.
 */
#define TILING_HINTS 64

typedef struct search_hint {
    int64_t h;     /* the head */
    int64_t start; /* offset of request r in the head */
    int64_t units; /* units of the head before request r */
    int32_t r;
} search_hint;

typedef struct search_hints {
    search_hint at[TILING_HINTS];
    int32_t count; /* entries filled */
} search_hints;

/* The state of one greedy walk's searches, whose targets only grow. */
typedef struct cursor {
    int64_t h;      /* the head `chunk` refers to */
    int32_t chunk;  /* no later search ends in an earlier chunk (same head) */
    int32_t search; /* searches done in this walk: the hint to use next */
    search_hints *hints;
} cursor;

static void cursor_init(cursor *cur, search_hints *hints) {
    cur->h = 0;
    cur->chunk = 0;
    cur->search = 0;
    cur->hints = hints;
}

/* One head's cost and units of a valid request r; padded and decode requests skip the
 * general shape computation. */
static int64_t request_head_cost(const plan_ctx *c, int32_t r, int64_t *units) {
    request_info ri;
    int32_t q_len = c->cu[r + 1] - c->cu[r];
    if (q_len <= 1) {
        *units = q_len;
        return q_len == 1 ? c->seg + decode_blocks(c, c->kv[r]) * c->w_decode : 0;
    }
    request_load(c, r, &ri);
    *units = ri.num_tiles;
    return ri.head_cost;
}

/*
 * The unit of one kv head holding offset o, 0 <= o < W_h, with its start offset, block count,
 * block cost and index among the head's units. From a hint when there is one (walking back
 * first if it lies past o), else a binary search for the chunk; then a walk forward.
 */
static void head_locate(const plan_ctx *c, cursor *cur, int64_t o, const search_hint *hint,
                        unit_at *u, search_hint *found) {
    int32_t r;
    int64_t start, units;
    if (hint != NULL) {
        r = hint->r;
        start = hint->start;
        units = hint->units;
        while (start > o) { /* request 0 starts at 0 <= o */
            int64_t n;
            r -= 1;
            start -= request_head_cost(c, r, &n);
            units -= n;
        }
    } else {
        int32_t lo = cur->chunk, hi = c->num_chunks - 1;
        while (lo < hi) { /* the first chunk that ends past o; the last one ends at W_h > o */
            int32_t mid = (lo + hi) >> 1;
            if (c->chunk_cost[mid] > o) hi = mid;
            else lo = mid + 1;
        }
        cur->chunk = lo;
        r = lo << c->chunk_shift;
        start = lo > 0 ? c->chunk_cost[lo - 1] : 0;
        units = lo > 0 ? c->chunk_units[lo - 1] : 0;
    }
    if (c->decode) { /* one decode tile per live request; padded requests cost nothing */
        const int32_t *cu = c->cu, *kv = c->kv;
        int64_t w = c->w_decode, blocks = 0;
        for (;; ++r) {
            if (cu[r + 1] != cu[r]) {
                blocks = decode_blocks(c, kv[r]);
                if (o - start < c->seg + blocks * w) break;
                start += c->seg + blocks * w;
                units += 1;
            }
        }
        u->r = r;
        u->t = 0;
        u->start = start;
        u->first = window_first(c, (int64_t)kv[r] - 1);
        u->blocks = blocks;
        u->w = w;
        u->index = units;
    } else {
        request_info ri;
        int64_t tile_start;
        int32_t t;
        for (;; ++r) {
            request_load(c, r, &ri);
            if (o - start < ri.head_cost) break;
            start += ri.head_cost;
            units += ri.num_tiles;
        }
        t = tile_at(c, &ri, o - start, &tile_start);
        u->r = r;
        u->t = t;
        u->start = start + tile_start;
        u->blocks = tile_blocks(c, &ri, t, &u->first);
        u->w = t == ri.num_tiles - 1 ? ri.w_last : ri.w_full;
        u->index = units + t;
    }
    found->r = r;
    found->start = start;
    found->units = units;
}

/* The unit holding position pos of the work-order axis, 0 <= pos < W. Every head has the
 * same units, so the head is a division and the rest a search within one head. */
static void axis_locate(const plan_ctx *c, cursor *cur, int64_t pos, unit_at *u) {
    int64_t h = pos < c->head_total ? 0 : div_pos(pos, c->head_total);
    search_hint found, *slot = NULL;
    const search_hint *hint = NULL;
    if (h != cur->h) {
        cur->h = h;
        cur->chunk = 0;
    }
    if (cur->hints != NULL && cur->search < TILING_HINTS) {
        slot = &cur->hints->at[cur->search];
        if (cur->search < cur->hints->count && slot->h == h) hint = slot;
    }
    head_locate(c, cur, pos - h * c->head_total, hint, u, &found);
    if (slot != NULL) {
        found.h = h;
        *slot = found;
        if (cur->search >= cur->hints->count) cur->hints->count = cur->search + 1;
    }
    cur->search += 1;
    u->h = (int32_t)h;
    u->start += h * c->head_total;
    u->index += h * c->head_units;
}

/* The position where the units of heads [0, heads) end: the first unit of head `heads`, or
 * the end of the work (0, H, 0, 0). */
static work_pos heads_end(const plan_ctx *c, int64_t heads) {
    work_pos wp;
    int last = heads >= c->p->num_kv_heads;
    wp.r = last ? 0 : c->first_live;
    wp.h = (int32_t)heads;
    wp.t = wp.k = 0;
    wp.first = last ? 0 : (int32_t)c->first_column;
    wp.unit_index = heads * c->head_units;
    return wp;
}

/* Fills of the combine table and padding run every call; eight stores a round keep them
 * cheap where the compiler does not vectorise (the AI-CPU builds at -O2). */
static void write_words(int32_t *dst, int64_t count, int32_t value) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) {
        dst[i] = value, dst[i + 1] = value, dst[i + 2] = value, dst[i + 3] = value;
        dst[i + 4] = value, dst[i + 5] = value, dst[i + 6] = value, dst[i + 7] = value;
    }
    for (; i < count; ++i) dst[i] = value;
}

static void copy_words(int32_t *TILING_RESTRICT dst, const int32_t *TILING_RESTRICT src,
                       int32_t count) {
    int32_t i;
    for (i = 0; i < count; ++i) dst[i] = src[i];
}

static void write_pos(int32_t *dst, const work_pos *wp) {
    dst[0] = wp->r;
    dst[1] = wp->h;
    dst[2] = wp->t;
    dst[3] = wp->k + wp->first;
}

int aicpu_tiling_params_check(const aicpu_tiling_params *p) {
    int64_t group, kv_cap, w_max, bound;
    int i;
    if (p == NULL) return AICPU_TILING_E_PARAMS;
    if (p->num_q_heads < 1 || p->num_q_heads > AICPU_TILING_MAX_HEADS) return AICPU_TILING_E_PARAMS;
    if (p->num_kv_heads < 1 || p->num_kv_heads > p->num_q_heads) return AICPU_TILING_E_PARAMS;
    if (p->num_q_heads % p->num_kv_heads != 0) return AICPU_TILING_E_PARAMS;
    if (p->head_dim < 1 || p->head_dim > AICPU_TILING_MAX_HEAD_DIM) return AICPU_TILING_E_PARAMS;
    if (p->block_size < 1 || p->block_size > AICPU_TILING_MAX_BLOCK_SIZE)
        return AICPU_TILING_E_PARAMS;
    if (p->max_batch < 1 || p->max_batch > AICPU_TILING_MAX_BATCH) return AICPU_TILING_E_PARAMS;
    if (p->max_tokens < 1 || p->max_tokens > AICPU_TILING_MAX_TOKENS) return AICPU_TILING_E_PARAMS;
    if (p->max_blocks_per_req < 1) return AICPU_TILING_E_PARAMS;
    kv_cap = (int64_t)p->max_blocks_per_req * p->block_size;
    if (kv_cap > AICPU_TILING_MAX_KV_TOKENS) return AICPU_TILING_E_PARAMS;
    if (p->num_cores < 1 || p->num_cores > AICPU_TILING_MAX_CORES) return AICPU_TILING_E_PARAMS;
    group = p->num_q_heads / p->num_kv_heads;
    if (p->q_tile < 1 || (int64_t)p->q_tile * group > AICPU_TILING_MAX_TILE_ROWS)
        return AICPU_TILING_E_PARAMS;
    if (p->cost_kv_load < 0 || p->cost_kv_load > AICPU_TILING_MAX_COST_WEIGHT ||
        p->cost_qk_tile < 0 || p->cost_qk_tile > AICPU_TILING_MAX_COST_WEIGHT ||
        p->cost_segment < 0 || p->cost_segment > AICPU_TILING_MAX_COST_WEIGHT ||
        p->cost_kv_load + p->cost_qk_tile < 1)
        return AICPU_TILING_E_PARAMS;
    if (p->sliding_window < 0 || p->sliding_window > AICPU_TILING_MAX_KV_TOKENS)
        return AICPU_TILING_E_PARAMS;
    for (i = 0; i < 3; ++i)
        if (p->reserved[i] != 0) return AICPU_TILING_E_PARAMS;
    /* Worst case: max_tokens one-token requests on every kv head, each unit with a full
     * block table at the widest tile's block cost. The per-unit cost is below 2^53 by the
     * limits above; dividing instead of multiplying keeps the check itself overflow-free. */
    w_max = ((int64_t)p->block_size + 15) / 16 *
            (p->cost_kv_load + (int64_t)p->cost_qk_tile * (((int64_t)p->q_tile * group + 15) / 16));
    bound = p->cost_segment + (int64_t)p->max_blocks_per_req * w_max;
    if (bound > TILING_COST_LIMIT / ((int64_t)p->max_tokens * p->num_kv_heads))
        return AICPU_TILING_E_PARAMS;
    return AICPU_TILING_OK;
}

/* Word offsets of the buffer's regions for valid params. */
static int64_t core_table_words(const aicpu_tiling_params *p) {
    return (int64_t)AICPU_TILING_CORE_WORDS * p->num_cores;
}
static int64_t combine_offset(const aicpu_tiling_params *p) {
    return AICPU_TILING_HDR_WORDS + core_table_words(p);
}
static int64_t used_words(const aicpu_tiling_params *p) {
    return combine_offset(p) + (int64_t)AICPU_TILING_COMB_WORDS * (p->num_cores - 1);
}

/* Whole buffer in int32 words, padded to 64 bytes; params already checked. */
static int64_t buffer_words(const aicpu_tiling_params *p) { return (used_words(p) + 15) / 16 * 16; }

size_t aicpu_tiling_bytes(const aicpu_tiling_params *p) {
    if (aicpu_tiling_params_check(p) != AICPU_TILING_OK) return 0;
    return (size_t)buffer_words(p) * 4;
}

int32_t aicpu_tiling_max_slots(const aicpu_tiling_params *p) {
    if (aicpu_tiling_params_check(p) != AICPU_TILING_OK) return 0;
    return 2 * (p->num_cores - 1);
}

size_t aicpu_tiling_workspace_bytes(const aicpu_tiling_params *p) {
    int64_t rows;
    if (aicpu_tiling_params_check(p) != AICPU_TILING_OK) return 0;
    rows = (int64_t)p->q_tile * (p->num_q_heads / p->num_kv_heads);
    return (size_t)(2 * (int64_t)(p->num_cores - 1) * rows * (p->head_dim + 1) * 4);
}

static void write_header(int32_t *buf, int status, int32_t batch, int32_t num_cores,
                         uint32_t flags, int32_t epoch) {
    write_words(buf, AICPU_TILING_HDR_WORDS, 0);
    buf[AICPU_TILING_HDR_MAGIC] = AICPU_TILING_MAGIC;
    buf[AICPU_TILING_HDR_VERSION] = AICPU_TILING_VERSION;
    buf[AICPU_TILING_HDR_STATUS] = status;
    buf[AICPU_TILING_HDR_BAD_REQUEST] = -1;
    buf[AICPU_TILING_HDR_BATCH] = batch;
    buf[AICPU_TILING_HDR_NUM_CORES] = num_cores;
    buf[AICPU_TILING_HDR_FLAGS] = (int32_t)(flags & AICPU_TILING_CAUSAL); /* known bits only */
    buf[AICPU_TILING_HDR_EPOCH] = epoch;
}

/* Input error: header names the offence, every core idle at (0,0,0,0), tables zero. */
static int write_input_error(const aicpu_tiling_params *p, int32_t *buf, int status,
                             int32_t request, int32_t value, int32_t limit, int32_t batch,
                             uint32_t flags, int32_t epoch) {
    int32_t core;
    write_words(buf, buffer_words(p), 0);
    write_header(buf, status, batch, p->num_cores, flags, epoch);
    buf[AICPU_TILING_HDR_BAD_REQUEST] = request;
    buf[AICPU_TILING_HDR_BAD_VALUE] = value;
    buf[AICPU_TILING_HDR_BAD_LIMIT] = limit;
    for (core = 0; core < p->num_cores; ++core) {
        int32_t *rec = buf + AICPU_TILING_HDR_WORDS + (int64_t)core * AICPU_TILING_CORE_WORDS;
        rec[AICPU_TILING_CORE_FIRST_SLOT] = -1;
        rec[AICPU_TILING_CORE_LAST_SLOT] = -1;
    }
    return status;
}

/*
 * Decode batches (every q_len 0 or 1) with a power-of-two block size, the per-step case
 * that must be fast: one pass that only flags trouble and sums one head's blocks and live
 * requests, recording the sums at each chunk's end (see TILING_CHUNKS). Returns 1 when it
 * covered the batch; 0 sends the caller to the general pass, which also finds the first
 * offending request.
 */
/* Decode chunks hold at least this many requests, summed in one fixed-count loop with 32-bit
 * partial sums (at most 2^26 blocks a request, so 32 of them fit). */
#define TILING_DECODE_STEP_SHIFT 5
#define TILING_DECODE_STEP (1 << TILING_DECODE_STEP_SHIFT)

static TILING_NOINLINE int decode_pass(plan_ctx *c, int64_t *total, int64_t *num_units) {
    const aicpu_tiling_params *p = c->p;
    const int32_t *cu = c->cu, *kv = c->kv;
    uint32_t round = (uint32_t)p->block_size - 1u;
    uint32_t cap_1 = (uint32_t)p->max_blocks_per_req * (uint32_t)p->block_size - 1u;
    uint32_t q_any = 0, trouble = 0;
    /* A decode row at kv - 1 starts its window at max(0, kv - W): s = kv - W, clipped at 0 by
     * its sign bit (kv <= cap <= 2^26 wherever `trouble` stays clear). */
    uint32_t window = (uint32_t)c->window;
    int windowed = c->window > 0;
    uint64_t blocks = 0, live = 0;
    int32_t r = 0, chunk;
    int32_t chunk_shift = c->chunk_shift < TILING_DECODE_STEP_SHIFT ? TILING_DECODE_STEP_SHIFT
                                                                   : c->chunk_shift;
    int32_t per_chunk = (int32_t)1 << chunk_shift;
    int shift = c->block_shift;
    if (shift < 0) return 0;
    /* Only ORs, adds and shifts of 32-bit lanes, which every SIMD unit has. Unsigned q: a
     * decreasing offset wraps to a huge value, so q_any, the OR of every q, stays in {0, 1}
     * exactly when every q is. Then cu never decreases, so only cu[batch] can pass
     * max_tokens, and d = kv - q (kv - 1 for a live request, which wraps when kv is 0) lies in
     * [0, cap - 1] for every request unless one is KV_SHORT / KV_EMPTY or KV_CAPACITY, or a
     * padded slot sits exactly at the capacity (valid; the general pass then plans it). With
     * cap <= 2^26, d is out of that range exactly when d or cap - 1 - d has its top bit set,
     * so `trouble` ORs both. WINDOWED is a literal at each use, so the loops without a window
     * are the version-4 loops (no instruction more per request). */
#define TILING_DECODE_REQUEST(i, WINDOWED)                                                   \
    do {                                                                                   \
        uint32_t q = (uint32_t)cu[(i) + 1] - (uint32_t)cu[i];                              \
        uint32_t k = (uint32_t)kv[i], d = k - q, n = (k + round) >> shift;                 \
        if (WINDOWED) {                                                                    \
            uint32_t s = k - window;                                                       \
            n -= (s & ((s >> 31) - 1u)) >> shift;                                          \
        }                                                                                  \
        q_any |= q;                                                                        \
        trouble |= d | (cap_1 - d);                                                        \
        part_blocks += n & ((uint32_t)0 - q);                                              \
        part_live += q;                                                                    \
    } while (0)
    for (chunk = 0; r < c->batch; ++chunk) {
        int32_t end = c->batch - r > per_chunk ? r + per_chunk : c->batch;
        while (r < end) {
            uint32_t part_blocks = 0, part_live = 0;
            int32_t i;
            if (end - r >= TILING_DECODE_STEP) { /* a fixed count, which vectorises fully */
                if (windowed)
                    for (i = 0; i < TILING_DECODE_STEP; ++i) TILING_DECODE_REQUEST(r + i, 1);
                else
                    for (i = 0; i < TILING_DECODE_STEP; ++i) TILING_DECODE_REQUEST(r + i, 0);
                r += TILING_DECODE_STEP;
            } else {
                for (; r < end; ++r) TILING_DECODE_REQUEST(r, windowed);
            }
            blocks += part_blocks;
            live += part_live;
        }
        c->chunk_cost[chunk] = (int64_t)(live * (uint64_t)c->seg + blocks * (uint64_t)c->w_decode);
        c->chunk_units[chunk] = (int64_t)live;
    }
    if (q_any > 1u || (trouble & 0x80000000u) != 0 || cu[c->batch] > p->max_tokens) return 0;
    c->chunk_shift = chunk_shift;
    c->num_chunks = chunk;
    c->head_total = (int64_t)(live * (uint64_t)c->seg + blocks * (uint64_t)c->w_decode);
    c->head_units = (int64_t)live;
    *total = c->head_total * p->num_kv_heads;
    *num_units = c->head_units * p->num_kv_heads;
    c->decode = 1;
    return 1;
#undef TILING_DECODE_REQUEST
}

/* Check every request in order; on the first offence write it and return its status. */
static int validate(plan_ctx *c, int32_t *buf, uint32_t flags, int64_t *total,
                    int64_t *num_units) {
    const aicpu_tiling_params *p = c->p;
    int64_t kv_cap = (int64_t)p->max_blocks_per_req * p->block_size;
    int64_t cost = 0, units = 0, n;
    int32_t r, chunk = 0, chunk_left = 1 << c->chunk_shift;
    *total = 0;
    *num_units = 0;
    if (c->cu[0] != 0)
        return write_input_error(p, buf, AICPU_TILING_E_QUERY_START, 0, c->cu[0], 0, c->batch,
                                 flags, c->epoch);
    if (decode_pass(c, total, num_units)) return AICPU_TILING_OK;
    for (r = 0; r < c->batch; ++r) {
        int32_t lo = c->cu[r], hi = c->cu[r + 1], kv = c->kv[r];
        int status = AICPU_TILING_OK;
        int32_t value = 0, limit = 0;
        if (hi < lo) status = AICPU_TILING_E_QUERY_DECREASING, value = hi, limit = lo;
        else if (hi > p->max_tokens)
            status = AICPU_TILING_E_QUERY_OVERFLOW, value = hi, limit = p->max_tokens;
        else if (kv < 0) status = AICPU_TILING_E_KV_NEGATIVE, value = kv, limit = 0;
        else if (c->causal && kv < hi - lo)
            status = AICPU_TILING_E_KV_SHORT, value = kv, limit = hi - lo;
        else if (kv > kv_cap)
            status = AICPU_TILING_E_KV_CAPACITY, value = kv, limit = (int32_t)kv_cap;
        else if (!c->causal && hi > lo && kv == 0)
            status = AICPU_TILING_E_KV_EMPTY, value = 0, limit = 1;
        if (status != AICPU_TILING_OK)
            return write_input_error(p, buf, status, r, value, limit, c->batch, flags,
                                     c->epoch);
        cost += request_head_cost(c, r, &n);
        units += n;
        if (--chunk_left == 0 || r + 1 == c->batch) {
            c->chunk_cost[chunk] = cost;
            c->chunk_units[chunk] = units;
            chunk += 1;
            chunk_left = 1 << c->chunk_shift;
        }
    }
    c->num_chunks = chunk;
    c->head_total = cost;
    c->head_units = units;
    *total = cost * p->num_kv_heads;
    *num_units = units * p->num_kv_heads;
    return AICPU_TILING_OK;
}

/* Partial slots and combine records, walking cores in work order. */
typedef struct slot_state {
    int32_t next_slot;
    int32_t num_combine;
    int32_t *combine;
} slot_state;

static int32_t open_split_unit(slot_state *s, const work_pos *unit) {
    int32_t *rec = s->combine + (int64_t)s->num_combine * AICPU_TILING_COMB_WORDS;
    rec[AICPU_TILING_COMB_REQUEST] = unit->r;
    rec[AICPU_TILING_COMB_KV_HEAD] = unit->h;
    rec[AICPU_TILING_COMB_Q_TILE] = unit->t;
    rec[AICPU_TILING_COMB_FIRST_SLOT] = s->next_slot;
    rec[AICPU_TILING_COMB_NUM_PIECES] = 1;
    s->num_combine += 1;
    return s->next_slot++;
}

static int32_t continue_split_unit(slot_state *s) {
    TILING_ASSERT(s->num_combine > 0);
    s->combine[(int64_t)(s->num_combine - 1) * AICPU_TILING_COMB_WORDS +
               AICPU_TILING_COMB_NUM_PIECES] += 1;
    return s->next_slot++;
}

/* Fill the slots of one core's first and last segments; returns its segment count. */
static int64_t assign_slots(slot_state *s, const work_pos *begin, const work_pos *end,
                            int32_t *rec) {
    int64_t last_unit;
    int begin_mid = begin->k > 0, end_mid = end->k > 0;
    rec[AICPU_TILING_CORE_FIRST_SLOT] = -1;
    rec[AICPU_TILING_CORE_LAST_SLOT] = -1;
    if (begin->unit_index == end->unit_index && begin->k == end->k) return 0;
    last_unit = end_mid ? end->unit_index : end->unit_index - 1;
    if (begin_mid) rec[AICPU_TILING_CORE_FIRST_SLOT] = continue_split_unit(s);
    else if (end_mid && last_unit == begin->unit_index)
        rec[AICPU_TILING_CORE_FIRST_SLOT] = open_split_unit(s, begin);
    if (last_unit == begin->unit_index) rec[AICPU_TILING_CORE_LAST_SLOT] = rec[AICPU_TILING_CORE_FIRST_SLOT];
    else if (end_mid) rec[AICPU_TILING_CORE_LAST_SLOT] = open_split_unit(s, end);
    return last_unit - begin->unit_index + 1;
}

/* Writes the core table, slots and combine table one core at a time. */
typedef struct core_writer {
    int32_t *buf;
    slot_state slots;
    work_pos begin; /* where the next core starts */
    int32_t core;   /* the next core */
    int64_t segments;
    int64_t max_cost;
} core_writer;

static void writer_init(const plan_ctx *c, core_writer *wr, int32_t *buf, const work_pos *begin) {
    const aicpu_tiling_params *p = c->p;
    wr->buf = buf;
    wr->slots.next_slot = 0;
    wr->slots.num_combine = 0;
    wr->slots.combine = buf + combine_offset(p);
    write_words(wr->slots.combine, used_words(p) - combine_offset(p), 0);
    wr->begin = *begin;
    wr->core = 0;
    wr->segments = 0;
    wr->max_cost = 0;
}

/* The next core ends at `end` and costs `cost`. */
static inline void writer_core(core_writer *wr, const work_pos *end, int64_t cost) {
    int32_t *rec = wr->buf + AICPU_TILING_HDR_WORDS + (int64_t)wr->core * AICPU_TILING_CORE_WORDS;
    int64_t segments;
    write_pos(rec + AICPU_TILING_CORE_BEGIN, &wr->begin);
    write_pos(rec + AICPU_TILING_CORE_END, end);
    segments = assign_slots(&wr->slots, &wr->begin, end, rec);
    rec[AICPU_TILING_CORE_NUM_SEGMENTS] = INT32_SATURATE(segments);
    rec[AICPU_TILING_CORE_COST] = INT32_SATURATE(cost);
    wr->segments += segments;
    if (cost > wr->max_cost) wr->max_cost = cost;
    wr->begin = *end;
    wr->core += 1;
}

/* Header counts, once every core is written. */
static void writer_finish(core_writer *wr, int64_t total, int64_t num_units) {
    int32_t *buf = wr->buf;
    buf[AICPU_TILING_HDR_NUM_UNITS] = INT32_SATURATE(num_units);
    buf[AICPU_TILING_HDR_NUM_SEGMENTS] = INT32_SATURATE(wr->segments);
    buf[AICPU_TILING_HDR_NUM_SLOTS] = wr->slots.next_slot;
    buf[AICPU_TILING_HDR_NUM_COMBINE] = wr->slots.num_combine;
    buf[AICPU_TILING_HDR_MAX_CORE_COST] = INT32_SATURATE(wr->max_cost);
    buf[AICPU_TILING_HDR_TOTAL_COST] = INT32_SATURATE(total);
}

/* The interval a greedy walk cuts: [0, total) of the work-order axis, which ends at `end`,
 * into at most `parts` core ranges. */
typedef struct walk_axis {
    int64_t total;
    int32_t parts;
    work_pos end;
} walk_axis;

/*
 * Greedy filling with a budget (see THE PARTITION): each core takes work up to `budget` and
 * stops at the last legal cut that fits. Instead of searching once per core, this searches
 * once per unit a core stops in: a core that stops inside a unit of n blocks after k of them
 * is followed by fresh cores that each take kk = floor((budget - seg) / w) blocks of it (a
 * fresh core pays the segment overhead whether it starts at the unit's start or inside it),
 * so ceil((n - k) / kk) cores start in that unit and the last of them carries on past its
 * end. Returns the busiest core's cost, or -1 when the work does not fit on the axis's parts.
 * With a writer it also writes every core of the axis.
 */
static int64_t greedy_walk(const plan_ctx *c, int64_t budget, const walk_axis *axis,
                           search_hints *hints, core_writer *wr) {
    int64_t seg = c->seg, target = budget, stops = 0, max_cost = 0, cost;
    int64_t limit = axis->parts - 1, total = axis->total;
    int32_t first_core = wr != NULL ? wr->core : 0;
    cursor cur;
    cursor_init(&cur, hints);
    while (target < total) {
        unit_at u;
        work_pos end;
        int64_t o, k, kk, fresh, last, i;
        axis_locate(c, &cur, target, &u);
        /* A core cannot take one whole block of a unit: it would stall. */
        if (budget < seg + u.w) return -1;
        o = target - u.start;
        k = o < seg + u.w ? 0 : div_pos(o - seg, u.w); /* < blocks: target is inside */
        if (seg + (u.blocks - k) * u.w <= budget) { /* one fresh core takes the rest: the */
            kk = u.blocks - k;                       /* common case, without dividing */
            fresh = 1;
        } else {
            kk = div_pos(budget - seg, u.w);
            fresh = div_pos(u.blocks - k + kk - 1, kk);
        }
        if (stops + fresh > limit) return -1;
        cost = budget - o + (k > 0 ? seg + k * u.w : 0);
        if (cost > max_cost) max_cost = cost;
        if (fresh > 1 && seg + kk * u.w > max_cost) max_cost = seg + kk * u.w;
        if (wr != NULL) {
            end.r = u.r, end.h = u.h, end.t = u.t, end.k = (int32_t)k;
            end.first = (int32_t)u.first;
            end.unit_index = u.index;
            writer_core(wr, &end, cost);
            for (i = 1; i < fresh; ++i) {
                end.k = (int32_t)(k + i * kk);
                writer_core(wr, &end, seg + kk * u.w);
            }
        }
        stops += fresh;
        last = u.blocks - k - (fresh - 1) * kk;
        /* The last fresh core starts last blocks before the unit's end. */
        target = u.start + (u.blocks - last) * u.w + budget;
    }
    cost = budget - (target - total);
    if (cost > max_cost) max_cost = cost;
    if (wr != NULL) {
        writer_core(wr, &axis->end, cost);
        while (wr->core - first_core < axis->parts) writer_core(wr, &axis->end, 0);
    }
    return max_cost;
}

/*
 * The smallest greedy budget that fits, in [lo, hi] where hi is known to fit: bisection,
 * where a budget that fits also lowers hi to the busiest core it left (greedy filling with
 * that budget fits too). Greedy filling is optimal for a given budget, so this is the
 * min-max over the legal cuts. Every core's cost is a sum of segment overheads and block
 * costs, and every block cost is a multiple of ceil(block_size / 16), so the min-max is a
 * multiple of g = gcd(cost_segment, ceil(block_size / 16)) and only those are probed.
 */
static int64_t min_max_budget(const plan_ctx *c, int64_t lo, int64_t hi, const walk_axis *axis,
                              search_hints *hints) {
    int64_t g = c->block_units, s = c->seg;
    while (s != 0) { /* Euclid */
        int64_t t = g % s;
        g = s;
        s = t;
    }
    lo = div_pos(lo + g - 1, g);
    hi = div_pos(hi, g);
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int64_t busiest = greedy_walk(c, mid * g, axis, hints, NULL);
        if (busiest >= 0) hi = div_pos(busiest, g);
        else lo = mid + 1;
    }
    return hi * g;
}

/* A position word of head 0's cores, for head h: head 0's units name head h's, and the end
 * of head 0 (the first unit of head 1) names the end of head h. */
static void head_shift_pos(const plan_ctx *c, int32_t *pos, int32_t h) {
    if (pos[1] == 0) {
        pos[1] = h;
    } else if (h + 1 < c->p->num_kv_heads) {
        pos[1] = h + 1;
    } else { /* the end of the work; the first unit's column goes too */
        pos[0] = 0;
        pos[1] = c->p->num_kv_heads;
        pos[3] = 0;
    }
}

/* Heads 1..H-1 are cut like head 0 (cores 0..parts-1, already written): copy its core
 * records and combine records with the head and slot numbers moved on. */
static void replicate_heads(const plan_ctx *c, core_writer *wr, int32_t parts) {
    int32_t *core0 = wr->buf + AICPU_TILING_HDR_WORDS;
    int32_t heads = c->p->num_kv_heads, slots = wr->slots.next_slot;
    int32_t records = wr->slots.num_combine, h, j;
    for (h = 1; h < heads; ++h) {
        int32_t *dst = core0 + (int64_t)h * parts * AICPU_TILING_CORE_WORDS;
        int32_t shift = h * slots;
        for (j = 0; j < parts; ++j) {
            const int32_t *src = core0 + (int64_t)j * AICPU_TILING_CORE_WORDS;
            int32_t *rec = dst + (int64_t)j * AICPU_TILING_CORE_WORDS;
            copy_words(rec, src, AICPU_TILING_CORE_WORDS);
            head_shift_pos(c, rec + AICPU_TILING_CORE_BEGIN, h);
            head_shift_pos(c, rec + AICPU_TILING_CORE_END, h);
            if (rec[AICPU_TILING_CORE_FIRST_SLOT] >= 0) rec[AICPU_TILING_CORE_FIRST_SLOT] += shift;
            if (rec[AICPU_TILING_CORE_LAST_SLOT] >= 0) rec[AICPU_TILING_CORE_LAST_SLOT] += shift;
        }
        for (j = 0; j < records; ++j) {
            const int32_t *src = wr->slots.combine + (int64_t)j * AICPU_TILING_COMB_WORDS;
            int32_t *rec = wr->slots.combine +
                           ((int64_t)h * records + j) * AICPU_TILING_COMB_WORDS;
            copy_words(rec, src, AICPU_TILING_COMB_WORDS);
            rec[AICPU_TILING_COMB_KV_HEAD] = h;
            rec[AICPU_TILING_COMB_FIRST_SLOT] += shift;
        }
    }
    wr->segments *= heads;
    wr->slots.next_slot = slots * heads;
    wr->slots.num_combine = records * heads;
}

/*
 * Cut the work as THE PARTITION in the header describes: per head when P is a multiple of H
 * (head 0 is cut, the other heads copy it), else the whole axis; always the min-max, from
 * the nearest-cut bound (which fits) down.
 */
static void partition(plan_ctx *c, int32_t *buf, int64_t total, int64_t num_units) {
    int32_t heads = c->p->num_kv_heads, cores = c->p->num_cores;
    int per_head = cores % heads == 0;
    int64_t lo, hi, share, fits, w_max;
    walk_axis axis;
    work_pos begin;
    core_writer wr;
    search_hints hints;
    if (total == 0) { /* no live request: every core idle at the end */
        begin = heads_end(c, heads);
        writer_init(c, &wr, buf, &begin);
        while (wr.core < cores) writer_core(&wr, &begin, 0);
        writer_finish(&wr, total, num_units);
        return;
    }
    {
        unit_at u;
        cursor cur;
        cursor_init(&cur, NULL);
        axis_locate(c, &cur, 0, &u); /* the first unit */
        c->first_live = u.r;
        c->first_column = u.first;
        begin.r = u.r, begin.h = 0, begin.t = begin.k = 0, begin.unit_index = 0;
        begin.first = (int32_t)u.first;
    }
    axis.parts = per_head ? cores / heads : cores;
    axis.total = per_head ? c->head_total : total;
    axis.end = heads_end(c, per_head ? 1 : heads);
    share = (axis.total + (axis.parts - 1) * c->seg + axis.parts - 1) / axis.parts;
    lo = (axis.total + axis.parts - 1) / axis.parts;
    /* Every block cost is at most that of a full query tile, or w_decode in a decode batch. */
    w_max = c->decode ? c->w_decode : block_cost(c, c->p->q_tile);
    hints.count = 0;
    fits = greedy_walk(c, share + c->seg + w_max, &axis, &hints, NULL);
    hi = fits >= 0 ? fits : axis.total;
    hi = min_max_budget(c, lo, hi, &axis, &hints);
    writer_init(c, &wr, buf, &begin);
    fits = greedy_walk(c, hi, &axis, &hints, &wr);
    TILING_ASSERT(fits == hi);
    (void)fits;
    if (per_head) replicate_heads(c, &wr, axis.parts);
    writer_finish(&wr, total, num_units);
}

int aicpu_tiling_plan(const aicpu_tiling_params *p, const int32_t *cu_seqlens_q,
                      const int32_t *seqlens_kv, int32_t batch, int32_t epoch, uint32_t flags,
                      void *buffer, size_t buffer_bytes) {
    plan_ctx c;
    int32_t *buf = (int32_t *)buffer;
    int64_t total, num_units, words;
    int status;
    if (buffer == NULL || ((uintptr_t)buffer & 3u) != 0) return AICPU_TILING_E_BUFFER;
    /* A window is a causal band: without the causal flag it has no meaning (ABI v5). */
    if (aicpu_tiling_params_check(p) != AICPU_TILING_OK ||
        (p->sliding_window > 0 && (flags & AICPU_TILING_CAUSAL) == 0)) {
        if (buffer_bytes < AICPU_TILING_HDR_WORDS * 4) return AICPU_TILING_E_BUFFER;
        write_header(buf, AICPU_TILING_E_PARAMS, batch, p != NULL ? p->num_cores : 0, flags,
                     epoch);
        return AICPU_TILING_E_PARAMS;
    }
    if (buffer_bytes < (size_t)buffer_words(p) * 4) return AICPU_TILING_E_BUFFER;
    if (batch < 0 || batch > p->max_batch)
        return write_input_error(p, buf, AICPU_TILING_E_BATCH, -1, batch, p->max_batch, batch,
                                 flags, epoch);
    if (cu_seqlens_q == NULL || (batch > 0 && seqlens_kv == NULL)) return AICPU_TILING_E_BUFFER;
    /* Trailing padding (ABI v4): slots after the last request with kv_len != 0 are padding
     * whatever their query offsets. vLLM-Ascend pads FULL_DECODE_ONLY batches with slots of
     * q_len = the uniform decode length and kv_len 0, and its FIA dummy request has kv_len 0
     * in the device buffer; none of their offsets is read from here on. */
    while (batch > 0 && seqlens_kv[batch - 1] == 0) --batch;

    c.p = p;
    c.cu = cu_seqlens_q;
    c.kv = seqlens_kv;
    c.batch = batch;
    c.epoch = epoch;
    c.causal = (flags & AICPU_TILING_CAUSAL) != 0;
    c.window = p->sliding_window;
    c.group = p->num_q_heads / p->num_kv_heads;
    c.seg = p->cost_segment;
    c.block_units = ((int64_t)p->block_size + 15) / 16;
    c.w_decode = block_cost(&c, 1);
    c.chunk_shift = 0;
    c.num_chunks = 0;
    c.decode = 0;
    c.head_total = c.head_units = 0;
    c.first_live = batch;
    c.first_column = 0;
    while (((int64_t)TILING_CHUNKS << c.chunk_shift) < batch) c.chunk_shift++;
    c.block_shift = -1;
    if ((p->block_size & (p->block_size - 1)) == 0) {
        int s = 0;
        while ((1 << s) < p->block_size) ++s;
        c.block_shift = s;
    }
    status = validate(&c, buf, flags, &total, &num_units);
    if (status != AICPU_TILING_OK) return status;

    /* Only the padding past the combine table is not written by the steps below. */
    words = buffer_words(p);
    write_words(buf + used_words(p), words - used_words(p), 0);
    write_header(buf, AICPU_TILING_OK, batch, p->num_cores, flags, epoch);
    buf[AICPU_TILING_HDR_NUM_TOKENS] = c.cu[batch];
    partition(&c, buf, total, num_units);
    return AICPU_TILING_OK;
}

const char *aicpu_tiling_strerror(int status) {
    switch (status) {
    case AICPU_TILING_OK: return "ok";
    case AICPU_TILING_E_PARAMS: return "static tiling parameters out of range";
    case AICPU_TILING_E_BUFFER: return "tiling buffer missing, misaligned or too small";
    case AICPU_TILING_E_BATCH: return "live batch is negative or larger than max_batch";
    case AICPU_TILING_E_QUERY_START: return "cu_seqlens_q[0] is not 0";
    case AICPU_TILING_E_QUERY_DECREASING: return "cu_seqlens_q decreases";
    case AICPU_TILING_E_QUERY_OVERFLOW: return "cu_seqlens_q runs past max_tokens";
    case AICPU_TILING_E_KV_NEGATIVE: return "seqlens_kv is negative";
    case AICPU_TILING_E_KV_SHORT: return "causal attention with seqlens_kv shorter than the query";
    case AICPU_TILING_E_KV_CAPACITY: return "seqlens_kv exceeds the block table's capacity";
    case AICPU_TILING_E_KV_EMPTY: return "non-causal query with an empty kv";
    default: return "unknown tiling status";
    }
}
