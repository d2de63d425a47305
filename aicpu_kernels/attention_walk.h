/*
 * attention_walk.h -- internal: the walk of a core's tiling range, shared by the consumers of
 * the tiling in C: the GQA reference (attention_ref.c, every instruction-set variant) and the
 * MLA reference (attention_mla_ref.c). Not part of the ABI.
 *
 * The walk is the one place that reads a core record (aicpu_tiling.h, THE PARTITION): it goes
 * through the core's range [begin, end) unit by unit in head-major work order, tells whole
 * units from the pieces of split units (and which slot a piece writes), re-checks every
 * request's lengths against the params, checks the block-table entries a segment will read,
 * and hands each segment to the consumer. What a segment computes is the consumer's, passed
 * in as callbacks (tiling_walk): how scores are formed, where values come from, how rows are
 * written. GQA fuses the whole units of several kv heads into one segment (fuse_cap); MLA
 * has one kv head and fuses none.
 *
 * Why a header of static inline functions rather than a translation unit: the C tests and
 * tools link the existing sources by name, and a header keeps every TU free of calls into
 * another consumer's symbols (tests/test_c_symbol_cycles.py). Strict C99 (inline is C99).
 */
#ifndef AICPU_ATTENTION_WALK_H
#define AICPU_ATTENTION_WALK_H

#include <stddef.h>
#include <stdint.h>

#include "aicpu_tiling.h"
#include "attention_ref.h"

typedef struct {
    int32_t r, h, t, k;
} work_pos;

/* Positions compare in the head-major work order, (h, r, t, k); the words are (r, h, t, k). */
static inline int pos_less(const work_pos *a, const work_pos *b) {
    if (a->h != b->h) return a->h < b->h;
    if (a->r != b->r) return a->r < b->r;
    if (a->t != b->t) return a->t < b->t;
    return a->k < b->k;
}

static inline void read_pos(work_pos *p, const int32_t *words) {
    p->r = words[0];
    p->h = words[1];
    p->t = words[2];
    p->k = words[3];
}

/* What the kernel needs of one live request, re-checked against the static params. */
typedef struct {
    int32_t q_start, q_len, kv_len;
} request_lens;

/*
 * A segment: kv blocks [kb, ke) of unit (r, h, t), or of the nh units (r, h..h+nh-1, t) when
 * whole units of a single-tile request in the core's range are fused. Fusing kv heads turns
 * the reads of K and V into one contiguous run per token ([token][kv head][dim] in the cache)
 * instead of nh runs of head_dim values at a stride, which hardware prefetchers follow far
 * better.
 */
typedef struct {
    int32_t r, h, t, kb, ke, nh;
    int32_t slot; /* partial slot, or -1 when the segment is whole units */
    int32_t ntok; /* query tokens in the tile */
    request_lens rl;
} segment;

/*
 * What the walk needs of a call: the tiling-level view (params, flags, lengths, block table,
 * the partial workspace) and the consumer's per-geometry parts. A consumer embeds this struct
 * as the FIRST member of its own context, so that its callbacks, given the walk, recover their
 * context with a cast (C99 6.7.2.1: a pointer to a struct, suitably converted, points to its
 * first member, and back).
 */
typedef struct tiling_walk tiling_walk;

struct tiling_walk {
    const aicpu_tiling_params *p;
    int32_t causal;     /* AICPU_TILING_CAUSAL was given */
    int32_t window;     /* sliding window W > 0 (causal only), or 0 (off) */
    int32_t num_blocks; /* the caches' dim 0: block-table entries must be below it */
    int32_t max_slots;  /* aicpu_tiling_max_slots(p) */
    const int32_t *block_table, *cu, *kv; /* block_table, cu_seqlens_q, seqlens_kv */
    float *partial_out, *partial_lse;     /* where pieces of split units write (may be NULL) */
    /* The geometry: run segment sg (the rows of its query tile, of kv heads sg->h ..
     * sg->h + sg->nh - 1, over kv blocks [sg->kb, sg->ke) of request sg->r) and write its rows,
     * to the output for a whole unit (sg->slot < 0), else to partial slot sg->slot with their
     * lse; with blocks_ok == 0 it reads no block and writes zero rows (a piece: lse = +inf). */
    void (*run_segment)(const tiling_walk *w, const segment *sg, int blocks_ok);
    /* Kv heads one run_segment call can take at once for a tile of ntok query tokens (>= 1),
     * or NULL: the consumer takes one kv head per call and the walk fuses none. */
    int32_t (*fuse_cap)(const tiling_walk *w, int32_t ntok);
};

/* The tiling-level view of a call (flags: AICPU_TILING_CAUSAL or 0; the arrays as documented
 * for aicpu_attention_core) and the consumer's geometry. */
static inline void walk_init(tiling_walk *w, const aicpu_tiling_params *params, uint32_t flags,
                             int32_t window, int32_t num_blocks, const int32_t *block_table,
                             const int32_t *cu_seqlens_q, const int32_t *seqlens_kv,
                             float *partial_out, float *partial_lse,
                             void (*run_segment)(const tiling_walk *, const segment *, int),
                             int32_t (*fuse_cap)(const tiling_walk *, int32_t)) {
    w->p = params;
    w->causal = (flags & AICPU_TILING_CAUSAL) != 0;
    w->window = window;
    w->num_blocks = num_blocks;
    w->max_slots = aicpu_tiling_max_slots(params);
    w->block_table = block_table;
    w->cu = cu_seqlens_q;
    w->kv = seqlens_kv;
    w->partial_out = partial_out;
    w->partial_lse = partial_lse;
    w->run_segment = run_segment;
    w->fuse_cap = fuse_cap;
}

/* Request r's lengths: 0 when they could not have been planned with these params and flags. */
static inline int load_request(const tiling_walk *w, int32_t r, request_lens *rl) {
    int32_t lo = w->cu[r], hi = w->cu[r + 1], kv = w->kv[r];
    int64_t capacity = (int64_t)w->p->max_blocks_per_req * w->p->block_size;
    if (lo < 0 || hi < lo || hi > w->p->max_tokens || kv < 0 || kv > capacity) return 0;
    if (w->causal ? kv < hi - lo : (hi > lo && kv == 0)) return 0;
    rl->q_start = lo;
    rl->q_len = hi - lo;
    rl->kv_len = kv;
    return 1;
}

static inline int32_t num_tiles(const tiling_walk *w, const request_lens *rl) {
    return (int32_t)(((int64_t)rl->q_len + w->p->q_tile - 1) / w->p->q_tile);
}

/* 1 when the buffer's header says it is a tiling of this ABI for params' core count. */
static inline int header_ok(const aicpu_tiling_params *p, const int32_t *tiling) {
    return tiling[AICPU_TILING_HDR_MAGIC] == AICPU_TILING_MAGIC &&
           tiling[AICPU_TILING_HDR_VERSION] == AICPU_TILING_VERSION &&
           tiling[AICPU_TILING_HDR_NUM_CORES] == p->num_cores;
}

/* kv blocks of query tile t of a request: causal tiles see the kv up to their last token. */
static inline int32_t unit_blocks(const tiling_walk *w, const request_lens *rl, int32_t t) {
    int32_t kv_end = rl->kv_len;
    if (w->causal) {
        int32_t q_end = (t + 1) * w->p->q_tile;
        kv_end = rl->kv_len - rl->q_len + (q_end < rl->q_len ? q_end : rl->q_len);
    }
    return (int32_t)(((int64_t)kv_end + w->p->block_size - 1) / w->p->block_size);
}

/* The first kv block a unit's rows see with a sliding window W: the block of max(0, p0 - W + 1),
 * p0 = kv_len - q_len + t * q_tile the position of its first row; 0 without a window. */
static inline int32_t window_first_block(const tiling_walk *w, const request_lens *rl,
                                         int32_t t) {
    int64_t lo;
    if (w->window <= 0) return 0;
    lo = (int64_t)rl->kv_len - rl->q_len + (int64_t)t * w->p->q_tile - w->window + 1;
    return lo <= 0 ? 0 : (int32_t)(lo / w->p->block_size);
}

/*
 * Where a tiling starts a unit. One that knows no window (ABI v4, or a window of 0) starts
 * every unit at block 0 and may cut it anywhere; one planned with the window (ABI v5) starts
 * it at kw = window_first_block, in absolute block-table columns, and cuts only above. The
 * consumer reads no block below kw either way, and tells the two apart from the core record
 * where the block index alone cannot: only 0 < k <= kw is ambiguous.
 *
 * begins_inside: 1 when a core's begin at block k (first_slot: its record's) continues a unit
 * the tiling cut there, 0 when it is the unit's start. k > kw is a cut for both. 0 < k <= kw
 * with first_slot < 0 is the start (a continuation is always a piece, which has a slot);
 * with first_slot >= 0 the first segment is a piece either way (a continuation, or a start
 * that ends inside the unit), over the same blocks [kw, ke), so both readings compute alike.
 */
static inline int begins_inside(int32_t k, int32_t kw, int32_t first_slot) {
    return k > kw || (k > 0 && first_slot >= 0);
}

/* 1 when request r's block-table entries for kv blocks [kb, ke) name blocks of the cache. */
static inline int blocks_valid(const tiling_walk *w, int32_t r, int32_t kb, int32_t ke) {
    const int32_t *row = w->block_table + (size_t)r * w->p->max_blocks_per_req;
    int ok = 1;
    int32_t b;
    for (b = kb; b < ke; b++)
        if (row[b] < 0 || row[b] >= w->num_blocks) ok = 0;
    return ok;
}

/* The kv heads [*lo, *hi] whose whole unit (h, r, 0) of single-tile request r lies inside the
 * range [begin, end) (head-major order: the heads strictly between begin's and end's, plus
 * begin's head when begin is not past request r, plus end's head when end is past request r;
 * begin_starts: begin, when in request r, is a unit's start, !begins_inside);
 * *lo > *hi when there are none. */
static inline void whole_heads(const tiling_walk *w, const work_pos *begin, const work_pos *end,
                               int32_t r, int begin_starts, int32_t *lo, int32_t *hi) {
    *lo = begin->r < r || (begin->r == r && begin_starts) ? begin->h : begin->h + 1;
    *hi = end->r > r ? end->h : end->h - 1;
    if (*hi > w->p->num_kv_heads - 1) *hi = w->p->num_kv_heads - 1;
}

/*
 * How a walk runs. A core's own walk (heads == 0) fuses the whole single-tile units of several
 * kv heads that lie inside its range. A sibling walk (heads == H, aicpu_attention_core_siblings)
 * walks the range of core j, which lies in head 0, and runs every segment for all H heads: a
 * whole unit for groups of up to `cap` heads at once, a piece once per head h with slot
 * + h * slot_step. With run == 0 the walk only checks the range (nothing is read of the caches
 * or written); it returns what a running walk would, apart from AICPU_ATTENTION_E_BLOCK_ID.
 */
typedef struct {
    int32_t heads;     /* 0: the core's own walk; else the sibling walk over this many heads */
    int32_t slot_step; /* sibling walk: the slots of one head */
    int run;
    int skip_whole; /* a core's own walk within a span: leave the whole single-tile units,
                     * which run_span_whole runs for the span (still checked and counted) */
} walk_mode;

/*
 * The walk: core record rec's range [begin, end) of the tiling, unit by unit in head-major
 * work order, cut where the tiling cuts (a piece of a split unit writes its slot), each
 * segment checked against the request's lengths and the slots before w->run_segment runs it.
 * Returns AICPU_TILING_OK, AICPU_ATTENTION_E_TILING at the first inconsistent segment, or
 * AICPU_ATTENTION_E_BLOCK_ID when some segment's block-table entries are out of range (that
 * segment still runs, with blocks_ok = 0: it writes zeros).
 */
static inline int walk_range(const tiling_walk *w, const int32_t *rec, int32_t batch,
                             const walk_mode *mode) {
    const aicpu_tiling_params *params = w->p;
    work_pos pos, first, end;
    int32_t first_slot, last_slot, nseg = 0;
    int status = AICPU_TILING_OK;

    read_pos(&pos, rec + AICPU_TILING_CORE_BEGIN);
    read_pos(&end, rec + AICPU_TILING_CORE_END);
    first = pos;
    first_slot = rec[AICPU_TILING_CORE_FIRST_SLOT];
    last_slot = rec[AICPU_TILING_CORE_LAST_SLOT];

    while (pos_less(&pos, &end)) {
        segment sg;
        int32_t nblocks, cap, kw;
        int blocks_ok, whole; /* whole: a whole unit of a single-tile request */
        int inside;           /* the segment continues a unit the tiling cut (begins_inside) */
        if (pos.r < 0 || pos.r >= batch || pos.h < 0 || pos.h >= params->num_kv_heads ||
            pos.t < 0 || !load_request(w, pos.r, &sg.rl) || pos.t >= num_tiles(w, &sg.rl) ||
            (mode->heads > 0 && pos.h != 0))
            return AICPU_ATTENTION_E_TILING;
        nblocks = unit_blocks(w, &sg.rl, pos.t);
        kw = window_first_block(w, &sg.rl, pos.t);
        inside = nseg == 0 && begins_inside(pos.k, kw, first_slot);
        /* an end at 0 < k <= kw: a tiling that knows the window names the unit's start there
         * (the core ends before the unit, its segments all walked); else a cut at k */
        if (end.r == pos.r && end.h == pos.h && end.t == pos.t && end.k > 0 && end.k <= kw &&
            nseg == rec[AICPU_TILING_CORE_NUM_SEGMENTS])
            break;
        sg.r = pos.r;
        sg.h = pos.h;
        sg.t = pos.t;
        sg.kb = pos.k;
        sg.ke = (end.r == pos.r && end.h == pos.h && end.t == pos.t) ? end.k : nblocks;
        if (sg.kb < 0 || sg.ke <= sg.kb || sg.ke > nblocks) return AICPU_ATTENTION_E_TILING;
        sg.slot = -1;
        sg.nh = 1;
        sg.ntok = sg.rl.q_len - pos.t * params->q_tile;
        if (sg.ntok > params->q_tile) sg.ntok = params->q_tile;
        cap = w->fuse_cap != NULL ? w->fuse_cap(w, sg.ntok) : 1;
        whole = !inside && sg.ke == nblocks && num_tiles(w, &sg.rl) == 1;
        if (w->fuse_cap != NULL && mode->heads == 0 && whole) {
            /* Fuse kv heads: the whole units (r, h', 0) inside the core's range are the heads
             * [lo, hi] (whole_heads). They run in groups of cap heads starting at lo, each group
             * when the walk reaches its first head; the walk skips the group's other heads
             * later. */
            int32_t lo, hi;
            whole_heads(w, &first, &end, pos.r, !begins_inside(first.k, kw, first_slot), &lo,
                        &hi);
            if (pos.h < lo || pos.h > hi) return AICPU_ATTENTION_E_TILING;
            if ((pos.h - lo) % cap != 0) {
                sg.nh = 0; /* run with the group that starts at an earlier head */
            } else {
                sg.nh = hi - pos.h + 1 < cap ? hi - pos.h + 1 : cap;
            }
        }
        if (inside || sg.ke < nblocks) {
            /* Only a core's first segment can start inside a unit and only its last can end
             * inside one; a piece that is both has first_slot == last_slot. */
            int last = sg.ke < nblocks || nseg + 1 == rec[AICPU_TILING_CORE_NUM_SEGMENTS];
            int32_t top = mode->heads > 0 ? (mode->heads - 1) * mode->slot_step : 0;
            sg.slot = nseg == 0 ? first_slot : last_slot;
            if ((nseg > 0 && (inside || !last)) ||
                (nseg == 0 && last && first_slot != last_slot))
                return AICPU_ATTENTION_E_TILING;
            if (sg.slot < 0 || sg.slot >= w->max_slots - top || w->partial_out == NULL ||
                w->partial_lse == NULL)
                return AICPU_ATTENTION_E_TILING;
        }
        /* only the blocks the window lets the segment read (from kw on) are checked (and read) */
        blocks_ok = blocks_valid(w, sg.r, sg.kb > kw ? sg.kb : kw, sg.ke);
        if (!blocks_ok) status = AICPU_ATTENTION_E_BLOCK_ID;
        if (mode->heads == 0) {
            if (sg.nh > 0 && mode->run && !(mode->skip_whole && whole))
                w->run_segment(w, &sg, blocks_ok);
            nseg += sg.nh;
        } else {
            /* the sibling walk: this segment for heads 0..heads-1, the siblings' segments */
            int32_t h, slot0 = sg.slot;
            for (h = 0; mode->run && h < mode->heads; h += sg.nh) {
                sg.h = h;
                if (slot0 >= 0) { /* a piece: one head per call, each with its own slot */
                    sg.nh = 1;
                    sg.slot = slot0 + h * mode->slot_step;
                } else {
                    sg.nh = mode->heads - h < cap ? mode->heads - h : cap;
                }
                w->run_segment(w, &sg, blocks_ok);
            }
            nseg += 1;
        }

        if (sg.ke < nblocks) {
            pos.k = sg.ke; /* a cut inside the unit: only the core's end can be there */
            if (!(pos.r == end.r && pos.h == end.h && pos.t == end.t && pos.k == end.k))
                return AICPU_ATTENTION_E_TILING;
            break;
        }
        /* the next unit in work order: the next query tile, else the next request with query
         * tokens under this head, else the first such request under the next head, else the
         * end of the work (0, num_kv_heads, 0, 0) */
        pos.k = 0;
        if (++pos.t >= num_tiles(w, &sg.rl)) {
            pos.t = 0;
            for (pos.r++; pos.r < batch && w->cu[pos.r + 1] == w->cu[pos.r]; pos.r++) {
            }
            if (pos.r >= batch) {
                for (pos.r = 0; pos.r < batch && w->cu[pos.r + 1] == w->cu[pos.r]; pos.r++) {
                }
                if (++pos.h >= params->num_kv_heads || pos.r >= batch) {
                    pos.r = 0;
                    pos.h = params->num_kv_heads;
                }
            }
        }
    }
    if (nseg != rec[AICPU_TILING_CORE_NUM_SEGMENTS]) return AICPU_ATTENTION_E_TILING;
    return status;
}

/* Core `core`'s record in the tiling's core table. */
static inline const int32_t *core_record(const int32_t *tiling, int32_t core) {
    return tiling + AICPU_TILING_HDR_WORDS + (size_t)core * AICPU_TILING_CORE_WORDS;
}

/* 1 when the record's range is empty (begin >= end in work order): the core has no work. */
static inline int core_idle(const int32_t *rec) {
    work_pos begin, end;
    read_pos(&begin, rec + AICPU_TILING_CORE_BEGIN);
    read_pos(&end, rec + AICPU_TILING_CORE_END);
    return !pos_less(&begin, &end);
}

/* ------------------------------------------------------------------------------------------ */
/* Within a segment: what a row sees, and the kv chunks of a row block                        */
/* ------------------------------------------------------------------------------------------ */

/* The kv positions [*lower, *limit) that query token tok of segment sg's tile sees: causal,
 * up to its own position kv_len - q_len + t * q_tile + tok, and with a window W only its last
 * W (attention_ref.h, WHAT A ROW COMPUTES); not causal, all kv_len. */
static inline void row_positions(const tiling_walk *w, const segment *sg, int32_t tok,
                                 int32_t *lower, int32_t *limit) {
    const int32_t shift = w->causal ? sg->rl.kv_len - sg->rl.q_len : 0;
    *limit = w->causal ? shift + sg->t * w->p->q_tile + tok + 1 : sg->rl.kv_len;
    /* the row at position limit - 1 sees (limit - 1 - W, limit - 1] (causal only) */
    *lower = w->window > 0 && *limit > w->window ? *limit - w->window : 0;
}

/* One chunk of kv positions of a segment, and the chunk after it (for prefetching). */
typedef struct {
    int32_t b;     /* the kv block: its column in the request's block-table row */
    int32_t block; /* the cache block there (the walk checked 0 <= block < num_blocks) */
    int32_t c0, n; /* positions [c0, c0 + n), all in block b: token c0 - b * block_size on */
    int32_t next_block, next_tok, next_n; /* the next chunk, in this kv block or the next:
                                           * its cache block, first token, length; next_n
                                           * = 0: none (the row block's last chunk) */
} kv_chunk;

/*
 * The kv chunks of one row block of segment sg whose rows see positions [kv_lo, kv_hi) at
 * most: of the segment's kv blocks [kb, ke), those from the block of kv_lo (a unit's blocks
 * in an ABI v4 tiling may start below the lowest window start: they are not read) up to the
 * one of position kv_hi - 1, each cut into chunks of at most `chunk` positions (>= 1) from
 * max(kv_lo, its first). In order, block_read(arg, b) once per kv block b before its chunks
 * (NULL: not called), then run_chunk(arg, ch) per chunk. Call it only for a segment whose
 * blocks are valid (walk_range's blocks_ok).
 */
static inline void walk_chunks(const tiling_walk *w, const segment *sg, int32_t kv_lo,
                               int32_t kv_hi, int32_t chunk, void *arg,
                               void (*block_read)(void *arg, int32_t b),
                               void (*run_chunk)(void *arg, const kv_chunk *ch)) {
    const int32_t bs = w->p->block_size;
    const int32_t *bt_row = w->block_table + (size_t)sg->r * w->p->max_blocks_per_req;
    int32_t b;
    if (kv_hi > sg->ke * bs) kv_hi = sg->ke * bs;
    for (b = sg->kb > kv_lo / bs ? sg->kb : kv_lo / bs; b < sg->ke && b * bs < kv_hi; b++) {
        const int32_t p0 = b * bs;
        const int32_t p1 = p0 + bs < kv_hi ? p0 + bs : kv_hi;
        kv_chunk ch;
        ch.b = b;
        ch.block = bt_row[b];
        if (block_read != NULL) block_read(arg, b);
        for (ch.c0 = p0 > kv_lo ? p0 : kv_lo; ch.c0 < p1; ch.c0 += chunk) {
            int32_t nc0 = ch.c0 + chunk, nb = b;
            ch.n = p1 - ch.c0 < chunk ? p1 - ch.c0 : chunk;
            ch.next_block = ch.next_tok = ch.next_n = 0;
            if (nc0 >= p1 && b + 1 < sg->ke && (b + 1) * bs < kv_hi) {
                nb = b + 1;
                nc0 = nb * bs;
            }
            if (nc0 < kv_hi && nc0 < (nb + 1) * bs) {
                ch.next_block = bt_row[nb];
                ch.next_tok = nc0 - nb * bs;
                ch.next_n = kv_hi - nc0 < chunk ? kv_hi - nc0 : chunk;
                if (ch.next_n > (nb + 1) * bs - nc0) ch.next_n = (nb + 1) * bs - nc0;
            }
            run_chunk(arg, &ch);
        }
    }
}

#endif /* AICPU_ATTENTION_WALK_H */
