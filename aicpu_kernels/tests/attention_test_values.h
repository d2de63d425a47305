/*
 * attention_test_values.h -- random inputs and read-back in any storage dtype, shared by the
 * C attention test programs (attention_variants.c, attention_siblings.c). Each program keeps
 * its own generator, so its inputs stay its own.
 */
#ifndef ATTENTION_TEST_VALUES_H
#define ATTENTION_TEST_VALUES_H

#include <stddef.h>
#include <stdint.h>

#include "attention_ref.h"

/* n values of `uniform` (in [-1, 1)) stored in dtype at p. */
static void fill_values(void *p, size_t n, int32_t dtype, float (*uniform)(void)) {
    size_t i;
    for (i = 0; i < n; i++) {
        float x = uniform();
        if (dtype == AICPU_ATTENTION_FP32)
            ((float *)p)[i] = x;
        else if (dtype == AICPU_ATTENTION_BF16)
            ((uint16_t *)p)[i] = aicpu_attention_float_to_bf16(x);
        else
            ((uint16_t *)p)[i] = aicpu_attention_float_to_half(x);
    }
}

/* Element i of p (dtype), widened exactly. */
static double value_at(const void *p, size_t i, int32_t dtype) {
    if (dtype == AICPU_ATTENTION_FP32) return ((const float *)p)[i];
    if (dtype == AICPU_ATTENTION_BF16)
        return aicpu_attention_bf16_to_float(((const uint16_t *)p)[i]);
    return aicpu_attention_half_to_float(((const uint16_t *)p)[i]);
}

#endif
