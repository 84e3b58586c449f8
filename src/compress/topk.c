/* Top-k: exact selection of the k largest |x_i| (ties to the lower index) in O(d), and its
 * codec. Selection is a radix select on the magnitude bits (hs_cw_key): a histogram of the top
 * 11 bits finds the bin holding the k-th largest key; one more pass takes every element above
 * that bin and collects the bin's elements as candidates; two small histograms over the
 * candidates' remaining 20 bits give the exact threshold key T and how many elements equal to
 * T are taken (the first ones by index). Two passes over x, no sort.
 *
 * Message: header (n = k, flags FP16 / FP8 / BITMAP) | k values (fp32, fp16, or with FP8 an
 * fp32 scale s and k FP8 E4M3 bytes of v / s, in index order) | indices, either as k LEB128
 * gaps (index - previous index, the first from -1, so every gap is >= 1) or as a bitmap of d
 * bits, whichever is smaller for this message.
 *
 * FP8 halves fp16's value bytes. Its one scale per message is max |v| / 448 (E4M3's largest
 * finite value): a top-k set spans a narrow range of magnitudes (all at or above the k-th
 * largest), which E4M3's 16 binades with 3 mantissa bits cover at a relative error of at most
 * 2^-4; what the cast leaves out stays in the sender's error feedback (CHOCO's x - x^). */
#include <math.h>
#include <stdlib.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"

#define H1_BITS 11
#define H1_SHIFT (31 - H1_BITS) /* keys have 31 bits */
#define H1_BINS (1u << H1_BITS)

int hs__topk_scratch_grow(hs__topk_scratch *s, size_t n) {
    if (n <= s->cap) return 0;
    size_t cap = s->cap ? s->cap : 1024;
    while (cap < n) cap *= 2;
    uint32_t *ci = realloc(s->ci, cap * sizeof(uint32_t));
    if (!ci) return hs__err(HS_ENOMEM, "top-k: %zu candidates: out of memory", n);
    s->ci = ci;
    uint32_t *ck = realloc(s->ck, cap * sizeof(uint32_t));
    if (!ck) return hs__err(HS_ENOMEM, "top-k: %zu candidates: out of memory", n);
    s->ck = ck;
    s->cap = cap;
    return 0;
}

void hs__topk_scratch_free(hs__topk_scratch *s) {
    free(s->ci);
    free(s->ck);
    s->ci = s->ck = NULL;
    s->cap = 0;
}

/* The bin of hist[0..nbins) holding the need-th largest element (counting from the top), and
 * how many of that bin's elements are needed. */
static uint32_t find_bin(const uint32_t *hist, uint32_t nbins, size_t need, size_t *need_in) {
    size_t above = 0;
    uint32_t b = nbins - 1;
    for (;; b--) {
        if (above + hist[b] >= need || b == 0) break;
        above += hist[b];
    }
    *need_in = need - above;
    return b;
}

int hs__topk_select(const hs_compressor *c, const float *x, size_t d, size_t k, uint32_t *idx,
                    hs__topk_scratch *s) {
    if (k >= d) {
        if (hs__cmax_key(x, d) >= HS_CW_KEY_INF)
            return hs__cerr_value(c, x, d, HS_CW_KEY_INF, "fp32");
        for (size_t i = 0; i < d; i++) idx[i] = (uint32_t)i;
        return 0;
    }
    /* Pass 1: histogram of the top bits. Two interleaved tables halve the stalls on runs of
     * equal bins. */
    uint32_t h[2][H1_BINS];
    memset(h, 0, sizeof(h));
    size_t i = 0;
    for (; i + 2 <= d; i += 2) {
        h[0][hs_cw_key(x[i]) >> H1_SHIFT]++;
        h[1][hs_cw_key(x[i + 1]) >> H1_SHIFT]++;
    }
    for (; i < d; i++) h[0][hs_cw_key(x[i]) >> H1_SHIFT]++;
    for (uint32_t b = 0; b < H1_BINS; b++) h[0][b] += h[1][b];
    for (uint32_t b = HS_CW_KEY_INF >> H1_SHIFT; b < H1_BINS; b++)
        if (h[0][b]) return hs__cerr_value(c, x, d, HS_CW_KEY_INF, "fp32");
    size_t need;
    uint32_t b1 = find_bin(h[0], H1_BINS, k, &need);
    int err = hs__topk_scratch_grow(s, h[0][b1]);
    if (err < 0) return err;

    /* Pass 2: indices above bin b1 are in; bin b1's elements become candidates. Both lists come
     * out in index order. */
    size_t nd = 0, nc = 0;
    uint32_t *ci = s->ci, *ck = s->ck;
    for (i = 0; i < d; i++) {
        uint32_t key = hs_cw_key(x[i]), hb = key >> H1_SHIFT;
        if (hb > b1) {
            idx[nd++] = (uint32_t)i;
        } else if (hb == b1) {
            ci[nc] = (uint32_t)i;
            ck[nc++] = key & ((1u << H1_SHIFT) - 1u);
        }
    }

    /* The candidates' threshold on the low 20 bits: 10 bits, then 10 more. */
    uint32_t h2[1024];
    memset(h2, 0, sizeof(h2));
    for (size_t j = 0; j < nc; j++) h2[ck[j] >> 10]++;
    size_t need2;
    uint32_t b2 = find_bin(h2, 1024, need, &need2);
    memset(h2, 0, sizeof(h2));
    for (size_t j = 0; j < nc; j++)
        if ((ck[j] >> 10) == b2) h2[ck[j] & 1023u]++;
    size_t ties;
    uint32_t b3 = find_bin(h2, 1024, need2, &ties);
    uint32_t t = b2 << 10 | b3;

    /* Keep the candidates above t and the first `ties` equal to t, in place. */
    size_t nk = 0;
    for (size_t j = 0; j < nc; j++) {
        uint32_t key = ck[j];
        int take = key > t;
        if (key == t && ties) {
            take = 1;
            ties--;
        }
        ci[nk] = ci[j];
        nk += (size_t)take;
    }
    /* Merge the two sorted lists from the back into idx[0..nd + nk). */
    size_t a = nd, bb = nk, o = nd + nk;
    while (bb) {
        if (a && idx[a - 1] > ci[bb - 1])
            idx[--o] = idx[--a];
        else
            idx[--o] = ci[--bb];
    }
    return 0;
}

/* ---------------------------------------------------------------- codec */

static size_t value_width(const hs_compressor *c) {
    return (c->flags & HS__CF_FP8) ? 1 : (c->flags & HS__CF_FP16) ? 2 : 4;
}

/* The value section's bytes: k values, and FP8's scale. */
static size_t value_bytes(const hs_compressor *c) {
    return (size_t)c->k * value_width(c) + ((c->flags & HS__CF_FP8) ? 4 : 0);
}

#define FP8_MAX 448.0f
#define FP8_NAN 0x7Fu /* S.1111.111: E4M3 has no infinity; never sent */

/* E4M3 of m in [0, FP8_MAX], round to nearest even: exact float steps (frexpf, a power-of-two
 * scaling, rintf in the default rounding mode), so every peer computes the same byte. */
static uint8_t fp8_from(float m) {
    if (!(m < FP8_MAX)) return 0x7E; /* 448 */
    if (m < 0x1p-6f) return (uint8_t)rintf(m * 0x1p9f); /* subnormal; 8 is 2^-6 */
    int e;
    float q = rintf((2.0f * frexpf(m, &e) - 1.0f) * 8.0f); /* m = (1 + q/8) 2^(e-1) */
    int ex = e - 1 + 7;
    if (q == 8.0f) {
        q = 0.0f;
        ex++;
    }
    return ex > 15 || (ex == 15 && q > 6.0f) ? 0x7E : (uint8_t)(ex << 3 | (int)q);
}

static float fp8_to(uint8_t b) {
    unsigned ex = (b >> 3) & 15u, m = b & 7u;
    float v = ex ? ldexpf((float)(8u + m), (int)ex - 10) : ldexpf((float)m, -9);
    return (b & 0x80u) ? -v : v;
}

/* Value j of a value section (checked) in format w (the value width: 1 is FP8, after s). */
static inline float get_value(const uint8_t *vals, size_t w, float s, size_t j) {
    return w == 1   ? s * fp8_to(vals[4 + j])
           : w == 2 ? hs_cw_f32_from_f16(hs__ld16(vals + 2 * j))
                    : hs__ldf(vals + 4 * j);
}

static size_t bitmap_bytes(size_t d) { return (d + 7) / 8; }

static size_t varint_len(uint32_t v) {
    return 1u + (v >= 1u << 7) + (v >= 1u << 14) + (v >= 1u << 21) + (v >= 1u << 28);
}

static int topk_init(hs_compressor *c) {
    if (!(c->idx = malloc(c->k * sizeof(uint32_t))))
        return hs__err(HS_ENOMEM, "compressor %s: out of memory", c->name);
    return 0;
}

static int topk_unbiased(const hs_compressor *c) {
    (void)c;
    return 0;
}

/* The d - k dropped elements are the smallest, so they hold at most (1 - k/d) of ||x||^2; fp16
 * values add a relative error of at most u on the k kept ones (fp8: on those in E4M3's normal
 * range, down to 2^-15 of the largest). */
static double topk_delta(const hs_compressor *c) {
    double keep = (double)c->k / (double)c->d;
    double u = (c->flags & HS__CF_FP16) ? HS__FP16_U : (c->flags & HS__CF_FP8) ? HS__FP8_U : 0;
    return keep * (1.0 - u * u);
}

static size_t topk_max_bytes(const hs_compressor *c) {
    size_t delta = (size_t)c->k * 5, bm = bitmap_bytes(c->d);
    return HS__CHDR + value_bytes(c) + (bm < delta ? bm : delta);
}

/* FP8's section: the scale, then the k bytes. The inputs are finite (the selection's check). A
 * scale that underflows to 0 sends zeros: values below 448 times the least float. The scale
 * keeps 448 s finite (what a decode checks), rounding down where max |v| / 448 rounded up. */
static void put_fp8(const uint32_t *idx, const float *src, int gather, size_t k, uint8_t *v) {
    float mx = 0.0f;
    for (size_t j = 0; j < k; j++) mx = fmaxf(mx, fabsf(gather ? src[idx[j]] : src[j]));
    float s = mx / FP8_MAX;
    if (!isfinite(s * FP8_MAX)) s = nextafterf(s, 0.0f);
    hs__stf(v, s);
    for (size_t j = 0; j < k; j++) {
        float f = gather ? src[idx[j]] : src[j];
        uint8_t b = s > 0.0f ? fp8_from(fabsf(f) / s) : 0;
        v[4 + j] = (uint8_t)(b | (signbit(f) ? 0x80u : 0u));
    }
}

/* Writes the k values (fp32, fp16 or fp8); value j is src[idx[j]] (gather) or src[j]. */
static int put_values(const hs_compressor *c, const uint32_t *idx, const float *src, int gather,
                      size_t k, uint8_t *v) {
    if (c->flags & HS__CF_FP8) {
        put_fp8(idx, src, gather, k, v);
        return 0;
    }
    int fp16 = (c->flags & HS__CF_FP16) != 0;
    uint32_t limit = fp16 ? HS_CW_F16_OVERFLOW : HS_CW_KEY_INF;
    for (size_t j = 0; j < k; j++) {
        float f = gather ? src[idx[j]] : src[j];
        if (hs_cw_key(f) >= limit)
            return hs__err(HS_ERANGE, "compressor %s: element %u = %g does not fit %s", c->name,
                           idx[j], (double)f, fp16 ? "fp16" : "fp32");
        if (fp16)
            hs__st16(v + 2 * j, hs_cw_f16_from_f32(f));
        else
            hs__stf(v + 4 * j, f);
    }
    return 0;
}

/* Writes the index section of sorted idx[0..k) (the smaller coding) to dst; its length to *n. */
static void put_indices(const uint32_t *idx, size_t k, size_t d, uint8_t *dst, size_t *n,
                        int *bitmap) {
    size_t delta = 0;
    int64_t prev = -1;
    for (size_t j = 0; j < k; j++) {
        delta += varint_len((uint32_t)((int64_t)idx[j] - prev));
        prev = idx[j];
    }
    size_t bm = bitmap_bytes(d);
    if (bm < delta) {
        memset(dst, 0, bm);
        for (size_t j = 0; j < k; j++) dst[idx[j] >> 3] |= (uint8_t)(1u << (idx[j] & 7));
        *n = bm;
        *bitmap = 1;
        return;
    }
    uint8_t *o = dst;
    prev = -1;
    for (size_t j = 0; j < k; j++) {
        uint32_t g = (uint32_t)((int64_t)idx[j] - prev);
        prev = idx[j];
        while (g >= 0x80) {
            *o++ = (uint8_t)(g | 0x80);
            g >>= 7;
        }
        *o++ = (uint8_t)g;
    }
    *n = delta;
    *bitmap = 0;
}

int hs__topk_pack(const hs_compressor *c, const uint32_t *idx, const float *src, int gather,
                  uint8_t *dst, size_t *n) {
    size_t vbytes = value_bytes(c), ibytes;
    int err = put_values(c, idx, src, gather, c->k, dst + HS__CHDR);
    if (err < 0) return err;
    int bitmap;
    put_indices(idx, c->k, c->d, dst + HS__CHDR + vbytes, &ibytes, &bitmap);
    hs__chdr_put(dst, HS_CODEC_TOPK,
                 (c->flags & (HS__CF_FP16 | HS__CF_FP8)) | (bitmap ? HS__CF_BITMAP : 0u), 0,
                 (uint32_t)c->d, c->k);
    *n = HS__CHDR + vbytes + ibytes;
    return 0;
}

static int topk_encode(hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                       uint8_t *dst, size_t *n) {
    (void)peer;
    (void)round;
    int err = hs__topk_select(c, x, c->d, c->k, c->idx, &c->sel);
    if (err < 0) return err;
    return hs__topk_pack(c, c->idx, x, 1, dst, n);
}

/* Reads one canonical LEB128 value of at most 32 bits (5 bytes, the last < 0x10) from
 * p[*pos..len). */
static int get_varint(const hs_compressor *c, const uint8_t *p, size_t len, size_t *pos,
                      size_t j, uint32_t *out) {
    uint32_t v = 0;
    for (int sh = 0;; sh += 7) {
        if (*pos >= len)
            return hs__err(HS_EFORMAT, "%s message: truncated in the gap of index %zu",
                           c->ops->name, j);
        uint8_t byte = p[(*pos)++];
        if (sh == 28 && byte > 0x0F)
            return hs__err(HS_EFORMAT, "%s message: gap of index %zu exceeds 32 bits",
                           c->ops->name, j);
        v |= (uint32_t)(byte & 0x7F) << sh;
        if (!(byte & 0x80)) {
            if (byte == 0 && sh > 0)
                return hs__err(HS_EFORMAT, "%s message: gap of index %zu is not minimally encoded",
                               c->ops->name, j);
            *out = v;
            return 0;
        }
    }
}

/* Checks an index section completely: k strictly increasing indices below d, exact length. */
static int check_indices(const hs_compressor *c, const uint8_t *p, size_t len, int bitmap,
                         size_t k) {
    size_t d = c->d;
    if (bitmap) {
        if ((size_t)len != bitmap_bytes(d))
            return hs__clen_check(c, len, bitmap_bytes(d), "the index bitmap");
        size_t pop = 0;
        for (size_t i = 0; i < len; i++) pop += (size_t)__builtin_popcount(p[i]);
        if (d % 8 && (p[len - 1] >> (d % 8)))
            return hs__err(HS_EFORMAT, "%s message: index bitmap has bits set past d = %zu "
                                       "(index out of range)",
                           c->ops->name, d);
        if (pop != k)
            return hs__err(HS_EFORMAT, "%s message: index bitmap holds %zu indices, count is %zu",
                           c->ops->name, pop, k);
        return 0;
    }
    size_t pos = 0;
    int64_t prev = -1;
    for (size_t j = 0; j < k; j++) {
        uint32_t g = 0;
        int err = get_varint(c, p, len, &pos, j, &g);
        if (err < 0) return err;
        if (g == 0)
            return hs__err(HS_EFORMAT, "%s message: index %zu repeats index %lld (gap 0; "
                                       "indices must increase)",
                           c->ops->name, j, (long long)prev);
        int64_t at = prev + (int64_t)g;
        if (at >= (int64_t)d)
            return hs__err(HS_EFORMAT, "%s message: index %zu = %lld is out of range (d = %zu)",
                           c->ops->name, j, (long long)at, d);
        prev = at;
    }
    if (pos != len)
        return hs__err(HS_EFORMAT, "%s message: %zu trailing bytes after %zu index gaps",
                       c->ops->name, len - pos, k);
    return 0;
}

/* Index j of a checked index section, in order, through a cursor. */
typedef struct idx_cursor {
    const uint8_t *p;
    size_t pos, len;
    int bitmap;
    int64_t prev;
    uint64_t word; /* bitmap: remaining bits of the current 64-bit word */
    size_t wbase;  /* bitmap: index of bit 0 of `word` */
} idx_cursor;

static uint32_t cursor_next(idx_cursor *cu) {
    if (!cu->bitmap) {
        uint32_t v = 0;
        for (int sh = 0;; sh += 7) {
            uint8_t byte = cu->p[cu->pos++];
            v |= (uint32_t)(byte & 0x7F) << sh;
            if (!(byte & 0x80)) break;
        }
        cu->prev += v;
        return (uint32_t)cu->prev;
    }
    while (!cu->word) {
        cu->wbase += 64;
        size_t n = cu->len - cu->wbase / 8 < 8 ? cu->len - cu->wbase / 8 : 8;
        uint64_t w = 0;
        for (size_t b = 0; b < n; b++) w |= (uint64_t)cu->p[cu->wbase / 8 + b] << (8 * b);
        cu->word = w;
    }
    uint32_t at = (uint32_t)(cu->wbase + (size_t)__builtin_ctzll(cu->word));
    cu->word &= cu->word - 1;
    return at;
}

/* acc[i] += alpha v_i, and acc2[i] += alpha2 v_i when acc2 is non-NULL, for the message's
 * (index, value) pairs: one walk of the indices for both. */
static void sparse_add(const uint8_t *ip, size_t ilen, int bitmap, const uint8_t *vals, size_t w,
                       size_t k, float *acc, float alpha, float *acc2, float alpha2) {
    idx_cursor cu = {ip, 0, ilen, bitmap, -1, 0, (size_t)0 - 64};
    float s = w == 1 ? hs__ldf(vals) : 0.0f;
    for (size_t j = 0; j < k; j++) {
        uint32_t at = cursor_next(&cu);
        float v = get_value(vals, w, s, j);
        acc[at] = acc[at] + alpha * v;
        if (acc2) acc2[at] = acc2[at] + alpha2 * v;
    }
}

/* Checks a whole message: header, values (finite), indices (increasing, in range, exactly k);
 * on success *vals, *ip, *ilen and *flags locate its sections. */
static int topk_check(const hs_compressor *c, const uint8_t *p, size_t len,
                      const uint8_t **vals_out, const uint8_t **ip_out, size_t *ilen_out,
                      uint32_t *flags_out) {
    uint32_t d = (uint32_t)c->d, flags;
    hs__chdr_want want = {HS__CF_FP16 | HS__CF_FP8 | HS__CF_BITMAP, HS__CF_FP16 | HS__CF_FP8,
                          0, 0, 0, c->k, 1, d, "parameter", "count k"};
    int err = hs__chdr_check(c, p, len, &want, &flags);
    if (err < 0) return err;
    size_t k = c->k, w = value_width(c), vbytes = value_bytes(c);
    if (len - HS__CHDR < vbytes)
        return hs__err(HS_EFORMAT, "%s message: truncated: %zu bytes, %zu values need %zu",
                       c->ops->name, len, k, HS__CHDR + vbytes);
    const uint8_t *vals = p + HS__CHDR, *ip = vals + vbytes;
    size_t ilen = len - HS__CHDR - vbytes;
    if ((err = check_indices(c, ip, ilen, (flags & HS__CF_BITMAP) != 0, k)) < 0)
        return err;
    if (w == 1) {
        uint32_t sb = hs__ld32(vals);
        /* the sign bit too: a scale is >= 0; and every value it scales is finite */
        if (sb >= HS_CW_KEY_INF || !isfinite(hs__ldf(vals) * FP8_MAX))
            return hs__err(HS_EFORMAT, "%s message: fp8 scale 0x%08x is not a number in "
                                       "[0, FLT_MAX / 448]",
                           c->ops->name, sb);
        for (size_t j = 0; j < k; j++)
            if ((vals[4 + j] & 0x7Fu) == FP8_NAN)
                return hs__err(HS_EFORMAT, "%s message: fp8 value %zu is NaN", c->ops->name, j);
    } else if (w == 4 ? hs__cf32_max_key(vals, k) >= HS_CW_KEY_INF
                      : hs__c16_max_mag(vals, k) >= 0x7C00) {
        return hs__err(HS_EFORMAT, "%s message: a value is not finite", c->ops->name);
    }
    *vals_out = vals;
    *ip_out = ip;
    *ilen_out = ilen;
    *flags_out = flags;
    return 0;
}

static int topk_decode2(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                        uint64_t round, float *acc, float alpha, float *acc2, float alpha2) {
    (void)peer;
    (void)round;
    const uint8_t *vals, *ip;
    size_t ilen;
    uint32_t flags;
    int err = topk_check(c, p, len, &vals, &ip, &ilen, &flags);
    if (err < 0) return err;
    sparse_add(ip, ilen, (flags & HS__CF_BITMAP) != 0, vals, value_width(c), c->k, acc, alpha,
               acc2, alpha2);
    return 0;
}

int hs__topk_unpack(const hs_compressor *c, const uint8_t *p, size_t len, float alpha,
                    uint32_t *idx, float *val) {
    const uint8_t *vals, *ip;
    size_t ilen;
    uint32_t flags;
    int err = topk_check(c, p, len, &vals, &ip, &ilen, &flags);
    if (err < 0) return err;
    idx_cursor cu = {ip, 0, ilen, (flags & HS__CF_BITMAP) != 0, -1, 0, (size_t)0 - 64};
    size_t w = value_width(c);
    float s = w == 1 ? hs__ldf(vals) : 0.0f;
    for (size_t j = 0; j < c->k; j++) {
        idx[j] = cursor_next(&cu);
        float v = get_value(vals, w, s, j);
        val[j] = alpha * v; /* sparse_add's product: acc + val[j] is its sum */
    }
    return 0;
}

static int topk_decode(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                       uint64_t round, float *acc, float alpha) {
    return topk_decode2(c, p, len, peer, round, acc, alpha, NULL, 0.0f);
}

static int topk_apply(const hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                      float *out) {
    (void)peer;
    (void)round;
    hs__topk_scratch s = {0};
    uint32_t *idx = malloc(c->k * sizeof(uint32_t));
    int err = idx ? 0 : hs__err(HS_ENOMEM, "compressor %s: out of memory", c->name);
    if (err == 0) err = hs__topk_select(c, x, c->d, c->k, idx, &s);
    for (size_t j = 0; err == 0 && (c->flags & HS__CF_FP16) && j < c->k; j++)
        if (hs_cw_key(x[idx[j]]) >= HS_CW_F16_OVERFLOW)
            err = hs__err(HS_ERANGE, "compressor %s: element %u = %g does not fit fp16", c->name,
                          idx[j], (double)x[idx[j]]);
    uint8_t *v8 = NULL; /* fp8: the section as sent, read back as a decode reads it */
    if (err == 0 && (c->flags & HS__CF_FP8)) {
        if (!(v8 = malloc(4 + (size_t)c->k)))
            err = hs__err(HS_ENOMEM, "compressor %s: out of memory", c->name);
        else
            put_fp8(idx, x, 1, c->k, v8);
    }
    if (err == 0) {
        memset(out, 0, c->d * sizeof(float));
        for (size_t j = 0; j < c->k; j++) {
            float f = x[idx[j]];
            out[idx[j]] = v8                         ? get_value(v8, 1, hs__ldf(v8), j)
                          : (c->flags & HS__CF_FP16) ? hs_cw_f32_from_f16(hs_cw_f16_from_f32(f))
                                                     : f;
        }
    }
    free(v8);
    free(idx);
    hs__topk_scratch_free(&s);
    return err;
}

/* topk:K[:fp16|:fp8]: K a count or a fraction of d. */
static int topk_parse(hs_compressor *c, const char *spec, const hs__cfield *f, int n) {
    return hs__cparse_sparse(c, spec, f, n, HS__CF_FP16 | HS__CF_FP8);
}

const hs__cops hs__cops_topk = {"topk",         HS_CODEC_TOPK, topk_init,   topk_unbiased,
                                topk_max_bytes, topk_encode,   topk_decode, topk_apply,
                                topk_decode2, topk_delta, topk_parse, HS__CSIZE_KEPT};
