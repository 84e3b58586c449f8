/* Sequential Philox reader and distributions. */
#include <math.h>
#include <stddef.h>

#include "core/rng.h"

void hs__rng_init(hs_rng *r, uint64_t seed, uint32_t purpose, uint32_t peer, uint32_t round) {
    r->seed = seed;
    r->purpose = purpose;
    r->peer = peer;
    r->round = round;
    r->block = 0;
    r->pos = 4;
    r->have_spare = 0;
    r->spare = 0;
}

uint32_t hs__rng_u32(hs_rng *r) {
    if (r->pos == 4) {
        hs_rng_block(r->seed, r->purpose, r->peer, r->round, r->block++, r->buf);
        r->pos = 0;
    }
    return r->buf[r->pos++];
}

uint64_t hs__rng_u64(hs_rng *r) {
    uint64_t hi = hs__rng_u32(r);
    return (hi << 32) | hs__rng_u32(r);
}

double hs__rng_double(hs_rng *r) { return (double)(hs__rng_u64(r) >> 11) * 0x1.0p-53; }

uint32_t hs__rng_uniform(hs_rng *r, uint32_t n) {
    /* Lemire's multiply-shift with rejection of the short tail: unbiased. */
    uint64_t m = (uint64_t)hs__rng_u32(r) * n;
    uint32_t l = (uint32_t)m;
    if (l < n) {
        uint32_t t = (uint32_t)(-n) % n;
        while (l < t) {
            m = (uint64_t)hs__rng_u32(r) * n;
            l = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

double hs__rng_normal(hs_rng *r) {
    if (r->have_spare) {
        r->have_spare = 0;
        return r->spare;
    }
    double u1, u2;
    do u1 = hs__rng_double(r);
    while (u1 <= 0.0);
    u2 = hs__rng_double(r);
    double rad = sqrt(-2.0 * log(u1));
    r->spare = rad * sin(2.0 * M_PI * u2);
    r->have_spare = 1;
    return rad * cos(2.0 * M_PI * u2);
}

double hs__rng_gamma(hs_rng *r, double shape) {
    if (shape < 1.0) {
        /* Boost: Gamma(a) = Gamma(a + 1) * U^(1/a). */
        double u;
        do u = hs__rng_double(r);
        while (u <= 0.0);
        return hs__rng_gamma(r, shape + 1.0) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = hs__rng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        double u = hs__rng_double(r);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
        if (u > 0.0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
    }
}

void hs__rng_shuffle_u32(hs_rng *r, uint32_t *idx, size_t n) {
    for (size_t i = n; i > 1; i--) {
        size_t j = hs__rng_uniform(r, (uint32_t)i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}
