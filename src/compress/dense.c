/* The dense codecs: none (fp32), fp16 and bf16 (round to nearest even). A message is the
 * 12-byte header (n = d) followed by d little-endian values; non-finite values are refused on
 * both ends, and values that would overflow the 16-bit formats on encode. */
#include <stdlib.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"

typedef struct dense_fmt {
    size_t width;      /* bytes per value */
    uint32_t overflow; /* smallest |x| bits that do not fit */
    uint16_t inf_mag;  /* smallest non-finite 16-bit magnitude (16-bit formats) */
    const char *fmt;
} dense_fmt;

static const dense_fmt fmt_none = {4, HS_CW_KEY_INF, 0, "fp32"};
static const dense_fmt fmt_fp16 = {2, HS_CW_F16_OVERFLOW, 0x7C00, "fp16"};
static const dense_fmt fmt_bf16 = {2, HS_CW_BF16_OVERFLOW, 0x7F80, "bf16"};

static const dense_fmt *fmt_of(const hs_compressor *c) {
    return c->ops->id == HS_CODEC_NONE ? &fmt_none
           : c->ops->id == HS_CODEC_FP16 ? &fmt_fp16
                                         : &fmt_bf16;
}

static int dense_init(hs_compressor *c) {
    (void)c;
    return 0;
}

static int dense_unbiased(const hs_compressor *c) { return c->ops->id == HS_CODEC_NONE; }

/* A cast rounds each element to nearest, within u |x_i| (u the unit roundoff), so
 * ||C(x) - x||^2 <= u^2 ||x||^2. Values below the format's normal range round with a larger
 * relative error (fp16 flushes |x_i| < 2^-25 to zero); gossip differences that small do not
 * matter to a model, so the normal-range bound is the one reported. */
static double dense_delta(const hs_compressor *c) {
    double u = c->ops->id == HS_CODEC_FP16 ? HS__FP16_U : c->ops->id == HS_CODEC_BF16 ? HS__BF16_U : 0;
    return 1.0 - u * u;
}

static size_t dense_max_bytes(const hs_compressor *c) {
    return HS__CHDR + c->d * fmt_of(c)->width;
}

static int dense_encode(hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                        uint8_t *dst, size_t *n) {
    (void)peer;
    (void)round;
    const dense_fmt *f = fmt_of(c);
    uint8_t *v = dst + HS__CHDR;
    /* fp32 checks while it copies (one pass, and no memcpy: see hs__cf32_put); a refused
     * vector leaves bytes past the caller's length only. */
    uint32_t key = c->ops->id == HS_CODEC_NONE ? hs__cf32_put(x, c->d, v) : hs__cmax_key(x, c->d);
    if (key >= f->overflow) return hs__cerr_value(c, x, c->d, f->overflow, f->fmt);
    if (c->ops->id == HS_CODEC_FP16)
        hs__cf16_encode(x, c->d, v);
    else if (c->ops->id == HS_CODEC_BF16)
        hs__cbf16_encode(x, c->d, v);
    hs__chdr_put(dst, c->ops->id, 0, 0, (uint32_t)c->d, (uint32_t)c->d);
    *n = dense_max_bytes(c);
    return 0;
}

int hs__dense_check_head(const hs_compressor *c, const uint8_t *p, size_t len) {
    uint32_t d = (uint32_t)c->d, flags;
    hs__chdr_want want = {0, 0, 0, 0, 0, d, d, d, "parameter", "count"};
    int err = hs__chdr_check(c, p, len, &want, &flags);
    return err < 0 ? err : hs__clen_check(c, len, dense_max_bytes(c), "header and values");
}

int hs__dense_check_f32(const hs_compressor *c, const uint8_t *v, size_t n, size_t first) {
    if (hs__cf32_max_key(v, n) < HS_CW_KEY_INF) return 0;
    size_t i = 0;
    while (i < n && hs_cw_key(hs__ldf(v + 4 * i)) < HS_CW_KEY_INF) i++;
    return hs__err(HS_EFORMAT, "%s message: value %zu is not finite", c->ops->name, first + i);
}

/* Values [first, first + n) of a message, n of them at v: all finite, or an error naming the
 * first that is not. */
static int check_values(const hs_compressor *c, const uint8_t *v, size_t n, size_t first) {
    const dense_fmt *f = fmt_of(c);
    if (f->width == 4) return hs__dense_check_f32(c, v, n, first);
    if (hs__c16_max_mag(v, n) < f->inf_mag) return 0;
    size_t i = 0;
    while (i < n && (hs__ld16(v + 2 * i) & 0x7FFFu) < f->inf_mag) i++;
    return hs__err(HS_EFORMAT, "%s message: value %zu is not finite", c->ops->name, first + i);
}

/* acc += alpha C over the n values at v (checked). */
static void add_values(const hs_compressor *c, const uint8_t *v, size_t n, float *acc,
                       float alpha) {
    if (c->ops->id == HS_CODEC_NONE)
        hs__cf32_add(v, n, acc, alpha);
    else if (c->ops->id == HS_CODEC_FP16)
        hs__cf16_add(v, n, acc, alpha);
    else
        hs__cbf16_add(v, n, acc, alpha);
}

int hs__dense_check(const hs_compressor *c, const uint8_t *p, size_t len) {
    int err = hs__dense_check_head(c, p, len);
    return err < 0 ? err : check_values(c, p + HS__CHDR, c->d, 0);
}

int hs__cops_dense(const hs__cops *o) {
    return o == &hs__cops_none || o == &hs__cops_fp16 || o == &hs__cops_bf16;
}

size_t hs__compress_dense_width(const hs_compressor *c) {
    return hs__cops_dense(c->ops) && !c->ef ? fmt_of(c)->width : 0;
}

int hs__compress_dense_head(const hs_compressor *c, const uint8_t *hdr, size_t len) {
    if (!hs__compress_dense_width(c))
        return hs__err(HS_EINVAL, "compressor %s: not a dense cast", c->name);
    int err = hs__ccheck_codec(c, hdr, len);
    return err < 0 ? err : hs__dense_check_head(c, hdr, len);
}

/* The adds of dense_decode, over values [first, first + n): the kernels give the same bits
 * whatever the run's length, so a message taken in runs adds what it adds whole. */
int hs__compress_dense_add(const hs_compressor *c, const uint8_t *v, size_t n, size_t first,
                           float *acc, float alpha, float *acc2, float alpha2) {
    int err = check_values(c, v, n, first);
    if (err < 0) return err;
    if (acc) add_values(c, v, n, acc, alpha);
    if (acc2) add_values(c, v, n, acc2, alpha2);
    return 0;
}

static int dense_decode(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                        uint64_t round, float *acc, float alpha) {
    (void)peer;
    (void)round;
    int err = hs__dense_check(c, p, len);
    if (err < 0) return err;
    add_values(c, p + HS__CHDR, c->d, acc, alpha);
    return 0;
}

/* The reference, element by element from compress_ew.h. */
static int dense_apply(const hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                       float *out) {
    (void)peer;
    (void)round;
    const dense_fmt *f = fmt_of(c);
    for (size_t i = 0; i < c->d; i++)
        if (hs_cw_key(x[i]) >= f->overflow) return hs__cerr_value(c, x, c->d, f->overflow, f->fmt);
    for (size_t i = 0; i < c->d; i++) {
        switch (c->ops->id) {
        case HS_CODEC_NONE:
            out[i] = x[i];
            break;
        case HS_CODEC_FP16:
            out[i] = hs_cw_f32_from_f16(hs_cw_f16_from_f32(x[i]));
            break;
        default:
            out[i] = hs_cw_f32_from_bf16(hs_cw_bf16_from_f32(x[i]));
            break;
        }
    }
    return 0;
}

/* The casts and none take no parameters. */
static int dense_parse(hs_compressor *c, const char *spec, const hs__cfield *f, int n) {
    (void)c;
    (void)f;
    if (n != 1) return hs__err(HS_EINVAL, "compressor \"%s\": takes no parameters", spec);
    return 0;
}

const hs__cops hs__cops_none = {"none",          HS_CODEC_NONE,   dense_init,  dense_unbiased,
                                dense_max_bytes, dense_encode,    dense_decode, dense_apply, NULL,
                                dense_delta, dense_parse, HS__CSIZE_NONE};
const hs__cops hs__cops_fp16 = {"fp16",          HS_CODEC_FP16,   dense_init,  dense_unbiased,
                                dense_max_bytes, dense_encode,    dense_decode, dense_apply, NULL,
                                dense_delta, dense_parse, HS__CSIZE_NONE};
const hs__cops hs__cops_bf16 = {"bf16",          HS_CODEC_BF16,   dense_init,  dense_unbiased,
                                dense_max_bytes, dense_encode,    dense_decode, dense_apply, NULL,
                                dense_delta, dense_parse, HS__CSIZE_NONE};
