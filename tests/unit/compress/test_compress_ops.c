/* Unit tests of src/compress's operators: top-k selection against a sort and its contraction,
 * unbiasedness of random-k and QSGD, random streams, sign values, half-precision conversions and
 * the vector kernels against the portable ones. */
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
#include "compress_cmocka.h"

/* ---------------------------------------------------------------- top-k */

static const float *sort_x;
static int by_mag_then_index(const void *a, const void *b) {
    uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
    uint32_t ki = hs_cw_key(sort_x[i]), kj = hs_cw_key(sort_x[j]);
    if (ki != kj) return ki > kj ? -1 : 1;
    return i < j ? -1 : i > j;
}

static void test_topk_selection(void **state) {
    (void)state;
    size_t sizes[] = {1, 2, 5, 33, 1000, 20000};
    for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
        size_t d = sizes[z];
        for (int kind = 0; kind < VEC_KINDS; kind++) {
            float *x = test_vec(d, 77 + z, kind);
            uint32_t *order = malloc(d * sizeof(uint32_t));
            for (size_t i = 0; i < d; i++) order[i] = (uint32_t)i;
            sort_x = x;
            qsort(order, d, sizeof(uint32_t), by_mag_then_index);
            size_t ks[] = {1, 2, d / 100, d / 10, d / 2, d - 1, d};
            for (size_t q = 0; q < sizeof(ks) / sizeof(ks[0]); q++) {
                size_t k = ks[q];
                if (k < 1 || k > d) continue;
                char spec[32];
                snprintf(spec, sizeof(spec), "topk:%zu", k);
                hs_compressor *c = mk(spec, d, 0);
                float *out = malloc(d * sizeof(float));
                assert_int_equal(hs_compress_apply(c, x, d, 0, 0, out), 0);
                /* Exactly the first k of the sorted order are kept, with their values. */
                char *in = calloc(d, 1);
                for (size_t j = 0; j < k; j++) in[order[j]] = 1;
                for (size_t i = 0; i < d; i++) {
                    float want = in[i] ? x[i] : 0.0f;
                    assert_memory_equal(&out[i], &want, 4);
                }
                free(in);
                free(out);
                hs_compressor_free(c);
            }
            free(order);
            free(x);
        }
    }
}

/* ||x - topk(x)||^2 <= (1 - k/d) ||x||^2: top-k keeps at least the average share of energy. */
static void test_topk_contraction(void **state) {
    (void)state;
    size_t sizes[] = {1, 10, 257, 10000};
    for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
        size_t d = sizes[z];
        for (int kind = 0; kind < VEC_KINDS; kind++) {
            for (int rep = 0; rep < 4; rep++) {
                float *x = test_vec(d, 1000 * z + 10 * (uint64_t)kind + (uint64_t)rep, kind);
                size_t ks[] = {1, (d + 99) / 100, d / 3 + 1, d};
                for (size_t q = 0; q < 4; q++) {
                    char spec[32];
                    snprintf(spec, sizeof(spec), "topk:%zu", ks[q]);
                    hs_compressor *c = mk(spec, d, 0);
                    float *out = malloc(d * sizeof(float));
                    assert_int_equal(hs_compress_apply(c, x, d, 0, 0, out), 0);
                    double err = 0, nrm = 0;
                    for (size_t i = 0; i < d; i++) {
                        double e = (double)x[i] - (double)out[i];
                        err += e * e;
                        nrm += (double)x[i] * (double)x[i];
                    }
                    assert_true(err <= (1.0 - (double)ks[q] / (double)d) * nrm * (1 + 1e-12));
                    free(out);
                    hs_compressor_free(c);
                }
                free(x);
            }
        }
    }
}

/* ---------------------------------------------------------------- statistics */

/* Random-k (rescaled): each stratum of size m keeps one element times m, so C(x)_i is m x_i
 * with probability 1/m, else 0: E = x_i, Var = (m - 1) x_i^2. The mean of N independent draws
 * (different rounds) has standard deviation |x_i| sqrt((m - 1) / N); we allow 5 of them per
 * element (the mean of N = 10^4 Bernoulli(1/m) counts, m <= 8, is near normal: expected hits
 * >= 1250). With 64 elements, P(any beyond 5 sd) ~ 64 * 6e-7. Plus a float term for summing
 * 10^4 values in double (negligible) and the multiply-shift bias of the draw (< m / 2^32). */
static void test_randk_unbiased(void **state) {
    (void)state;
    const size_t d = 64, N = 10000;
    hs_compressor *c = mk("randk:9", d, 2024); /* strata of 8 and 7 */
    float *x = test_vec(d, 3, VEC_GAUSS), *acc = malloc(d * sizeof(float));
    double *sum = calloc(d, sizeof(double));
    hs_buf *b = newbuf();
    for (size_t r = 0; r < N; r++) {
        b->len = 0;
        assert_true(hs_compress_encode(c, x, d, 5, r, b) > 0);
        memset(acc, 0, d * sizeof(float));
        assert_int_equal(hs_compress_decode_add(c, b->data, b->len, 5, r, acc, d, 1.0f), 0);
        /* Stratified: exactly one nonzero per stratum. */
        for (uint32_t j = 0; j < 9; j++) {
            uint32_t st, m, nz = 0;
            hs_cw_randk_stratum((uint32_t)d, 9, j, &st, &m);
            for (uint32_t i = st; i < st + m; i++) nz += acc[i] != 0.0f;
            assert_int_equal(nz, 1);
        }
        for (size_t i = 0; i < d; i++) sum[i] += acc[i];
    }
    for (uint32_t j = 0; j < 9; j++) {
        uint32_t st, m;
        hs_cw_randk_stratum((uint32_t)d, 9, j, &st, &m);
        assert_int_equal(m, j == 0 ? 8 : 7);
        for (size_t i = st; i < st + m; i++) {
            double mean = sum[i] / (double)N;
            double sd = fabs((double)x[i]) * sqrt((m - 1.0) / (double)N);
            double tol = 5 * sd + 1e-6 * fabs((double)x[i]);
            if (fabs(mean - x[i]) > tol)
                fprintf(stderr, "randk element %zu: mean %g, x %g, tol %g\n", i, mean,
                        (double)x[i], tol);
            assert_true(fabs(mean - x[i]) <= tol);
        }
    }
    hs_buf_unref(b);
    free(sum);
    free(acc);
    free(x);
    hs_compressor_free(c);
}

/* QSGD: Q(x_i) = u * l with u = norm / s and l = floor(r) + Bernoulli(p), p = r - floor(r), so
 * Var = u^2 p (1 - p) per element; the mean of N draws has sd = u sqrt(p (1 - p) / N), and we
 * allow 5 sd (>= N p(1-p) effective trials; elements with p near 0 or 1 have tiny sd, so the
 * tolerance also carries the deterministic error: the draw resolution (bias < 2^-16 levels),
 * float rounding of r (relative 2^-23, i.e. < s 2^-22 levels) and of the value (|x| 2^-22)). */
static void test_qsgd_unbiased(void **state) {
    (void)state;
    const size_t d = 1000, N = 10000;
    const uint32_t s = 4;
    hs_compressor *c = mk("qsgd:4", d, 99); /* buckets of 512 and 488 */
    float *x = test_vec(d, 4, VEC_GAUSS), *acc = malloc(d * sizeof(float));
    double *sum = calloc(d, sizeof(double));
    hs_buf *b = newbuf();
    for (size_t r = 0; r < N; r++) {
        b->len = 0;
        assert_true(hs_compress_encode(c, x, d, 1, r, b) > 0);
        memset(acc, 0, d * sizeof(float));
        assert_int_equal(hs_compress_decode_add(c, b->data, b->len, 1, r, acc, d, 1.0f), 0);
        for (size_t i = 0; i < d; i++) sum[i] += acc[i];
    }
    int wide = 0;
    for (size_t j = 0; j < 2; j++) {
        size_t lo = 512 * j, hi = j ? d : 512;
        double ss = 0;
        for (size_t i = lo; i < hi; i++) ss += (double)x[i] * x[i];
        double u = sqrt(ss) / s;
        for (size_t i = lo; i < hi; i++) {
            double rr = fabs((double)x[i]) / u, p = rr - floor(rr);
            double sd = u * sqrt(p * (1 - p) / (double)N);
            double tol = 5 * sd + u * (0x1p-16 + s * 0x1p-22) + fabs((double)x[i]) * 0x1p-21;
            double mean = sum[i] / (double)N;
            if (fabs(mean - x[i]) > tol)
                fprintf(stderr, "qsgd element %zu: mean %.9g, x %.9g, tol %g\n", i, mean,
                        (double)x[i], tol);
            assert_true(fabs(mean - x[i]) <= tol);
            wide += sd > 0 && fabs(mean - x[i]) > 3 * sd;
        }
    }
    /* A sanity check that the tolerance is not vacuous: beyond 3 sd happens for ~0.3% of the
     * elements, so at most a handful here. */
    assert_true(wide < 20);
    hs_buf_unref(b);
    free(sum);
    free(acc);
    free(x);
    hs_compressor_free(c);
}

/* Different rounds and peers draw different numbers; the same ones draw the same. */
static void test_random_streams(void **state) {
    (void)state;
    size_t d = 1000;
    float *x = test_vec(d, 8, VEC_GAUSS);
    const char *specs[] = {"randk:0.1", "qsgd:4"};
    for (int s = 0; s < 2; s++) {
        hs_compressor *c = mk(specs[s], d, 5), *c2 = mk(specs[s], d, 5), *c3 = mk(specs[s], d, 6);
        hs_buf *a = newbuf(), *b = newbuf();
        assert_true(hs_compress_encode(c, x, d, 1, 2, a) > 0);
        assert_true(hs_compress_encode(c2, x, d, 1, 2, b) > 0);
        assert_int_equal(a->len, b->len);
        assert_memory_equal(a->data, b->data, a->len);
        uint64_t variants[3][2] = {{1, 3}, {2, 2}, {1, 2 + (1ull << 32)}};
        for (int v = 0; v < 3; v++) {
            b->len = 0;
            assert_true(hs_compress_encode(c, x, d, (uint32_t)variants[v][0], variants[v][1], b) >
                        0);
            assert_true(memcmp(a->data + 12, b->data + 12, a->len - 12) != 0);
        }
        b->len = 0;
        assert_true(hs_compress_encode(c3, x, d, 1, 2, b) > 0);
        assert_true(memcmp(a->data + 12, b->data + 12, a->len - 12) != 0);
        hs_buf_unref(a);
        hs_buf_unref(b);
        hs_compressor_free(c);
        hs_compressor_free(c2);
        hs_compressor_free(c3);
    }
    free(x);
}

/* ---------------------------------------------------------------- sign and casts */

static void test_sign_values(void **state) {
    (void)state;
    size_t d = 1001;
    float *x = test_vec(d, 12, VEC_GAUSS), *out = malloc(d * sizeof(float));
    hs_compressor *c = mk("sign", d, 0);
    assert_int_equal(hs_compress_apply(c, x, d, 0, 0, out), 0);
    double l1 = 0;
    for (size_t i = 0; i < d; i++) l1 += fabs((double)x[i]);
    for (size_t i = 0; i < d; i++) {
        assert_true(fabs(fabs((double)out[i]) - l1 / d) <= 1e-6 * l1 / d);
        assert_true(signbit(out[i]) == signbit(x[i]));
    }
    hs_compressor_free(c);
    c = mk("sign:100", d, 0);
    assert_int_equal(hs_compress_apply(c, x, d, 0, 0, out), 0);
    for (size_t j = 0; j < 11; j++) {
        size_t lo = 100 * j, hi = j == 10 ? d : lo + 100;
        double s = 0;
        for (size_t i = lo; i < hi; i++) s += fabs((double)x[i]);
        s /= (double)(hi - lo);
        for (size_t i = lo; i < hi; i++) assert_true(fabs(fabs((double)out[i]) - s) <= 1e-6 * s);
    }
    hs_compressor_free(c);
    free(out);
    free(x);
}

/* The integer fp16 conversion against exact rounding in double, and against F16C. */
static void test_half_conversions(void **state) {
    (void)state;
    hs_rng r;
    hs__rng_init(&r, 1, HS_RNG_TEST, 0, 0);
    int top = hs__csimd_level();
    enum { N = 1 << 16 };
    float *x = malloc(N * sizeof(float));
    uint8_t *h = malloc(2 * N);
    for (int rep = 0; rep < 64; rep++) {
        for (int i = 0; i < N; i++) {
            uint32_t u = hs__rng_u32(&r);
            /* Mostly around the fp16 range, including subnormals and the rounding edges. */
            if (i % 2) u = (u & 0x80001FFFu) | ((0x33000000u + (u >> 13 & 0x7FFu) * 0x8000u) & 0x7FFFE000u);
            if ((u & 0x7FFFFFFFu) >= HS_CW_F16_OVERFLOW) u &= 0xBFFFFFFFu;
            memcpy(&x[i], &u, 4);
        }
        for (int i = 0; i < N; i++) {
            /* Exact: round |x| / 2^e to an integer (ties to even) on the fp16 grid. */
            double a = fabs((double)x[i]);
            int e;
            frexp(a, &e);
            int q = e - 11 < -24 ? -24 : e - 11; /* grid spacing exponent */
            double want = nearbyint(a / ldexp(1, q)) * ldexp(1, q);
            float got = hs_cw_f32_from_f16(hs_cw_f16_from_f32(x[i]));
            if (fabs((double)got) != want) {
                fprintf(stderr, "fp16 of %a: got %a, want %a\n", (double)x[i], (double)got, want);
                fail();
            }
            assert_true(signbit(got) == signbit(x[i]));
        }
        for (int lv = 0; lv <= top; lv++) {
            hs__csimd_cap(lv);
            hs__cf16_encode(x, N, h);
            for (int i = 0; i < N; i++)
                assert_int_equal(hs__ld16(h + 2 * i), hs_cw_f16_from_f32(x[i]));
        }
        hs__csimd_cap(2);
    }
    /* Edges: the largest half, the first value rounding to infinity, the smallest subnormal. */
    assert_int_equal(hs_cw_f16_from_f32(65504.0f), 0x7BFF);
    assert_int_equal(hs_cw_f16_from_f32(65519.996f), 0x7BFF);
    assert_int_equal(hs_cw_f16_from_f32(65520.0f), 0x7C00);
    assert_int_equal(hs_cw_f16_from_f32(0x1p-24f), 0x0001);
    assert_int_equal(hs_cw_f16_from_f32(0x1p-25f), 0x0000);          /* tie to even: 0 */
    assert_int_equal(hs_cw_f16_from_f32(0x1.8p-24f), 0x0002);        /* tie to even: 2 */
    assert_int_equal(hs_cw_f16_from_f32(0x1.ffcp-15f), 0x0400);      /* rounds up to normal */
    assert_int_equal(hs_cw_f16_from_f32(-0.0f), 0x8000);
    assert_int_equal(hs_cw_bf16_from_f32(1.00390625f), 0x3F80);      /* tie to even */
    assert_int_equal(hs_cw_bf16_from_f32(1.01171875f), 0x3F82);      /* tie to even, up */
    assert_true(hs_cw_f32_from_f16(0x0001) == 0x1p-24f);
    assert_true(hs_cw_f32_from_f16(0xFBFF) == -65504.0f);
    free(x);
    free(h);
}

/* ---------------------------------------------------------------- kernels */

static void test_kernels(void **state) {
    (void)state;
    int top = hs__csimd_level();
    /* Philox: bulk fill = the stream's words, any start block and length. */
    uint32_t *w = malloc(4096 * sizeof(uint32_t));
    for (int lv = 0; lv <= top; lv++) {
        hs__csimd_cap(lv);
        size_t lens[] = {0, 1, 3, 4, 31, 32, 33, 64, 65, 1000, 4096};
        for (size_t q = 0; q < sizeof(lens) / sizeof(lens[0]); q++) {
            uint64_t first = 4 * (uint64_t)(q * 977);
            hs__cphilox_fill(0x1234567887654321ull, HS_RNG_QSGD, 7, 9, first, lens[q], w);
            for (size_t j = 0; j < lens[q]; j++)
                assert_int_equal(w[j], hs_rng_at(0x1234567887654321ull, HS_RNG_QSGD, 7, 9,
                                                 first + j));
        }
    }
    hs__csimd_cap(2);
    free(w);
    /* Bit packing of b-bit fields: all levels agree and invert. */
    uint8_t f[1003], g[1003], p0[1003], p1[1003];
    for (uint32_t b = 1; b <= 8; b++) {
        for (size_t n = 0; n <= 1003; n += (n < 40 ? 1 : 97)) {
            for (size_t i = 0; i < n; i++) f[i] = (uint8_t)((i * 2654435761u >> 7) & ((1u << b) - 1));
            size_t bytes = (n * b + 7) / 8;
            memset(p0, 0xEE, sizeof(p0));
            hs__csimd_cap(0);
            hs__cbits_pack8(f, n, b, p0);
            for (int lv = 1; lv <= top; lv++) {
                hs__csimd_cap(lv);
                memset(p1, 0xEE, sizeof(p1));
                hs__cbits_pack8(f, n, b, p1);
                assert_memory_equal(p0, p1, sizeof(p0)); /* nothing written past the end */
            }
            for (int lv = 0; lv <= top; lv++) {
                hs__csimd_cap(lv);
                memset(g, 0xAA, sizeof(g));
                hs__cbits_unpack8(p0, n, b, g);
                if (n) assert_memory_equal(f, g, n);
            }
            hs__csimd_cap(2);
            for (size_t i = bytes; i < sizeof(p0); i++) assert_int_equal(p0[i], 0xEE);
        }
    }
    /* Reductions, sign bits and QSGD fields at every level, bit for bit. */
    size_t n = 4099;
    float *x = test_vec(n, 13, VEC_WIDE);
    x[5] = -0.0f;
    uint16_t *u = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) u[i] = (uint16_t)hs_cw_qsgd_draw(3, 4, 5, i);
    hs__csimd_cap(0);
    double l1 = hs__cl1(x, n), l2 = hs__cl2sq(x, n);
    uint8_t *s0 = malloc(n / 8 + 1), *s1 = malloc(n / 8 + 1), *q0 = malloc(n), *q1 = malloc(n);
    hs__csign_pack(x, n, s0);
    float pre, inv;
    hs_cw_qsgd_factors(hs_cw_qsgd_norm(l2), 100, &pre, &inv);
    hs__cqsgd_fields8(x, n, pre, inv, 100, 8, u, q0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(q0[i], hs_cw_qsgd_field(x[i], pre, inv, 100, 8, u[i]));
    for (int lv = 1; lv <= top; lv++) {
        hs__csimd_cap(lv);
        double a = hs__cl1(x, n), b2 = hs__cl2sq(x, n);
        assert_memory_equal(&a, &l1, sizeof(double));
        assert_memory_equal(&b2, &l2, sizeof(double));
        hs__csign_pack(x, n, s1);
        assert_memory_equal(s0, s1, n / 8 + 1);
        hs__cqsgd_fields8(x, n, pre, inv, 100, 8, u, q1);
        assert_memory_equal(q0, q1, n);
    }
    hs__csimd_cap(2);
    free(s0);
    free(s1);
    free(q0);
    free(q1);
    free(u);
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_topk_selection),
        cmocka_unit_test(test_topk_contraction),
        cmocka_unit_test(test_randk_unbiased),
        cmocka_unit_test(test_qsgd_unbiased),
        cmocka_unit_test(test_random_streams),
        cmocka_unit_test(test_sign_values),
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
