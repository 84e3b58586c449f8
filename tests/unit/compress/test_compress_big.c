/* Unit tests of the compressors at vector lengths past 2^28, up to 2^32 - 1 (issue 21, models of
 * any size): every operator is made at such d, its message sizes come out of 64-bit arithmetic,
 * its decoder checks lengths and indices against d, and the sparse operators, whose messages
 * stay small, round-trip on vectors of 2^32 - 1 floats that are mapped but never backed (only
 * the pages of the elements a message carries are touched). The round trips that touch every
 * element (QSGD, sign, top-k's selection) at d > 2^28 take a gigabyte a vector and are in
 * tools/bench/big/codecs_big.c, not here. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"
#include "compress_cmocka.h"

#define D_MAX ((size_t)UINT32_MAX)
#define D_OVER (((size_t)1 << 28) + 5)

/* d floats of address space, zero, backed only where written. NULL (the test is not run) where
 * the system refuses the reservation. */
static float *map_floats(size_t d) {
    void *p = mmap(NULL, d * sizeof(float), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "# no %zu bytes of address space for the test vector\n", d * 4);
        return NULL;
    }
    return p;
}

static void unmap_floats(float *p, size_t d) { munmap(p, d * sizeof(float)); }

/* Whether both vectors of D_MAX floats were mapped (a test of one passes it twice). Where the
 * system refused either there is nothing to test: the other is unmapped, a note is printed and
 * the caller returns, which passes (cmocka's skip() is written as "not ok # SKIP", which meson
 * counts as a failure). */
static int mapped(const char *test, float *a, float *b) {
    if (a && b) return 1;
    if (a) unmap_floats(a, D_MAX);
    if (b && b != a) unmap_floats(b, D_MAX);
    printf("# %s not run: no address space for its vectors\n", test);
    return 0;
}

static uint64_t div_up(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* The message size of each operator by docs/PROTOCOL.md, in 64 bits. */
struct size_case {
    const char *spec;
    uint64_t (*bytes)(uint64_t d);
};

static uint64_t b_none(uint64_t d) { return 12 + 4 * d; }
static uint64_t b_fp16(uint64_t d) { return 12 + 2 * d; }
/* topk:10: 10 values and the gaps' 5 bytes each (a bitmap of d bits is larger). */
static uint64_t b_topk10(uint64_t d) { return 12 + 40 + (div_up(d, 8) < 50 ? div_up(d, 8) : 50); }
static uint64_t b_topk10_fp8(uint64_t d) {
    (void)d;
    return 12 + 4 + 10 + 50;
}
static uint64_t b_randk10(uint64_t d) {
    (void)d;
    return 12 + 4 + 40;
}
static uint64_t b_randk10_fp16(uint64_t d) {
    (void)d;
    return 12 + 4 + 20;
}
/* b = 6 bits a field for s = 16, 16 for s = 32767: d b passes 2^32 at d > 2^28. */
static uint64_t b_qsgd16(uint64_t d) { return 12 + 4 * div_up(d, 512) + div_up(6 * d, 8); }
static uint64_t b_qsgd32767(uint64_t d) { return 12 + 4 * div_up(d, 64) + div_up(16 * d, 8); }
static uint64_t b_sign(uint64_t d) { return 12 + 4 + div_up(d, 8); }
static uint64_t b_sign512(uint64_t d) { return 12 + 4 * div_up(d, 512) + div_up(d, 8); }

static const struct size_case sizes[] = {
    {"none", b_none},           {"fp16", b_fp16},           {"bf16", b_fp16},
    {"topk:10", b_topk10},      {"topk:10:fp8", b_topk10_fp8},
    {"randk:10", b_randk10},    {"randk:10:fp16:unscaled", b_randk10_fp16},
    {"qsgd:16", b_qsgd16},      {"qsgd:32767:64", b_qsgd32767},
    {"sign", b_sign},           {"sign:512", b_sign512},
};
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* Every operator takes d = 2^28 + 5 and 2^32 - 1, with its exact message size; 2^32 is refused
 * with the range in the message. */
static void test_limits_and_sizes(void **state) {
    (void)state;
    const size_t ds[] = {D_OVER, D_MAX};
    for (size_t i = 0; i < N_SIZES; i++) {
        for (size_t j = 0; j < 2; j++) {
            hs_compressor *c = mk(sizes[i].spec, ds[j], 1);
            size_t want = (size_t)sizes[i].bytes(ds[j]), got = hs_compress_max_bytes(c, ds[j]);
            if (got != want)
                fprintf(stderr, "%s at d = %zu: %zu bytes, want %zu\n", sizes[i].spec, ds[j], got,
                        want);
            assert_true(got == want);
            assert_true(hs_compressor_dim(c) == ds[j]);
            hs_compressor_free(c);
        }
        hs_compressor *c = NULL;
        assert_int_equal(hs_compressor_new(&c, sizes[i].spec, D_MAX + 1, 1), HS_EINVAL);
        assert_null(c);
        assert_non_null(strstr(hs_error_message(), "1..4294967295"));
    }
    /* A bitmap of d bits is the smaller index coding once k > d / 40. */
    size_t k = D_OVER / 32;
    char spec[40];
    snprintf(spec, sizeof(spec), "topk:%zu", k);
    hs_compressor *c = mk(spec, D_OVER, 1);
    assert_true(hs_compress_max_bytes(c, D_OVER) == 12 + 4 * k + div_up(D_OVER, 8));
    hs_compressor_free(c);
}

/* The 12-byte header of a message of c. */
static void put_header(uint8_t *p, const hs_compressor *c, unsigned id, unsigned param,
                       uint32_t n) {
    hs__chdr_put(p, (hs_codec_id)id, 0, param, (uint32_t)hs_compressor_dim(c), n);
}

/* A QSGD or sign message that holds only its header is refused as truncated, naming the exact
 * size its d needs (over 2^32 bytes for qsgd:32767 at d = 2^32 - 1); acc is untouched. */
static void test_truncated_sizes(void **state) {
    (void)state;
    float *acc = map_floats(D_MAX);
    if (!mapped(__func__, acc, acc)) return;
    struct {
        const char *spec;
        unsigned id, param;
        uint32_t n;
        uint64_t (*bytes)(uint64_t d);
    } cases[] = {
        {"qsgd:16", HS_CODEC_QSGD, 16, 512, b_qsgd16},
        {"qsgd:32767:64", HS_CODEC_QSGD, 32767, 64, b_qsgd32767},
        {"sign:512", HS_CODEC_SIGN, 0, 512, b_sign512},
        {"sign", HS_CODEC_SIGN, 0, 0, b_sign},
        {"randk:10", HS_CODEC_RANDK, 0, 10, b_randk10},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hs_compressor *c = mk(cases[i].spec, D_MAX, 1);
        uint8_t msg[64] = {0};
        put_header(msg, c, cases[i].id, cases[i].param, cases[i].n);
        char want[64];
        snprintf(want, sizeof(want), "needs %llu",
                 (unsigned long long)cases[i].bytes(D_MAX));
        assert_int_equal(hs_compress_decode_add(c, msg, 12, 0, 0, acc, D_MAX, 1.0f), HS_EFORMAT);
        if (!strstr(hs_error_message(), want))
            fprintf(stderr, "%s: \"%s\", want \"%s\"\n", cases[i].spec, hs_error_message(), want);
        assert_non_null(strstr(hs_error_message(), want));
        /* The header of another d is another configuration. */
        hs__chdr_put(msg, (hs_codec_id)cases[i].id, 0, cases[i].param, (uint32_t)D_OVER,
                     cases[i].n);
        assert_int_equal(hs_compress_decode_add(c, msg, 12, 0, 0, acc, D_MAX, 1.0f),
                         HS_EMISMATCH);
        hs_compressor_free(c);
    }
    assert_true(acc[0] == 0.0f && acc[D_MAX - 1] == 0.0f);
    unmap_floats(acc, D_MAX);
}

static size_t put_varint(uint8_t *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* A top-k message of 3 fp32 values at d = 2^32 - 1 whose indices are at, written by hand. */
static size_t topk_msg(const hs_compressor *c, const uint64_t at[3], const float v[3],
                       uint8_t *p) {
    put_header(p, c, HS_CODEC_TOPK, 0, 3);
    for (int j = 0; j < 3; j++) hs__stf(p + 12 + 4 * j, v[j]);
    size_t n = 24;
    for (int j = 0; j < 3; j++) n += put_varint(p + n, at[j] - (j ? at[j - 1] : (uint64_t)-1));
    return n;
}

/* Top-k at d = 2^32 - 1: indices past 2^31 and the last one, d - 1, as gaps of up to 32 bits,
 * are decoded where they point; an index at d or a gap past 32 bits is refused. The codec's own
 * packing of such indices (fp32, fp16, fp8 values) reads back the same. */
static void test_topk_far_indices(void **state) {
    (void)state;
    float *acc = map_floats(D_MAX), *acc2 = map_floats(D_MAX);
    if (!mapped(__func__, acc, acc2)) return;
    hs_compressor *c = mk("topk:3", D_MAX, 1);
    const uint64_t at[3] = {0, ((uint64_t)1 << 31) + 5, D_MAX - 1};
    const float v[3] = {1.5f, -2.5f, 3.25f};
    uint8_t msg[64];
    size_t n = topk_msg(c, at, v, msg);
    assert_int_equal(n, 24 + 1 + 5 + 5);
    assert_int_equal(hs_compress_decode_add(c, msg, n, 0, 0, acc, D_MAX, 2.0f), 0);
    for (int j = 0; j < 3; j++) assert_true(acc[at[j]] == 2.0f * v[j]);
    assert_true(acc[1] == 0.0f && acc[at[1] - 1] == 0.0f && acc[at[1] + 1] == 0.0f);
    assert_int_equal(hs_compress_decode_add2(c, msg, n, 0, 0, acc, 1.0f, acc2, -1.0f, D_MAX), 0);
    for (int j = 0; j < 3; j++) {
        assert_true(acc[at[j]] == 3.0f * v[j]);
        assert_true(acc2[at[j]] == -v[j]);
    }
    /* Index d (one past the end), and a last gap of 2^32 (past 32 bits). */
    const uint64_t over[3] = {0, ((uint64_t)1 << 31) + 5, D_MAX};
    n = topk_msg(c, over, v, msg);
    assert_int_equal(hs_compress_decode_add(c, msg, n, 0, 0, acc, D_MAX, 1.0f), HS_EFORMAT);
    assert_non_null(strstr(hs_error_message(), "out of range"));
    const uint64_t wide[3] = {0, 1, 1 + ((uint64_t)1 << 32)};
    n = topk_msg(c, wide, v, msg);
    assert_int_equal(hs_compress_decode_add(c, msg, n, 0, 0, acc, D_MAX, 1.0f), HS_EFORMAT);
    assert_non_null(strstr(hs_error_message(), "exceeds 32 bits"));
    hs_compressor_free(c);

    const char *specs[] = {"topk:3", "topk:3:fp16", "topk:3:fp8"};
    uint32_t idx[3] = {(uint32_t)at[0], (uint32_t)at[1], (uint32_t)at[2]};
    for (size_t s = 0; s < 3; s++) {
        c = mk(specs[s], D_MAX, 1);
        uint8_t *dst = malloc(hs_compress_max_bytes(c, D_MAX));
        assert_non_null(dst);
        size_t len = 0;
        assert_int_equal(hs__topk_pack(c, idx, v, 0, dst, &len), 0);
        uint32_t back[3];
        float val[3];
        assert_int_equal(hs__topk_unpack(c, dst, len, 1.0f, back, val), 0);
        for (int j = 0; j < 3; j++) {
            assert_true(back[j] == idx[j]);
            /* 1.5, -2.5, 3.25 are exact in fp16; fp8 sends v / s to 3 mantissa bits */
            if (s < 2) assert_true(val[j] == v[j]);
            else assert_true(fabsf(val[j] - v[j]) <= 0x1p-4f * fabsf(v[j]));
        }
        for (int j = 0; j < 3; j++) acc[at[j]] = 0.0f;
        assert_int_equal(hs_compress_decode_add(c, dst, len, 0, 0, acc, D_MAX, 1.0f), 0);
        for (int j = 0; j < 3; j++) assert_true(acc[at[j]] == val[j]);
        free(dst);
        hs_compressor_free(c);
    }
    unmap_floats(acc, D_MAX);
    unmap_floats(acc2, D_MAX);
}

/* Random-k at d = 2^32 - 1 with strata of about 1.4 billion (k = 3) and 0.86 billion (k = 5)
 * elements: the encoder takes each stratum's element from where the definition puts it
 * (computed here in 64 bits), and the decoder adds m_j times it there. */
static void test_randk_far_strata(void **state) {
    (void)state;
    float *x = map_floats(D_MAX), *acc = map_floats(D_MAX);
    if (!mapped(__func__, x, acc)) return;
    const char *specs[] = {"randk:3", "randk:5:fp16", "randk:5:unscaled"};
    const uint64_t seed = 77, round = ((uint64_t)5 << 32) + 9;
    const uint32_t peer = 6;
    for (size_t s = 0; s < 3; s++) {
        hs_compressor *c = mk(specs[s], D_MAX, seed);
        uint64_t k = hs_compressor_count(c), q = D_MAX / k, t = D_MAX % k;
        uint64_t pos[5], m[5];
        for (uint64_t j = 0; j < k; j++) {
            uint64_t start = j * q + (j < t ? j : t);
            m[j] = q + (j < t);
            uint64_t w = hs_cw_randk_word(seed, peer, round, (uint32_t)j);
            pos[j] = start + ((w * m[j]) >> 32);
            assert_true(pos[j] < start + m[j] && pos[j] < D_MAX);
            x[pos[j]] = 0.5f + (float)j;
        }
        hs_buf *b = newbuf();
        assert_true(hs_compress_encode(c, x, D_MAX, peer, round, b) > 0);
        assert_true(b->len == hs_compress_max_bytes(c, D_MAX));
        assert_int_equal(hs_compress_decode_add(c, b->data, b->len, peer, round, acc, D_MAX, 1.0f),
                         0);
        int unscaled = strstr(specs[s], "unscaled") != NULL;
        for (uint64_t j = 0; j < k; j++) {
            float want = unscaled ? x[pos[j]] : (float)m[j] * x[pos[j]];
            assert_true(acc[pos[j]] == want);
            acc[pos[j]] = 0.0f;
            x[pos[j]] = 0.0f;
        }
        hs_buf_unref(b);
        hs_compressor_free(c);
    }
    unmap_floats(x, D_MAX);
    unmap_floats(acc, D_MAX);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits_and_sizes),
        cmocka_unit_test(test_truncated_sizes),
        cmocka_unit_test(test_topk_far_indices),
        cmocka_unit_test(test_randk_far_strata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
