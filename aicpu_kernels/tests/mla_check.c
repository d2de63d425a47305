/*
 * mla_check.c -- aicpu_mla_core + aicpu_mla_finalize against a double-precision absorbed MLA,
 * for random tilings (tests/test_mla_c.py builds it plainly and under ASan+UBSan).
 *
 *   cc -std=c99 -pedantic -Wall -Wextra -Werror -I aicpu_kernels \
 *      aicpu_kernels/tests/mla_check.c aicpu_kernels/attention_mla_ref.c \
 *      aicpu_kernels/attention_ref.c aicpu_kernels/attention_x86.c \
 *      aicpu_kernels/aicpu_tiling.c -lm -o /tmp/mla_check
 *   /tmp/mla_check [problems]   prints "<n> problems, <s> with split units, <b> bad block ids;
 *                               <f> failures"
 *
 * A problem draws heads (1, 4, 16), kv_lora_rank (32, 64, 13), rope (16, 8, 0), block size,
 * q_tile, num_cores (1 to 9: splits and idle cores), dtype (fp32, fp16, bf16), causal or not,
 * and a batch of decode and MTP requests (q_len 0 to 4: padded slots too). Inputs are stored
 * in the dtype and the double reference reads the stored values, so the only error left is
 * fp32 accumulation and one rounding of the output: within 1e-4 relative to the row block's
 * largest value for fp32, 1e-2 for fp16 / bf16. Every fourth problem sets one used block-table
 * entry out of range: some core must report AICPU_ATTENTION_E_BLOCK_ID and that request's rows
 * must be zero after finalize. Padding rows must be zero. Exit status 1 on the first failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_mla_ref.h"

#define MAX_BATCH 4
#define MAX_TOKENS 16
#define MBPR 10
#define MAX_HEADS 16
#define MAX_DIM 96
#define NUM_BLOCKS (MAX_BATCH * MBPR)

static uint32_t rng_state = 88172645u;

static uint32_t next_u32(void) { /* xorshift32 */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static int32_t pick(int32_t n) { return (int32_t)(next_u32() % (uint32_t)n); }

static float uniform(void) { return (float)(next_u32() >> 8) / 8388608.0f - 1.0f; }

/* Store x in dtype at element i of buf; return the stored value as a float. */
static float put(void *buf, size_t i, int32_t dtype, float x) {
    if (dtype == AICPU_ATTENTION_FP32) {
        ((float *)buf)[i] = x;
        return x;
    }
    if (dtype == AICPU_ATTENTION_FP16) {
        uint16_t h = aicpu_attention_float_to_half(x);
        ((uint16_t *)buf)[i] = h;
        return aicpu_attention_half_to_float(h);
    }
    ((uint16_t *)buf)[i] = aicpu_attention_float_to_bf16(x);
    return aicpu_attention_bf16_to_float(((uint16_t *)buf)[i]);
}

static float get(const void *buf, size_t i, int32_t dtype) {
    if (dtype == AICPU_ATTENTION_FP32) return ((const float *)buf)[i];
    if (dtype == AICPU_ATTENTION_FP16)
        return aicpu_attention_half_to_float(((const uint16_t *)buf)[i]);
    return aicpu_attention_bf16_to_float(((const uint16_t *)buf)[i]);
}

/* the stored inputs, widened (the reference reads exactly what the kernel reads) */
static float qn_f[MAX_TOKENS * MAX_HEADS * MAX_DIM], qp_f[MAX_TOKENS * MAX_HEADS * MAX_DIM];
static float kc_f[NUM_BLOCKS * 64 * MAX_DIM], kp_f[NUM_BLOCKS * 64 * MAX_DIM];
static float qn[MAX_TOKENS * MAX_HEADS * MAX_DIM], qp[MAX_TOKENS * MAX_HEADS * MAX_DIM];
static float kc[NUM_BLOCKS * 64 * MAX_DIM], kp[NUM_BLOCKS * 64 * MAX_DIM];
static float out[MAX_TOKENS * MAX_HEADS * MAX_DIM];
static float po[16 * MAX_TOKENS * MAX_HEADS * MAX_DIM], pl[16 * MAX_TOKENS * MAX_HEADS];
static int32_t tiling_buf[4096];
static double want[MAX_TOKENS * MAX_HEADS * MAX_DIM];

/* Double absorbed MLA of the request with query rows [lo, hi) into want. */
static void reference(const aicpu_tiling_params *p, int32_t lora, int32_t rope, float scale,
                      int causal, const int32_t *bt, int32_t lo, int32_t hi, int32_t kv_len) {
    int32_t i, h, j, x, bs = p->block_size, heads = p->num_q_heads;
    for (i = lo; i < hi; i++) {
        int32_t seen = causal ? kv_len - (hi - lo) + (i - lo) + 1 : kv_len;
        for (h = 0; h < heads; h++) {
            double s[MBPR * 64], mx = -INFINITY, sum = 0.0;
            const float *q1 = qn_f + ((size_t)i * heads + h) * lora;
            const float *q2 = qp_f + ((size_t)i * heads + h) * rope;
            double *o = want + ((size_t)i * heads + h) * lora;
            for (j = 0; j < seen; j++) {
                size_t tok = (size_t)bt[j / bs] * bs + (size_t)(j % bs);
                double d = 0.0;
                for (x = 0; x < lora; x++) d += (double)q1[x] * kc_f[tok * lora + x];
                for (x = 0; x < rope; x++) d += (double)q2[x] * kp_f[tok * rope + x];
                s[j] = d * scale;
                if (s[j] > mx) mx = s[j];
            }
            for (x = 0; x < lora; x++) o[x] = 0.0;
            for (j = 0; j < seen; j++) {
                size_t tok = (size_t)bt[j / bs] * bs + (size_t)(j % bs);
                double w = exp(s[j] - mx);
                sum += w;
                for (x = 0; x < lora; x++) o[x] += w * kc_f[tok * lora + x];
            }
            for (x = 0; x < lora && sum > 0.0; x++) o[x] /= sum;
        }
    }
}

int main(int argc, char **argv) {
    static const int32_t heads_pick[] = {1, 4, 16}, lora_pick[] = {32, 64, 13};
    static const int32_t rope_pick[] = {16, 8, 0}, bs_pick[] = {16, 8, 64};
    static const int32_t dtypes[] = {AICPU_ATTENTION_FP32, AICPU_ATTENTION_FP16,
                                     AICPU_ATTENTION_BF16};
    int32_t problems = argc > 1 ? atoi(argv[1]) : 300, n, splits = 0, bad_ids = 0;
    for (n = 0; n < problems; n++) {
        aicpu_tiling_params p;
        int32_t cu[MAX_BATCH + 1], kv[MAX_BATCH], bt[MAX_BATCH * MBPR];
        int32_t lora = lora_pick[pick(3)], rope = rope_pick[pick(3)];
        int32_t batch = 1 + pick(MAX_BATCH);
        int32_t dtype = dtypes[pick(3)], r, c, i, bad_r = -1, tokens;
        int causal = pick(4) != 0, got_bad = 0;
        float scale = 1.0f / sqrtf((float)(lora + rope));
        double tol = dtype == AICPU_ATTENTION_FP32 ? 1e-4 : 1e-2;
        memset(&p, 0, sizeof p);
        p.num_q_heads = heads_pick[pick(3)];
        p.num_kv_heads = 1;
        p.head_dim = lora + rope;
        p.block_size = bs_pick[pick(3)];
        p.max_batch = MAX_BATCH;
        p.max_tokens = MAX_TOKENS;
        p.max_blocks_per_req = MBPR;
        p.num_cores = 1 + pick(9);
        p.q_tile = 1 + pick(4);
        p.cost_kv_load = 2;
        p.cost_qk_tile = 1;
        p.cost_segment = pick(2) ? 60 : 4;
        cu[0] = 0;
        for (r = 0; r < batch; r++) {
            int32_t q_len = pick(5), cap = MBPR * p.block_size;
            if (cu[r] + q_len > MAX_TOKENS) q_len = 0;
            cu[r + 1] = cu[r] + q_len;
            kv[r] = q_len == 0 ? pick(3) : q_len + pick(cap - q_len + 1);
            for (i = 0; i < MBPR; i++) bt[r * MBPR + i] = r * MBPR + (i * 7 + r) % MBPR;
        }
        tokens = cu[batch];
        for (i = 0; i < MAX_TOKENS * p.num_q_heads * lora; i++)
            qn_f[i] = put(qn, (size_t)i, dtype, uniform());
        for (i = 0; i < MAX_TOKENS * p.num_q_heads * rope; i++)
            qp_f[i] = put(qp, (size_t)i, dtype, uniform());
        for (i = 0; i < NUM_BLOCKS * p.block_size * lora; i++)
            kc_f[i] = put(kc, (size_t)i, dtype, uniform());
        for (i = 0; i < NUM_BLOCKS * p.block_size * rope; i++)
            kp_f[i] = put(kp, (size_t)i, dtype, uniform());
        if (n % 4 == 3) { /* one used block id out of range */
            for (r = 0; r < batch && bad_r < 0; r++)
                if (cu[r + 1] > cu[r] && kv[r] > 0) bad_r = r;
            if (bad_r >= 0) bt[bad_r * MBPR] = NUM_BLOCKS + 3; /* block 0: every unit reads it */
        }
        if (aicpu_tiling_plan(&p, cu, kv, batch, 0, causal ? AICPU_TILING_CAUSAL : 0, tiling_buf,
                              sizeof tiling_buf) != AICPU_TILING_OK) {
            printf("problem %d: plan failed\n", n);
            return 1;
        }
        splits += tiling_buf[AICPU_TILING_HDR_NUM_COMBINE] > 0;
        for (i = 0; i < MAX_TOKENS * p.num_q_heads * lora; i++) put(out, (size_t)i, dtype, 7.0f);
        for (c = 0; c < p.num_cores; c++) {
            int s = aicpu_mla_core(&p, lora, tiling_buf, c, causal ? AICPU_TILING_CAUSAL : 0,
                                   dtype, scale, qn, rope ? qp : NULL, kc, rope ? kp : NULL,
                                   NUM_BLOCKS, bt, cu, kv, out, po, pl);
            if (s == AICPU_ATTENTION_E_BLOCK_ID) got_bad = 1;
            else if (s != AICPU_TILING_OK) {
                printf("problem %d core %d: %s\n", n, c, aicpu_attention_strerror(s));
                return 1;
            }
        }
        if (got_bad != (bad_r >= 0)) {
            printf("problem %d: bad block id reported %d, planted %d\n", n, got_bad, bad_r >= 0);
            return 1;
        }
        bad_ids += got_bad;
        if (aicpu_mla_finalize(&p, lora, tiling_buf, dtype, cu, out, po, pl) != AICPU_TILING_OK) {
            printf("problem %d: finalize failed\n", n);
            return 1;
        }
        memset(want, 0, sizeof want);
        for (r = 0; r < batch; r++)
            if (cu[r + 1] > cu[r] && r != bad_r)
                reference(&p, lora, rope, scale, causal, bt + r * MBPR, cu[r], cu[r + 1], kv[r]);
        for (r = 0; r < batch; r++) {
            int32_t row_lo = cu[r] * p.num_q_heads * lora;
            int32_t row_hi = cu[r + 1] * p.num_q_heads * lora;
            double big = 1e-30;
            for (i = row_lo; i < row_hi; i++) big = fabs(want[i]) > big ? fabs(want[i]) : big;
            for (i = row_lo; i < row_hi; i++) {
                double g = get(out, (size_t)i, dtype);
                if (r == bad_r ? g != 0.0 : !(fabs(g - want[i]) <= tol * big)) {
                    printf("problem %d (heads %d, L %d, R %d, bs %d, P %d, q_tile %d, dtype %d, "
                           "causal %d): request %d element %d got %g want %g\n", n,
                           p.num_q_heads, lora, rope, p.block_size, p.num_cores, p.q_tile, dtype,
                           causal, r, i, g, r == bad_r ? 0.0 : want[i]);
                    return 1;
                }
            }
        }
        for (i = tokens * p.num_q_heads * lora; i < MAX_TOKENS * p.num_q_heads * lora; i++)
            if (get(out, (size_t)i, dtype) != 0.0f) {
                printf("problem %d: padding element %d not zero\n", n, i);
                return 1;
            }
    }
    printf("%d problems, %d with split units, %d bad block ids; 0 failures\n", problems, splits,
           bad_ids);
    return 0;
}
