/* Decoders reject malformed messages, each with its error code and a message, and leave the
 * destination unchanged: truncation, trailing bytes, header fields that are out of bounds or of
 * another configuration, non-finite values, indices out of range / repeated / badly coded,
 * levels above s, nonzero padding, and random corruption. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"
#include "util.h"

static hs_compressor *mk(const char *spec, size_t d, uint64_t seed) {
    hs_compressor *c = NULL;
    int err = hs_compressor_new(&c, spec, d, seed);
    if (err < 0) fprintf(stderr, "%s: %s\n", spec, hs_error_message());
    assert_int_equal(err, 0);
    return c;
}

/* A valid message of c for a Gaussian x; owned by the caller (free). */
static uint8_t *msg_of(hs_compressor *c, uint32_t peer, uint64_t round, size_t *len) {
    size_t d = hs_compressor_dim(c);
    float *x = test_vec(d, 31, VEC_GAUSS);
    hs_buf *b = NULL;
    assert_int_equal(hs_buf_new(&b, 0), 0);
    int n = hs_compress_encode(c, x, d, peer, round, b);
    assert_true(n > 0);
    uint8_t *m = malloc((size_t)n + 16);
    memcpy(m, b->data, (size_t)n);
    hs_buf_unref(b);
    free(x);
    *len = (size_t)n;
    return m;
}

/* Decodes and checks the outcome: code 0 (accepted) or the expected error with acc unchanged
 * and a message containing needle (if given). */
static void expect(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                   uint64_t round, int code, const char *needle) {
    size_t d = hs_compressor_dim(c);
    float *acc = test_acc(d, 5), *copy = malloc(d * sizeof(float));
    memcpy(copy, acc, d * sizeof(float));
    int err = hs_compress_decode_add(c, p, len, peer, round, acc, d, 1.0f);
    if (err != code || (code < 0 && needle && !strstr(hs_error_message(), needle)))
        fprintf(stderr, "%s, %zu bytes: got %s (%s), want %s containing \"%s\"\n",
                hs_compressor_name(c), len, hs_err_name(err), hs_error_message(),
                hs_err_name(code), needle ? needle : "");
    assert_int_equal(err, code);
    if (code < 0) {
        assert_memory_equal(acc, copy, d * sizeof(float));
        assert_true(strlen(hs_error_message()) > 0);
        if (needle) assert_non_null(strstr(hs_error_message(), needle));
    }
    free(acc);
    free(copy);
}

static const struct {
    const char *spec;
    size_t d;
} cases[] = {
    {"none", 37},          {"fp16", 37},        {"bf16", 37},          {"topk:0.01", 1000},
    {"topk:0.5", 1000},    {"topk:3:fp16", 37}, {"topk:37", 37},       {"randk:0.1", 1000},
    {"randk:5:fp16", 37},  {"qsgd:4", 1000},    {"qsgd:200:100", 999}, {"qsgd:16:7", 37},
    {"sign", 37},          {"sign:10", 1001},   {"topk:1", 1},         {"qsgd:1", 1},
    {"topk:3:fp8", 37},    {"topk:0.5:fp8", 1000},
};
#define N_CASES (sizeof(cases) / sizeof(cases[0]))

/* ---------------------------------------------------------------- lengths */

static void test_truncated_and_trailing(void **state) {
    (void)state;
    for (size_t t = 0; t < N_CASES; t++) {
        hs_compressor *c = mk(cases[t].spec, cases[t].d, 1);
        size_t len;
        uint8_t *m = msg_of(c, 2, 3, &len);
        expect(c, m, len, 2, 3, 0, NULL);
        for (size_t n = 0; n < len; n++) {
            if (n > 80 && n < len - 80 && n != len / 2) continue;
            expect(c, m, n, 2, 3, HS_EFORMAT, n < 12 ? "truncated" : NULL);
        }
        m[len] = 0;
        expect(c, m, len + 1, 2, 3, HS_EFORMAT, "trailing");
        free(m);
        hs_compressor_free(c);
    }
    /* NULL with length 0 is just a truncated message. */
    hs_compressor *c = mk("none", 3, 1);
    expect(c, NULL, 0, 0, 0, HS_EFORMAT, "truncated");
    hs_compressor_free(c);
}

/* ---------------------------------------------------------------- headers */

static void test_header_fields(void **state) {
    (void)state;
    for (size_t t = 0; t < N_CASES; t++) {
        hs_compressor *c = mk(cases[t].spec, cases[t].d, 1);
        size_t len;
        uint8_t *m = msg_of(c, 0, 0, &len), *q = malloc(len + 16);
        hs_codec_id id = hs_compressor_codec(c);
#define MUTATE(stmt, code, needle)                                                                 \
    do {                                                                                           \
        memcpy(q, m, len);                                                                         \
        stmt;                                                                                      \
        expect(c, q, len, 0, 0, code, needle);                                                     \
    } while (0)
        MUTATE(q[0] = 0, HS_EFORMAT, "unknown codec");
        MUTATE(q[0] = 8, HS_EFORMAT, "unknown codec");
        MUTATE(q[0] = 255, HS_EFORMAT, "unknown codec");
        MUTATE(q[0] = (uint8_t)(id == HS_CODEC_NONE ? HS_CODEC_SIGN : HS_CODEC_NONE),
               HS_EMISMATCH, "expects");
        MUTATE(q[1] |= 0x80, HS_EFORMAT, "flag");
        MUTATE(hs__st32(q + 4, (uint32_t)cases[t].d + 1), HS_EMISMATCH, "d =");
        MUTATE(hs__st32(q + 4, 0), HS_EMISMATCH, "d =");
        uint32_t n = hs__ld32(m + 8);
        switch (id) {
        case HS_CODEC_NONE:
        case HS_CODEC_FP16:
        case HS_CODEC_BF16:
            MUTATE(hs__st32(q + 8, n - 1), HS_EFORMAT, "count");
            MUTATE(hs__st16(q + 2, 1), HS_EFORMAT, NULL);
            MUTATE(q[1] = 1, HS_EFORMAT, "flag");
            break;
        case HS_CODEC_TOPK:
        case HS_CODEC_RANDK:
            MUTATE(hs__st32(q + 8, (uint32_t)cases[t].d + 1), HS_EFORMAT, "count");
            MUTATE(hs__st32(q + 8, 0), HS_EFORMAT, "count");
            if (n < cases[t].d) MUTATE(hs__st32(q + 8, n + 1), HS_EMISMATCH, "count");
            MUTATE(hs__st16(q + 2, 3), HS_EFORMAT, NULL);
            MUTATE(q[1] ^= HS__CF_FP16, HS_EMISMATCH, "value format");
            if (id == HS_CODEC_RANDK) {
                MUTATE(q[1] ^= HS__CF_UNSCALED, HS_EMISMATCH, "scaling");
                MUTATE(q[1] |= HS__CF_BITMAP, HS_EFORMAT, "flag");
            } else {
                MUTATE(q[1] |= HS__CF_UNSCALED, HS_EFORMAT, "flag");
            }
            break;
        case HS_CODEC_QSGD:
            MUTATE(hs__st16(q + 2, 0), HS_EFORMAT, "levels s");
            MUTATE(hs__st16(q + 2, 32768), HS_EFORMAT, "levels s");
            MUTATE(hs__st16(q + 2, 65535), HS_EFORMAT, "levels s");
            MUTATE(hs__st16(q + 2, (uint16_t)(hs__ld16(m + 2) + 1)), HS_EMISMATCH, "levels s");
            MUTATE(hs__st32(q + 8, 0), HS_EFORMAT, "bucket");
            MUTATE(hs__st32(q + 8, n + 1), HS_EMISMATCH, "bucket");
            MUTATE(q[1] = 1, HS_EFORMAT, "flag");
            break;
        case HS_CODEC_SIGN:
            MUTATE(hs__st32(q + 8, n + 1), HS_EMISMATCH, "bucket");
            MUTATE(hs__st16(q + 2, 1), HS_EFORMAT, NULL);
            break;
        }
#undef MUTATE
        free(q);
        free(m);
        hs_compressor_free(c);
    }
}

/* Messages of one configuration offered to another. */
static void test_config_mismatch(void **state) {
    (void)state;
    const char *pairs[][2] = {
        {"topk:0.01", "topk:0.02"}, {"topk:0.01", "topk:0.01:fp16"}, {"none", "fp16"},
        {"topk:0.01:fp8", "topk:0.01:fp16"}, {"topk:0.01", "topk:0.01:fp8"},
        {"fp16", "bf16"},           {"qsgd:16", "qsgd:8"},           {"qsgd:16", "qsgd:16:256"},
        {"sign", "sign:512"},       {"randk:0.01", "randk:0.01:unscaled"},
        {"randk:0.01", "topk:0.01"}, {"sign", "qsgd:1"},
    };
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        hs_compressor *a = mk(pairs[i][0], 1000, 1), *b = mk(pairs[i][1], 1000, 1);
        size_t len;
        uint8_t *m = msg_of(a, 0, 0, &len);
        expect(b, m, len, 0, 0, HS_EMISMATCH, NULL);
        free(m);
        hs_compressor_free(a);
        hs_compressor_free(b);
    }
    /* Another dimension. */
    hs_compressor *a = mk("topk:10", 1000, 1), *b = mk("topk:10", 1001, 1);
    size_t len;
    uint8_t *m = msg_of(a, 0, 0, &len);
    expect(b, m, len, 0, 0, HS_EMISMATCH, "d =");
    free(m);
    hs_compressor_free(a);
    hs_compressor_free(b);
    /* Random-k regenerates indices: another seed, peer or round is detected. */
    a = mk("randk:0.1", 1000, 1);
    b = mk("randk:0.1", 1000, 2);
    m = msg_of(a, 4, 5, &len);
    expect(a, m, len, 4, 5, 0, NULL);
    expect(b, m, len, 4, 5, HS_EMISMATCH, "stream check");
    expect(a, m, len, 3, 5, HS_EMISMATCH, "stream check");
    expect(a, m, len, 4, 6, HS_EMISMATCH, "stream check");
    expect(a, m, len, 4, 5 + (1ull << 32), HS_EMISMATCH, "stream check");
    free(m);
    hs_compressor_free(a);
    hs_compressor_free(b);
}

/* ---------------------------------------------------------------- values */

static void test_nonfinite(void **state) {
    (void)state;
    const uint32_t f32bad[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFFFFFFFu, 0x7F800001u};
    const uint16_t f16bad[] = {0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFFFF};
    const uint16_t bf16bad[] = {0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF};
    struct {
        const char *spec;
        size_t d, off; /* offset of the first value */
        int width;     /* 4 fp32, 2 fp16, 3 bf16 */
        size_t count;  /* values to try */
    } vc[] = {
        {"none", 20, 12, 4, 20},      {"fp16", 20, 12, 2, 20},      {"bf16", 20, 12, 3, 20},
        {"topk:5", 100, 12, 4, 5},    {"topk:5:fp16", 100, 12, 2, 5}, {"randk:5", 100, 16, 4, 5},
        {"randk:5:fp16", 100, 16, 2, 5},
    };
    for (size_t t = 0; t < sizeof(vc) / sizeof(vc[0]); t++) {
        hs_compressor *c = mk(vc[t].spec, vc[t].d, 1);
        size_t len;
        uint8_t *m = msg_of(c, 0, 0, &len), *q = malloc(len);
        size_t which[2] = {0, vc[t].count - 1};
        for (int w = 0; w < 2; w++) {
            size_t j = which[w];
            for (int v = 0; v < 5; v++) {
                memcpy(q, m, len);
                if (vc[t].width == 4)
                    hs__st32(q + vc[t].off + 4 * j, f32bad[v]);
                else
                    hs__st16(q + vc[t].off + 2 * j, vc[t].width == 2 ? f16bad[v] : bf16bad[v]);
                expect(c, q, len, 0, 0, HS_EFORMAT, "finite");
            }
        }
        free(q);
        free(m);
        hs_compressor_free(c);
    }
    /* Norms and scales: non-finite, negative (also -0), and QSGD norms above 2^127. */
    const uint32_t scalebad[] = {0x7F800000u, 0x7FC00000u, 0xBF800000u, 0x80000000u, 0xFF800000u};
    const char *specs[] = {"qsgd:4:10", "sign:10"};
    for (int s = 0; s < 2; s++) {
        hs_compressor *c = mk(specs[s], 35, 1);
        size_t len;
        uint8_t *m = msg_of(c, 0, 0, &len), *q = malloc(len);
        for (size_t j = 0; j < 4; j++) {
            for (int v = 0; v < 5; v++) {
                memcpy(q, m, len);
                hs__st32(q + 12 + 4 * j, scalebad[v]);
                expect(c, q, len, 0, 0, HS_EFORMAT, s == 0 ? "norm" : "scale");
            }
        }
        if (s == 0) {
            memcpy(q, m, len);
            hs__st32(q + 12, 0x7F000001u); /* just above 2^127 */
            expect(c, q, len, 0, 0, HS_EFORMAT, "norm");
            hs__st32(q + 12, 0x7F000000u); /* 2^127 itself is allowed */
            expect(c, q, len, 0, 0, 0, NULL);
        }
        free(q);
        free(m);
        hs_compressor_free(c);
    }
    /* fp8: a NaN byte (either sign), a scale that is not finite or negative (also -0). */
    hs_compressor *c8 = mk("topk:5:fp8", 100, 1);
    size_t len8;
    uint8_t *m8 = msg_of(c8, 0, 0, &len8), *q8 = malloc(len8);
    for (int v = 0; v < 2; v++) {
        memcpy(q8, m8, len8);
        q8[16 + 4 * v] = v ? 0xFF : 0x7F;
        expect(c8, q8, len8, 0, 0, HS_EFORMAT, "NaN");
    }
    for (int v = 0; v < 5; v++) {
        memcpy(q8, m8, len8);
        hs__st32(q8 + 12, scalebad[v]);
        expect(c8, q8, len8, 0, 0, HS_EFORMAT, "scale");
    }
    free(q8);
    free(m8);
    hs_compressor_free(c8);
    /* Random-k values whose rescaling overflows. */
    hs_compressor *c = mk("randk:2", 10, 1);
    size_t len;
    uint8_t *m = msg_of(c, 0, 0, &len);
    hs__stf(m + 16, 3e38f);
    expect(c, m, len, 0, 0, HS_EFORMAT, "overflows");
    free(m);
    hs_compressor_free(c);
}

/* ---------------------------------------------------------------- top-k indices */

/* A topk message of d = 100, k given, values 1..k, with the index section given verbatim. */
static size_t topk_msg(uint8_t *q, uint32_t k, int bitmap, const uint8_t *ix, size_t ilen) {
    hs__chdr_put(q, HS_CODEC_TOPK, bitmap ? HS__CF_BITMAP : 0, 0, 100, k);
    for (uint32_t j = 0; j < k; j++) hs__stf(q + 12 + 4 * j, (float)(j + 1));
    memcpy(q + 12 + 4 * k, ix, ilen);
    return 12 + 4 * (size_t)k + ilen;
}

static void test_topk_indices(void **state) {
    (void)state;
    hs_compressor *c = mk("topk:3", 100, 1);
    uint8_t q[256];
    /* Sanity: a valid message built by hand: indices 0, 5, 99 = gaps 1, 5, 94. */
    const uint8_t ok[] = {1, 5, 94};
    size_t len = topk_msg(q, 3, 0, ok, 3);
    float acc[100];
    memset(acc, 0, sizeof(acc));
    assert_int_equal(hs_compress_decode_add(c, q, len, 0, 0, acc, 100, 2.0f), 0);
    assert_true(acc[0] == 2.0f && acc[5] == 4.0f && acc[99] == 6.0f && acc[1] == 0.0f);
    struct {
        uint8_t ix[12];
        size_t n;
        const char *needle;
    } bad[] = {
        {{1, 5, 95}, 3, "out of range"},                       /* last index = d */
        {{1, 5, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F}, 7, "out of range"}, /* gap 2^32 - 1 */
        {{101, 1, 1}, 3, "out of range"},                      /* first index = d */
        {{1, 0, 5}, 3, "repeats"},                             /* duplicate index */
        {{0, 1, 5}, 3, "repeats"},                             /* first gap 0: index -1 */
        {{1, 5, 0x80, 0x00}, 4, "minimally"},                  /* overlong zero */
        {{1, 5, 0xDE, 0x00}, 4, "minimally"},                  /* overlong 94 */
        {{1, 5, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, 8, "32 bits"}, /* 6 bytes */
        {{1, 5, 0x80, 0x80, 0x80, 0x80, 0x10}, 7, "32 bits"},
        {{1, 5}, 2, "truncated"},                              /* k - 1 gaps */
        {{1, 5, 0x80}, 3, "truncated"},                        /* unfinished varint */
        {{1, 5, 94, 1}, 4, "trailing"},                        /* k + 1 gaps */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        len = topk_msg(q, 3, 0, bad[i].ix, bad[i].n);
        expect(c, q, len, 0, 0, HS_EFORMAT, bad[i].needle);
    }
    /* Bitmap: 13 bytes for d = 100; bits 100..103 are padding. */
    uint8_t bm[14];
    memset(bm, 0, sizeof(bm));
    bm[0] = 0x01;
    bm[1] = 0x02;
    bm[12] = 0x08; /* index 99 */
    len = topk_msg(q, 3, 1, bm, 13);
    expect(c, q, len, 0, 0, 0, NULL);
    bm[12] = 0x10; /* index 100: padding */
    len = topk_msg(q, 3, 1, bm, 13);
    expect(c, q, len, 0, 0, HS_EFORMAT, "past d");
    bm[12] = 0x08;
    bm[5] = 0x40; /* a fourth index */
    len = topk_msg(q, 3, 1, bm, 13);
    expect(c, q, len, 0, 0, HS_EFORMAT, "holds 4");
    bm[5] = 0;
    bm[0] = 0; /* two indices */
    len = topk_msg(q, 3, 1, bm, 13);
    expect(c, q, len, 0, 0, HS_EFORMAT, "holds 2");
    bm[0] = 1;
    len = topk_msg(q, 3, 1, bm, 12);
    expect(c, q, len, 0, 0, HS_EFORMAT, "truncated");
    len = topk_msg(q, 3, 1, bm, 14);
    expect(c, q, len, 0, 0, HS_EFORMAT, "trailing");
    hs_compressor_free(c);
}

/* ---------------------------------------------------------------- QSGD levels, padding */

static void set_field(uint8_t *p, size_t i, uint32_t b, uint32_t v) {
    for (uint32_t t = 0; t < b; t++) {
        size_t bit = i * b + t;
        p[bit / 8] = (uint8_t)((p[bit / 8] & ~(1u << (bit % 8))) | (((v >> t) & 1u) << (bit % 8)));
    }
}

static void test_qsgd_fields(void **state) {
    (void)state;
    struct {
        const char *spec;
        uint32_t s, b;
    } qc[] = {{"qsgd:4:10", 4, 4}, {"qsgd:200:10", 200, 9}, {"qsgd:1:10", 1, 2}};
    for (size_t t = 0; t < 3; t++) {
        size_t d = 35, nb = 4;
        hs_compressor *c = mk(qc[t].spec, d, 1);
        size_t len;
        uint8_t *m = msg_of(c, 0, 0, &len), *q = malloc(len);
        uint8_t *f = q + 12 + 4 * nb;
        uint32_t b = qc[t].b, sign = 1u << (b - 1);
        assert_int_equal(len, 12 + 4 * nb + (d * b + 7) / 8);
        memcpy(q, m, len);
        set_field(f, 17, b, qc[t].s);
        expect(c, q, len, 0, 0, 0, NULL);
        set_field(f, 17, b, qc[t].s | sign);
        expect(c, q, len, 0, 0, 0, NULL);
        if (qc[t].s + 1 < sign) {
            set_field(f, 17, b, qc[t].s + 1);
            expect(c, q, len, 0, 0, HS_EFORMAT, "above s");
            set_field(f, 17, b, (sign - 1) | sign);
            expect(c, q, len, 0, 0, HS_EFORMAT, "above s");
        }
        memcpy(q, m, len);
        set_field(f, 34, b, sign); /* -0 */
        expect(c, q, len, 0, 0, HS_EFORMAT, "negative zero");
        /* A zero bucket carries zero levels only. */
        memcpy(q, m, len);
        hs__st32(q + 12 + 4, 0);
        for (size_t i = 10; i < 20; i++) set_field(f, i, b, 0);
        expect(c, q, len, 0, 0, 0, NULL);
        set_field(f, 13, b, 1);
        expect(c, q, len, 0, 0, HS_EFORMAT, "norm 0");
        /* Padding bits after the last field. */
        memcpy(q, m, len);
        if ((d * b) % 8) {
            q[len - 1] |= (uint8_t)(0x80u);
            expect(c, q, len, 0, 0, HS_EFORMAT, "padding");
        }
        free(q);
        free(m);
        hs_compressor_free(c);
    }
    /* Sign: padding bits after the last sign. */
    hs_compressor *c = mk("sign", 13, 1);
    size_t len;
    uint8_t *m = msg_of(c, 0, 0, &len);
    m[len - 1] |= 0x20;
    expect(c, m, len, 0, 0, HS_EFORMAT, "padding");
    free(m);
    hs_compressor_free(c);
}

/* ---------------------------------------------------------------- corruption */

/* Random corruption: flipped bytes, cut or extended messages. Whatever a decoder does with
 * them, it either accepts (and then adds finite values) or fails leaving acc as it was. */
static void test_random_corruption(void **state) {
    (void)state;
    hs_rng r;
    hs__rng_init(&r, 17, HS_RNG_TEST, 0, 0);
    for (size_t t = 0; t < N_CASES; t++) {
        hs_compressor *c = mk(cases[t].spec, cases[t].d, 1);
        size_t d = cases[t].d, len, accepted = 0;
        uint8_t *m = msg_of(c, 1, 1, &len), *q = malloc(len + 8);
        float *acc = test_acc(d, 3), *copy = malloc(d * sizeof(float));
        for (int it = 0; it < 1500; it++) {
            memcpy(q, m, len);
            size_t n = len;
            int flips = 1 + (int)hs__rng_uniform(&r, 3);
            for (int f = 0; f < flips; f++) {
                size_t at = hs__rng_uniform(&r, (uint32_t)len);
                /* Favour the header and low bits: those make plausible messages. */
                if (hs__rng_uniform(&r, 4) == 0) at = hs__rng_uniform(&r, 16 < len ? 16 : (uint32_t)len);
                q[at] ^= (uint8_t)(1u << hs__rng_uniform(&r, 8));
            }
            if (hs__rng_uniform(&r, 8) == 0) n = hs__rng_uniform(&r, (uint32_t)len + 8);
            if (n > len) memset(q + len, 0, n - len);
            memcpy(copy, acc, d * sizeof(float));
            int err = hs_compress_decode_add(c, q, n, 1, 1, acc, d, 1.0f);
            if (err < 0) {
                assert_true(err == HS_EFORMAT || err == HS_EMISMATCH);
                assert_memory_equal(acc, copy, d * sizeof(float));
            } else {
                accepted++;
                for (size_t i = 0; i < d; i++) assert_true(isfinite(acc[i]));
                memcpy(acc, copy, d * sizeof(float));
            }
        }
        (void)accepted;
        free(acc);
        free(copy);
        free(q);
        free(m);
        hs_compressor_free(c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_truncated_and_trailing),
        cmocka_unit_test(test_header_fields),
        cmocka_unit_test(test_config_mismatch),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_topk_indices),
        cmocka_unit_test(test_qsgd_fields),
        cmocka_unit_test(test_random_corruption),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
