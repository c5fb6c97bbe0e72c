// specpilot: one quantized weight row against several activation rows (speculative verification).
#pragma once

#include "ggml.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// s[r * s_stride] = dot(weight row vx, activation row r) for r < nrows, where activation row r
// is the q8_K row at (const char *) vy + r * vy_stride; n weights per row.
typedef void (*ggml_multirow_dot_t)(int n, const void * vx, const void * vy, size_t vy_stride,
                                    int nrows, float * s, size_t s_stride);

// The kernel for weights of `type`, or NULL where this build has none.
ggml_multirow_dot_t ggml_multirow_dot(enum ggml_type type);

// Largest activation row count a kernel call takes.
#define GGML_MULTIROW_MAX 16

#ifdef __cplusplus
}
#endif
