/* Random-k, stratified (compress_ew.h): one element per contiguous stratum, drawn from the
 * Philox stream (seed, RANDK, peer, round), so the receiver regenerates the indices and only
 * the values travel.
 *
 * Message: header (n = k, flags FP16 / UNSCALED) | u32 stream check | k values (fp32 or fp16)
 * in stratum order, unscaled (the receiver multiplies by the stratum size). */
#include <stdlib.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"

#define RANDK_HDR (HS__CHDR + 4)
#define CHUNK 1024 /* indices regenerated at a time on decode */

static size_t value_width(const hs_compressor *c) { return (c->flags & HS__CF_FP16) ? 2 : 4; }

static int randk_init(hs_compressor *c) {
    if (!(c->idx = malloc(c->k * sizeof(uint32_t))))
        return hs__err(HS_ENOMEM, "compressor %s: out of memory", c->name);
    return 0;
}

static int randk_unbiased(const hs_compressor *c) { return !(c->flags & HS__CF_UNSCALED); }

/* Stratum j of m_j elements keeps one uniformly. Unscaled, E||C(x) - x||^2 = sum_j (1 - 1/m_j)
 * ||x_j||^2 <= (1 - 1/m) ||x||^2 with m = ceil(d/k) the largest stratum: delta = 1/m. Rescaled
 * by m_j (unbiased), E||C(x) - x||^2 = sum_j (m_j - 1) ||x_j||^2, up to (m - 1) ||x||^2:
 * delta = 2 - m, which is <= 0 (not a contraction) as soon as a stratum has two elements.
 * fp16 values scale delta by (1 - u^2) as for top-k. */
static double randk_delta(const hs_compressor *c) {
    double m = (double)((c->d + c->k - 1) / c->k);
    double u = (c->flags & HS__CF_FP16) ? HS__FP16_U : 0;
    if (!(c->flags & HS__CF_UNSCALED)) return m > 1 ? 2.0 - m : 1.0 - u * u;
    return (1.0 / m) * (1.0 - u * u);
}

static size_t randk_max_bytes(const hs_compressor *c) {
    return RANDK_HDR + (size_t)c->k * value_width(c);
}

/* Indices of strata j0 .. j0 + n - 1 (j0 a multiple of 4) into idx. */
static void indices(const hs_compressor *c, uint32_t peer, uint64_t round, uint32_t j0, size_t n,
                    uint32_t *idx) {
    hs__cphilox_fill(hs_cw_key_seed(c->seed, round), HS_RNG_RANDK, peer, (uint32_t)round, j0, n,
                     idx);
    uint32_t d = (uint32_t)c->d, k = c->k;
    for (size_t j = 0; j < n; j++) {
        uint32_t st, m;
        hs_cw_randk_stratum(d, k, j0 + (uint32_t)j, &st, &m);
        idx[j] = st + hs_cw_randk_offset(idx[j], m);
    }
}

/* The largest stratum size: the scale that could overflow first. */
static uint32_t max_stratum(const hs_compressor *c) {
    return (uint32_t)(c->d / c->k) + (c->d % c->k ? 1u : 0u);
}

/* The decoded value of element x (through fp16 if so configured) for a stratum of size m, or an
 * error if it cannot be sent. */
static int value_of(const hs_compressor *c, float x, uint32_t at, uint32_t m, float *out) {
    int unscaled = (c->flags & HS__CF_UNSCALED) != 0;
    if (hs_cw_key(x) >= HS_CW_KEY_INF)
        return hs__err(HS_ERANGE, "compressor %s: element %u is not finite (%g)", c->name, at,
                       (double)x);
    if ((c->flags & HS__CF_FP16) && hs_cw_key(x) >= HS_CW_F16_OVERFLOW)
        return hs__err(HS_ERANGE, "compressor %s: element %u = %g does not fit fp16", c->name, at,
                       (double)x);
    float v = (c->flags & HS__CF_FP16) ? hs_cw_f32_from_f16(hs_cw_f16_from_f32(x)) : x;
    float s = hs_cw_randk_value(v, m, unscaled);
    if (hs_cw_key(s) >= HS_CW_KEY_INF)
        return hs__err(HS_ERANGE, "compressor %s: element %u = %g times stratum size %u "
                                  "overflows",
                       c->name, at, (double)x, m);
    *out = s;
    return 0;
}

int hs__randk_pack(const hs_compressor *c, uint32_t peer, uint64_t round, const uint32_t *idx,
                   const float *src, int gather, uint8_t *dst, size_t *n) {
    uint32_t d = (uint32_t)c->d, k = c->k;
    uint8_t *v = dst + RANDK_HDR;
    int fp16 = (c->flags & HS__CF_FP16) != 0;
    for (uint32_t j = 0; j < k; j++) {
        uint32_t st, m;
        hs_cw_randk_stratum(d, k, j, &st, &m);
        float f = gather ? src[idx[j]] : src[j], ignore;
        int err = value_of(c, f, idx[j], m, &ignore);
        if (err < 0) return err;
        if (fp16)
            hs__st16(v + 2 * (size_t)j, hs_cw_f16_from_f32(f));
        else
            hs__stf(v + 4 * (size_t)j, f);
    }
    hs__chdr_put(dst, HS_CODEC_RANDK, c->flags, 0, d, k);
    hs__st32(dst + HS__CHDR, hs_cw_randk_check(c->seed, peer, round));
    *n = randk_max_bytes(c);
    return 0;
}

static int randk_encode(hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                        uint8_t *dst, size_t *n) {
    indices(c, peer, round, 0, c->k, c->idx);
    return hs__randk_pack(c, peer, round, c->idx, x, 1, dst, n);
}

static int randk_decode(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                        uint64_t round, float *acc, float alpha) {
    uint32_t d = (uint32_t)c->d, k = c->k, flags;
    hs__chdr_want want = {HS__CF_FP16 | HS__CF_UNSCALED, HS__CF_FP16 | HS__CF_UNSCALED, 0, 0, 0,
                          k, 1, d, "parameter", "count k"};
    int err = hs__chdr_check(c, p, len, &want, &flags);
    if (err < 0) return err;
    if ((err = hs__clen_check(c, len, randk_max_bytes(c), "header, stream check and values")) < 0)
        return err;
    uint32_t check = hs__ld32(p + HS__CHDR), mine = hs_cw_randk_check(c->seed, peer, round);
    if (check != mine)
        return hs__err(HS_EMISMATCH, "randk message: stream check %08x, this peer derives %08x "
                                     "for peer %u round %llu (different seed, peer or round)",
                       check, mine, peer, (unsigned long long)round);
    const uint8_t *v = p + RANDK_HDR;
    int fp16 = (flags & HS__CF_FP16) != 0, unscaled = (flags & HS__CF_UNSCALED) != 0;
    float vmax;
    if (fp16) {
        uint16_t mag = hs__c16_max_mag(v, k);
        if (mag >= 0x7C00) return hs__err(HS_EFORMAT, "randk message: a value is not finite");
        vmax = hs_cw_f32_from_f16(mag);
    } else {
        uint32_t key = hs__cf32_max_key(v, k);
        if (key >= HS_CW_KEY_INF) return hs__err(HS_EFORMAT, "randk message: a value is not finite");
        vmax = hs_cw_float(key);
    }
    if (hs_cw_key(hs_cw_randk_value(vmax, max_stratum(c), unscaled)) >= HS_CW_KEY_INF)
        return hs__err(HS_EFORMAT, "randk message: value %g times stratum size %u overflows",
                       (double)vmax, max_stratum(c));
    uint32_t idx[CHUNK];
    /* j0 in 64 bits: with k over 2^32 - CHUNK a 32-bit j0 would wrap past the last chunk to 0
     * and decode forever. */
    for (size_t j0 = 0; j0 < k; j0 += CHUNK) {
        size_t n = k - j0 < CHUNK ? k - j0 : CHUNK;
        indices(c, peer, round, (uint32_t)j0, n, idx);
        for (size_t j = 0; j < n; j++) {
            uint32_t st, m, jj = (uint32_t)(j0 + j);
            hs_cw_randk_stratum(d, k, jj, &st, &m);
            float f = fp16 ? hs_cw_f32_from_f16(hs__ld16(v + 2 * (size_t)jj))
                           : hs__ldf(v + 4 * (size_t)jj);
            acc[idx[j]] = acc[idx[j]] + alpha * hs_cw_randk_value(f, m, unscaled);
        }
    }
    return 0;
}

/* The reference: each stratum's word drawn directly (no bulk generator). */
static int randk_apply(const hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                       float *out) {
    uint32_t d = (uint32_t)c->d, k = c->k;
    for (uint32_t j = 0; j < k; j++) {
        uint32_t st, m;
        hs_cw_randk_stratum(d, k, j, &st, &m);
        uint32_t at = st + hs_cw_randk_offset(hs_cw_randk_word(c->seed, peer, round, j), m);
        float ignore;
        int err = value_of(c, x[at], at, m, &ignore);
        if (err < 0) return err;
    }
    memset(out, 0, c->d * sizeof(float));
    for (uint32_t j = 0; j < k; j++) {
        uint32_t st, m;
        hs_cw_randk_stratum(d, k, j, &st, &m);
        uint32_t at = st + hs_cw_randk_offset(hs_cw_randk_word(c->seed, peer, round, j), m);
        value_of(c, x[at], at, m, &out[at]);
    }
    return 0;
}

/* randk:K[:fp16:unscaled]: K a count or a fraction of d. */
static int randk_parse(hs_compressor *c, const char *spec, const hs__cfield *f, int n) {
    return hs__cparse_sparse(c, spec, f, n, HS__CF_FP16 | HS__CF_UNSCALED);
}

const hs__cops hs__cops_randk = {"randk",         HS_CODEC_RANDK, randk_init,   randk_unbiased,
                                 randk_max_bytes, randk_encode,   randk_decode, randk_apply, NULL,
                                 randk_delta, randk_parse, HS__CSIZE_KEPT};
