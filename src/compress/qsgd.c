/* QSGD with s levels and one L2 norm per bucket of B elements (compress_ew.h has the exact
 * per-element definition).
 *
 * Message: header (param = s, n = B) | ceil(d / B) norms (fp32) | d fields of b = bits(s) + 1
 * bits, LSB-first (element i at bit i * b), zero padding to a byte. Fields of 8 bits or fewer
 * (s <= 127) take the vector path: 8 fields fill exactly b bytes, so a chunk that starts at a
 * multiple of 8 elements starts on a byte. */
#include <math.h>
#include <stdlib.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"

#define CHUNK 4096 /* elements per pass of draws, fields and packing (a multiple of 8) */

typedef struct qsgd_scratch {
    union {
        uint32_t w[CHUNK / 2]; /* Philox words */
        uint16_t h[CHUNK];     /* on little-endian, the draws: word i / 2, low half first */
    } r;
    uint16_t u[CHUNK]; /* the draws on big-endian */
    uint8_t fields[CHUNK];
} qsgd_scratch;

static size_t n_buckets(const hs_compressor *c) { return (c->d + c->bucket - 1) / c->bucket; }

static uint32_t field_bits(const hs_compressor *c) { return hs_cw_qsgd_bits(c->s); }

static size_t field_bytes(const hs_compressor *c) {
    return (c->d * field_bits(c) + 7) / 8;
}

static int qsgd_init(hs_compressor *c) {
    if (!(c->aux = malloc(sizeof(qsgd_scratch))))
        return hs__err(HS_ENOMEM, "compressor %s: out of memory", c->name);
    return 0;
}

static int qsgd_unbiased(const hs_compressor *c) {
    (void)c;
    return 1;
}

/* QSGD is unbiased with E||Q(x) - x||^2 <= omega ||x||^2, omega = min(B/s^2, sqrt(B)/s) per
 * bucket of B elements (Alistarh et al. 2017, Lemma 3.1), and B is at most d. Q itself is a
 * contraction only when omega < 1; Q / (1 + omega) always is, with delta = 1 / (1 + omega)
 * (Koloskova et al. 2019, section 3), and that is the delta reported. hearsay's CHOCO and BEER
 * send Q unscaled while its error on a flat bucket stays below 1, and Q times s / sqrt(B)
 * beyond (hs__compress_replica_scale); for the step rule this delta is the conservative one,
 * since qsgd's measured errors on gossip differences are well below the worst case
 * (docs/RESULTS.md, the gamma_c table). */
static double qsgd_delta(const hs_compressor *c) {
    double b = (double)(c->bucket < c->d ? c->bucket : c->d), s = (double)c->s;
    double omega = fmin(b / (s * s), sqrt(b) / s);
    return 1.0 / (1.0 + omega);
}

double hs__qsgd_flat_error(const hs_compressor *c) {
    double b = (double)(c->bucket < c->d ? c->bucket : c->d), p = (double)c->s / sqrt(b);
    /* Every |v_i| = |v| / sqrt(B): each element rounds between levels 0 and 1 with P(1) = p,
     * variance (|v| / s)^2 p (1 - p), B of them. At p >= 1 the levels resolve a flat bucket
     * (the error is at most B / (4 s^2) <= 1/4 of |v|^2). */
    return p < 1.0 ? 1.0 / p - 1.0 : 0.0;
}

static size_t qsgd_max_bytes(const hs_compressor *c) {
    return HS__CHDR + 4 * n_buckets(c) + field_bytes(c);
}

/* Bucket j's norm from its sum of squares, or an error naming the bucket. */
static int bucket_norm(const hs_compressor *c, double sumsq, size_t j, float *norm) {
    float nrm = hs_cw_qsgd_norm(sumsq);
    if (!(nrm <= HS_CW_QSGD_MAX_NORM)) {
        if (!isfinite(sumsq))
            return hs__err(HS_ERANGE, "compressor %s: bucket %zu holds a non-finite value",
                           c->name, j);
        return hs__err(HS_ERANGE, "compressor %s: bucket %zu has norm %g, above 2^127", c->name,
                       j, (double)nrm);
    }
    *norm = nrm;
    return 0;
}

/* Writes b-bit fields LSB-first, 64 bits at a time (the path for b > 8). */
typedef struct bitw {
    uint8_t *p;
    uint64_t acc;
    unsigned n;
} bitw;

static void bitw_put(bitw *w, uint32_t v, uint32_t b) {
    w->acc |= (uint64_t)v << w->n;
    w->n += b;
    while (w->n >= 8) {
        *w->p++ = (uint8_t)w->acc;
        w->acc >>= 8;
        w->n -= 8;
    }
}

static void bitw_flush(bitw *w) {
    if (w->n) *w->p++ = (uint8_t)w->acc;
}

static int qsgd_encode(hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                       uint8_t *dst, size_t *n) {
    size_t d = c->d, bsz = c->bucket, nb = n_buckets(c);
    uint32_t s = c->s, b = field_bits(c);
    uint8_t *norms = dst + HS__CHDR, *fields = norms + 4 * nb;
    for (size_t j = 0; j < nb; j++) {
        size_t lo = j * bsz, len = d - lo < bsz ? d - lo : bsz;
        float nrm = 0;
        int err = bucket_norm(c, hs__cl2sq(x + lo, len), j, &nrm);
        if (err < 0) return err;
        hs__stf(norms + 4 * j, nrm);
    }
    qsgd_scratch *sc = c->aux;
    uint64_t key = hs_cw_key_seed(c->seed, round);
    bitw w = {fields, 0, 0};
    for (size_t c0 = 0; c0 < d; c0 += CHUNK) {
        size_t cn = d - c0 < CHUNK ? d - c0 : CHUNK;
        hs__cphilox_fill(key, HS_RNG_QSGD, peer, (uint32_t)round, c0 / 2, (cn + 1) / 2,
                         sc->r.w);
#if HS__LE
        const uint16_t *u = sc->r.h;
#else
        uint16_t *u = sc->u;
        for (size_t i = 0; i < (cn + 1) / 2; i++) {
            u[2 * i] = (uint16_t)sc->r.w[i];
            u[2 * i + 1] = (uint16_t)(sc->r.w[i] >> 16);
        }
#endif
        /* Walk the bucket segments of this chunk. */
        for (size_t i = c0; i < c0 + cn;) {
            size_t j = i / bsz, end = (j + 1) * bsz;
            end = end < c0 + cn ? end : c0 + cn;
            float pre, inv;
            hs_cw_qsgd_factors(hs__ldf(norms + 4 * j), s, &pre, &inv);
            if (b <= 8) {
                hs__cqsgd_fields8(x + i, end - i, pre, inv, s, b, u + (i - c0),
                                  sc->fields + (i - c0));
            } else {
                for (size_t e = i; e < end; e++)
                    bitw_put(&w, hs_cw_qsgd_field(x[e], pre, inv, s, b, u[e - c0]), b);
            }
            i = end;
        }
        if (b <= 8) hs__cbits_pack8(sc->fields, cn, b, fields + c0 * b / 8);
    }
    if (b > 8) bitw_flush(&w);
    hs__chdr_put(dst, HS_CODEC_QSGD, 0, s, (uint32_t)d, c->bucket);
    *n = qsgd_max_bytes(c);
    return 0;
}

/* Reads fields of b > 8 bits LSB-first. */
typedef struct bitr {
    const uint8_t *p;
    uint64_t acc;
    unsigned n;
} bitr;

static uint32_t bitr_get(bitr *r, uint32_t b) {
    while (r->n < b) {
        r->acc |= (uint64_t)*r->p++ << r->n;
        r->n += 8;
    }
    uint32_t v = (uint32_t)(r->acc & ((1u << b) - 1u));
    r->acc >>= b;
    r->n -= b;
    return v;
}

/* Walks every field of a message: with acc == NULL checks them (level <= s, no signed zero,
 * zero levels in zero buckets), otherwise adds alpha * value to acc. */
static int walk_fields(const hs_compressor *c, const uint8_t *norms, const uint8_t *fields,
                       float *acc, float alpha) {
    size_t d = c->d, bsz = c->bucket;
    uint32_t s = c->s, b = field_bits(c), lmask = (1u << (b - 1u)) - 1u;
    uint8_t f8[CHUNK];
    bitr r = {fields, 0, 0};
    for (size_t c0 = 0; c0 < d; c0 += CHUNK) {
        size_t cn = d - c0 < CHUNK ? d - c0 : CHUNK;
        if (b <= 8) hs__cbits_unpack8(fields + c0 * b / 8, cn, b, f8);
        for (size_t i = c0; i < c0 + cn;) {
            size_t j = i / bsz, end = (j + 1) * bsz;
            end = end < c0 + cn ? end : c0 + cn;
            float nrm = hs__ldf(norms + 4 * j);
            if (!acc) {
                uint32_t lmax = nrm > 0.0f ? s : 0;
                if (b <= 8 && !hs__cqsgd_check8(f8 + (i - c0), end - i, b, lmax)) {
                    i = end;
                    continue;
                }
                for (size_t e = i; e < end; e++) {
                    uint32_t f = b <= 8 ? f8[e - c0] : bitr_get(&r, b), l = f & lmask;
                    if (l > lmax || f == lmask + 1u) {
                        if (l > s)
                            return hs__err(HS_EFORMAT, "qsgd message: element %zu has level %u, "
                                                       "above s = %u",
                                           e, l, s);
                        if (l)
                            return hs__err(HS_EFORMAT, "qsgd message: element %zu has level %u "
                                                       "in bucket %zu of norm 0",
                                           e, l, j);
                        return hs__err(HS_EFORMAT, "qsgd message: element %zu is a negative "
                                                   "zero level",
                                       e);
                    }
                }
            } else {
                float unit = hs_cw_qsgd_unit(nrm, s);
                if (b <= 8) {
                    hs__cqsgd_add8(f8 + (i - c0), end - i, b, unit, alpha, acc + i);
                } else {
                    for (size_t e = i; e < end; e++)
                        acc[e] = acc[e] + alpha * hs_cw_qsgd_value(bitr_get(&r, b), b, unit);
                }
            }
            i = end;
        }
    }
    return 0;
}

int hs__qsgd_check(const hs_compressor *c, const uint8_t *p, size_t len) {
    uint32_t flags;
    hs__chdr_want want = {0,      0, c->s,       1, HS_CW_QSGD_MAX_S, c->bucket, 1, UINT32_MAX,
                          "levels s", "bucket size"};
    int err = hs__chdr_check(c, p, len, &want, &flags);
    if (err < 0) return err;
    if ((err = hs__clen_check(c, len, qsgd_max_bytes(c), "header, norms and levels")) < 0)
        return err;
    size_t nb = n_buckets(c), d = c->d;
    const uint8_t *norms = p + HS__CHDR, *fields = norms + 4 * nb;
    for (size_t j = 0; j < nb; j++) {
        uint32_t u = hs__ld32(norms + 4 * j);
        if (u > hs_cw_bits(HS_CW_QSGD_MAX_NORM)) /* also the sign bit, NaN and Inf */
            return hs__err(HS_EFORMAT, "qsgd message: bucket %zu has norm %g (not in [0, 2^127])",
                           j, (double)hs_cw_float(u));
    }
    size_t pad = d * field_bits(c) % 8;
    if (pad && (fields[field_bytes(c) - 1] >> pad))
        return hs__err(HS_EFORMAT, "qsgd message: nonzero padding bits after the last level");
    return walk_fields(c, norms, fields, NULL, 0);
}

static int qsgd_decode(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                       uint64_t round, float *acc, float alpha) {
    (void)peer;
    (void)round;
    int err = hs__qsgd_check(c, p, len);
    if (err < 0) return err;
    const uint8_t *norms = p + HS__CHDR;
    walk_fields(c, norms, norms + 4 * n_buckets(c), acc, alpha);
    return 0;
}

/* The reference, element by element: scalar norms in the 32-lane order, direct draws. */
static int qsgd_apply(const hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                      float *out) {
    size_t d = c->d, bsz = c->bucket, nb = n_buckets(c);
    uint32_t s = c->s, b = field_bits(c);
    for (size_t j = 0; j < nb; j++) {
        size_t lo = j * bsz, hi = d - lo < bsz ? d : lo + bsz;
        double l[32];
        memset(l, 0, sizeof(l));
        for (size_t i = lo; i < hi; i++) l[(i - lo) % 32] += (double)x[i] * (double)x[i];
        float nrm = 0, pre, inv;
        int err = bucket_norm(c, hs_cw_lanes32(l), j, &nrm);
        if (err < 0) return err;
        hs_cw_qsgd_factors(nrm, s, &pre, &inv);
        float unit = hs_cw_qsgd_unit(nrm, s);
        for (size_t i = lo; i < hi; i++) {
            uint32_t u = hs_cw_qsgd_draw(c->seed, peer, round, i);
            out[i] = hs_cw_qsgd_value(hs_cw_qsgd_field(x[i], pre, inv, s, b, u), b, unit);
        }
    }
    return 0;
}

/* qsgd:S[:BUCKET]: S levels, buckets of 512 values unless given. */
static int qsgd_parse(hs_compressor *c, const char *spec, const hs__cfield *f, int n) {
    uint64_t v;
    if (n < 2 || n > 3)
        return hs__err(HS_EINVAL, "compressor \"%s\": qsgd takes levels and an optional "
                                  "bucket size (qsgd:16 or qsgd:16:512)",
                       spec);
    if (hs__cparse_count(&f[1], &v) < 0 || v < 1 || v > HS_CW_QSGD_MAX_S)
        return hs__err(HS_EINVAL, "compressor \"%s\": levels \"%.*s\" not in 1..%u", spec,
                       (int)f[1].len, f[1].s, HS_CW_QSGD_MAX_S);
    c->s = (uint32_t)v;
    c->bucket = 512;
    if (n == 3) {
        if (hs__cparse_count(&f[2], &v) < 0 || v < 1 || v > UINT32_MAX)
            return hs__err(HS_EINVAL, "compressor \"%s\": bucket size \"%.*s\" is not a "
                                      "positive integer",
                           spec, (int)f[2].len, f[2].s);
        c->bucket = (uint32_t)v;
    }
    hs__cname_append(c, ":%u:%u", c->s, c->bucket);
    return 0;
}

const hs__cops hs__cops_qsgd = {"qsgd",         HS_CODEC_QSGD, qsgd_init,   qsgd_unbiased,
                                qsgd_max_bytes, qsgd_encode,   qsgd_decode, qsgd_apply, NULL,
                                qsgd_delta, qsgd_parse, HS__CSIZE_LEVELS};
