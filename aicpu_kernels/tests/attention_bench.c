/*
 * attention_bench.c -- single-thread decode microbenchmark of the reference attention.
 *
 *   cc -std=c99 -O3 -I aicpu_kernels aicpu_kernels/tests/attention_bench.c \
 *      aicpu_kernels/attention_ref.c aicpu_kernels/attention_x86.c aicpu_kernels/aicpu_tiling.c \
 *      -lm -o /tmp/attention_bench
 *   /tmp/attention_bench [dtype 0|1|2] [group] [kv_len] [batch] [repeats] [cores]
 * Environment: ATTENTION_BENCH_CPU=1 times thread CPU time instead of wall time;
 * ATTENTION_BENCH_HUGE=1 asks for 2 MiB pages for the caches; AICPU_TILING_ATTENTION_ISA=
 * portable|avx2|avx512 forces the kernels' variant (default: the best the CPU supports).
 *
 * Prints KV bytes read per second by one thread running every core of a decode tiling, and
 * the read bandwidth of a plain summing loop over a buffer of the same size.
 */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention_ref.h"

/* A contiguous cache's block stride, in elements: one block after the other. */
#define PAGE_OF(p) ((int64_t)(p)->block_size * (p)->num_kv_heads * (p)->head_dim)

/* Thread CPU time when ATTENTION_BENCH_CPU=1 (steadier on a shared machine), else wall time. */
static double now(void) {
    struct timespec ts;
    const char *cpu = getenv("ATTENTION_BENCH_CPU");
    clock_gettime(cpu && atoi(cpu) ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Large buffers, on 2 MiB pages when ATTENTION_BENCH_HUGE=1 and the kernel allows it. */
static unsigned char *big_alloc(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, (size_t)2 << 20, bytes)) return NULL;
    if (getenv("ATTENTION_BENCH_HUGE") && atoi(getenv("ATTENTION_BENCH_HUGE")))
        madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

int main(int argc, char **argv) {
    int32_t dtype = argc > 1 ? atoi(argv[1]) : 2;
    int32_t group = argc > 2 ? atoi(argv[2]) : 4;
    int32_t kv_len = argc > 3 ? atoi(argv[3]) : 2048;
    int32_t batch = argc > 4 ? atoi(argv[4]) : 32;
    int32_t reps = argc > 5 ? atoi(argv[5]) : 7, cores = argc > 6 ? atoi(argv[6]) : 24;
    int32_t hkv = 8, d = 128, bs = 128, i, r, c;
    aicpu_tiling_params p;
    size_t esize = dtype == AICPU_ATTENTION_FP32 ? 4 : 2, cache_elems, nb;
    int32_t *cu, *kv, *bt, *tiling, mbpr = (kv_len + bs - 1) / bs, num_blocks;
    float *po, *pl;
    unsigned char *kc, *vc, *q, *out;
    double *times, *sumt, kv_bytes, t0;
    volatile float sink = 0;

    if (getenv("AICPU_TILING_ATTENTION_ISA")) {
        const char *want = getenv("AICPU_TILING_ATTENTION_ISA");
        int32_t isa;
        for (isa = 0; isa < AICPU_ATTENTION_NUM_ISA; isa++)
            if (strcmp(want, aicpu_attention_isa_name(isa)) == 0) break;
        if (aicpu_attention_set_isa(isa) != AICPU_TILING_OK) {
            fprintf(stderr, "AICPU_TILING_ATTENTION_ISA=%s: unknown or unsupported here\n", want);
            return 4;
        }
    }
    if (reps < 1) reps = 1;
    times = malloc(sizeof(double) * (size_t)reps);
    sumt = malloc(sizeof(double) * (size_t)reps);
    memset(&p, 0, sizeof p);
    p.num_q_heads = hkv * group;
    p.num_kv_heads = hkv;
    p.head_dim = d;
    p.block_size = bs;
    p.max_batch = batch;
    p.max_tokens = batch;
    p.max_blocks_per_req = mbpr;
    p.num_cores = cores;
    p.q_tile = 1;
    p.cost_kv_load = AICPU_TILING_DEFAULT_COST_KV_LOAD;
    p.cost_qk_tile = AICPU_TILING_DEFAULT_COST_QK_TILE;
    p.cost_segment = AICPU_TILING_DEFAULT_COST_SEGMENT;
    num_blocks = batch * mbpr;
    cache_elems = (size_t)num_blocks * bs * hkv * d;
    kc = big_alloc(cache_elems * esize);
    vc = big_alloc(cache_elems * esize);
    q = malloc((size_t)batch * p.num_q_heads * d * esize);
    out = malloc((size_t)batch * p.num_q_heads * d * esize);
    cu = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    kv = malloc(sizeof(int32_t) * (size_t)batch);
    bt = malloc(sizeof(int32_t) * (size_t)batch * mbpr);
    tiling = malloc(aicpu_tiling_bytes(&p));
    nb = (size_t)aicpu_tiling_max_slots(&p) * group * (d + 1);
    po = malloc(nb * sizeof(float));
    pl = malloc(nb * sizeof(float));
    for (i = 0; i < (int32_t)(cache_elems * esize / 2); i++) {
        ((uint16_t *)kc)[i] = (uint16_t)(0x3c00u + (i & 0xff));
        ((uint16_t *)vc)[i] = (uint16_t)(0x3c00u + ((i >> 3) & 0xff));
    }
    memset(q, 0, (size_t)batch * p.num_q_heads * d * esize);
    for (r = 0; r <= batch; r++) cu[r] = r;
    for (r = 0; r < batch; r++) kv[r] = kv_len;
    for (r = 0; r < batch * mbpr; r++) bt[r] = (r * 7919) % num_blocks; /* scattered blocks */
    if (aicpu_tiling_plan(&p, cu, kv, batch, 0, AICPU_TILING_CAUSAL, tiling, aicpu_tiling_bytes(&p)))
        return 1;
    for (i = 0; i < reps; i++) {
        t0 = now();
        for (c = 0; c < cores; c++)
            if (aicpu_attention_core(&p, tiling, c, AICPU_TILING_CAUSAL, dtype, 0.088f, 0.0f, NULL,
                                     0, NULL, q, kc, vc, num_blocks, PAGE_OF(&p), PAGE_OF(&p), bt, cu,
                                     kv, out, po, pl))
                return 2;
        if (aicpu_attention_finalize(&p, tiling, dtype, cu, out, po, pl, NULL)) return 3;
        times[i] = now() - t0;
        t0 = now();
        {
            const float *f = (const float *)kc;
            size_t n = cache_elems * esize / 4, k;
            float a[8] = {0};
            for (k = 0; k + 8 <= n; k += 8) {
                int l;
                for (l = 0; l < 8; l++) a[l] += f[k + l];
            }
            sink += a[0] + a[7];
        }
        sumt[i] = now() - t0;
    }
    qsort(times, (size_t)reps, sizeof(double), cmp_double);
    qsort(sumt, (size_t)reps, sizeof(double), cmp_double);
    kv_bytes = 2.0 * batch * kv_len * hkv * d * (double)esize;
    printf("%s: ", aicpu_attention_isa_name(aicpu_attention_isa_active()));
    printf("dtype %d group %d kv %d batch %d: KV %.2f GB/s, read loop %.2f GB/s, ratio %.1f%%\n",
           dtype, group, kv_len, batch, kv_bytes / times[reps / 2] / 1e9,
           (double)(cache_elems * esize) / sumt[reps / 2] / 1e9,
           100.0 * (kv_bytes / times[reps / 2]) / ((double)(cache_elems * esize) / sumt[reps / 2]));
    free(kc);
    free(vc);
    free(q);
    free(out);
    free(cu);
    free(kv);
    free(bt);
    free(tiling);
    free(po);
    free(pl);
    free(times);
    free(sumt);
    return 0;
}
