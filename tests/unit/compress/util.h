/* Helpers shared by the compression tests: seeded test vectors and message encoding. */
#ifndef HS_TEST_COMPRESS_UTIL_H
#define HS_TEST_COMPRESS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"

/* Kinds of test vectors: each stresses a different part of the operators. */
enum vec_kind {
    VEC_GAUSS,  /* N(0, 1) */
    VEC_TIES,   /* integers in -3..3: many equal magnitudes and zeros (top-k ties) */
    VEC_WIDE,   /* N(0, 1) * 2^U(-40, 15): magnitudes over many binades, fp16 subnormals */
    VEC_SPARSE, /* mostly +-0, a few N(0, 1) */
    VEC_KINDS
};

static inline float *test_vec(size_t d, uint64_t seed, int kind) {
    float *x = malloc((d ? d : 1) * sizeof(float));
    hs_rng r;
    hs__rng_init(&r, seed, HS_RNG_TEST, (uint32_t)kind, 0);
    for (size_t i = 0; i < d; i++) {
        switch (kind) {
        case VEC_GAUSS:
            x[i] = (float)hs__rng_normal(&r);
            break;
        case VEC_TIES:
            x[i] = (float)((int)hs__rng_uniform(&r, 7) - 3);
            break;
        case VEC_WIDE:
            x[i] = (float)ldexp(hs__rng_normal(&r), (int)hs__rng_uniform(&r, 56) - 40);
            break;
        default:
            x[i] = hs__rng_uniform(&r, 10) == 0 ? (float)hs__rng_normal(&r)
                   : hs__rng_uniform(&r, 2)     ? -0.0f
                                               : 0.0f;
            break;
        }
    }
    return x;
}

/* A vector of nonzero values (never -0.0), as a receiver's accumulator. */
static inline float *test_acc(size_t d, uint64_t seed) {
    float *a = malloc((d ? d : 1) * sizeof(float));
    hs_rng r;
    hs__rng_init(&r, seed, HS_RNG_TEST, 99, 1);
    for (size_t i = 0; i < d; i++) a[i] = (float)(hs__rng_double(&r) + 0.5);
    return a;
}

#endif
