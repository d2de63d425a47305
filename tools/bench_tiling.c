/*
 * bench_tiling.c -- time aicpu_tiling_plan() per call in C, without Python in the loop.
 *
 *   gcc -std=c99 -O3 -Iaicpu_kernels aicpu_kernels/aicpu_tiling.c tools/bench_tiling.c \
 *       -o build/bench_tiling && gunzip -c pyruntime/workload/data/azure_llm_2023_conv.csv.gz \
 *       > build/trace.csv && build/bench_tiling build/trace.csv [quick]
 *
 * The trace is a plain CSV whose 2nd and 3rd columns are ContextTokens and GeneratedTokens
 * (`aicpu-tiling bench tiling` writes one from the bundled trace or AICPU_TILING_TRACE).
 *
 * "quick" (or building with -DAICPU_BENCH_QUICK=1) runs 5 repeats of a tenth of the calls:
 * a smoke test of about a second.
 *
 * "count B" times nothing: it makes the same batches and runs COUNT_CALLS calls at batch
 * size B only, for an instruction count that does not depend on the machine's load:
 *     valgrind --tool=callgrind --toggle-collect=aicpu_tiling_plan \
 *         build/bench_tiling trace.csv count 256      (instructions per call = total / 80)
 *
 * For each batch size it draws decode batches from the Azure conversation trace (kv length
 * = ContextTokens + a uniform share of GeneratedTokens, one query token per request),
 * then times repeats of CALLS calls and prints the median ns per call, one line per size:
 *     batch=256 ns_per_call=... ns_per_request=... min=... max=... repeats=...
 * Geometry: 32 query heads, 8 kv heads, head_dim 128, block 128, 24 cores (a 910B2's AIC).
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aicpu_tiling.h"

#define MAX_REQUESTS 20000
#define MAX_REPEATS 31
#define BATCHES 8 /* distinct batches per size, cycled so no single input is cached */
#define COUNT_CALLS 80

static int32_t context[MAX_REQUESTS], generated[MAX_REQUESTS];
static uint64_t rng_state = 0x2545F4914F6CDD1DULL;

static uint32_t rng(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ULL) >> 32);
}

static int load_trace(const char *path) {
    char line[256];
    int n = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bench_tiling: cannot open the trace %s\n", path);
        return -1;
    }
    if (!fgets(line, sizeof line, f)) n = -1; /* header */
    while (n >= 0 && n < MAX_REQUESTS && fgets(line, sizeof line, f)) {
        char *comma = strchr(line, ',');
        if (!comma) continue;
        context[n] = (int32_t)strtol(comma + 1, &comma, 10);
        generated[n] = (int32_t)strtol(comma + 1, NULL, 10);
        n++;
    }
    fclose(f);
    return n;
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    static const int32_t sizes[] = {1, 8, 64, 256, 1024};
    const char *trace = argc > 1 ? argv[1] : NULL;
#ifdef AICPU_BENCH_QUICK
    int quick = 1; /* the CLI's smoke mode compiles with -DAICPU_BENCH_QUICK=1 */
#else
    int quick = argc > 2 && strcmp(argv[2], "quick") == 0;
#endif
    int32_t count_batch = argc > 3 && strcmp(argv[2], "count") == 0 ? (int32_t)atoi(argv[3]) : 0;
    int repeats = quick ? 5 : MAX_REPEATS;
    int n = trace ? load_trace(trace) : -1, s;
    aicpu_tiling_params p;
    if (!trace) fprintf(stderr, "usage: bench_tiling TRACE.csv [quick]\n");
    if (n <= 0) return 1;
    memset(&p, 0, sizeof p);
    p.num_q_heads = 32, p.num_kv_heads = 8, p.head_dim = 128, p.block_size = 128;
    p.max_batch = 1024, p.max_tokens = 1024, p.max_blocks_per_req = 512, p.num_cores = 24;
    p.q_tile = 16, p.cost_kv_load = AICPU_TILING_DEFAULT_COST_KV_LOAD;
    p.cost_qk_tile = AICPU_TILING_DEFAULT_COST_QK_TILE;
    p.cost_segment = AICPU_TILING_DEFAULT_COST_SEGMENT;
    for (s = 0; s < (int)(sizeof sizes / sizeof sizes[0]); ++s) {
        int32_t batch = sizes[s], b, r, i;
        static int32_t cu[BATCHES][1025], kv[BATCHES][1024];
        static unsigned char buf[AICPU_TILING_BYTES_BOUND(24)];
        double per_call[MAX_REPEATS];
        long calls = (batch >= 256 ? 20000 : 100000) / (quick ? 10 : 1);
        for (b = 0; b < BATCHES; ++b) {
            cu[b][0] = 0;
            for (r = 0; r < batch; ++r) {
                int k = (int)(rng() % (uint32_t)n);
                int64_t len = context[k] + (generated[k] > 0 ? rng() % (uint32_t)generated[k] : 0) + 1;
                if (len > p.max_blocks_per_req * p.block_size) len = p.max_blocks_per_req * p.block_size;
                cu[b][r + 1] = r + 1;
                kv[b][r] = (int32_t)len;
            }
        }
        if (count_batch > 0) { /* the batches above keep the generator in step */
            long c;
            if (batch != count_batch) continue;
            for (c = 0; c < COUNT_CALLS; ++c)
                if (aicpu_tiling_plan(&p, cu[c % BATCHES], kv[c % BATCHES], batch, (int32_t)c,
                                      AICPU_TILING_CAUSAL, buf, sizeof buf) != AICPU_TILING_OK)
                    return 1;
            printf("batch=%d calls=%d\n", batch, COUNT_CALLS);
            continue;
        }
        for (i = 0; i < repeats; ++i) {
            double t0 = now_ns();
            long c;
            for (c = 0; c < calls; ++c) {
                int st = aicpu_tiling_plan(&p, cu[c % BATCHES], kv[c % BATCHES], batch,
                                           (int32_t)c, AICPU_TILING_CAUSAL, buf, sizeof buf);
                if (st != AICPU_TILING_OK) {
                    fprintf(stderr, "bench_tiling: status %d\n", st);
                    return 1;
                }
            }
            per_call[i] = (now_ns() - t0) / (double)calls;
        }
        qsort(per_call, (size_t)repeats, sizeof per_call[0], cmp_double);
        printf("batch=%d ns_per_call=%.1f ns_per_request=%.2f min=%.1f max=%.1f repeats=%d\n",
               batch, per_call[repeats / 2], per_call[repeats / 2] / batch, per_call[0],
               per_call[repeats - 1], repeats);
    }
    return 0;
}
