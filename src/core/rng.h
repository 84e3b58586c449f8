/* A sequential host-side reader over one Philox stream, with the distributions the data and
 * model code need (uniform, normal, gamma). Single-threaded per object; deterministic. */
#ifndef HS_CORE_RNG_H
#define HS_CORE_RNG_H

#include <stdint.h>

#include "core/philox.h"

typedef struct hs_rng {
    uint64_t seed;
    uint32_t purpose, peer, round;
    uint32_t block;  /* next block to generate */
    uint32_t buf[4]; /* current block */
    int pos;         /* next word of buf; 4 = empty */
    int have_spare;  /* Box-Muller produces pairs */
    double spare;
} hs_rng;

void hs__rng_init(hs_rng *r, uint64_t seed, uint32_t purpose, uint32_t peer, uint32_t round);
uint32_t hs__rng_u32(hs_rng *r);
uint64_t hs__rng_u64(hs_rng *r);
/* Uniform double in [0, 1) with 53 bits. */
double hs__rng_double(hs_rng *r);
/* Uniform integer in [0, n), unbiased (rejection). n > 0. */
uint32_t hs__rng_uniform(hs_rng *r, uint32_t n);
/* Standard normal (Box-Muller). */
double hs__rng_normal(hs_rng *r);
/* Gamma(shape, 1) by Marsaglia-Tsang; shape > 0. */
double hs__rng_gamma(hs_rng *r, double shape);
/* Fisher-Yates shuffle of idx[0..n). */
void hs__rng_shuffle_u32(hs_rng *r, uint32_t *idx, size_t n);

#endif
