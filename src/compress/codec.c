/* What every compression operator shares, below them all: the fields of a spec and the canonical
 * name, the argument checks of a decode, the message header every codec writes and checks, and
 * the error for a value that does not fit. compress.c (the table of operators and the public
 * entries) sits above the operators; the operators use only this file. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"

/* ---------------------------------------------------------------- spec parsing */

int hs__cparse_count(const hs__cfield *f, uint64_t *v) {
    const char *s = f->s;
    size_t len = f->len;
    if (len == 0 || len > 12) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        x = x * 10 + (uint64_t)(s[i] - '0');
    }
    *v = x;
    return 0;
}

int hs__cparse_k(hs_compressor *c, const char *spec, const hs__cfield *f) {
    const char *s = f->s;
    size_t len = f->len;
    uint64_t v;
    if (hs__cparse_count(f, &v) == 0) {
        if (v < 1 || v > c->d)
            return hs__err(HS_EINVAL, "compressor \"%s\": count %.*s is not in 1..%zu (d)", spec,
                           (int)len, s, c->d);
        c->k = (uint32_t)v;
        c->frac = 0;
        return 0;
    }
    char buf[40];
    if (len >= sizeof(buf) ||
        (!memchr(s, '.', len) && !memchr(s, 'e', len) && !memchr(s, 'E', len)))
        return hs__err(HS_EINVAL, "compressor \"%s\": \"%.*s\" is neither a count nor a fraction",
                       spec, (int)len, s);
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    double fr = strtod(buf, &end);
    if (*end || errno || !(fr > 0.0 && fr <= 1.0))
        return hs__err(HS_EINVAL, "compressor \"%s\": fraction \"%s\" is not in (0, 1]", spec,
                       buf);
    double kk = nearbyint(fr * (double)c->d);
    c->k = kk < 1.0 ? 1u : kk > (double)c->d ? (uint32_t)c->d : (uint32_t)kk;
    c->frac = fr;
    return 0;
}

/* Shortest %g spelling of f that reads back as f, so the canonical name is exact; always with
 * a '.' or an exponent, so that it reads back as a fraction ("1.0", not the count "1"). */
static void fmt_frac(char *buf, size_t n, double f) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, f);
        if (strtod(buf, NULL) == f) break;
    }
    if (!strpbrk(buf, ".e")) strncat(buf, ".0", n - strlen(buf) - 1);
}

void hs__cname_append(hs_compressor *c, const char *fmt, ...) {
    size_t len = strlen(c->name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name + len, sizeof(c->name) - len, fmt, ap);
    va_end(ap);
}

void hs__cname_append_k(hs_compressor *c) {
    char kb[40];
    if (c->frac > 0)
        fmt_frac(kb, sizeof(kb), c->frac);
    else
        snprintf(kb, sizeof(kb), "%u", c->k);
    hs__cname_append(c, ":%s", kb);
}

int hs__cparse_sparse(hs_compressor *c, const char *spec, const hs__cfield *f, int n,
                      uint32_t options) {
    if (n < 2)
        return hs__err(HS_EINVAL, "compressor \"%s\": needs k (%.*s:0.01 or %.*s:500)", spec,
                       (int)f[0].len, f[0].s, (int)f[0].len, f[0].s);
    int err = hs__cparse_k(c, spec, &f[1]);
    if (err < 0) return err;
    static const struct {
        uint32_t flag;
        const char *word;
    } opts[] = {{HS__CF_FP16, "fp16"}, {HS__CF_FP8, "fp8"}, {HS__CF_UNSCALED, "unscaled"}};
    for (int i = 2; i < n; i++) {
        uint32_t flag = 0;
        for (size_t j = 0; j < sizeof(opts) / sizeof(opts[0]); j++)
            if ((options & opts[j].flag) && hs__cfield_is(&f[i], opts[j].word)) flag = opts[j].flag;
        if (!flag || (c->flags & flag))
            return hs__err(HS_EINVAL, "compressor \"%s\": unknown or repeated option \"%.*s\"",
                           spec, (int)f[i].len, f[i].s);
        c->flags |= flag;
    }
    if ((c->flags & HS__CF_FP16) && (c->flags & HS__CF_FP8))
        return hs__err(HS_EINVAL, "compressor \"%s\": fp16 and fp8 exclude each other", spec);
    hs__cname_append_k(c);
    hs__cname_append(c, "%s%s%s", (c->flags & HS__CF_FP16) ? ":fp16" : "",
                     (c->flags & HS__CF_FP8) ? ":fp8" : "",
                     (c->flags & HS__CF_UNSCALED) ? ":unscaled" : "");
    return 0;
}

int hs__cfield_is(const hs__cfield *f, const char *word) {
    return f->len == strlen(word) && memcmp(f->s, word, f->len) == 0;
}

/* ---------------------------------------------------------------- decode */

int hs__cdecode_args(const hs_compressor *c, size_t d, float alpha) {
    if (d != c->d)
        return hs__err(HS_EINVAL, "compressor %s: decode into %zu floats, configured for %zu",
                       c->name, d, c->d);
    if (!isfinite(alpha))
        return hs__err(HS_EINVAL, "compressor %s: decode with alpha = %g", c->name,
                       (double)alpha);
    return 0;
}

/* ---------------------------------------------------------------- header */

void hs__chdr_put(uint8_t *p, hs_codec_id id, uint32_t flags, uint32_t param, uint32_t d,
                  uint32_t n) {
    p[0] = (uint8_t)id;
    p[1] = (uint8_t)flags;
    hs__st16(p + 2, (uint16_t)param);
    hs__st32(p + 4, d);
    hs__st32(p + 8, n);
}

int hs__chdr_check(const hs_compressor *c, const uint8_t *p, size_t len,
                   const hs__chdr_want *want, uint32_t *flags) {
    if (len < HS__CHDR)
        return hs__err(HS_EFORMAT, "%s message: truncated: %zu bytes, the header needs %d",
                       c->ops->name, len, HS__CHDR);
    /* hs_compress_decode_add names a foreign codec; this is the operator's own guard. */
    if (p[0] != (uint8_t)c->ops->id)
        return hs__err(HS_EMISMATCH, "message of codec id %u, this peer expects %s (id %u)",
                       p[0], c->ops->name, (unsigned)c->ops->id);
    uint32_t fl = p[1], param = hs__ld16(p + 2), d = hs__ld32(p + 4), n = hs__ld32(p + 8);
    if (fl & ~want->legal_flags)
        return hs__err(HS_EFORMAT, "%s message: undefined flag bits 0x%02x", c->ops->name,
                       fl & ~want->legal_flags);
    if (d != c->d)
        return hs__err(HS_EMISMATCH, "%s message: d = %u, this peer expects %zu", c->ops->name,
                       d, c->d);
    if (param < want->param_min || param > want->param_max)
        return hs__err(HS_EFORMAT, "%s message: %s = %u is not in %u..%u", c->ops->name,
                       want->param_name, param, want->param_min, want->param_max);
    if (n < want->n_min || n > want->n_max)
        return hs__err(HS_EFORMAT, "%s message: %s = %u is not in %u..%u", c->ops->name,
                       want->n_name, n, want->n_min, want->n_max);
    if ((fl & want->config_flags) != (c->flags & want->config_flags))
        return hs__err(HS_EMISMATCH, "%s message: flags 0x%02x, this peer expects 0x%02x "
                                     "(value format or scaling differs)",
                       c->ops->name, fl & want->config_flags, c->flags & want->config_flags);
    if (param != want->param)
        return hs__err(HS_EMISMATCH, "%s message: %s = %u, this peer expects %u", c->ops->name,
                       want->param_name, param, want->param);
    if (n != want->n)
        return hs__err(HS_EMISMATCH, "%s message: %s = %u, this peer expects %u", c->ops->name,
                       want->n_name, n, want->n);
    *flags = fl;
    return 0;
}

int hs__clen_check(const hs_compressor *c, size_t have, size_t want, const char *what) {
    if (have < want)
        return hs__err(HS_EFORMAT, "%s message: truncated: %zu bytes, %s needs %zu",
                       c->ops->name, have, what, want);
    if (have > want)
        return hs__err(HS_EFORMAT, "%s message: %zu trailing bytes after %s (%zu bytes)",
                       c->ops->name, have - want, what, want);
    return 0;
}

int hs__cerr_value(const hs_compressor *c, const float *x, size_t d, uint32_t limit_key,
                   const char *format) {
    for (size_t i = 0; i < d; i++) {
        uint32_t k = hs_cw_key(x[i]);
        if (k >= limit_key) {
            if (k >= HS_CW_KEY_INF)
                return hs__err(HS_ERANGE, "compressor %s: element %zu is not finite (%g)",
                               c->name, i, (double)x[i]);
            return hs__err(HS_ERANGE, "compressor %s: element %zu = %g does not fit %s", c->name,
                           i, (double)x[i], format);
        }
    }
    return hs__err(HS_ERANGE, "compressor %s: a value does not fit %s", c->name, format);
}
