/* Compressor objects: the table of operators, the ef: prefix and the operator's name, the
 * error-feedback wrapper, and dispatch to the operators' tables (what the operators share is in
 * codec.c, below them). Threading as in
 * hearsay/compress.h: encode needs exclusive access, everything else only reads. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"

static const hs__cops *const all_ops[] = {
    &hs__cops_none, &hs__cops_fp16,  &hs__cops_bf16, &hs__cops_topk,
    &hs__cops_randk, &hs__cops_qsgd, &hs__cops_sign,
};
#define N_OPS (sizeof(all_ops) / sizeof(all_ops[0]))

static const char *codec_name(unsigned id) {
    for (size_t i = 0; i < N_OPS; i++)
        if ((unsigned)all_ops[i]->id == id) return all_ops[i]->name;
    return NULL;
}

/* ---------------------------------------------------------------- spec parsing */

const char *hs_compressor_spec_more(const char *spec, char *buf, size_t cap) {
    if (!spec) return NULL;
    const char *ef = !strncmp(spec, "ef:", 3) ? "ef:" : "";
    const char *kind = spec + strlen(ef), *colon = strchr(kind, ':');
    if (!colon) return NULL;
    int kl = (int)(colon - kind), size = HS__CSIZE_NONE;
    for (size_t i = 0; i < N_OPS; i++)
        if ((size_t)kl == strlen(all_ops[i]->name) && !strncmp(kind, all_ops[i]->name, (size_t)kl))
            size = all_ops[i]->size_param;
    char *end;
    double v = strtod(colon + 1, &end);
    if (size == HS__CSIZE_NONE || end == colon + 1 || !(v > 0)) return NULL;
    /* A kept fraction (0.01, 1.0) stops at all of it; a count or a number of levels does not. */
    int fraction = size == HS__CSIZE_KEPT &&
                   (v < 1 || memchr(colon + 1, '.', (size_t)(end - colon - 1)));
    double more = fraction && 4 * v > 1 ? 1 : 4 * v;
    snprintf(buf, cap, "%s%.*s:%g%s", ef, kl, kind, more, end);
    return buf;
}

/* Splits spec at ':' into at most 4 fields. */
static int split(const char *s, hs__cfield *f, int max) {
    int n = 0;
    for (;;) {
        const char *e = strchr(s, ':');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        if (n == max) return -1;
        f[n].s = s;
        f[n].len = len;
        n++;
        if (!e) return n;
        s = e + 1;
    }
}

/* The ef: prefix and the operator's name here; its parameters in its own file (ops->parse). */
static int parse_spec(hs_compressor *c, const char *spec) {
    const char *s = spec;
    if (strncmp(s, "ef:", 3) == 0) {
        c->ef = 1;
        s += 3;
    }
    hs__cfield f[4];
    int n = split(s, f, 4);
    if (n < 0) return hs__err(HS_EINVAL, "compressor \"%s\": too many ':' fields", spec);
    const hs__cops *ops = NULL;
    for (size_t i = 0; i < N_OPS; i++)
        if (hs__cfield_is(&f[0], all_ops[i]->name)) ops = all_ops[i];
    if (!ops)
        return hs__err(HS_EINVAL,
                       "compressor \"%s\": unknown operator \"%.*s\" (none, fp16, bf16, topk, "
                       "randk, qsgd, sign, with an optional ef: prefix)",
                       spec, (int)f[0].len, f[0].s);
    c->ops = ops;
    snprintf(c->name, sizeof(c->name), "%s%s", c->ef ? "ef:" : "", ops->name);
    return ops->parse(c, spec, f, n);
}

/* ---------------------------------------------------------------- objects */

int hs_compressor_new(hs_compressor **out, const char *spec, size_t d, uint64_t seed) {
    hs_compressor *c = NULL;
    int err;
    if (!spec) return hs__err(HS_EINVAL, "compressor: no spec");
    if (d < 1 || d > HS_COMPRESS_MAX_D)
        return hs__err(HS_EINVAL, "compressor \"%s\": d = %zu is not in 1..%zu (the message "
                                  "header's 32-bit length)",
                       spec, d, HS_COMPRESS_MAX_D);
    if (!(c = calloc(1, sizeof(*c)))) return hs__err(HS_ENOMEM, "compressor: out of memory");
    c->d = d;
    c->seed = seed;
    if ((err = parse_spec(c, spec)) < 0) goto fail;
    if ((err = c->ops->init(c)) < 0) goto fail;
    if (c->ef) {
        c->residual = calloc(d, sizeof(float));
        c->ef_tmp = malloc(d * sizeof(float));
        if (!c->residual || !c->ef_tmp) {
            err = hs__err(HS_ENOMEM, "compressor \"%s\": residual of %zu floats: out of memory",
                          spec, d);
            goto fail;
        }
    }
    *out = c;
    return 0;
fail:
    hs_compressor_free(c);
    return err;
}

void hs_compressor_free(hs_compressor *c) {
    if (!c) return;
    free(c->residual);
    free(c->ef_tmp);
    free(c->idx);
    hs__topk_scratch_free(&c->sel);
    free(c->aux);
    free(c);
}

const char *hs_compressor_name(const hs_compressor *c) { return c->name; }

int hs_compressor_unbiased(const hs_compressor *c) { return !c->ef && c->ops->unbiased(c); }

/* An ef: wrapper's messages are its operator's applied to x + e, so its delta is the
 * operator's. */
double hs_compressor_delta(const hs_compressor *c) { return c->ops->delta(c); }

int hs_compressor_contractive(const hs_compressor *c) { return hs_compressor_delta(c) > 0.0; }

float hs__compress_replica_scale(const hs_compressor *c) {
    double w = !c->ef && c->ops == &hs__cops_qsgd ? hs__qsgd_flat_error(c) : 0.0;
    return w >= 1.0 ? (float)(1.0 / (1.0 + w)) : 1.0f;
}

hs_codec_id hs_compressor_codec(const hs_compressor *c) { return c->ops->id; }

size_t hs_compressor_dim(const hs_compressor *c) { return c->d; }

size_t hs_compressor_count(const hs_compressor *c) {
    return (c->ops->id == HS_CODEC_TOPK || c->ops->id == HS_CODEC_RANDK) ? c->k : c->d;
}

const float *hs_compressor_residual(const hs_compressor *c) { return c->residual; }

void hs_compressor_reset(hs_compressor *c) {
    if (c->residual) memset(c->residual, 0, c->d * sizeof(float));
}

size_t hs_compress_max_bytes(const hs_compressor *c, size_t d) {
    return d == c->d ? c->ops->max_bytes(c) : 0;
}

/* ---------------------------------------------------------------- encode / decode */

int hs_compress_encode(hs_compressor *c, const float *x, size_t d, uint32_t peer, uint64_t round,
                       hs_buf *out) {
    if (d != c->d)
        return hs__err(HS_EINVAL, "compressor %s: encode of %zu floats, configured for %zu",
                       c->name, d, c->d);
    size_t max = c->ops->max_bytes(c), n = 0, len0 = out->len;
    int err = hs_buf_reserve(out, len0 + max);
    if (err < 0) return err;
    uint8_t *dst = out->data + len0;
    if (!c->ef) {
        err = c->ops->encode(c, x, peer, round, dst, &n);
        if (err < 0) return err;
    } else {
        /* x' = x + e; q = C(x'); e = x' - C(x'), the last step by decoding q itself, so the
         * residual holds exactly what the receivers did not get. */
        float *xp = c->ef_tmp;
        const float *e = c->residual;
        for (size_t i = 0; i < d; i++) xp[i] = x[i] + e[i];
        err = c->ops->encode(c, xp, peer, round, dst, &n);
        if (err < 0) return hs__err_prefix(err, "compressor %s (error feedback)", c->name);
        err = c->ops->decode(c, dst, n, peer, round, xp, -1.0f);
        if (err < 0) return hs__err_prefix(err, "compressor %s: decoding its own message",
                                           c->name);
        c->ef_tmp = c->residual;
        c->residual = xp;
    }
    out->len = len0 + n;
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* Whose message p is: named from the table of operators, which the operators' own header check
 * (hs__chdr_check, below them) cannot see. */
int hs__ccheck_codec(const hs_compressor *c, const uint8_t *p, size_t len) {
    if (len < HS__CHDR)
        return hs__err(HS_EFORMAT, "%s message: truncated: %zu bytes, the header needs %d",
                       c->ops->name, len, HS__CHDR);
    const char *other = codec_name(p[0]);
    if (!other) return hs__err(HS_EFORMAT, "%s message: unknown codec id %u", c->ops->name, p[0]);
    if (p[0] != (uint8_t)c->ops->id)
        return hs__err(HS_EMISMATCH, "message of codec %s (id %u), this peer expects %s (id %u)",
                       other, p[0], c->ops->name, (unsigned)c->ops->id);
    return 0;
}

int hs__compress_values_raw(const hs_compressor *c) {
    return c->ops->id == HS_CODEC_NONE && !c->residual;
}

int hs__compress_f32_values(const hs_compressor *c, const uint8_t *p, size_t len,
                            const uint8_t **values) {
    if (!hs__compress_values_raw(c))
        return hs__err(HS_EINVAL, "compressor %s: its messages are not the values themselves",
                       c->name);
    int err = hs__ccheck_codec(c, p, len);
    if (err == 0) err = hs__dense_check(c, p, len);
    if (err == 0) *values = p + HS__CHDR;
    return err;
}

int hs__compress_f32_head(const hs_compressor *c, const uint8_t *hdr, size_t len) {
    if (!hs__compress_values_raw(c))
        return hs__err(HS_EINVAL, "compressor %s: its messages are not the values themselves",
                       c->name);
    int err = hs__ccheck_codec(c, hdr, len);
    return err < 0 ? err : hs__dense_check_head(c, hdr, len);
}

int hs__compress_f32_check(const hs_compressor *c, const uint8_t *v, size_t n, size_t first) {
    return hs__dense_check_f32(c, v, n, first);
}

int hs_compress_decode_add(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                           uint64_t round, float *acc, size_t d, float alpha) {
    int err = hs__cdecode_args(c, d, alpha);
    if (err == 0) err = hs__ccheck_codec(c, p, len);
    return err < 0 ? err : c->ops->decode(c, p, len, peer, round, acc, alpha);
}

int hs_compress_decode_add2(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                            uint64_t round, float *acc, float alpha, float *acc2, float alpha2,
                            size_t d) {
    int err = hs__cdecode_args(c, d, alpha2);
    if (err < 0) return err;
    if (c->ops->decode2) {
        if ((err = hs__cdecode_args(c, d, alpha)) < 0 || (err = hs__ccheck_codec(c, p, len)) < 0)
            return err;
        return c->ops->decode2(c, p, len, peer, round, acc, alpha, acc2, alpha2);
    }
    err = hs_compress_decode_add(c, p, len, peer, round, acc, d, alpha);
    /* The first decode validated the message: the second cannot fail on its bytes. */
    return err < 0 ? err : hs_compress_decode_add(c, p, len, peer, round, acc2, d, alpha2);
}

int hs_compress_apply(const hs_compressor *c, const float *x, size_t d, uint32_t peer,
                      uint64_t round, float *out) {
    if (d != c->d)
        return hs__err(HS_EINVAL, "compressor %s: apply to %zu floats, configured for %zu",
                       c->name, d, c->d);
    return c->ops->apply(c, x, peer, round, out);
}
