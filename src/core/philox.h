/* Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11):
 * a counter-based generator, so the n-th number of a stream is computed directly from
 * (key, counter) with no state. Host and device share this code, so a receiver or a GPU kernel
 * regenerates exactly the numbers the sender drew on the CPU.
 *
 * Stream layout used throughout hearsay: key = the 64-bit run seed; counter =
 * (block, purpose, round, peer), where block indexes groups of 4 outputs. */
#ifndef HS_CORE_PHILOX_H
#define HS_CORE_PHILOX_H

#include <stdint.h>

#include "core/hd.h"

/* What a stream is for; distinct purposes never share numbers. Stable: changing a value
 * changes every seeded result. */
enum hs_rng_purpose {
    HS_RNG_INIT = 1,      /* model initialisation */
    HS_RNG_SHUFFLE = 2,   /* data shuffling and sharding */
    HS_RNG_RANDK = 3,     /* random-k indices */
    HS_RNG_QSGD = 4,      /* QSGD stochastic rounding */
    HS_RNG_DIRICHLET = 5, /* non-IID label skew */
    HS_RNG_SYNTH = 6,     /* synthetic datasets */
    HS_RNG_TOPO = 7,      /* random graphs */
    HS_RNG_NET = 8,       /* link emulation (delay, jitter, loss) */
    HS_RNG_TEST = 9,      /* tests and benchmarks */
    HS_RNG_SIM = 10,      /* simulator scheduling */
    HS_RNG_AUGMENT = 11,  /* data augmentation (crop offsets, flips) */
    HS_RNG_PROBE = 12,    /* the consensus step's probe vector (algo/step.c) */
};

HS_HD static void hs__philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo) {
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

/* out = Philox4x32-10(ctr, key). */
HS_HD static void hs_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, lo0, hi1, lo1;
        hs__philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
        hs__philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The 4 numbers of block `block` of the stream (seed, purpose, peer, round). */
HS_HD static void hs_rng_block(uint64_t seed, uint32_t purpose, uint32_t peer, uint32_t round,
                               uint32_t block, uint32_t out[4]) {
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t ctr[4] = {block, purpose, round, peer};
    hs_philox4x32_10(ctr, key, out);
}

/* The i-th 32-bit number of a stream (i / 4 selects the block, i % 4 the word). */
HS_HD static uint32_t hs_rng_at(uint64_t seed, uint32_t purpose, uint32_t peer, uint32_t round,
                                uint64_t i) {
    uint32_t out[4];
    hs_rng_block(seed, purpose, peer, round, (uint32_t)(i >> 2), out);
    return out[i & 3];
}

/* Uniform in [0, 1) with 24 bits, exactly representable in float (no rounding up to 1). */
HS_HD static float hs_rng_u01(uint32_t r) { return (float)(r >> 8) * (1.0f / 16777216.0f); }

/* Uniform integer in [0, n), by multiply-shift; its bias (at most n / 2^32) is immaterial at
 * the sizes hearsay uses and it is branch-free, so host and device agree trivially. */
HS_HD static uint32_t hs_rng_below(uint32_t r, uint32_t n) {
    return (uint32_t)(((uint64_t)r * (uint64_t)n) >> 32);
}

#endif
