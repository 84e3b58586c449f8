/* Unit tests of the fp32 copy kernels (hs__cf32_put / hs__cf32_get) that the none codec and
 * full replicas use instead of memcpy: exact bytes at every kernel level, length and
 * destination offset, nothing written outside the destination, the largest key returned for
 * the finiteness checks, and the none codec refusing a non-finite value wherever it sits. */
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

#define GUARD 64

/* Lengths around every vector width and its tails, and two that span many iterations. */
static const size_t lens[] = {0,  1,  2,  3,  4,  5,  7,  8,  9,   15,  16,
                              17, 31, 32, 33, 47, 63, 64, 65, 1000, 4099};

static uint32_t ref_max_key(const float *x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) m = hs_cw_key(x[i]) > m ? hs_cw_key(x[i]) : m;
    return m;
}

/* x with the values a copy must carry bit for bit; `big` (if < n) holds the largest key. */
static float *special_vec(size_t n, uint64_t seed, size_t big, float big_value) {
    float *x = test_vec(n, seed, VEC_WIDE);
    const float s[] = {-0.0f, 0x1p-149f, -0x1p-126f, 3.4028235e38f, -1.0f};
    for (size_t i = 0; i < n && i < 5; i++) x[(i * 7) % n] = s[i];
    if (big < n) x[big] = big_value;
    return x;
}

static void check_copy(size_t n, size_t off, size_t big, float big_value, int lv) {
    float *x = special_vec(n, 11 + n, big, big_value);
    uint8_t *buf = malloc(4 * n + 2 * GUARD), *dst = buf + GUARD + off;
    memset(buf, 0xEE, 4 * n + 2 * GUARD);
    hs__csimd_cap(lv);
    uint32_t key = hs__cf32_put(x, n, dst);
    assert_int_equal(key, ref_max_key(x, n));
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if (hs__ld32(dst + 4 * i) != u) {
            fprintf(stderr, "put n=%zu off=%zu level %d: element %zu wrong\n", n, off, lv, i);
            fail();
        }
    }
    for (size_t i = 0; i < GUARD + off; i++) assert_int_equal(buf[i], 0xEE);
    for (size_t i = GUARD + off + 4 * n; i < 4 * n + 2 * GUARD; i++)
        assert_int_equal(buf[i], 0xEE);

    /* Back into floats, at an offset from their allocation as well. */
    float *back = malloc((n + 2 * GUARD) * sizeof(float)), *y = back + GUARD;
    memset(back, 0xEE, (n + 2 * GUARD) * sizeof(float));
    assert_int_equal(hs__cf32_get(dst, n, y), key);
    if (n) assert_memory_equal(y, x, 4 * n);
    for (size_t i = 0; i < GUARD * sizeof(float); i++) {
        assert_int_equal(((uint8_t *)back)[i], 0xEE);
        assert_int_equal(((uint8_t *)(y + n))[i], 0xEE);
    }
    hs__csimd_cap(2);
    free(back);
    free(buf);
    free(x);
}

static void test_copy_kernels(void **state) {
    (void)state;
    int top = hs__csimd_level();
    float bigs[] = {1e30f, INFINITY, -INFINITY, NAN};
    for (int lv = 0; lv <= top; lv++)
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
            for (size_t off = 0; off < 14; off += (off < 4 ? 1 : 9)) {
                size_t n = lens[l];
                /* The largest key first, last (a tail element), in the middle, or nowhere. */
                size_t where[] = {0, n ? n - 1 : 0, n / 2, n};
                for (int w = 0; w < 4; w++)
                    check_copy(n, off, where[w], bigs[(l + (size_t)w) % 4], lv);
            }
}

/* The none codec checks while it copies: a non-finite value anywhere is refused, at every
 * level, and the buffer keeps its length. Finite vectors give the same bytes at every level. */
static void test_none_encode(void **state) {
    (void)state;
    int top = hs__csimd_level();
    size_t d = 1000;
    hs_compressor *c = NULL;
    assert_int_equal(hs_compressor_new(&c, "none", d, 1), 0);
    float *x = test_vec(d, 5, VEC_WIDE);
    hs_buf *ref = NULL;
    assert_int_equal(hs_buf_new(&ref, 0), 0);
    assert_int_equal(hs_compress_encode(c, x, d, 0, 0, ref), (int)(HS__CHDR + 4 * d));
    size_t pos[] = {0, 15, 16, 500, 991, 999};
    float bad[] = {NAN, INFINITY, -INFINITY};
    for (int lv = 0; lv <= top; lv++) {
        hs__csimd_cap(lv);
        for (size_t p = 0; p < sizeof(pos) / sizeof(pos[0]); p++) {
            float keep = x[pos[p]];
            x[pos[p]] = bad[p % 3];
            hs_buf *b = NULL;
            assert_int_equal(hs_buf_new(&b, 0), 0);
            assert_int_equal(hs_buf_append(b, "a", 1), 0);
            assert_int_equal(hs_compress_encode(c, x, d, 0, 0, b), HS_ERANGE);
            assert_int_equal(b->len, 1);
            x[pos[p]] = keep;
            assert_int_equal(hs_compress_encode(c, x, d, 0, 0, b), (int)ref->len);
            assert_memory_equal(b->data + 1, ref->data, ref->len);
            hs_buf_unref(b);
        }
    }
    hs__csimd_cap(2);
    hs_buf_unref(ref);
    free(x);
    hs_compressor_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_kernels),
        cmocka_unit_test(test_none_encode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
