/* The contraction delta each operator reports (hs_compressor_delta): its exact value from the
 * configuration, and that applying the operator to seeded vectors never loses more than
 * (1 - delta) of ||x||^2 where delta is a guarantee (top-k, unscaled random-k in expectation
 * over rounds, the casts), or to Gaussian vectors where it is a typical value (sign). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "util.h"

static hs_compressor *mk(const char *spec, size_t d) {
    hs_compressor *c = NULL;
    int err = hs_compressor_new(&c, spec, d, 3);
    if (err < 0) fprintf(stderr, "%s (d=%zu): %s\n", spec, d, hs_error_message());
    assert_int_equal(err, 0);
    return c;
}

static void test_delta_values(void **state) {
    (void)state;
    const double u16 = ldexp(1, -11), ub = ldexp(1, -8);
    struct {
        const char *spec;
        size_t d;
        double delta;
    } cases[] = {
        {"none", 10, 1.0},
        {"fp16", 10, 1.0 - u16 * u16},
        {"bf16", 10, 1.0 - ub * ub},
        {"topk:0.01", 235146, 2351.0 / 235146.0},
        {"topk:500", 1000, 0.5},
        {"topk:1.0", 7, 1.0},
        {"topk:0.5:fp16", 9, 4.0 / 9.0 * (1.0 - u16 * u16)},
        {"topk:0.5:fp8", 9, 4.0 / 9.0 * (1.0 - 0x1p-8)},
        {"ef:topk:0.1", 100, 0.1},
        /* Strata of ceil(d/k): 1000/10 = 100; 10/3 -> 4. */
        {"randk:0.01:unscaled", 1000, 0.01},
        {"randk:3:unscaled", 10, 0.25},
        {"randk:0.01", 1000, -98.0}, /* rescaled: error up to 99 ||x||^2 */
        {"randk:1.0", 7, 1.0},       /* k = d: every element is sent as it is */
        /* QSGD: B = min(bucket, d); omega = min(B/s^2, sqrt(B)/s). */
        {"qsgd:16", 100, 1.0 / (1.0 + 100.0 / 256.0)},
        {"qsgd:4:64", 100, 1.0 / 3.0},
        {"qsgd:16", 235146, 1.0 / (1.0 + sqrt(512.0) / 16.0)},
        {"sign", 100, 1.0 / M_PI},
        {"sign:2", 100, 1.0 / 2.0},
        {"sign:1", 100, 1.0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hs_compressor *c = mk(cases[i].spec, cases[i].d);
        double got = hs_compressor_delta(c);
        if (fabs(got - cases[i].delta) > 1e-12 * fabs(cases[i].delta))
            fail_msg("%s (d=%zu): delta %.17g, expected %.17g", cases[i].spec, cases[i].d, got,
                     cases[i].delta);
        assert_int_equal(hs_compressor_contractive(c), cases[i].delta > 0);
        hs_compressor_free(c);
    }
}

/* ||C(x) - x||^2 / ||x||^2 for one application (round r). */
static double loss_ratio(hs_compressor *c, const float *x, size_t d, uint64_t r) {
    float *out = malloc(d * sizeof(float));
    assert_int_equal(hs_compress_apply(c, x, d, 1, r, out), 0);
    double err = 0, nrm = 0;
    for (size_t i = 0; i < d; i++) {
        double e = (double)out[i] - (double)x[i];
        err += e * e;
        nrm += (double)x[i] * (double)x[i];
    }
    free(out);
    return err / nrm;
}

static void test_delta_bounds(void **state) {
    (void)state;
    const size_t d = 10000;
    /* Guarantees: every vector kind, every application (top-k, casts on normal values). */
    const char *sure[] = {"topk:0.01", "topk:0.1:fp16", "topk:37", "fp16", "bf16", "none"};
    for (size_t s = 0; s < sizeof(sure) / sizeof(sure[0]); s++) {
        hs_compressor *c = mk(sure[s], d);
        double delta = hs_compressor_delta(c);
        for (int kind = 0; kind < VEC_KINDS; kind++) {
            if (kind == VEC_WIDE) continue; /* subnormal fp16: outside the normal-range bound */
            float *x = test_vec(d, 40 + (uint64_t)kind, kind);
            double q = loss_ratio(c, x, d, 0);
            if (q > (1.0 - delta) * (1 + 1e-9) + 1e-15)
                fail_msg("%s kind %d: lost %.9g of ||x||^2, delta %.9g", sure[s], kind, q, delta);
            free(x);
        }
        hs_compressor_free(c);
    }
    /* In expectation: unscaled random-k averaged over 200 rounds keeps about delta; the mean
     * of 200 draws of a ratio in [0, 1] is within 0.02 of its expectation here by far. */
    float *x = test_vec(d, 7, VEC_GAUSS);
    hs_compressor *c = mk("randk:0.01:unscaled", d);
    double mean = 0;
    for (uint64_t r = 0; r < 200; r++) mean += loss_ratio(c, x, d, r) / 200;
    assert_true(mean <= 1.0 - hs_compressor_delta(c) + 0.02);
    hs_compressor_free(c);
    /* Rescaled random-k loses more than the vector: no contraction. */
    c = mk("randk:0.01", d);
    assert_true(loss_ratio(c, x, d, 0) > 1.0);
    hs_compressor_free(c);
    /* The scaled sign's typical delta holds for Gaussian vectors (2/pi there), whole-vector or
     * bucketed. */
    const char *sg[] = {"sign", "sign:512"};
    for (int s = 0; s < 2; s++) {
        c = mk(sg[s], d);
        assert_true(loss_ratio(c, x, d, 0) <= 1.0 - hs_compressor_delta(c));
        hs_compressor_free(c);
    }
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delta_values),
        cmocka_unit_test(test_delta_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
