/*
 * attention_kernels.h -- internal: the inner kernels of the reference attention, one table per
 * instruction-set variant (see aicpu_attention_set_isa in attention_ref.h).
 *
 * attention_ref.c owns the portable table and the choice of the active one; attention_x86.c
 * provides the AVX2+FMA+F16C and AVX-512 tables, compiled with per-function target attributes
 * so that one build runs on any x86-64 and uses what the CPU has. Not part of the ABI.
 *
 * Query rows, scores, probabilities and outputs are fp32; K and V are read in their storage
 * dtype, straight from the caches. Rows of one call belong to one kv head. Results may differ
 * between variants in the last bits (FMA contraction, summation order) but each variant is
 * deterministic.
 *
 * The logits soft cap (attention_ref.h, WHAT A ROW COMPUTES) is not in the table: whichever
 * variant runs, attention_ref.c caps the scores its `scores` kernel wrote in one portable pass
 * (libm tanhf) before `row_max`, so the SIMD variants take the portable path for the cap alone
 * and their kernels are the same with the cap on or off.
 */
#ifndef AICPU_ATTENTION_KERNELS_H
#define AICPU_ATTENTION_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct attention_kernels {
    /* s[r * sn + j] = q_r . k_j for r < nr and j < nv[r]; q_r = q + r * d (fp32), k_j the row
     * at element j * ks of k in storage dtype (AICPU_ATTENTION_FP32/FP16/BF16). Entries of s
     * with nv[r] <= j < max(nv) may be written too. scratch: max(nv) * d floats the kernel may
     * use (the portable one widens 16-bit K there). */
    void (*scores)(float *s, ptrdiff_t sn, const float *q, int32_t nr, const int32_t *nv,
                   const void *k, int32_t dtype, ptrdiff_t ks, int32_t d, float *scratch);
    /* max_{j < n} s[j], n >= 1 (NaN entries may be skipped). */
    float (*row_max)(const float *s, int32_t n);
    /* s[j] = e^(s[j] - mx) for j < n (every s[j] <= mx); returns their sum. */
    float (*exp_sum)(float *s, int32_t n, float mx);
    /* o_r += sum_{j < nv[r]} p_r[j] v_j for r < nr; o_r = o + r * d, p_r = p + r * ps, v_j the
     * row at element j * vs of v in storage dtype; scratch as for scores. */
    void (*accumulate)(float *o, int32_t nr, const int32_t *nv, const float *p, ptrdiff_t ps,
                       const void *v, int32_t dtype, ptrdiff_t vs, int32_t d, float *scratch);
    /* Start bringing n rows of row_bytes bytes, `stride` bytes apart, into the cache while the
     * current chunk is computed (a hint: no effect on results). */
    void (*prefetch_rows)(const void *p, int32_t n, size_t row_bytes, ptrdiff_t stride);
} attention_kernels;

/* The x86 tables (attention_x86.c); NULL when the build or the CPU lacks the variant. isa is
 * AICPU_ATTENTION_ISA_AVX2 or _AVX512. */
const attention_kernels *attention_x86_kernels(int32_t isa);

#endif /* AICPU_ATTENTION_KERNELS_H */
