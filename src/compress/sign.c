/* Scaled sign with one scale per bucket (compress_ew.h): C(x)_i = +-scale_b by the sign bit of
 * x_i, scale_b = ||x_b||_1 / |b|. The default bucket is the whole vector.
 *
 * Message: header (n = configured bucket size, 0 for the whole vector) | one fp32 scale per
 * bucket | d sign bits, LSB-first (element i is bit i % 8 of byte i / 8), zero padding. */
#include <math.h>
#include <stdlib.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"

static size_t bucket_len(const hs_compressor *c) {
    return c->bucket == 0 || c->bucket > c->d ? c->d : c->bucket;
}

static size_t n_buckets(const hs_compressor *c) {
    return (c->d + bucket_len(c) - 1) / bucket_len(c);
}

static int sign_init(hs_compressor *c) {
    (void)c;
    return 0;
}

static int sign_unbiased(const hs_compressor *c) {
    (void)c;
    return 0;
}

/* Per bucket b, ||C(x_b) - x_b||^2 = ||x_b||^2 - ||x_b||_1^2 / |b| exactly, so delta is the
 * smallest ||x_b||_1^2 / (|b| ||x_b||^2): 1/|b| for a vector with one nonzero per bucket (the
 * guaranteed bound, uselessly small for a whole-vector bucket of a model), 2/pi for Gaussian
 * vectors, 1/2 for Laplace ones. Gossip differences are dense, so the bound reported is the
 * typical value with a margin for heavier tails, 1/pi, and never below the guarantee 1/|b|;
 * the gamma_c table in docs/RESULTS.md measures the step sign tolerates. */
static double sign_delta(const hs_compressor *c) {
    double b = (double)bucket_len(c), typical = 1.0 / 3.14159265358979323846;
    return b <= 1 ? 1.0 : fmax(typical, 1.0 / b);
}

static size_t sign_max_bytes(const hs_compressor *c) {
    return HS__CHDR + 4 * n_buckets(c) + (c->d + 7) / 8;
}

static int scale_of(const hs_compressor *c, double l1, size_t len, size_t j, float *scale) {
    if (!isfinite(l1))
        return hs__err(HS_ERANGE, "compressor %s: bucket %zu holds a non-finite value", c->name,
                       j);
    *scale = hs_cw_sign_scale(l1, (uint32_t)len);
    return 0;
}

static int sign_encode(hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                       uint8_t *dst, size_t *n) {
    (void)peer;
    (void)round;
    size_t d = c->d, bl = bucket_len(c), nb = n_buckets(c);
    uint8_t *scales = dst + HS__CHDR;
    for (size_t j = 0; j < nb; j++) {
        size_t lo = j * bl, len = d - lo < bl ? d - lo : bl;
        float sc = 0;
        int err = scale_of(c, hs__cl1(x + lo, len), len, j, &sc);
        if (err < 0) return err;
        hs__stf(scales + 4 * j, sc);
    }
    hs__csign_pack(x, d, scales + 4 * nb);
    hs__chdr_put(dst, HS_CODEC_SIGN, 0, 0, (uint32_t)d, c->bucket);
    *n = sign_max_bytes(c);
    return 0;
}

int hs__sign_check(const hs_compressor *c, const uint8_t *p, size_t len) {
    uint32_t flags;
    hs__chdr_want want = {0, 0, 0, 0, 0, c->bucket, 0, UINT32_MAX, "parameter", "bucket size"};
    int err = hs__chdr_check(c, p, len, &want, &flags);
    if (err < 0) return err;
    if ((err = hs__clen_check(c, len, sign_max_bytes(c), "header, scales and sign bits")) < 0)
        return err;
    size_t d = c->d, nb = n_buckets(c);
    const uint8_t *scales = p + HS__CHDR, *bits = scales + 4 * nb;
    for (size_t j = 0; j < nb; j++) {
        uint32_t u = hs__ld32(scales + 4 * j);
        if (u >= HS_CW_KEY_INF) /* also the sign bit */
            return hs__err(HS_EFORMAT, "sign message: bucket %zu has scale %g (not finite and "
                                       ">= 0)",
                           j, (double)hs_cw_float(u));
    }
    if (d % 8 && (bits[(d - 1) / 8] >> (d % 8)))
        return hs__err(HS_EFORMAT, "sign message: nonzero padding bits after the last sign");
    return 0;
}

static int sign_decode(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                       uint64_t round, float *acc, float alpha) {
    (void)peer;
    (void)round;
    int err = hs__sign_check(c, p, len);
    if (err < 0) return err;
    size_t d = c->d, bl = bucket_len(c), nb = n_buckets(c);
    const uint8_t *scales = p + HS__CHDR, *bits = scales + 4 * nb;
    for (size_t j = 0; j < nb; j++) {
        size_t lo = j * bl, hi = d - lo < bl ? d : lo + bl;
        /* alpha * -s is exactly -(alpha * s): one product per bucket. */
        hs__csign_add(bits, lo, hi, alpha * hs__ldf(scales + 4 * j), acc);
    }
    return 0;
}

/* The reference, element by element, with the scalar 32-lane sums. */
static int sign_apply(const hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                      float *out) {
    (void)peer;
    (void)round;
    size_t d = c->d, bl = bucket_len(c), nb = n_buckets(c);
    for (size_t j = 0; j < nb; j++) {
        size_t lo = j * bl, hi = d - lo < bl ? d : lo + bl;
        double l[32];
        memset(l, 0, sizeof(l));
        for (size_t i = lo; i < hi; i++) l[(i - lo) % 32] += (double)fabsf(x[i]);
        float sc = 0;
        int err = scale_of(c, hs_cw_lanes32(l), hi - lo, j, &sc);
        if (err < 0) return err;
        for (size_t i = lo; i < hi; i++) out[i] = hs_cw_sign_value(hs_cw_bits(x[i]) >> 31, sc);
    }
    return 0;
}

/* sign[:BUCKET]: one scale for the whole vector unless a bucket size is given. */
static int sign_parse(hs_compressor *c, const char *spec, const hs__cfield *f, int n) {
    uint64_t v;
    if (n > 2)
        return hs__err(HS_EINVAL, "compressor \"%s\": sign takes an optional bucket size", spec);
    if (n == 2) {
        if (hs__cparse_count(&f[1], &v) < 0 || v < 1 || v > UINT32_MAX)
            return hs__err(HS_EINVAL, "compressor \"%s\": bucket size \"%.*s\" is not a "
                                      "positive integer",
                           spec, (int)f[1].len, f[1].s);
        c->bucket = (uint32_t)v;
        hs__cname_append(c, ":%u", c->bucket);
    }
    return 0;
}

const hs__cops hs__cops_sign = {"sign",         HS_CODEC_SIGN, sign_init,   sign_unbiased,
                                sign_max_bytes, sign_encode,   sign_decode, sign_apply, NULL,
                                sign_delta, sign_parse, HS__CSIZE_NONE};
