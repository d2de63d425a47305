/*
 * attention_storage.h -- internal: the storage dtypes of the reference attention (fp32, fp16,
 * bf16; attention_ref.h) to and from fp32, for every translation unit that reads or writes
 * them: the GQA walk (attention_ref.c), its x86 kernels (attention_x86.c) and the MLA walk
 * (attention_mla_ref.c). Not part of the ABI; attention_ref.c exports the four conversions
 * as aicpu_attention_half_to_float etc.
 *
 * Why a header of static functions: each TU gets the conversions inline (the loops over them
 * vectorise), and no TU calls another's symbols for them, which would tie the TUs into a
 * cycle (tests/test_c_symbol_cycles.py). Integer bit manipulation only, round to nearest
 * even: the same bits wherever they are compiled.
 */
#ifndef AICPU_ATTENTION_STORAGE_H
#define AICPU_ATTENTION_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "attention_ref.h"

typedef union {
    float f;
    uint32_t u;
} storage_f32_bits;

static inline float storage_bits_to_float(uint32_t u) {
    storage_f32_bits c;
    c.u = u;
    return c.f;
}

static inline uint32_t storage_float_to_bits(float f) {
    storage_f32_bits c;
    c.f = f;
    return c.u;
}

/* Normals rebias the exponent (112 = 127 - 15); subnormals are em * 2^-24, exact in fp32.
 * Selects are integer masks so that loops over this vectorise. */
static inline float storage_half_to_float(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t infnan = 0u - (uint32_t)(em >= 0x7c00u); /* exponent 31 -> 255 */
    uint32_t sub = 0u - (uint32_t)(em < 0x400u);
    uint32_t normal = (em << 13) + 0x38000000u + (0x38000000u & infnan);
    uint32_t subnormal = storage_float_to_bits((float)(int32_t)em * 5.9604644775390625e-8f);
    return storage_bits_to_float((normal & ~sub) | (subnormal & sub) | sign);
}

static inline float storage_bf16_to_float(uint32_t b) { return storage_bits_to_float(b << 16); }

static inline uint16_t storage_float_to_half(float f) {
    uint32_t x = storage_float_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t h;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {
        h = x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u;
    } else if (x >= 0x477ff000u) { /* >= 65520 rounds to infinity */
        h = 0x7c00u;
    } else if (x >= 0x38800000u) { /* normal half: rebias, round to nearest even */
        h = (x - 0x38000000u + 0xfffu + ((x >> 13) & 1u)) >> 13;
    } else if (x > 0x33000000u) { /* subnormal half, units of 2^-24 */
        uint32_t e = x >> 23;
        uint32_t m = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        h = m >> shift;
        if (rem > half || (rem == half && (h & 1u))) h += 1u;
    } else { /* <= 2^-25 rounds to zero (2^-25 is a tie, to even) */
        h = 0;
    }
    return (uint16_t)(h | sign);
}

static inline uint16_t storage_float_to_bf16(float f) {
    uint32_t x = storage_float_to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline int storage_dtype_ok(int32_t dtype) {
    return dtype == AICPU_ATTENTION_FP32 || dtype == AICPU_ATTENTION_FP16 ||
           dtype == AICPU_ATTENTION_BF16;
}

static inline size_t storage_dtype_bytes(int32_t dtype) {
    return dtype == AICPU_ATTENTION_FP32 ? 4 : 2;
}

/* n values from storage to fp32, times mul (a query row: mul is the softmax scale). */
static inline void storage_load_row(float *restrict dst, const void *src, int32_t dtype,
                                    int32_t n, float mul) {
    int32_t x;
    if (dtype == AICPU_ATTENTION_FP32) {
        const float *s = (const float *)src;
        for (x = 0; x < n; x++) dst[x] = s[x] * mul;
    } else if (dtype == AICPU_ATTENTION_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (x = 0; x < n; x++) dst[x] = storage_bf16_to_float(s[x]) * mul;
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (x = 0; x < n; x++) dst[x] = storage_half_to_float(s[x]) * mul;
    }
}

/* n fp32 values times mul to storage (an output row: mul is 1 / the softmax sum). */
static inline void storage_store_row(void *dst, const float *restrict src, int32_t dtype,
                                     int32_t n, float mul) {
    int32_t x;
    if (dtype == AICPU_ATTENTION_FP32) {
        float *o = (float *)dst;
        for (x = 0; x < n; x++) o[x] = src[x] * mul;
    } else if (dtype == AICPU_ATTENTION_BF16) {
        uint16_t *o = (uint16_t *)dst;
        for (x = 0; x < n; x++) o[x] = storage_float_to_bf16(src[x] * mul);
    } else {
        uint16_t *o = (uint16_t *)dst;
        for (x = 0; x < n; x++) o[x] = storage_float_to_half(src[x] * mul);
    }
}

#endif /* AICPU_ATTENTION_STORAGE_H */
