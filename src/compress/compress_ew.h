/* Per-element arithmetic and random draws of the compression operators, shared by the CPU
 * codecs (C) and the CUDA kernels: one definition, so a kernel that calls these functions
 * produces the same bits as the CPU path. Everything here is integer arithmetic or single IEEE
 * operations written out one by one (no FMA: -ffp-contract=off / --fmad=false), and every
 * random number is addressed directly by (seed, purpose, peer, round, element) through
 * core/philox.h, so element i of any stream can be computed without drawing the others.
 *
 * Reductions (norms of QSGD buckets, L1 scales of sign buckets) are part of the definition:
 * 32 double accumulators, lane = element offset mod 32 within the bucket, each summing its
 * elements in order, then combined as a warp shuffle-down would: for h = 16, 8, 4, 2, 1,
 * l[i] = l[i] + l[i + h] for i < h (hs_cw_lanes32). A kernel must sum in that order. */
#ifndef HS_COMPRESS_COMPRESS_EW_H
#define HS_COMPRESS_COMPRESS_EW_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/hd.h"
#include "core/philox.h"

/* ---------------------------------------------------------------- bits */

HS_HD static uint32_t hs_cw_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

HS_HD static float hs_cw_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* |x| as an unsigned key that orders like the magnitude: for finite x and +-Inf the IEEE bits
 * without the sign are monotone in |x|; NaNs sort above Inf (keys >= HS_CW_KEY_INF are not
 * finite). Top-k selects by this key. */
#define HS_CW_KEY_INF 0x7F800000u
HS_HD static uint32_t hs_cw_key(float x) { return hs_cw_bits(x) & 0x7FFFFFFFu; }

/* ---------------------------------------------------------------- random streams */

/* Philox's counter holds a 32-bit round; rounds at or past 2^32 fold their high word into the
 * key, so streams of different rounds never coincide and rounds below 2^32 use the seed as is. */
HS_HD static uint64_t hs_cw_key_seed(uint64_t seed, uint64_t round) {
    return seed ^ ((round >> 32) * 0x9E3779B97F4A7C15ull);
}

/* ---------------------------------------------------------------- fp16 and bf16 */

/* Magnitude bits from which a float rounds (to nearest even) to half infinity: 65520. The
 * largest finite half is 65504; encoders refuse magnitudes >= this limit. */
#define HS_CW_F16_OVERFLOW 0x477FF000u
/* Magnitude bits from which a float rounds to bf16 infinity. */
#define HS_CW_BF16_OVERFLOW 0x7F7F8000u

/* Float -> IEEE binary16, round to nearest even, integer arithmetic only (independent of the
 * floating-point environment). Magnitudes >= HS_CW_F16_OVERFLOW give infinity; NaN gives a
 * quiet NaN. Matches the F16C instruction vcvtps2ph with rounding mode 0 on every finite input. */
HS_HD static uint16_t hs_cw_f16_from_f32(float f) {
    uint32_t x = hs_cw_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7FFFFFFFu;
    if (a > HS_CW_KEY_INF) return (uint16_t)(sign | 0x7E00u);
    if (a >= HS_CW_F16_OVERFLOW) return (uint16_t)(sign | 0x7C00u);
    uint32_t e = a >> 23;
    if (e >= 113) {
        /* Normal half: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits;
         * a carry out of the mantissa correctly bumps the exponent. */
        uint32_t h = (a - (112u << 23)) >> 13;
        uint32_t rem = a & 0x1FFFu;
        h += (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u;
        return (uint16_t)(sign | h);
    }
    /* Subnormal half (or zero): the result is round(|f| / 2^-24). Below 2^-25 it is 0. */
    if (e < 102) return sign;
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u; /* |f| = m * 2^(e - 150) */
    uint32_t sh = 126u - e;                   /* 14..24 */
    uint32_t q = m >> sh;
    uint32_t rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
    return (uint16_t)(sign | q); /* q == 0x400 is the smallest normal, correctly encoded */
}

/* Exact binary16 -> float. Infinities and NaNs map to float infinities and NaNs (decoders
 * reject them before converting). */
HS_HD static float hs_cw_f32_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-08f; /* m * 2^-24, exact */
        return hs_cw_float(hs_cw_bits(v) | sign);
    }
    if (e == 31) return hs_cw_float(sign | 0x7F800000u | (m << 13));
    return hs_cw_float(sign | ((e + 112u) << 23) | (m << 13));
}

HS_HD static int hs_cw_f16_finite(uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }

/* Float -> bfloat16, round to nearest even. Magnitudes >= HS_CW_BF16_OVERFLOW give infinity. */
HS_HD static uint16_t hs_cw_bf16_from_f32(float f) {
    uint32_t x = hs_cw_bits(f);
    if ((x & 0x7FFFFFFFu) > HS_CW_KEY_INF) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

HS_HD static float hs_cw_f32_from_bf16(uint16_t h) { return hs_cw_float((uint32_t)h << 16); }

HS_HD static int hs_cw_bf16_finite(uint16_t h) { return (h & 0x7F80u) != 0x7F80u; }

/* ---------------------------------------------------------------- reductions */

HS_HD static double hs_cw_lanes32(const double lanes[32]) {
    double l[16];
    for (int i = 0; i < 16; i++) l[i] = lanes[i] + lanes[i + 16];
    for (int h = 8; h >= 1; h /= 2)
        for (int i = 0; i < h; i++) l[i] = l[i] + l[i + h];
    return l[0];
}

/* ---------------------------------------------------------------- random-k (stratified) */

/* Random-k splits [0, d) into k contiguous strata, r = d mod k of size q + 1 = d/k + 1 first,
 * then k - r of size q, and keeps one uniformly drawn element of each. Stratum j's element is
 * a function of (seed, peer, round, j) alone, so indices are distinct, increasing, and
 * regenerated by the receiver in O(k). With the rescaled variant (the default) the kept value
 * is multiplied by its stratum's size m_j, so E[C(x)] = x and
 * E||C(x) - x||^2 = sum_j (m_j - 1) ||x_stratum j||^2 <= (ceil(d/k) - 1) ||x||^2. */
HS_HD static void hs_cw_randk_stratum(uint32_t d, uint32_t k, uint32_t j, uint32_t *start,
                                      uint32_t *size) {
    uint32_t q = d / k, r = d % k;
    *start = j * q + (j < r ? j : r);
    *size = q + (j < r ? 1u : 0u);
}

/* Offset within a stratum of `size` elements from random word w (multiply-shift: bias at
 * most size / 2^32). */
HS_HD static uint32_t hs_cw_randk_offset(uint32_t w, uint32_t size) {
    return hs_rng_below(w, size);
}

/* Word j of the random-k stream of (seed, peer, round): stratum j keeps element
 * start_j + hs_cw_randk_offset(word, size_j). */
HS_HD static uint32_t hs_cw_randk_word(uint64_t seed, uint32_t peer, uint64_t round, uint32_t j) {
    return hs_rng_at(hs_cw_key_seed(seed, round), HS_RNG_RANDK, peer, (uint32_t)round, j);
}

/* The value stratum j contributes: v times the stratum size (rescaled) or v itself. */
HS_HD static float hs_cw_randk_value(float v, uint32_t size, int unscaled) {
    return unscaled ? v : (float)size * v;
}

/* A stream check carried by random-k messages: a word outside the index stream (block
 * 2^32 - 1), so a receiver that would regenerate different indices (other seed, peer or round)
 * detects it instead of adding the values at the wrong places. */
HS_HD static uint32_t hs_cw_randk_check(uint64_t seed, uint32_t peer, uint64_t round) {
    uint32_t out[4];
    hs_rng_block(hs_cw_key_seed(seed, round), HS_RNG_RANDK, peer, (uint32_t)round, 0xFFFFFFFFu,
                 out);
    return out[0];
}

/* ---------------------------------------------------------------- QSGD */

/* QSGD (Alistarh et al., NeurIPS 2017, eq. (1)) with s levels per bucket of B elements:
 *   Q(x_i) = ||x_b||_2 * sign(x_i) * l_i / s,  E[l_i] = r_i = |x_i| * s / ||x_b||_2,
 * with the stochastic rounding done in 16.16 fixed point: R_i = floor(r_i * 2^16) (in float),
 * u_i a uniform 16-bit draw (hs_cw_qsgd_draw), l_i = min((R_i + u_i) >> 16, s). Then
 * E[l_i] = R_i / 2^16, within 2^-16 below r_i (for s < 256, where r_i * 2^16 < 2^24 is exact
 * in float; larger s add the float rounding of r_i * 2^16), so Q is unbiased up to 2^-16 of a
 * level. A field of b = bits(s) + 1 bits holds l_i in its low bits and the sign in its top bit;
 * a zero level never carries a sign (one encoding per value). The norm is the square root of
 * the 32-lane double sum of squares, rounded to float. */
#define HS_CW_QSGD_MAX_S 32767u
/* Largest bucket norm on the wire: level * (norm / s) then cannot overflow. */
#define HS_CW_QSGD_MAX_NORM 0x1p127f

/* Bits of one QSGD field for s levels: enough for 0..s plus a sign bit (2..16). */
HS_HD static uint32_t hs_cw_qsgd_bits(uint32_t s) {
    uint32_t b = 1;
    while ((1u << b) <= s) b++;
    return b + 1u;
}

/* A bucket's norm from its sum of squares (32-lane double order). */
HS_HD static float hs_cw_qsgd_norm(double sumsq) { return (float)sqrt(sumsq); }

/* Per-bucket factors of r_i * 2^16 = (|x_i| * pre) * inv16, inv16 = 2^16 * s / (norm * pre),
 * where pre is 2^64 for buckets with norm < 2^-64 (so that s / norm stays finite for the
 * tiniest norms) and 1 otherwise (then |x_i| * pre = |x_i| exactly). A zero bucket has
 * inv16 = 0 and gives zero levels. */
HS_HD static void hs_cw_qsgd_factors(float norm, uint32_t s, float *pre, float *inv16) {
    float g = norm < 0x1p-64f ? 0x1p64f : 1.0f;
    *pre = g;
    *inv16 = norm > 0.0f ? ((float)s / (norm * g)) * 65536.0f : 0.0f;
}

/* The 16-bit uniform draw of QSGD element i (its index in the whole vector): half i mod 2 of
 * word i / 2 of the stream (seed, QSGD, peer, round), low half first. 16 bits per element
 * halve the Philox work. */
HS_HD static uint32_t hs_cw_qsgd_draw(uint64_t seed, uint32_t peer, uint64_t round, uint64_t i) {
    uint32_t w = hs_rng_at(hs_cw_key_seed(seed, round), HS_RNG_QSGD, peer, (uint32_t)round,
                           i >> 1);
    return (i & 1) ? w >> 16 : w & 0xFFFFu;
}

/* One QSGD field of x given the bucket's factors and the element's draw u (0..65535). */
HS_HD static uint32_t hs_cw_qsgd_field(float x, float pre, float inv16, uint32_t s, uint32_t b,
                                       uint32_t u) {
    float r16 = (hs_cw_float(hs_cw_bits(x) & 0x7FFFFFFFu) * pre) * inv16;
    uint32_t fix = (uint32_t)(int32_t)r16; /* 0 <= r16 <= 2^16 s (1 + 2^-22) < 2^31 */
    uint32_t l = (fix + u) >> 16;
    l = l < s ? l : s;
    uint32_t neg = (hs_cw_bits(x) >> 31) & (l != 0 ? 1u : 0u);
    return l | (neg << (b - 1u));
}

/* The size of one level, norm / s. */
HS_HD static float hs_cw_qsgd_unit(float norm, uint32_t s) { return norm / (float)s; }

/* The value of a field: sign * (level * unit). */
HS_HD static float hs_cw_qsgd_value(uint32_t field, uint32_t b, float unit) {
    float v = (float)(field & ((1u << (b - 1u)) - 1u)) * unit;
    return (field >> (b - 1u)) ? -v : v;
}

/* ---------------------------------------------------------------- scaled sign */

/* Scaled sign with one scale per bucket (Karimireddy et al. 2019; CHOCO-SGD's "sign"):
 * C(x)_i = scale_b * (signbit(x_i) ? -1 : 1), scale_b = ||x_b||_1 / n_b, so -0.0 maps to
 * -scale and +0.0 to +scale. The scale is the 32-lane double sum of |x_i| divided by the
 * bucket's length n_b, rounded to float. */
HS_HD static float hs_cw_sign_scale(double l1, uint32_t n) { return (float)(l1 / (double)n); }

HS_HD static float hs_cw_sign_value(uint32_t bit, float scale) { return bit ? -scale : scale; }

#endif
