/*
 * fuzz_tiling.c -- random and adversarial inputs through aicpu_tiling_plan(), each checked
 * against the contract. Built plain and under -fsanitize=address,undefined by the tests.
 *
 *     fuzz_tiling ITERATIONS [SEED]      prints "fuzz: N cases, K ok, E errors" or a failure
 *
 * Inputs live in exactly-sized heap arrays so AddressSanitizer sees any read past
 * cu_seqlens_q[batch] or seqlens_kv[batch - 1]; the buffer has a canary past its end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "aicpu_tiling.h"
#include "tiling_check.h"

static uint64_t rng_state;
static uint64_t status_seen[AICPU_TILING_NUM_STATUS];

static uint32_t rng(void) { /* xorshift64*: small, deterministic, good enough for fuzzing */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ULL) >> 32);
}

static int32_t pick(int32_t lo, int32_t hi) { /* uniform in [lo, hi] */
    return lo + (int32_t)(rng() % (uint32_t)(hi - lo + 1));
}

static void random_params(aicpu_tiling_params *p) {
    static const int32_t block_sizes[] = {1, 7, 16, 64, 128, 100};
    int32_t group;
    memset(p, 0, sizeof *p);
    p->num_kv_heads = pick(1, 4);
    group = (rng() & 1) ? 1 : pick(1, 8);
    p->num_q_heads = p->num_kv_heads * group;
    p->head_dim = pick(1, 256);
    p->block_size = block_sizes[rng() % 6];
    p->max_batch = pick(1, 24);
    p->max_tokens = pick(1, 300);
    p->max_blocks_per_req = pick(1, 40);
    /* One core, a multiple of the kv heads (the per-head partition) or any count (the whole
     * axis), each often. */
    switch (rng() % 4) {
    case 0: p->num_cores = 1; break;
    case 1: p->num_cores = p->num_kv_heads * pick(1, 12); break;
    default: p->num_cores = pick(1, 48); break;
    }
    p->q_tile = pick(1, 32);
    p->cost_kv_load = pick(0, 8);
    p->cost_qk_tile = pick(p->cost_kv_load == 0, 4);
    p->cost_segment = (rng() % 3 == 0) ? 0 : pick(0, 200);
    /* Sliding window (ABI v5): none half the time, else a few tokens, a few blocks, or as
     * long as the kv capacity or longer (then the same work as no window). */
    switch (rng() % 6) {
    case 0: p->sliding_window = pick(1, 4); break;
    case 1: p->sliding_window = pick(1, 3 * p->block_size); break;
    case 2: p->sliding_window = pick(1, p->max_blocks_per_req * p->block_size + 8); break;
    default: p->sliding_window = 0; break;
    }
}

/* Fill lengths: mostly valid decode / spec / prefill mixes, sometimes one corrupted value. */
static void random_inputs(const aicpu_tiling_params *p, int causal, int32_t batch, int32_t *cu,
                          int32_t *kv) {
    int64_t cap = (int64_t)p->max_blocks_per_req * p->block_size;
    int32_t r, budget = p->max_tokens;
    cu[0] = 0;
    for (r = 0; r < batch; ++r) {
        int32_t mode = (int32_t)(rng() % 5), q;
        if (mode == 0) q = 0;                                    /* padded slot */
        else if (mode <= 2) q = 1;                               /* decode */
        else if (mode == 3) q = pick(1, 6);                      /* speculative */
        else q = pick(1, budget > 1 ? budget : 1);               /* prefill chunk */
        if (q > budget) q = budget;
        budget -= q;
        cu[r + 1] = cu[r] + q;
        if (q == 0 && (rng() & 1)) kv[r] = 0;
        else {
            int32_t lo = causal ? q : 1;
            kv[r] = lo > cap ? (int32_t)cap : pick(lo, (int32_t)cap);
            if (rng() % 4 == 0) kv[r] = (int32_t)cap;            /* exactly full */
        }
    }
    if (batch > 0 && rng() % 3 == 0) { /* corrupt one value */
        r = pick(0, batch - 1);
        switch (rng() % 8) {
        case 0: cu[r + 1] = cu[r] - pick(1, 5); break;
        case 1: cu[batch] = p->max_tokens + pick(1, 3); break;
        case 2: kv[r] = -pick(1, 1000); break;
        case 3: kv[r] = cu[r + 1] - cu[r] - 1; break;
        case 4: kv[r] = (int32_t)cap + pick(1, 100); break;
        case 5: cu[0] = pick(1, 3); break;
        case 6: kv[r] = 0; break;
        default: cu[r + 1] = INT32_MIN + pick(0, 10); break;
        }
    }
    if (batch > 0 && rng() % 4 == 0) { /* vLLM-Ascend's trailing padding (kv_len 0) */
        int32_t first = pick(0, batch - 1);
        for (r = first; r < batch; ++r) {
            kv[r] = 0;
            switch (rng() % 4) {
            case 0: cu[r + 1] = cu[r] + 1; break;                /* uniform decode padding */
            case 1: cu[r + 1] = -1; break;                       /* the unused tail */
            case 2: cu[r + 1] = p->max_tokens + pick(0, 3); break; /* FIA's dummy, or past T */
            default: break;                                      /* as drawn */
            }
        }
    }
}

static int check_case(uint64_t iteration, const aicpu_tiling_params *p, int causal, int32_t batch,
                      const int32_t *cu, const int32_t *kv, unsigned char *buf, unsigned char *buf2,
                      size_t bytes, int *ok);

/* A window without the causal flag: E_PARAMS, only the header written (with the epoch), the
 * rest of the buffer untouched. */
static int check_window_needs_causal(uint64_t iteration, const aicpu_tiling_params *p,
                                     int32_t batch, const int32_t *cu, const int32_t *kv,
                                     unsigned char *buf, size_t bytes) {
    const int32_t epoch = (int32_t)(uint32_t)(iteration * 2654435761u);
    int32_t words[AICPU_TILING_HDR_WORDS];
    size_t i;
    int status;
    memset(buf, 0xA5, bytes + 64);
    status = aicpu_tiling_plan(p, cu, kv, batch, epoch, 0, buf, bytes);
    status_seen[AICPU_TILING_E_PARAMS]++;
    memcpy(words, buf, sizeof words);
    if (status != AICPU_TILING_E_PARAMS || words[AICPU_TILING_HDR_STATUS] != status ||
        words[AICPU_TILING_HDR_EPOCH] != epoch || words[AICPU_TILING_HDR_BAD_REQUEST] != -1) {
        fprintf(stderr, "case %llu: a window without causal gave status %d\n",
                (unsigned long long)iteration, status);
        return 1;
    }
    for (i = sizeof words; i < bytes + 64; ++i)
        if (buf[i] != 0xA5) {
            fprintf(stderr, "case %llu: E_PARAMS wrote past the header\n",
                    (unsigned long long)iteration);
            return 1;
        }
    return 0;
}

static int fuzz_one(uint64_t iteration, int *ok) {
    aicpu_tiling_params p;
    int causal = (int)(rng() & 1), failed;
    int32_t batch, *cu, *kv;
    size_t bytes;
    unsigned char *buf, *buf2;
    random_params(&p);
    if (aicpu_tiling_params_check(&p) != AICPU_TILING_OK) {
        fprintf(stderr, "case %llu: generator made invalid params\n", (unsigned long long)iteration);
        return 1;
    }
    batch = rng() % 16 == 0 ? p.max_batch + pick(1, 3) : pick(0, p.max_batch);
    if (rng() % 64 == 0) batch = -pick(1, 5);
    cu = malloc(sizeof(int32_t) * (size_t)(batch > 0 ? batch + 1 : 1));
    kv = malloc(sizeof(int32_t) * (size_t)(batch > 0 ? batch : 1));
    bytes = aicpu_tiling_bytes(&p);
    if (bytes == 0 || bytes % 64 != 0 || bytes > AICPU_TILING_BYTES_BOUND(p.num_cores)) {
        fprintf(stderr, "case %llu: %lu bytes, bound %lu\n", (unsigned long long)iteration,
                (unsigned long)bytes, (unsigned long)AICPU_TILING_BYTES_BOUND(p.num_cores));
        return 1;
    }
    buf = malloc(bytes + 64);
    buf2 = malloc(bytes);
    if (!cu || !kv || !buf || !buf2) return 1;
    random_inputs(&p, causal, batch > 0 && batch <= p.max_batch ? batch : 0, cu, kv);
    if (p.sliding_window > 0 && !causal && rng() % 4 != 0) causal = 1; /* mostly plannable */
    if (p.sliding_window > 0 && !causal) failed = check_window_needs_causal(iteration, &p, batch,
                                                                            cu, kv, buf, bytes);
    else failed = check_case(iteration, &p, causal, batch, cu, kv, buf, buf2, bytes, ok);
    free(cu);
    free(kv);
    free(buf);
    free(buf2);
    return failed;
}

static int check_case(uint64_t iteration, const aicpu_tiling_params *p, int causal, int32_t batch,
                      const int32_t *cu, const int32_t *kv, unsigned char *buf, unsigned char *buf2,
                      size_t bytes, int *ok) {
    int status, expected, again;
    int32_t bad;
    /* Any int32 is a valid epoch; spread them, sign included. */
    const int32_t epoch = (int32_t)(uint32_t)(iteration * 2654435761u);
    memset(buf, 0xA5, bytes + 64);
    memset(buf2, 0x5A, bytes);
    status = aicpu_tiling_plan(p, cu, kv, batch, epoch, causal ? AICPU_TILING_CAUSAL : 0, buf, bytes);
    again = aicpu_tiling_plan(p, cu, kv, batch, epoch, causal ? AICPU_TILING_CAUSAL : 0, buf2, bytes);
    expected = tiling_expected_status(p, cu, kv, batch, causal, &bad);
    if (status >= 0 && status < AICPU_TILING_NUM_STATUS) status_seen[status]++;
    if (status != expected || again != status) {
        fprintf(stderr, "case %llu: status %d, expected %d\n", (unsigned long long)iteration,
                status, expected);
        return 1;
    }
    if (status != AICPU_TILING_E_BUFFER) {
        int32_t echoed;
        memcpy(&echoed, buf + 4 * AICPU_TILING_HDR_EPOCH, sizeof echoed);
        if (echoed != epoch) {
            fprintf(stderr, "case %llu: header epoch %d, expected %d\n",
                    (unsigned long long)iteration, echoed, epoch);
            return 1;
        }
    }
    if (memcmp(buf, buf2, bytes) != 0) {
        fprintf(stderr, "case %llu: buffer not fully written (differs by prior contents)\n",
                (unsigned long long)iteration);
        return 1;
    }
    {
        size_t i;
        for (i = bytes; i < bytes + 64; ++i)
            if (buf[i] != 0xA5) {
                fprintf(stderr, "case %llu: wrote past the buffer\n", (unsigned long long)iteration);
                return 1;
            }
    }
    if (status == AICPU_TILING_OK) {
        const char *err = tiling_check(p, cu, kv, batch, causal, (const int32_t *)(void *)buf);
        if (err) {
            fprintf(stderr, "case %llu: %s\n", (unsigned long long)iteration, err);
            return 1;
        }
        *ok += 1;
    } else {
        /* Every core idle at (0, 0, 0, 0) with slots -1; the combine table and padding 0. */
        static const int32_t idle[AICPU_TILING_CORE_WORDS] = {0, 0, 0, 0, 0, 0, 0, 0, -1, -1,
                                                              0, 0};
        const int32_t *words = (const int32_t *)(void *)buf;
        int32_t core;
        size_t i;
        if (words[AICPU_TILING_HDR_BAD_REQUEST] != bad) {
            fprintf(stderr, "case %llu: bad request %d, expected %d\n",
                    (unsigned long long)iteration, words[AICPU_TILING_HDR_BAD_REQUEST], bad);
            return 1;
        }
        for (core = 0; core < p->num_cores; ++core)
            if (memcmp(words + AICPU_TILING_HDR_WORDS + core * AICPU_TILING_CORE_WORDS, idle,
                       sizeof idle) != 0) {
                fprintf(stderr, "case %llu: core %d not idle despite an error\n",
                        (unsigned long long)iteration, core);
                return 1;
            }
        for (i = AICPU_TILING_HDR_WORDS + (size_t)p->num_cores * AICPU_TILING_CORE_WORDS;
             i < bytes / 4; ++i)
            if (words[i] != 0) {
                fprintf(stderr, "case %llu: word %lu not zero despite an error\n",
                        (unsigned long long)iteration, (unsigned long)i);
                return 1;
            }
    }
    return 0;
}

int main(int argc, char **argv) {
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 10000, i;
    int ok = 0;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 10) : 0x9E3779B97F4A7C15ULL;
    if (rng_state == 0) rng_state = 1;
    for (i = 0; i < n; ++i)
        if (fuzz_one(i, &ok)) return 1;
    printf("fuzz: %llu cases, %d ok, %llu errors; by status:", (unsigned long long)n, ok,
           (unsigned long long)(n - (uint64_t)ok));
    for (i = 0; i < AICPU_TILING_NUM_STATUS; ++i) printf(" %llu", (unsigned long long)status_seen[i]);
    printf("\n");
    return 0;
}
