/*
 * attention_x86.c -- the x86-64 SIMD variants of the reference attention's inner kernels (see
 * attention_kernels.h for what each computes and attention_ref.h, INSTRUCTION-SET VARIANTS).
 *
 * Each function carries its own target attribute, so this file builds with the baseline x86-64
 * flags and the caller picks a table only when the CPU reports the features (GCC/Clang
 * __builtin_cpu_supports, which also checks that the OS saves the wider registers). Compiled
 * anywhere else (aarch64, another compiler) it provides no table and the portable C runs.
 *
 * Shapes the kernels are tuned for: decode with grouped-query attention, 1-8 query rows per kv
 * head, head_dim 64-256, chunks of up to 64 kv tokens. Scores: blocks of four query rows
 * against two K rows per pass (each query vector loaded once for two FMAs, each K vector for
 * four), the eight dot products reduced together by one transpose-and-add tree; AVX-512 bf16
 * (head_dim % 32 == 0) takes four K rows per pass, sixteen dot products per tree. Weighted V
 * sum: four rows x 64 dims (AVX-512) or x 16 dims (AVX2) of the output stay in registers across
 * the chunk's tokens, so each V vector loaded feeds four FMAs and 16 or 8 independent FMA
 * chains hide the FMA latency. The exp is the portable one's Cody-Waite reduction and degree-7
 * Taylor polynomial, evaluated with FMA. Measured with tools/bench_attention.py --isa all and
 * aicpu_kernels/tests/attention_bench.c (figures in docs/reference-attention.md). None of these
 * kernels applies the logits soft cap: with the cap on, attention_ref.c runs its portable cap
 * pass on the scores these kernels write (attention_kernels.h).
 */
#include "attention_kernels.h"
#include "attention_ref.h"
#include "attention_storage.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <immintrin.h>

#define AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* Constants of exp_nonpositive (attention_ref.c): ln 2 split in a short high part (exact
 * products with k) and a low part, the cut-off below which e^x is flushed to 0, and the Taylor
 * coefficients 1/7! ... 1/1!. */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693145751953125f
#define EXP_LN2_LO 1.42860682030941723e-6f
#define EXP_CUTOFF -87.0f

/* Software prefetch (SSE, in every x86-64): unlike the portable variant's touching loads these
 * do not hold up retirement while their lines arrive, so the chunk's work overlaps them. */
static void x86_prefetch_rows(const void *p, int32_t n, size_t row_bytes, ptrdiff_t stride) {
    const char *base = (const char *)p;
    int32_t j;
    size_t x;
    for (j = 0; j < n; j++) {
        const char *row = base + j * stride;
        for (x = 0; x < row_bytes; x += 64) _mm_prefetch(row + x, _MM_HINT_T0);
        _mm_prefetch(row + row_bytes - 1, _MM_HINT_T0);
    }
}

/* Element `at` of a K or V row in storage dtype, as fp32 (the scalar tails). */
static float load1(const void *p, ptrdiff_t at, int32_t dtype) {
    uint16_t u;
    if (dtype == AICPU_ATTENTION_FP32) return ((const float *)p)[at];
    u = ((const uint16_t *)p)[at];
    return dtype == AICPU_ATTENTION_BF16 ? storage_bf16_to_float(u)
                                         : storage_half_to_float(u);
}

/*
 * The kernels read K and V straight from the caches in their storage dtype and widen each
 * vector in registers (bf16: shift into the high half; fp16: F16C), so no fp32 copy of a chunk
 * is written and read back. Each kernel body is inlined once per dtype (constant `dtype`), so
 * the inner loops carry no dtype branch.
 */
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#define AVX512_INLINE                                                                        \
    static inline __attribute__((always_inline,                                              \
                                 target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* ------------------------------------------------------------------------------------------ */
/* AVX2 + FMA + F16C                                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Elements [at, at + 8) as fp32. */
AVX2_INLINE __m256 avx2_load8(const void *p, ptrdiff_t at, int32_t dtype) {
    __m128i h;
    if (dtype == AICPU_ATTENTION_FP32) return _mm256_loadu_ps((const float *)p + at);
    h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + at));
    if (dtype == AICPU_ATTENTION_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* [sum a0, sum a1, sum a2, sum a3] */
AVX2_INLINE __m128 avx2_sum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m128 b0 = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    __m128 b1 = _mm_add_ps(_mm256_castps256_ps128(a1), _mm256_extractf128_ps(a1, 1));
    __m128 b2 = _mm_add_ps(_mm256_castps256_ps128(a2), _mm256_extractf128_ps(a2, 1));
    __m128 b3 = _mm_add_ps(_mm256_castps256_ps128(a3), _mm256_extractf128_ps(a3, 1));
    return _mm_hadd_ps(_mm_hadd_ps(b0, b1), _mm_hadd_ps(b2, b3));
}

/* [sum a0, ..., sum a7]: one hadd tree for eight vectors. */
AVX2_INLINE __m256 avx2_sum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                             __m256 a6, __m256 a7) {
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    /* t0 = [a0 a1 a2 a3 | a0 a1 a2 a3] halves of the sums, t1 likewise for a4..a7 */
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20),
                         _mm256_permute2f128_ps(t0, t1, 0x31));
}

/* Scores of up to four rows (q0..q3; missing rows repeat one and are not stored). */
AVX2_INLINE void avx2_scores_body(float *s, ptrdiff_t sn, const float *q, int32_t nr,
                                  const int32_t *nv, const void *k, int32_t dtype, ptrdiff_t ks,
                                  int32_t d) {
    const int32_t dv = d - d % 8;
    int32_t r, j, x, i;
    for (r = 0; r < nr; r += 4) {
        const int32_t rows = nr - r < 4 ? nr - r : 4;
        const float *q0 = q + (ptrdiff_t)r * d;
        const float *q1 = q0 + (ptrdiff_t)(rows > 1) * d;
        const float *q2 = q0 + (ptrdiff_t)(rows > 2 ? 2 : rows - 1) * d;
        const float *q3 = q0 + (ptrdiff_t)(rows - 1) * d;
        int32_t jm = 0;
        for (i = 0; i < rows; i++)
            if (nv[r + i] > jm) jm = nv[r + i];
        for (j = 0; j + 2 <= jm; j += 2) { /* two K rows per pass share the query loads */
            const ptrdiff_t kj = j * ks, kk = kj + ks;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            float t[8];
            for (x = 0; x < dv; x += 8) {
                const __m256 kv = avx2_load8(k, kj + x, dtype), kw = avx2_load8(k, kk + x, dtype);
                const __m256 c0 = _mm256_loadu_ps(q0 + x), c1 = _mm256_loadu_ps(q1 + x);
                const __m256 c2 = _mm256_loadu_ps(q2 + x), c3 = _mm256_loadu_ps(q3 + x);
                a0 = _mm256_fmadd_ps(c0, kv, a0);
                a1 = _mm256_fmadd_ps(c1, kv, a1);
                a2 = _mm256_fmadd_ps(c2, kv, a2);
                a3 = _mm256_fmadd_ps(c3, kv, a3);
                b0 = _mm256_fmadd_ps(c0, kw, b0);
                b1 = _mm256_fmadd_ps(c1, kw, b1);
                b2 = _mm256_fmadd_ps(c2, kw, b2);
                b3 = _mm256_fmadd_ps(c3, kw, b3);
            }
            _mm256_storeu_ps(t, avx2_sum8(a0, a1, a2, a3, b0, b1, b2, b3));
            for (x = dv; x < d; x++) {
                float kx = load1(k, kj + x, dtype), kz = load1(k, kk + x, dtype);
                t[0] += q0[x] * kx;
                t[1] += q1[x] * kx;
                t[2] += q2[x] * kx;
                t[3] += q3[x] * kx;
                t[4] += q0[x] * kz;
                t[5] += q1[x] * kz;
                t[6] += q2[x] * kz;
                t[7] += q3[x] * kz;
            }
            for (i = 0; i < rows; i++) {
                if (j < nv[r + i]) s[(r + i) * sn + j] = t[i];
                if (j + 1 < nv[r + i]) s[(r + i) * sn + j + 1] = t[4 + i];
            }
        }
        for (; j < jm; j++) {
            const ptrdiff_t kj = j * ks;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            float t[4];
            for (x = 0; x < dv; x += 8) {
                __m256 kv = avx2_load8(k, kj + x, dtype);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + x), kv, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + x), kv, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + x), kv, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + x), kv, a3);
            }
            _mm_storeu_ps(t, avx2_sum4(a0, a1, a2, a3));
            for (x = dv; x < d; x++) {
                float kx = load1(k, kj + x, dtype);
                t[0] += q0[x] * kx;
                t[1] += q1[x] * kx;
                t[2] += q2[x] * kx;
                t[3] += q3[x] * kx;
            }
            for (i = 0; i < rows; i++)
                if (j < nv[r + i]) s[(r + i) * sn + j] = t[i];
        }
    }
}

AVX2_TARGET static void avx2_scores(float *s, ptrdiff_t sn, const float *q, int32_t nr,
                                    const int32_t *nv, const void *k, int32_t dtype, ptrdiff_t ks,
                                    int32_t d, float *scratch) {
    (void)scratch;
    if (dtype == AICPU_ATTENTION_BF16)
        avx2_scores_body(s, sn, q, nr, nv, k, AICPU_ATTENTION_BF16, ks, d);
    else if (dtype == AICPU_ATTENTION_FP16)
        avx2_scores_body(s, sn, q, nr, nv, k, AICPU_ATTENTION_FP16, ks, d);
    else
        avx2_scores_body(s, sn, q, nr, nv, k, AICPU_ATTENTION_FP32, ks, d);
}

/* e^x for x <= 0 (see exp_nonpositive in attention_ref.c); NaN stays NaN. */
AVX2_INLINE __m256 avx2_exp(__m256 x) {
    const __m256 cutoff = _mm256_set1_ps(EXP_CUTOFF);
    __m256 under = _mm256_cmp_ps(x, cutoff, _CMP_LT_OQ);
    __m256 xc = _mm256_max_ps(cutoff, x); /* max returns its second operand for NaN */
    __m256 kf = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(EXP_LOG2E)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(EXP_LN2_HI), xc);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(kf), _mm256_set1_epi32(127)),
                                  23);
    r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(EXP_LN2_LO), r);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

AVX2_TARGET static float avx2_row_max(const float *s, int32_t n) {
    __m256 mx = _mm256_set1_ps(s[0]);
    __m128 h;
    float best;
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    best = _mm_cvtss_f32(h);
    for (; j < n; j++) best = s[j] > best ? s[j] : best;
    return best;
}

AVX2_TARGET static float avx2_exp_sum(float *s, int32_t n, float mx) {
    const __m256 m = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    float t[4];
    int32_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = avx2_exp(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (j < n) { /* the tail through a lane mask: lanes >= n are neither read nor written */
        __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lanes);
        __m256 e = avx2_exp(_mm256_sub_ps(_mm256_maskload_ps(s + j, mask), m));
        _mm256_maskstore_ps(s + j, mask, e);
        sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(mask)));
    }
    _mm_storeu_ps(t, avx2_sum4(sum, _mm256_setzero_ps(), _mm256_setzero_ps(),
                               _mm256_setzero_ps()));
    return t[0];
}

/* One output row, tokens [j0, j1): o += sum_j p[j] v_j. */
AVX2_INLINE void avx2_accumulate_row(float *o, int32_t j0, int32_t j1, const float *p,
                                     const void *v, int32_t dtype, ptrdiff_t vs, int32_t d) {
    int32_t x = 0, j;
    for (; x + 16 <= d; x += 16) {
        __m256 o0 = _mm256_loadu_ps(o + x), o1 = _mm256_loadu_ps(o + x + 8);
        for (j = j0; j < j1; j++) {
            __m256 pj = _mm256_broadcast_ss(p + j);
            o0 = _mm256_fmadd_ps(pj, avx2_load8(v, j * vs + x, dtype), o0);
            o1 = _mm256_fmadd_ps(pj, avx2_load8(v, j * vs + x + 8, dtype), o1);
        }
        _mm256_storeu_ps(o + x, o0);
        _mm256_storeu_ps(o + x + 8, o1);
    }
    for (; x + 8 <= d; x += 8) {
        __m256 o0 = _mm256_loadu_ps(o + x);
        for (j = j0; j < j1; j++)
            o0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + j), avx2_load8(v, j * vs + x, dtype), o0);
        _mm256_storeu_ps(o + x, o0);
    }
    for (; x < d; x++) {
        float acc = o[x];
        for (j = j0; j < j1; j++) acc += p[j] * load1(v, j * vs + x, dtype);
        o[x] = acc;
    }
}

AVX2_INLINE void avx2_accumulate_body(float *o, int32_t nr, const int32_t *nv, const float *p,
                                      ptrdiff_t ps, const void *v, int32_t dtype, ptrdiff_t vs,
                                      int32_t d) {
    const int32_t dv = d - d % 8;
    int32_t r, j, x, i;
    for (r = 0; r + 4 <= nr; r += 4) {
        float *o0 = o + (ptrdiff_t)r * d, *o1 = o0 + d, *o2 = o1 + d, *o3 = o2 + d;
        const float *p0 = p + r * ps, *p1 = p0 + ps, *p2 = p1 + ps, *p3 = p2 + ps;
        int32_t jm = nv[r];
        for (i = 1; i < 4; i++)
            if (nv[r + i] < jm) jm = nv[r + i];
        for (x = 0; x + 16 <= dv; x += 16) { /* 4 rows x 16 dims: 8 accumulators */
            __m256 a0 = _mm256_loadu_ps(o0 + x), a1 = _mm256_loadu_ps(o1 + x);
            __m256 a2 = _mm256_loadu_ps(o2 + x), a3 = _mm256_loadu_ps(o3 + x);
            __m256 b0 = _mm256_loadu_ps(o0 + x + 8), b1 = _mm256_loadu_ps(o1 + x + 8);
            __m256 b2 = _mm256_loadu_ps(o2 + x + 8), b3 = _mm256_loadu_ps(o3 + x + 8);
            for (j = 0; j < jm; j++) {
                const __m256 w = avx2_load8(v, j * vs + x, dtype);
                const __m256 z = avx2_load8(v, j * vs + x + 8, dtype);
                const __m256 c0 = _mm256_broadcast_ss(p0 + j), c1 = _mm256_broadcast_ss(p1 + j);
                const __m256 c2 = _mm256_broadcast_ss(p2 + j), c3 = _mm256_broadcast_ss(p3 + j);
                a0 = _mm256_fmadd_ps(c0, w, a0);
                a1 = _mm256_fmadd_ps(c1, w, a1);
                a2 = _mm256_fmadd_ps(c2, w, a2);
                a3 = _mm256_fmadd_ps(c3, w, a3);
                b0 = _mm256_fmadd_ps(c0, z, b0);
                b1 = _mm256_fmadd_ps(c1, z, b1);
                b2 = _mm256_fmadd_ps(c2, z, b2);
                b3 = _mm256_fmadd_ps(c3, z, b3);
            }
            _mm256_storeu_ps(o0 + x, a0);
            _mm256_storeu_ps(o1 + x, a1);
            _mm256_storeu_ps(o2 + x, a2);
            _mm256_storeu_ps(o3 + x, a3);
            _mm256_storeu_ps(o0 + x + 8, b0);
            _mm256_storeu_ps(o1 + x + 8, b1);
            _mm256_storeu_ps(o2 + x + 8, b2);
            _mm256_storeu_ps(o3 + x + 8, b3);
        }
        for (; x < dv; x += 8) {
            __m256 a0 = _mm256_loadu_ps(o0 + x), a1 = _mm256_loadu_ps(o1 + x);
            __m256 a2 = _mm256_loadu_ps(o2 + x), a3 = _mm256_loadu_ps(o3 + x);
            for (j = 0; j < jm; j++) {
                __m256 w = avx2_load8(v, j * vs + x, dtype);
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), w, a0);
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), w, a1);
                a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(p2 + j), w, a2);
                a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(p3 + j), w, a3);
            }
            _mm256_storeu_ps(o0 + x, a0);
            _mm256_storeu_ps(o1 + x, a1);
            _mm256_storeu_ps(o2 + x, a2);
            _mm256_storeu_ps(o3 + x, a3);
        }
        for (i = 0; i < 4; i++) {
            float *orow = o + (ptrdiff_t)(r + i) * d;
            const float *prow = p + (r + i) * ps;
            for (x = dv; x < d; x++) { /* the head_dim tail, all tokens in order */
                float acc = orow[x];
                for (j = 0; j < jm; j++) acc += prow[j] * load1(v, j * vs + x, dtype);
                orow[x] = acc;
            }
            if (nv[r + i] > jm) /* causal rows that see more tokens than the block's shortest */
                avx2_accumulate_row(orow, jm, nv[r + i], prow, v, dtype, vs, d);
        }
    }
    for (; r < nr; r++) avx2_accumulate_row(o + (ptrdiff_t)r * d, 0, nv[r], p + r * ps, v, dtype,
                                            vs, d);
}

AVX2_TARGET static void avx2_accumulate(float *o, int32_t nr, const int32_t *nv, const float *p,
                                        ptrdiff_t ps, const void *v, int32_t dtype, ptrdiff_t vs,
                                        int32_t d, float *scratch) {
    (void)scratch;
    if (dtype == AICPU_ATTENTION_BF16)
        avx2_accumulate_body(o, nr, nv, p, ps, v, AICPU_ATTENTION_BF16, vs, d);
    else if (dtype == AICPU_ATTENTION_FP16)
        avx2_accumulate_body(o, nr, nv, p, ps, v, AICPU_ATTENTION_FP16, vs, d);
    else
        avx2_accumulate_body(o, nr, nv, p, ps, v, AICPU_ATTENTION_FP32, vs, d);
}

static const attention_kernels avx2_kernels = {avx2_scores, avx2_row_max, avx2_exp_sum,
                                               avx2_accumulate, x86_prefetch_rows};

/* ------------------------------------------------------------------------------------------ */
/* AVX-512 F/BW/VL (+ FMA, F16C)                                                               */
/* ------------------------------------------------------------------------------------------ */

/* Lanes [0, n) of a 16-lane vector: none for n <= 0, all for n >= 16. Masked-off lanes are
 * neither read nor written (no fault past the end of a row). */
AVX512_INLINE __mmask16 avx512_head(int32_t n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* Elements [at, at + 16) as fp32, lanes outside m zero (and not read). */
AVX512_INLINE __m512 avx512_load16(const void *p, ptrdiff_t at, int32_t dtype, __mmask16 m) {
    __m256i h;
    if (dtype == AICPU_ATTENTION_FP32) return _mm512_maskz_loadu_ps(m, (const float *)p + at);
    h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + at);
    if (dtype == AICPU_ATTENTION_BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* The upper eight lanes (AVX-512F only: _mm512_extractf32x8_ps would need AVX-512DQ). */
AVX512_INLINE __m256 avx512_upper(__m512 a) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
}

/* [sum a0, sum a1, sum a2, sum a3] */
AVX512_INLINE __m128 avx512_sum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    __m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), avx512_upper(a0));
    __m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), avx512_upper(a1));
    __m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), avx512_upper(a2));
    __m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), avx512_upper(a3));
    __m128 c0 = _mm_add_ps(_mm256_castps256_ps128(b0), _mm256_extractf128_ps(b0, 1));
    __m128 c1 = _mm_add_ps(_mm256_castps256_ps128(b1), _mm256_extractf128_ps(b1, 1));
    __m128 c2 = _mm_add_ps(_mm256_castps256_ps128(b2), _mm256_extractf128_ps(b2, 1));
    __m128 c3 = _mm_add_ps(_mm256_castps256_ps128(b3), _mm256_extractf128_ps(b3, 1));
    return _mm_hadd_ps(_mm_hadd_ps(c0, c1), _mm_hadd_ps(c2, c3));
}

/*
 * Sums of eight vectors in one transpose-and-add tree (about three operations per sum instead
 * of seven for one vector at a time). Returns lanes of 128 bits: [a0 a1 . .][a4 a5 . .]
 * [a2 a3 . .][a6 a7 . .] (the sum of a_i where a_i is named).
 */
AVX512_INLINE __m512 avx512_sum8(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4,
                                 __m512 a5, __m512 a6, __m512 a7) {
    /* halve each vector, pairing a_i with a_{i+4}: 128-bit lanes [a_i a_i a_i+4 a_i+4] */
    __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a4, 0x44),
                               _mm512_shuffle_f32x4(a0, a4, 0xee));
    __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(a1, a5, 0x44),
                               _mm512_shuffle_f32x4(a1, a5, 0xee));
    __m512 u2 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a6, 0x44),
                               _mm512_shuffle_f32x4(a2, a6, 0xee));
    __m512 u3 = _mm512_add_ps(_mm512_shuffle_f32x4(a3, a7, 0x44),
                               _mm512_shuffle_f32x4(a3, a7, 0xee));
    /* again: lanes [a0 a4 a2 a6] and [a1 a5 a3 a7], four partial sums each */
    __m512 v0 = _mm512_add_ps(_mm512_shuffle_f32x4(u0, u2, 0x88),
                               _mm512_shuffle_f32x4(u0, u2, 0xdd));
    __m512 v1 = _mm512_add_ps(_mm512_shuffle_f32x4(u1, u3, 0x88),
                               _mm512_shuffle_f32x4(u1, u3, 0xdd));
    /* within each lane: [v0 v1 v0 v1] two partials each, then one */
    __m512 w = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
    return _mm512_add_ps(w, _mm512_shuffle_ps(w, w, 0x4e));
}

AVX512_INLINE void avx512_scores_body(float *s, ptrdiff_t sn, const float *q, int32_t nr,
                                      const int32_t *nv, const void *k, int32_t dtype,
                                      ptrdiff_t ks, int32_t d) {
    const int32_t dv = d - d % 16;
    const __mmask16 all = avx512_head(16), tail = avx512_head(d - dv);
    int32_t r, j, x, i;
    for (r = 0; r < nr; r += 4) {
        /* a block of up to four rows; missing rows repeat the last one and are not stored */
        const int32_t rows = nr - r < 4 ? nr - r : 4;
        const float *q0 = q + (ptrdiff_t)r * d;
        const float *q1 = q0 + (ptrdiff_t)(rows > 1) * d;
        const float *q2 = q0 + (ptrdiff_t)(rows > 2 ? 2 : rows - 1) * d;
        const float *q3 = q0 + (ptrdiff_t)(rows - 1) * d;
        int32_t jm = 0;
        for (i = 0; i < rows; i++)
            if (nv[r + i] > jm) jm = nv[r + i];
        for (j = 0; j + 2 <= jm; j += 2) { /* two K rows per pass share the query loads */
            const ptrdiff_t kj = j * ks, kk = kj + ks;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            float t[16];
            for (x = 0; x < dv; x += 16) {
                const __m512 kv = avx512_load16(k, kj + x, dtype, all);
                const __m512 kw = avx512_load16(k, kk + x, dtype, all);
                const __m512 c0 = _mm512_loadu_ps(q0 + x), c1 = _mm512_loadu_ps(q1 + x);
                const __m512 c2 = _mm512_loadu_ps(q2 + x), c3 = _mm512_loadu_ps(q3 + x);
                a0 = _mm512_fmadd_ps(c0, kv, a0);
                a1 = _mm512_fmadd_ps(c1, kv, a1);
                a2 = _mm512_fmadd_ps(c2, kv, a2);
                a3 = _mm512_fmadd_ps(c3, kv, a3);
                b0 = _mm512_fmadd_ps(c0, kw, b0);
                b1 = _mm512_fmadd_ps(c1, kw, b1);
                b2 = _mm512_fmadd_ps(c2, kw, b2);
                b3 = _mm512_fmadd_ps(c3, kw, b3);
            }
            if (dv < d) {
                const __m512 kv = avx512_load16(k, kj + dv, dtype, tail);
                const __m512 kw = avx512_load16(k, kk + dv, dtype, tail);
                const __m512 c0 = _mm512_maskz_loadu_ps(tail, q0 + dv);
                const __m512 c1 = _mm512_maskz_loadu_ps(tail, q1 + dv);
                const __m512 c2 = _mm512_maskz_loadu_ps(tail, q2 + dv);
                const __m512 c3 = _mm512_maskz_loadu_ps(tail, q3 + dv);
                a0 = _mm512_fmadd_ps(c0, kv, a0);
                a1 = _mm512_fmadd_ps(c1, kv, a1);
                a2 = _mm512_fmadd_ps(c2, kv, a2);
                a3 = _mm512_fmadd_ps(c3, kv, a3);
                b0 = _mm512_fmadd_ps(c0, kw, b0);
                b1 = _mm512_fmadd_ps(c1, kw, b1);
                b2 = _mm512_fmadd_ps(c2, kw, b2);
                b3 = _mm512_fmadd_ps(c3, kw, b3);
            }
            _mm512_storeu_ps(t, avx512_sum8(a0, a1, a2, a3, b0, b1, b2, b3));
            { /* row i of token j sits at at_j[i], of token j + 1 at at_j[i] + 4 */
                static const int at_j[4] = {0, 1, 8, 9};
                for (i = 0; i < rows; i++) {
                    if (j < nv[r + i]) s[(r + i) * sn + j] = t[at_j[i]];
                    if (j + 1 < nv[r + i]) s[(r + i) * sn + j + 1] = t[at_j[i] + 4];
                }
            }
        }
        for (; j < jm; j++) {
            const ptrdiff_t kj = j * ks;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            float t[4];
            for (x = 0; x < dv; x += 16) {
                const __m512 kv = avx512_load16(k, kj + x, dtype, all);
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q0 + x), kv, a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q1 + x), kv, a1);
                a2 = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + x), kv, a2);
                a3 = _mm512_fmadd_ps(_mm512_loadu_ps(q3 + x), kv, a3);
            }
            if (dv < d) { /* the head_dim tail, masked */
                const __m512 kv = avx512_load16(k, kj + dv, dtype, tail);
                a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q0 + dv), kv, a0);
                a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q1 + dv), kv, a1);
                a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q2 + dv), kv, a2);
                a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, q3 + dv), kv, a3);
            }
            _mm_storeu_ps(t, avx512_sum4(a0, a1, a2, a3));
            for (i = 0; i < rows; i++)
                if (j < nv[r + i]) s[(r + i) * sn + j] = t[i];
        }
    }
}

/*
 * 32 bf16 values from one 64-byte load as two fp32 vectors in natural order: a bf16 is the upper
 * half of an fp32, so one word permute that zeroes the lower halves (vpermw with a zero mask)
 * widens 16 of them, where zero-extension then a shift (vpmovzxwd, vpslld) takes two
 * instructions and a second load.
 */
AVX512_INLINE void avx512_bf16x32(const uint16_t *p, __m512 *lo, __m512 *hi) {
    const __m512i w = _mm512_loadu_si512((const void *)p);
    const __m512i ix_lo = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                           7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
    const __m512i ix_hi = _mm512_add_epi16(ix_lo, _mm512_set1_epi16(16));
    const __mmask32 upper = 0xaaaaaaaau; /* the odd words: the upper half of each 32-bit lane */
    *lo = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(upper, ix_lo, w));
    *hi = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(upper, ix_hi, w));
}

/*
 * Sixteen dot-product accumulators a[t][i] (token t, row i) to their sums, 128-bit lane i
 * holding [row i . token 0, ..., row i . token 3]: one transpose-and-add tree of 45 operations
 * (under three per score, where avx512_sum8 takes about three and a scalar store each).
 */
AVX512_INLINE __m512 avx512_sum16(__m512 a[4][4]) {
    __m512 z[4], w0, w1;
    int32_t i;
    for (i = 0; i < 4; i++) {
        /* per 128-bit lane: [t0 t1 t2 t3], partial sums of row i */
        const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a[0][i], a[1][i]),
                                       _mm512_unpackhi_ps(a[0][i], a[1][i]));
        const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(a[2][i], a[3][i]),
                                       _mm512_unpackhi_ps(a[2][i], a[3][i]));
        z[i] = _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xee));
    }
    /* the four 128-bit lanes of z[i] summed into lane i */
    w0 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x44),
                       _mm512_shuffle_f32x4(z[0], z[1], 0xee));
    w1 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], 0x44),
                       _mm512_shuffle_f32x4(z[2], z[3], 0xee));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

/* The first `count` (at most four) of a row's four scores u, at `at`. */
AVX512_INLINE void avx512_store4(float *at, int32_t count, __m128 u) {
    if (count >= 4)
        _mm_storeu_ps(at, u);
    else if (count > 0)
        _mm_mask_storeu_ps(at, (__mmask8)((1u << count) - 1u), u);
}

/*
 * bf16 scores for head_dim % 32 == 0: blocks of four query rows against four K rows per pass.
 * Each widened K vector feeds four FMAs and each query vector four, and the sixteen dot
 * products of a pass share one reduction tree whose result is four 128-bit stores. (The
 * generic body's two K rows per pass spend about a third of its time on the reductions and
 * scalar stores; tools/bench_attention.py and docs/reference-attention.md.) Missing rows
 * repeat the block's last row and missing tokens the last token; neither is stored.
 */
AVX512_INLINE void avx512_scores_bf16(float *s, ptrdiff_t sn, const float *q, int32_t nr,
                                      const int32_t *nv, const uint16_t *k, ptrdiff_t ks,
                                      int32_t d) {
    int32_t r, j, x, i, t;
    for (r = 0; r < nr; r += 4) {
        const int32_t rows = nr - r < 4 ? nr - r : 4;
        const float *qr[4];
        int32_t jm = 0;
        for (i = 0; i < 4; i++) qr[i] = q + (ptrdiff_t)(r + (i < rows ? i : rows - 1)) * d;
        for (i = 0; i < rows; i++)
            if (nv[r + i] > jm) jm = nv[r + i];
        for (j = 0; j < jm; j += 4) {
            const uint16_t *kt[4];
            __m512 a[4][4], u;
            for (t = 0; t < 4; t++) {
                kt[t] = k + (j + t < jm ? j + t : jm - 1) * ks;
                for (i = 0; i < 4; i++) a[t][i] = _mm512_setzero_ps();
            }
            for (x = 0; x < d; x += 32) {
                __m512 qlo[4], qhi[4];
                for (i = 0; i < 4; i++) {
                    qlo[i] = _mm512_loadu_ps(qr[i] + x);
                    qhi[i] = _mm512_loadu_ps(qr[i] + x + 16);
                }
                for (t = 0; t < 4; t++) {
                    __m512 klo, khi;
                    avx512_bf16x32(kt[t] + x, &klo, &khi);
                    for (i = 0; i < 4; i++) {
                        a[t][i] = _mm512_fmadd_ps(qlo[i], klo, a[t][i]);
                        a[t][i] = _mm512_fmadd_ps(qhi[i], khi, a[t][i]);
                    }
                }
            }
            u = avx512_sum16(a);
            avx512_store4(s + r * sn + j, nv[r] - j, _mm512_castps512_ps128(u));
            if (rows > 1)
                avx512_store4(s + (r + 1) * sn + j, nv[r + 1] - j, _mm512_extractf32x4_ps(u, 1));
            if (rows > 2)
                avx512_store4(s + (r + 2) * sn + j, nv[r + 2] - j, _mm512_extractf32x4_ps(u, 2));
            if (rows > 3)
                avx512_store4(s + (r + 3) * sn + j, nv[r + 3] - j, _mm512_extractf32x4_ps(u, 3));
        }
    }
}

AVX512_TARGET static void avx512_scores(float *s, ptrdiff_t sn, const float *q, int32_t nr,
                                        const int32_t *nv, const void *k, int32_t dtype,
                                        ptrdiff_t ks, int32_t d, float *scratch) {
    (void)scratch;
    if (dtype == AICPU_ATTENTION_BF16 && d % 32 == 0)
        avx512_scores_bf16(s, sn, q, nr, nv, (const uint16_t *)k, ks, d);
    else if (dtype == AICPU_ATTENTION_BF16)
        avx512_scores_body(s, sn, q, nr, nv, k, AICPU_ATTENTION_BF16, ks, d);
    else if (dtype == AICPU_ATTENTION_FP16)
        avx512_scores_body(s, sn, q, nr, nv, k, AICPU_ATTENTION_FP16, ks, d);
    else
        avx512_scores_body(s, sn, q, nr, nv, k, AICPU_ATTENTION_FP32, ks, d);
}

/* e^x for x <= 0 (see exp_nonpositive in attention_ref.c); NaN stays NaN. */
AVX512_INLINE __m512 avx512_exp(__m512 x) {
    const __m512 cutoff = _mm512_set1_ps(EXP_CUTOFF);
    __mmask16 keep = _mm512_cmp_ps_mask(x, cutoff, _CMP_NLT_UQ); /* not below: NaN kept */
    __m512 xc = _mm512_max_ps(cutoff, x);
    __m512 kf = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(EXP_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(EXP_LN2_HI), xc);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(kf), _mm512_set1_epi32(127)),
                                  23);
    r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(EXP_LN2_LO), r);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(e));
}

AVX512_TARGET static float avx512_row_max(const float *s, int32_t n) {
    __m512 mx = _mm512_set1_ps(s[0]);
    int32_t j;
    for (j = 0; j < n; j += 16) {
        const __mmask16 lanes = avx512_head(n - j);
        mx = _mm512_mask_max_ps(mx, lanes, mx, _mm512_maskz_loadu_ps(lanes, s + j));
    }
    return _mm512_reduce_max_ps(mx);
}

AVX512_TARGET static float avx512_exp_sum(float *s, int32_t n, float mx) {
    const __m512 m = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    float t[4];
    int32_t j;
    for (j = 0; j < n; j += 16) {
        __mmask16 lanes = avx512_head(n - j);
        __m512 e = avx512_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + j), m));
        _mm512_mask_storeu_ps(s + j, lanes, e);
        sum = _mm512_mask_add_ps(sum, lanes, sum, e);
    }
    _mm_storeu_ps(t, avx512_sum4(sum, _mm512_setzero_ps(), _mm512_setzero_ps(),
                                 _mm512_setzero_ps()));
    return t[0];
}

/* One output row, tokens [j0, j1): o += sum_j p[j] v_j, two vectors of o per pass. */
AVX512_INLINE void avx512_accumulate_row(float *o, int32_t j0, int32_t j1, const float *p,
                                         const void *v, int32_t dtype, ptrdiff_t vs, int32_t d) {
    int32_t x, j;
    for (x = 0; x < d; x += 32) {
        const __mmask16 m0 = avx512_head(d - x), m1 = avx512_head(d - x - 16);
        __m512 o0 = _mm512_maskz_loadu_ps(m0, o + x), o1 = _mm512_maskz_loadu_ps(m1, o + x + 16);
        for (j = j0; j < j1; j++) {
            const __m512 pj = _mm512_set1_ps(p[j]);
            o0 = _mm512_fmadd_ps(pj, avx512_load16(v, j * vs + x, dtype, m0), o0);
            o1 = _mm512_fmadd_ps(pj, avx512_load16(v, j * vs + x + 16, dtype, m1), o1);
        }
        _mm512_mask_storeu_ps(o + x, m0, o0);
        _mm512_mask_storeu_ps(o + x + 16, m1, o1);
    }
}

AVX512_INLINE void avx512_accumulate_body(float *o, int32_t nr, const int32_t *nv,
                                          const float *p, ptrdiff_t ps, const void *v,
                                          int32_t dtype, ptrdiff_t vs, int32_t d) {
    int32_t r, j, x, i;
    for (r = 0; r + 4 <= nr; r += 4) {
        float *o0 = o + (ptrdiff_t)r * d, *o1 = o0 + d, *o2 = o1 + d, *o3 = o2 + d;
        const float *p0 = p + r * ps, *p1 = p0 + ps, *p2 = p1 + ps, *p3 = p2 + ps;
        int32_t jm = nv[r];
        for (i = 1; i < 4; i++)
            if (nv[r + i] < jm) jm = nv[r + i];
        for (x = 0; x + 64 <= d; x += 64) { /* 4 rows x 64 dims: 16 accumulators */
            const __mmask16 all = avx512_head(16);
            __m512 acc[4][4];
            int32_t u;
            for (i = 0; i < 4; i++)
                for (u = 0; u < 4; u++)
                    acc[i][u] = _mm512_loadu_ps(o0 + (ptrdiff_t)i * d + x + 16 * u);
            for (j = 0; j < jm; j++) {
                const ptrdiff_t vj = j * vs + x;
                const __m512 w0 = avx512_load16(v, vj, dtype, all);
                const __m512 w1 = avx512_load16(v, vj + 16, dtype, all);
                const __m512 w2 = avx512_load16(v, vj + 32, dtype, all);
                const __m512 w3 = avx512_load16(v, vj + 48, dtype, all);
                const float pr[4] = {p0[j], p1[j], p2[j], p3[j]};
                for (i = 0; i < 4; i++) {
                    const __m512 c = _mm512_set1_ps(pr[i]);
                    acc[i][0] = _mm512_fmadd_ps(c, w0, acc[i][0]);
                    acc[i][1] = _mm512_fmadd_ps(c, w1, acc[i][1]);
                    acc[i][2] = _mm512_fmadd_ps(c, w2, acc[i][2]);
                    acc[i][3] = _mm512_fmadd_ps(c, w3, acc[i][3]);
                }
            }
            for (i = 0; i < 4; i++)
                for (u = 0; u < 4; u++)
                    _mm512_storeu_ps(o0 + (ptrdiff_t)i * d + x + 16 * u, acc[i][u]);
        }
        for (; x < d; x += 32) {
            const __mmask16 m0 = avx512_head(d - x), m1 = avx512_head(d - x - 16);
            __m512 a0 = _mm512_maskz_loadu_ps(m0, o0 + x);
            __m512 b0 = _mm512_maskz_loadu_ps(m1, o0 + x + 16);
            __m512 a1 = _mm512_maskz_loadu_ps(m0, o1 + x);
            __m512 b1 = _mm512_maskz_loadu_ps(m1, o1 + x + 16);
            __m512 a2 = _mm512_maskz_loadu_ps(m0, o2 + x);
            __m512 b2 = _mm512_maskz_loadu_ps(m1, o2 + x + 16);
            __m512 a3 = _mm512_maskz_loadu_ps(m0, o3 + x);
            __m512 b3 = _mm512_maskz_loadu_ps(m1, o3 + x + 16);
            for (j = 0; j < jm; j++) {
                const __m512 w0 = avx512_load16(v, j * vs + x, dtype, m0);
                const __m512 w1 = avx512_load16(v, j * vs + x + 16, dtype, m1);
                const __m512 c0 = _mm512_set1_ps(p0[j]), c1 = _mm512_set1_ps(p1[j]);
                const __m512 c2 = _mm512_set1_ps(p2[j]), c3 = _mm512_set1_ps(p3[j]);
                a0 = _mm512_fmadd_ps(c0, w0, a0);
                b0 = _mm512_fmadd_ps(c0, w1, b0);
                a1 = _mm512_fmadd_ps(c1, w0, a1);
                b1 = _mm512_fmadd_ps(c1, w1, b1);
                a2 = _mm512_fmadd_ps(c2, w0, a2);
                b2 = _mm512_fmadd_ps(c2, w1, b2);
                a3 = _mm512_fmadd_ps(c3, w0, a3);
                b3 = _mm512_fmadd_ps(c3, w1, b3);
            }
            _mm512_mask_storeu_ps(o0 + x, m0, a0);
            _mm512_mask_storeu_ps(o0 + x + 16, m1, b0);
            _mm512_mask_storeu_ps(o1 + x, m0, a1);
            _mm512_mask_storeu_ps(o1 + x + 16, m1, b1);
            _mm512_mask_storeu_ps(o2 + x, m0, a2);
            _mm512_mask_storeu_ps(o2 + x + 16, m1, b2);
            _mm512_mask_storeu_ps(o3 + x, m0, a3);
            _mm512_mask_storeu_ps(o3 + x + 16, m1, b3);
        }
        for (i = 0; i < 4; i++) /* causal rows that see more tokens than the block's shortest */
            if (nv[r + i] > jm)
                avx512_accumulate_row(o + (ptrdiff_t)(r + i) * d, jm, nv[r + i],
                                      p + (r + i) * ps, v, dtype, vs, d);
    }
    for (; r < nr; r++)
        avx512_accumulate_row(o + (ptrdiff_t)r * d, 0, nv[r], p + r * ps, v, dtype, vs, d);
}

AVX512_TARGET static void avx512_accumulate(float *o, int32_t nr, const int32_t *nv,
                                            const float *p, ptrdiff_t ps, const void *v,
                                            int32_t dtype, ptrdiff_t vs, int32_t d,
                                            float *scratch) {
    (void)scratch;
    if (dtype == AICPU_ATTENTION_BF16)
        avx512_accumulate_body(o, nr, nv, p, ps, v, AICPU_ATTENTION_BF16, vs, d);
    else if (dtype == AICPU_ATTENTION_FP16)
        avx512_accumulate_body(o, nr, nv, p, ps, v, AICPU_ATTENTION_FP16, vs, d);
    else
        avx512_accumulate_body(o, nr, nv, p, ps, v, AICPU_ATTENTION_FP32, vs, d);
}

static const attention_kernels avx512_kernels = {avx512_scores, avx512_row_max, avx512_exp_sum,
                                                 avx512_accumulate, x86_prefetch_rows};

const attention_kernels *attention_x86_kernels(int32_t isa) {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c"))
        return NULL;
    if (isa == AICPU_ATTENTION_ISA_AVX2) return &avx2_kernels;
    if (isa == AICPU_ATTENTION_ISA_AVX512 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        return &avx512_kernels;
    return NULL;
}

#else /* not x86-64 with GCC or Clang: only the portable variant */

const attention_kernels *attention_x86_kernels(int32_t isa) {
    (void)isa;
    return NULL;
}

#endif
