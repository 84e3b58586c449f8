/* Unit tests of the full-replica payload (hs__payload_full / hs__payload_read_full): exact
 * bytes after the type tag at every kernel level and length, a reused pool buffer, and a
 * malformed replica (non-finite value, wrong length) refused with the receiver's copy left as
 * it was. And the multi-vector DELTA_PARTS payload (BEER): each part decoded into its own
 * vector with its own key, and bad part lengths refused before any replica changes. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "algo/algo_internal.h"
#include "compress/codec.h"
#include "core/rng.h"
#include "hearsay/algo.h"
#include "hearsay/error.h"

static float *vec(size_t d, uint64_t seed) {
    float *x = malloc(d * sizeof(float));
    hs_rng r;
    hs__rng_init(&r, seed, HS_RNG_TEST, 0, 0);
    for (size_t i = 0; i < d; i++) x[i] = (float)ldexp(hs__rng_normal(&r), (int)(i % 60) - 40);
    const float s[] = {-0.0f, 0x1p-149f, 3.4028235e38f, -3.4028235e38f};
    for (size_t i = 0; i < 4 && i < d; i++) x[(i * 5) % d] = s[i];
    return x;
}

static hs_algo *mk_algo(size_t d, const float *x0) {
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_DPSGD;
    hs_algo *a = NULL;
    assert_int_equal(hs_algo_new(&a, &cfg, 0, d, x0), 0);
    return a;
}

static void test_full_roundtrip(void **state) {
    (void)state;
    size_t ds[] = {1, 3, 8, 15, 16, 17, 33, 1000, 4099};
    int top = hs__csimd_level();
    for (size_t k = 0; k < sizeof(ds) / sizeof(ds[0]); k++) {
        size_t d = ds[k];
        float *x = vec(d, d), *y = malloc(d * sizeof(float));
        hs_algo *a = mk_algo(d, x);
        for (int lv = 0; lv <= top; lv++) {
            hs__csimd_cap(lv);
            /* Twice: the second payload reuses the first one's pool buffer. */
            for (int rep = 0; rep < 2; rep++) {
                x[d / 2] = (float)(lv * 2 + rep) - 0.5f;
                hs_buf *b = NULL;
                assert_int_equal(hs__payload_full(a, &b, x, d), 0);
                assert_int_equal(b->len, 1 + 4 * d);
                assert_int_equal(b->data[0], HS_PAYLOAD_FULL);
                for (size_t i = 0; i < d; i++) {
                    uint32_t u;
                    memcpy(&u, &x[i], 4);
                    assert_int_equal(hs__ld32(b->data + 1 + 4 * i), u);
                }
                memset(y, 0xAB, d * sizeof(float));
                assert_int_equal(hs__payload_read_full(b->data, b->len, y, d, 3), 0);
                assert_memory_equal(y, x, d * sizeof(float));
                hs_buf_unref(b);
            }
        }
        hs__csimd_cap(2);
        hs_algo_free(a);
        free(x);
        free(y);
    }
}

static void test_full_refused(void **state) {
    (void)state;
    size_t d = 1000;
    float *x = vec(d, 9), *y = malloc(d * sizeof(float)), *was = malloc(d * sizeof(float));
    hs_algo *a = mk_algo(d, x);
    hs_buf *b = NULL;
    assert_int_equal(hs__payload_full(a, &b, x, d), 0);
    for (size_t i = 0; i < d; i++) was[i] = (float)i;
    size_t pos[] = {0, 15, 16, 517, 999};
    float bad[] = {NAN, INFINITY, -INFINITY};
    int top = hs__csimd_level();
    for (int lv = 0; lv <= top; lv++) {
        hs__csimd_cap(lv);
        for (size_t p = 0; p < sizeof(pos) / sizeof(pos[0]); p++) {
            uint8_t keep[4];
            memcpy(keep, b->data + 1 + 4 * pos[p], 4);
            hs__stf(b->data + 1 + 4 * pos[p], bad[p % 3]);
            memcpy(y, was, d * sizeof(float));
            assert_int_equal(hs__payload_read_full(b->data, b->len, y, d, 3), HS_EFORMAT);
            char want[64];
            snprintf(want, sizeof(want), "peer 3: value %zu is not finite", pos[p]);
            assert_non_null(strstr(hs_error_message(), want));
            assert_memory_equal(y, was, d * sizeof(float));
            memcpy(b->data + 1 + 4 * pos[p], keep, 4);
        }
        /* A byte short or long. */
        assert_int_equal(hs__payload_read_full(b->data, b->len - 1, y, d, 3), HS_EFORMAT);
        assert_int_equal(hs__payload_read_full(b->data, b->len, y, d - 1, 3), HS_EFORMAT);
        assert_memory_equal(y, was, d * sizeof(float));
    }
    hs__csimd_cap(2);
    assert_int_equal(hs__payload_read_full(b->data, b->len, y, d, 3), 0);
    assert_memory_equal(y, x, d * sizeof(float));
    hs_buf_unref(b);
    hs_algo_free(a);
    free(x);
    free(y);
    free(was);
}

/* A BEER-shaped message: part 0 (model) keyed by round r, part 1 (tracker) by
 * hs__part_round(r, 1), the first part's length in front. */
static void test_delta_parts(void **state) {
    (void)state;
    enum { D = 200 };
    float *x0 = calloc(D, sizeof(float)), *u = vec(D, 4), *w = vec(D, 5);
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_BEER;
    cfg.compress = "randk:0.1:unscaled";
    cfg.gamma_c = 0.5f;
    hs_algo *a = NULL;
    assert_int_equal(hs_algo_new(&a, &cfg, 0, D, x0), 0);
    assert_int_equal(a->dpub, 2 * D);
    const uint64_t r = 7;
    hs_buf *m = NULL;
    assert_int_equal(hs__payload_new(a, &m, HS_PAYLOAD_DELTA_PARTS, 4), 0);
    uint32_t l0 = 0;
    assert_int_equal(hs_buf_append(m, &l0, 4), 0);
    assert_true(hs_compress_encode(a->comp, u, D, 3, r, m) >= 0);
    l0 = (uint32_t)(m->len - 5);
    memcpy(m->data + 1, &l0, 4);
    assert_true(hs_compress_encode(a->comp, w, D, 3, hs__part_round(r, 1), m) >= 0);
    /* What each part must decode to, separately. */
    float *want = calloc(2 * D, sizeof(float));
    assert_int_equal(hs_compress_decode_add(a->comp, m->data + 5, l0, 3, r, want, D, 1.0f), 0);
    assert_int_equal(hs_compress_decode_add(a->comp, m->data + 5 + l0, m->len - 5 - l0, 3,
                                            hs__part_round(r, 1), want + D, D, 1.0f),
                     0);
    hs__nbr n = {.id = 3, .is_in = 1, .synced = 1, .w_in = 0.5f};
    n.rep = calloc(2 * D, sizeof(float));
    assert_int_equal(hs__apply_replica(a, &n, r, m->data, m->len, NULL), 0);
    assert_memory_equal(n.rep, want, 2 * D * sizeof(float));
    /* The two parts select different coordinates: keyed apart. */
    int same = 1;
    for (int k = 0; k < D; k++) same &= (want[k] != 0) == (want[D + k] != 0);
    assert_false(same);
    /* Bad lengths and types leave the replica as it was. */
    memcpy(want, n.rep, 2 * D * sizeof(float));
    uint32_t over = (uint32_t)m->len;
    memcpy(m->data + 1, &over, 4);
    assert_int_equal(hs__apply_replica(a, &n, r, m->data, m->len, NULL), HS_EFORMAT);
    assert_int_equal(hs__apply_replica(a, &n, r, m->data, 3, NULL), HS_EFORMAT);
    m->data[0] = HS_PAYLOAD_DELTA;
    assert_int_equal(hs__apply_replica(a, &n, r, m->data, m->len, NULL), HS_EPROTO);
    assert_memory_equal(n.rep, want, 2 * D * sizeof(float));
    hs_buf_unref(m);
    hs_algo_free(a);
    free(n.rep);
    free(want);
    free(x0);
    free(u);
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_roundtrip),
        cmocka_unit_test(test_full_refused),
        cmocka_unit_test(test_delta_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
