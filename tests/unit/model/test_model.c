/* Unit tests of the MLP and the optimizer: configuration parsing, a gradient check against a
 * double-precision reference of the same flat-vector model, bit-identical determinism, the
 * learning-rate schedules, and that it actually learns a synthetic task. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/model.h"

static hs_backend *open_cpu(int threads) {
    hs_backend *be;
    hs_backend_cfg cfg = {threads, 0};
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &cfg), 0);
    return be;
}

static void test_cfg(void **state) {
    (void)state;
    hs_mlp_cfg c;
    hs_mlp_cfg_default(&c);
    assert_int_equal(hs_mlp_cfg_nparams(&c), 235146);
    char s[64];
    hs_mlp_cfg_format(&c, s, sizeof(s));
    assert_string_equal(s, "mlp:784-256-128-10");
    assert_int_equal(hs_mlp_cfg_parse(&c, 784, "64,32,16", 10), 0);
    assert_int_equal(c.n_layers, 4);
    assert_int_equal(c.width[3], 16);
    assert_int_equal(hs_mlp_cfg_parse(&c, 784, "", 10), 0);
    assert_int_equal(c.n_layers, 1);
    assert_int_equal(hs_mlp_cfg_parse(&c, 784, "64,0", 10), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "width 0"));
    assert_int_equal(hs_mlp_cfg_parse(&c, 784, "64,-3", 10), HS_EINVAL);
    assert_int_equal(hs_mlp_cfg_parse(&c, 784, "64,abc", 10), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "abc"));
    assert_int_equal(hs_mlp_cfg_parse(&c, 784, "64,", 10), HS_EINVAL);
}

/* Mean cross-entropy of the flat-vector MLP in double precision, straight from the layout
 * documented in model.h: per layer W (out x in, row-major) then b. */
static double ref_loss(const hs_mlp_cfg *c, const double *p, const float *x, const int32_t *y,
                       int bs) {
    double total = 0;
    double a[2][512];
    for (int e = 0; e < bs; e++) {
        int in = c->width[0];
        for (int j = 0; j < in; j++) a[0][j] = x[e * in + j];
        const double *w = p;
        int cur = 0;
        for (int l = 0; l < c->n_layers; l++) {
            int outw = c->width[l + 1];
            const double *b = w + (size_t)outw * in;
            for (int o = 0; o < outw; o++) {
                double s = b[o];
                for (int j = 0; j < in; j++) s += w[(size_t)o * in + j] * a[cur][j];
                a[cur ^ 1][o] = (l + 1 < c->n_layers && s < 0) ? 0 : s;
            }
            w = b + outw;
            cur ^= 1;
            in = outw;
        }
        double mx = -1e300, s = 0;
        for (int o = 0; o < in; o++) mx = a[cur][o] > mx ? a[cur][o] : mx;
        for (int o = 0; o < in; o++) s += exp(a[cur][o] - mx);
        total += log(s) - (a[cur][y[e]] - mx);
    }
    return total / bs;
}

static void test_gradient_check(void **state) {
    (void)state;
    hs_backend *be = open_cpu(1);
    hs_mlp_cfg c;
    assert_int_equal(hs_mlp_cfg_parse(&c, 13, "11,7", 5), 0);
    hs_model *m;
    const int bs = 6;
    assert_int_equal(hs_model_new(&m, be, &c, bs), 0);
    assert_int_equal(hs_model_init(m, 5), 0);
    size_t n = hs_model_nparams(m);
    assert_int_equal(n, 13 * 11 + 11 + 11 * 7 + 7 + 7 * 5 + 5);
    float *p = hs_model_params(m);
    /* Non-zero biases so every term of the backward pass is exercised. */
    hs_rng r;
    hs__rng_init(&r, 11, HS_RNG_TEST, 0, 0);
    for (size_t i = 0; i < n; i++) p[i] += (float)(0.1 * hs__rng_normal(&r));
    float x[6 * 13];
    int32_t y[6];
    for (int i = 0; i < bs * 13; i++) x[i] = (float)hs__rng_normal(&r);
    for (int i = 0; i < bs; i++) y[i] = (int32_t)hs__rng_uniform(&r, 5);
    hs_step_stats st;
    assert_int_equal(hs_model_grad(m, x, y, bs, &st), 0);
    const float *g = hs_model_grads(m);
    double *pd = malloc(sizeof(double) * n);
    assert_non_null(pd);
    for (size_t i = 0; i < n; i++) pd[i] = p[i];
    /* The float forward pass agrees with the double reference. */
    double l0 = ref_loss(&c, pd, x, y, bs);
    assert_true(fabs(st.loss - l0) < 1e-5 * (1 + fabs(l0)));
    /* Central differences in double: truncation and rounding errors are far below 1e-6, so any
     * disagreement beyond float rounding of the analytic gradient is a bug. */
    double num = 0, den = 0, worst = 0;
    const double h = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double keep = pd[i];
        pd[i] = keep + h;
        double lp = ref_loss(&c, pd, x, y, bs);
        pd[i] = keep - h;
        double lm = ref_loss(&c, pd, x, y, bs);
        pd[i] = keep;
        double fd = (lp - lm) / (2 * h);
        double diff = fabs(fd - g[i]);
        num += diff * diff;
        den += fd * fd;
        double rel = diff / (fabs(fd) + fabs(g[i]) + 1e-4);
        if (rel > worst) worst = rel;
    }
    double relnorm = sqrt(num / den);
    printf("# gradient check: %zu parameters, relative error %.2e (norm), worst element %.2e\n",
           n, relnorm, worst);
    assert_true(relnorm < 1e-3);
    assert_true(worst < 1e-3);
    free(pd);
    hs_model_free(m);
    hs_backend_close(be);
}

static hs_dataset *synth(size_t n, int dim, uint32_t split) {
    hs_dataset *ds;
    hs_synth_cfg sc = {n, dim, 10, 5.0f, 42, split};
    assert_int_equal(hs_dataset_synthetic(&ds, &sc), 0);
    return ds;
}

/* Trains `steps` steps from seed and returns a copy of the parameters. */
static float *train_copy(hs_backend *be, const hs_dataset *ds, uint64_t seed, int steps) {
    hs_mlp_cfg c;
    assert_int_equal(hs_mlp_cfg_parse(&c, ds->dim, "64,32", 10), 0);
    hs_model *m;
    hs_optim *o;
    hs_batcher *b;
    hs_optim_cfg oc;
    hs_optim_cfg_default(&oc);
    oc.total_steps = steps;
    oc.weight_decay = 1e-4f;
    assert_int_equal(hs_model_new(&m, be, &c, 32), 0);
    assert_int_equal(hs_model_init(m, seed), 0);
    assert_int_equal(hs_optim_new(&o, be, hs_model_nparams(m), &oc), 0);
    assert_int_equal(hs_batcher_new(&b, ds, 32, seed, 0, 0), 0);
    for (int s = 0; s < steps; s++) {
        const float *x;
        const int32_t *y;
        int bs = hs_batcher_next(b, &x, &y);
        assert_int_equal(hs_model_grad(m, x, y, bs, NULL), 0);
        assert_int_equal(hs_optim_step(o, hs_model_params(m), hs_model_grads(m), s, NULL), 0);
    }
    size_t n = hs_model_nparams(m);
    float *out = malloc(sizeof(float) * n);
    memcpy(out, hs_model_params(m), sizeof(float) * n);
    hs_batcher_free(b);
    hs_optim_free(o);
    hs_model_free(m);
    return out;
}

static void test_determinism(void **state) {
    (void)state;
    hs_dataset *ds = synth(1000, 50, 0);
    size_t n = 50 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10;
    for (int threads = 1; threads <= 2; threads++) {
        hs_backend *be = open_cpu(threads);
        float *a = train_copy(be, ds, 7, 100), *b = train_copy(be, ds, 7, 100);
        float *c = train_copy(be, ds, 8, 100);
        assert_memory_equal(a, b, sizeof(float) * n);
        assert_memory_not_equal(a, c, sizeof(float) * n);
        free(a);
        free(b);
        free(c);
        hs_backend_close(be);
    }
    hs_dataset_free(ds);
}

static void test_learns_synthetic(void **state) {
    (void)state;
    hs_backend *be = open_cpu(1);
    hs_dataset *tr = synth(4000, 100, 0), *te = synth(1000, 100, 1);
    hs_mlp_cfg c;
    assert_int_equal(hs_mlp_cfg_parse(&c, 100, "64", 10), 0);
    hs_model *m;
    hs_optim *o;
    hs_batcher *b;
    hs_optim_cfg oc;
    hs_optim_cfg_default(&oc);
    oc.total_steps = 600;
    assert_int_equal(hs_model_new(&m, be, &c, 64), 0);
    assert_int_equal(hs_model_init(m, 1), 0);
    double loss0, acc0, loss1, acc1;
    assert_int_equal(hs_model_evaluate(m, te, &loss0, &acc0), 0);
    assert_int_equal(hs_optim_new(&o, be, hs_model_nparams(m), &oc), 0);
    assert_int_equal(hs_batcher_new(&b, tr, 64, 1, 0, 0), 0);
    for (int s = 0; s < 600; s++) {
        const float *x;
        const int32_t *y;
        int bs = hs_batcher_next(b, &x, &y);
        assert_int_equal(hs_model_grad(m, x, y, bs, NULL), 0);
        assert_int_equal(hs_optim_step(o, hs_model_params(m), hs_model_grads(m), s, NULL), 0);
    }
    assert_int_equal(hs_model_evaluate(m, te, &loss1, &acc1), 0);
    printf("# synthetic: accuracy %.3f -> %.3f, loss %.3f -> %.3f\n", acc0, acc1, loss0, loss1);
    assert_true(acc0 < 0.4);
    assert_true(acc1 > 0.95);
    assert_true(loss1 < loss0 / 4);
    /* Mismatched inputs are refused with a message, not read out of bounds. */
    hs_dataset *wrong = synth(10, 99, 0);
    assert_int_equal(hs_model_evaluate(m, wrong, NULL, NULL), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "99 features"));
    const float *x;
    const int32_t *y;
    hs_batcher_next(b, &x, &y);
    assert_int_equal(hs_model_grad(m, x, y, 65, NULL), HS_EINVAL);
    int32_t bad[1] = {10};
    assert_int_equal(hs_model_grad(m, x, bad, 1, NULL), HS_EINVAL);
    hs_dataset_free(wrong);
    hs_batcher_free(b);
    hs_optim_free(o);
    hs_model_free(m);
    hs_dataset_free(tr);
    hs_dataset_free(te);
    hs_backend_close(be);
}

static void test_schedules(void **state) {
    (void)state;
    hs_optim_cfg c;
    hs_optim_cfg_default(&c);
    c.lr = 0.1f;
    c.sched = HS_LR_COSINE;
    c.total_steps = 100;
    assert_true(fabsf(hs_optim_lr(&c, 0) - 0.1f) < 1e-7f);
    assert_true(fabsf(hs_optim_lr(&c, 50) - 0.05f) < 1e-6f);
    assert_true(hs_optim_lr(&c, 100) < 1e-7f);
    assert_true(hs_optim_lr(&c, 1000) < 1e-7f);
    c.warmup_steps = 10;
    assert_true(fabsf(hs_optim_lr(&c, 0) - 0.01f) < 1e-7f);
    assert_true(fabsf(hs_optim_lr(&c, 9) - 0.1f) < 1e-7f);
    assert_true(fabsf(hs_optim_lr(&c, 10) - 0.1f) < 1e-7f);
    c.sched = HS_LR_STEP;
    c.warmup_steps = 0;
    c.step_size = 30;
    c.step_gamma = 0.5f;
    assert_true(hs_optim_lr(&c, 29) == 0.1f);
    assert_true(fabsf(hs_optim_lr(&c, 30) - 0.05f) < 1e-7f);
    assert_true(fabsf(hs_optim_lr(&c, 65) - 0.025f) < 1e-7f);
    c.sched = HS_LR_CONST;
    assert_true(hs_optim_lr(&c, 12345) == 0.1f);
    hs_lr_sched s;
    assert_int_equal(hs_lr_sched_parse("cosine", &s), 0);
    assert_int_equal(hs_lr_sched_parse("linear", &s), HS_EINVAL);
    /* Nonsense hyper-parameters are refused by name. */
    hs_backend *be = open_cpu(1);
    hs_optim *o;
    c.momentum = 1.5f;
    assert_int_equal(hs_optim_new(&o, be, 10, &c), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "--momentum"));
    c.momentum = 0.0f;
    c.nesterov = 1;
    assert_int_equal(hs_optim_new(&o, be, 10, &c), HS_EINVAL);
    hs_backend_close(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cfg),
        cmocka_unit_test(test_gradient_check),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_learns_synthetic),
        cmocka_unit_test(test_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
