/* Unit tests of batch lanes (src/model/model.c on the CPU backend's pool, src/core/pool.c): a
 * step split over T threads gives the one-lane gradient up to summation order, the same bits on
 * every run, works for any batch size, reports a worker's error with its message, and
 * evaluates to the same counts. Several backends with lanes run at once in one process. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/pool.h"
#include "core/rng.h"
#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "model/devshard.h"

static hs_backend *open_cpu(int threads) {
    hs_backend *be;
    hs_backend_cfg cfg = {threads, 0};
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &cfg), 0);
    return be;
}

/* resnet20 (GroupNorm, residual shortcuts, strided stages) on 3 x 8 x 8 inputs: every layer
 * kind the lanes split, small enough for a unit test. */
static void small_resnet(hs_model_spec *s) {
    assert_int_equal(hs_model_spec_parse(s, "resnet20", NULL, 3, 8, 8, 10), 0);
}

static float *inputs(int n, int dim, uint64_t seed) {
    float *x = malloc(sizeof(float) * (size_t)n * (size_t)dim);
    assert_non_null(x);
    hs_rng r;
    hs__rng_init(&r, seed, HS_RNG_INIT, 0, 0);
    for (size_t i = 0; i < (size_t)n * (size_t)dim; i++) x[i] = (float)hs__rng_normal(&r);
    return x;
}

static int32_t *labels(int n) {
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(y);
    for (int i = 0; i < n; i++) y[i] = (int32_t)((i * 7 + 3) % 10);
    return y;
}

/* ||a - b|| / ||b||. */
static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / sqrt(den);
}

/* The gradient and statistics of one step on `bs` examples with T threads (max_batch mb). */
static float *grad_with(int threads, int mb, int bs, hs_step_stats *st) {
    hs_model_spec spec;
    small_resnet(&spec);
    hs_backend *be = open_cpu(threads);
    hs_model *m;
    assert_int_equal(hs_model_new_spec(&m, be, &spec, mb), 0);
    assert_int_equal(hs_model_init(m, 5), 0);
    float *x = inputs(bs, 3 * 8 * 8, 9);
    int32_t *y = labels(bs);
    int err = hs_model_grad(m, x, y, bs, st);
    if (err < 0) fail_msg("grad: %s", hs_error_message());
    size_t n = hs_model_nparams(m);
    float *g = malloc(sizeof(float) * n);
    assert_non_null(g);
    memcpy(g, hs_model_grads(m), sizeof(float) * n);
    free(x);
    free(y);
    hs_model_free(m);
    hs_backend_close(be);
    return g;
}

static size_t resnet_nparams(void) {
    hs_model_spec spec;
    small_resnet(&spec);
    return hs_model_spec_nparams(&spec);
}

/* T lanes against one: the same gradient up to the order of the sums (relative error < 1e-5),
 * the same correct count, and the same loss up to float rounding (OpenBLAS may take another
 * kernel for a GEMM of fewer rows, so a logit can differ in its last bit). */
static void expect_like_one_lane(int threads, int mb, int bs) {
    hs_step_stats s1, sT;
    float *g1 = grad_with(1, mb, bs, &s1);
    float *gT = grad_with(threads, mb, bs, &sT);
    double e = rel_err(gT, g1, resnet_nparams());
    if (!(e < 1e-5))
        fail_msg("threads %d, batch %d of %d: gradient relative error %g", threads, bs, mb, e);
    assert_int_equal(sT.count, bs);
    assert_int_equal(sT.correct, s1.correct);
    if (!(fabs(sT.loss - s1.loss) <= 1e-6 * fabs(s1.loss)))
        fail_msg("threads %d, batch %d of %d: loss %.17g, one lane %.17g", threads, bs, mb,
                 sT.loss, s1.loss);
    free(g1);
    free(gT);
}

static void test_two_lanes_match_one(void **state) {
    (void)state;
    expect_like_one_lane(2, 16, 16);
    /* Not bitwise equal: the lanes really split the sums (else this test proves nothing). */
    hs_step_stats s1, s2;
    float *g1 = grad_with(1, 16, 16, &s1);
    float *g2 = grad_with(2, 16, 16, &s2);
    assert_memory_not_equal(g1, g2, sizeof(float) * resnet_nparams());
    free(g1);
    free(g2);
}

static void test_odd_batches(void **state) {
    (void)state;
    expect_like_one_lane(2, 16, 5);  /* parts of 3 and 2 */
    expect_like_one_lane(2, 16, 1);  /* fewer examples than lanes */
    expect_like_one_lane(3, 8, 7);   /* parts of 3, 2, 2 */
    expect_like_one_lane(4, 8, 3);   /* a lane without an example */
    expect_like_one_lane(2, 1, 1);   /* max_batch below the lanes: one lane */
}

/* A few SGD steps with lanes: the same parameters, bit for bit, on every run. */
static float *train_steps(int threads, int steps) {
    hs_model_spec spec;
    small_resnet(&spec);
    hs_backend *be = open_cpu(threads);
    hs_model *m;
    assert_int_equal(hs_model_new_spec(&m, be, &spec, 12), 0);
    assert_int_equal(hs_model_init(m, 21), 0);
    size_t n = hs_model_nparams(m);
    for (int s = 0; s < steps; s++) {
        float *x = inputs(12, 3 * 8 * 8, 100 + (uint64_t)s);
        int32_t *y = labels(12);
        if (hs_model_grad(m, x, y, 12, NULL) < 0) fail_msg("grad: %s", hs_error_message());
        float *p = hs_model_params(m);
        const float *g = hs_model_grads(m);
        for (size_t i = 0; i < n; i++) p[i] -= 0.05f * g[i];
        free(x);
        free(y);
    }
    float *out = malloc(sizeof(float) * n);
    assert_non_null(out);
    memcpy(out, hs_model_params(m), sizeof(float) * n);
    hs_model_free(m);
    hs_backend_close(be);
    return out;
}

static void test_bit_identical_runs(void **state) {
    (void)state;
    float *a = train_steps(2, 4), *b = train_steps(2, 4);
    assert_memory_equal(a, b, sizeof(float) * resnet_nparams());
    free(a);
    free(b);
}

/* Several models with lanes in one process at once (nodes on threads, the simulator's peers):
 * each thread gets what it gets alone. */
static void *train_thread(void *arg) {
    *(float **)arg = train_steps(2, 3);
    return NULL;
}

static void test_concurrent_models(void **state) {
    (void)state;
    float *alone = train_steps(2, 3);
    pthread_t th[2];
    float *got[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, train_thread, &got[i]), 0);
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 2; i++) {
        assert_memory_equal(got[i], alone, sizeof(float) * resnet_nparams());
        free(got[i]);
    }
    free(alone);
}

/* A bad label in lane 1's part, passed where only the softmax checks it (a device batch): the
 * worker's error comes back on the caller's thread with its message and the lane named. */
static void test_worker_error_reaches_caller(void **state) {
    (void)state;
    hs_model_spec spec;
    small_resnet(&spec);
    hs_backend *be = open_cpu(2);
    hs_model *m;
    assert_int_equal(hs_model_new_spec(&m, be, &spec, 8), 0);
    assert_int_equal(hs_model_init(m, 5), 0);
    float *x = inputs(8, 3 * 8 * 8, 9);
    int32_t *y = labels(8);
    y[6] = 42;
    assert_int_equal(hs__model_grad_dev(m, x, y, 8, NULL), HS_EINVAL);
    const char *msg = hs_error_message();
    if (!strstr(msg, "lane 1 of 2 (examples 4..7 of 8)") || !strstr(msg, "label 42"))
        fail_msg("message: %s", msg);
    /* The model still works afterwards. */
    y[6] = 1;
    assert_int_equal(hs__model_grad_dev(m, x, y, 8, NULL), 0);
    free(x);
    free(y);
    hs_model_free(m);
    hs_backend_close(be);
}

static void test_evaluate_matches(void **state) {
    (void)state;
    hs_model_spec spec;
    small_resnet(&spec);
    hs_dataset ds;
    memset(&ds, 0, sizeof(ds));
    ds.n = 37;
    ds.channels = 3, ds.height = 8, ds.width = 8, ds.dim = 3 * 8 * 8, ds.classes = 10;
    ds.x = inputs(37, ds.dim, 3);
    ds.y = malloc(37);
    assert_non_null(ds.y);
    for (int i = 0; i < 37; i++) ds.y[i] = (uint8_t)(i % 10);
    strcpy(ds.name, "test-images");
    double loss[2], acc[2];
    for (int t = 1; t <= 2; t++) {
        hs_backend *be = open_cpu(t);
        hs_model *m;
        assert_int_equal(hs_model_new_spec(&m, be, &spec, 16), 0);
        assert_int_equal(hs_model_init(m, 8), 0);
        if (hs_model_evaluate(m, &ds, &loss[t - 1], &acc[t - 1]) < 0)
            fail_msg("evaluate: %s", hs_error_message());
        hs_model_free(m);
        hs_backend_close(be);
    }
    assert_true(acc[0] == acc[1]);
    assert_true(fabs(loss[0] - loss[1]) <= 1e-5 * fabs(loss[0]));
    free(ds.x);
    free(ds.y);
}

/* The pool runs every lane once per run, for many runs in a row. */
typedef struct count_job {
    int hits[4];
} count_job;

static void count_lane(void *arg, int k) { ((count_job *)arg)->hits[k]++; }

static void test_pool_runs_every_lane(void **state) {
    (void)state;
    hs__pool *p;
    assert_int_equal(hs__pool_new(&p, 4), 0);
    assert_int_equal(hs__pool_lanes(p), 4);
    count_job j = {{0, 0, 0, 0}};
    for (int r = 0; r < 500; r++) hs__pool_run(p, count_lane, &j);
    for (int k = 0; k < 4; k++) assert_int_equal(j.hits[k], 500);
    hs__pool_free(p);
    assert_int_equal(hs__pool_new(&p, 0), HS_EINVAL);
    hs__pool_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_runs_every_lane),
        cmocka_unit_test(test_two_lanes_match_one),
        cmocka_unit_test(test_odd_batches),
        cmocka_unit_test(test_bit_identical_runs),
        cmocka_unit_test(test_concurrent_models),
        cmocka_unit_test(test_worker_error_reaches_caller),
        cmocka_unit_test(test_evaluate_matches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
