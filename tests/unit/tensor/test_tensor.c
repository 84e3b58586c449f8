/* Unit tests of the CPU backend against naive double-precision references, and of the backend
 * registry's error paths. The CPU backend is the reference every other backend is compared
 * with, so these tests pin down its exact semantics. */
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
#include "hearsay/error.h"
#include "hearsay/tensor.h"
#include "hs_config.h"
#include "tensor/ew.h"

static hs_backend *be;

static int setup(void **state) {
    (void)state;
    hs_backend_cfg cfg = {1, 0};
    return hs_backend_open(&be, HS_DEVICE_CPU, &cfg);
}

static int teardown(void **state) {
    (void)state;
    hs_backend_close(be);
    return 0;
}

static void fill_random(float *x, size_t n, uint32_t stream) {
    hs_rng r;
    hs__rng_init(&r, 99, HS_RNG_TEST, stream, 0);
    for (size_t i = 0; i < n; i++) x[i] = (float)hs__rng_normal(&r);
}

static float *alloc_f(size_t n) {
    float *p;
    assert_int_equal(hs_be_alloc_f(be, n, &p), 0);
    for (size_t i = 0; i < n; i++) assert_true(p[i] == 0.0f); /* zeroed */
    return p;
}

static void test_gemm_all_transposes(void **state) {
    (void)state;
    const int m = 7, n = 5, k = 9;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *a = alloc_f((size_t)m * k), *b = alloc_f((size_t)k * n);
            float *c = alloc_f((size_t)m * n);
            fill_random(a, (size_t)m * k, 1);
            fill_random(b, (size_t)k * n, 2);
            fill_random(c, (size_t)m * n, 3);
            float *c0 = malloc(sizeof(float) * m * n);
            memcpy(c0, c, sizeof(float) * m * n);
            int lda = ta ? m : k, ldb = tb ? k : n;
            assert_int_equal(be->ops->gemm(be, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 2.0f, c, n), 0);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double s = 0;
                    for (int p = 0; p < k; p++) {
                        double av = ta ? a[p * lda + i] : a[i * lda + p];
                        double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                        s += av * bv;
                    }
                    double ref = 0.5 * s + 2.0 * c0[i * n + j];
                    assert_true(fabs(c[i * n + j] - ref) < 1e-5 * (1 + fabs(ref)));
                }
            free(c0);
            hs_be_free(be, a);
            hs_be_free(be, b);
            hs_be_free(be, c);
        }
    assert_true(be->ops->gemm(be, 0, 0, -1, 1, 1, 1, NULL, 1, NULL, 1, 0, NULL, 1) == HS_EINVAL);
}

static void test_vector_ops(void **state) {
    (void)state;
    const size_t n = 1003;
    float *x = alloc_f(n), *y = alloc_f(n), *y0 = malloc(sizeof(float) * n);
    fill_random(x, n, 4);
    fill_random(y, n, 5);
    memcpy(y0, y, sizeof(float) * n);
    assert_int_equal(hs_be_axpy(be, y, x, n, 0.25f), 0);
    for (size_t i = 0; i < n; i++) assert_true(y[i] == y0[i] + 0.25f * x[i]);
    memcpy(y, y0, sizeof(float) * n);
    assert_int_equal(be->ops->axpby(be, y, x, n, 0.5f, -2.0f), 0);
    for (size_t i = 0; i < n; i++) assert_true(y[i] == 0.5f * x[i] + -2.0f * y0[i]);
    assert_int_equal(hs_be_scale(be, y, n, 3.0f), 0);
    double d, ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * y[i];
    assert_int_equal(hs_be_dot(be, x, y, n, &d), 0);
    assert_true(fabs(d - ref) < 1e-9 * (1 + fabs(ref)));
    assert_int_equal(be->ops->fill(be, y, n, 1.5f), 0);
    for (size_t i = 0; i < n; i++) assert_true(y[i] == 1.5f);
    assert_int_equal(hs_be_copy_f(be, y, x, n), 0);
    assert_memory_equal(x, y, sizeof(float) * n);
    free(y0);
    hs_be_free(be, x);
    hs_be_free(be, y);
}

static void test_bias_and_relu(void **state) {
    (void)state;
    const int m = 6, n = 11;
    float *y = alloc_f((size_t)m * n), *b = alloc_f((size_t)n), *db = alloc_f((size_t)n);
    fill_random(y, (size_t)m * n, 6);
    fill_random(b, (size_t)n, 7);
    float *y0 = malloc(sizeof(float) * m * n);
    memcpy(y0, y, sizeof(float) * m * n);
    assert_int_equal(be->ops->bias_add(be, y, b, m, n), 0);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) assert_true(y[i * n + j] == y0[i * n + j] + b[j]);
    assert_int_equal(be->ops->bias_grad(be, db, y0, m, n), 0);
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int i = 0; i < m; i++) s += y0[i * n + j];
        assert_true(fabs(db[j] - s) < 1e-5);
    }
    assert_int_equal(be->ops->relu(be, y, y0, (size_t)m * n), 0);
    for (int i = 0; i < m * n; i++) assert_true(y[i] == (y0[i] > 0 ? y0[i] : 0.0f));
    float *dx = alloc_f((size_t)m * n);
    assert_int_equal(be->ops->relu_grad(be, dx, y0, y, (size_t)m * n), 0);
    for (int i = 0; i < m * n; i++) assert_true(dx[i] == (y[i] > 0 ? y0[i] : 0.0f));
    free(y0);
    hs_be_free(be, y);
    hs_be_free(be, b);
    hs_be_free(be, db);
    hs_be_free(be, dx);
}

static void test_softmax_xent(void **state) {
    (void)state;
    const int m = 5, k = 4;
    float z[20], dz[20];
    fill_random(z, 20, 8);
    z[3 * k + 2] = 50.0f; /* a large logit must not overflow */
    int32_t y[5] = {0, 3, 1, 2, 2};
    double loss;
    int correct;
    assert_int_equal(be->ops->softmax_xent(be, z, y, m, k, dz, 0.5f, &loss, &correct), 0);
    double ref = 0;
    int ok = 0;
    for (int i = 0; i < m; i++) {
        double mx = -1e30, s = 0;
        int arg = 0;
        for (int j = 0; j < k; j++)
            if (z[i * k + j] > mx) mx = z[i * k + j], arg = j;
        for (int j = 0; j < k; j++) s += exp(z[i * k + j] - mx);
        ref += log(s) - (z[i * k + y[i]] - mx);
        ok += arg == y[i];
        for (int j = 0; j < k; j++) {
            double g = 0.5 * (exp(z[i * k + j] - mx) / s - (j == y[i]));
            assert_true(fabs(dz[i * k + j] - g) < 1e-6);
        }
    }
    assert_true(fabs(loss - ref) < 1e-5);
    assert_int_equal(correct, ok);
    assert_true(isfinite(loss));
    /* In place, as the model uses it. */
    float z2[20];
    memcpy(z2, z, sizeof(z));
    assert_int_equal(be->ops->softmax_xent(be, z2, y, m, k, z2, 0.5f, NULL, NULL), 0);
    assert_memory_equal(z2, dz, sizeof(dz));
    int32_t bad[5] = {0, 4, 0, 0, 0};
    assert_int_equal(be->ops->softmax_xent(be, z, bad, m, k, NULL, 1, &loss, &correct), HS_EINVAL);
}

static void test_sgd_step(void **state) {
    (void)state;
    float x[3] = {1, -2, 3}, g[3] = {0.5f, 0.5f, -1}, v[3] = {0, 0, 0};
    hs_sgd_hparams h = {0.1f, 0.9f, 0.01f, 0};
    /* Two heavy-ball steps computed by hand in float. */
    float ex[3], ev[3];
    for (int i = 0; i < 3; i++) {
        ex[i] = x[i];
        ev[i] = 0;
        for (int s = 0; s < 2; s++) {
            float gp = g[i] + 0.01f * ex[i];
            ev[i] = 0.9f * ev[i] + gp;
            ex[i] = ex[i] - 0.1f * ev[i];
        }
    }
    for (int s = 0; s < 2; s++) assert_int_equal(be->ops->sgd_step(be, x, g, v, 3, &h), 0);
    for (int i = 0; i < 3; i++) {
        assert_true(x[i] == ex[i]);
        assert_true(v[i] == ev[i]);
    }
    /* Nesterov: d = g' + mu * v. */
    float xn = 1, vn = 0, gn = 0.5f;
    hs_sgd_hparams hn = {0.1f, 0.9f, 0.0f, 1};
    assert_int_equal(be->ops->sgd_step(be, &xn, &gn, &vn, 1, &hn), 0);
    assert_true(vn == 0.5f);
    assert_true(xn == 1.0f - 0.1f * (0.5f + 0.9f * 0.5f));
    /* No momentum: plain SGD, no velocity needed. */
    float xp = 1, gp = 2;
    hs_sgd_hparams hp = {0.25f, 0.0f, 0.0f, 0};
    assert_int_equal(be->ops->sgd_step(be, &xp, &gp, NULL, 1, &hp), 0);
    assert_true(xp == 0.5f);
    assert_int_equal(be->ops->sgd_step(be, &xp, &gp, NULL, 1, &h), HS_EINVAL);
}

static void test_registry(void **state) {
    (void)state;
    hs_device d;
    assert_int_equal(hs_device_parse("cpu", &d), 0);
    assert_int_equal(d, HS_DEVICE_CPU);
    assert_int_equal(hs_device_parse("cuda", &d), 0);
    assert_int_equal(d, HS_DEVICE_CUDA);
    assert_int_equal(hs_device_parse("tpu", &d), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "tpu"));
    /* cuda:N: the device number, digits only and in range; refused where none is wanted. */
    int id = -1;
    assert_int_equal(hs_device_parse_id("cuda", &d, &id), 0);
    assert_int_equal(id, 0);
    assert_int_equal(hs_device_parse_id("cuda:3", &d, &id), 0);
    assert_int_equal(d, HS_DEVICE_CUDA);
    assert_int_equal(id, 3);
    assert_int_equal(hs_device_parse_id("cpu", &d, &id), 0);
    assert_int_equal(d, HS_DEVICE_CPU);
    assert_int_equal(id, 0);
    static const char *const bad[] = {"cuda:", "cuda:-1", "cuda:+1", "cuda: 1", "cuda:0x1",
                                      "cuda:1024", "cuda:99999", "cpu:0", "cuda1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(hs_device_parse_id(bad[i], &d, &id), HS_EINVAL);
        assert_non_null(strstr(hs_error_message(), bad[i]));
    }
    assert_int_equal(hs_device_parse("cuda:1", &d), HS_EINVAL);
    assert_non_null(strstr(hs_backends_built(), "cpu"));
    assert_true(be->host_memory);
    assert_non_null(strstr(be->description, "cpu"));
    /* A CUDA backend that cannot be opened says why and leaves nothing behind. */
    setenv("HEARSAY_CUDA_MODULE", "/nonexistent/libhearsay-cuda.so", 1);
    hs_backend *cu = NULL;
    int err = hs_backend_open(&cu, HS_DEVICE_CUDA, NULL);
    if (err == 0) {
        hs_backend_close(cu); /* a machine with a GPU and the module beside the binary */
    } else {
        assert_true(err == HS_ENODEV || err == HS_ENOTSUP);
        assert_non_null(strstr(hs_error_message(), "--device cuda"));
    }
    unsetenv("HEARSAY_CUDA_MODULE");
    hs_backend_close(NULL);
}

static void test_ew_header(void **state) {
    (void)state;
    assert_true(hs_ew_relu(-1.0f) == 0.0f);
    assert_true(hs_ew_relu(2.0f) == 2.0f);
    assert_true(hs_ew_relu_grad(3.0f, 0.0f) == 0.0f);
    assert_true(hs_ew_relu_grad(3.0f, 1e-30f) == 3.0f);
    float x = 1.0f, v = 123.0f;
    hs_ew_sgd(&x, 1.0f, &v, 0.5f, 0.0f, 0.0f, 0); /* mu = 0 leaves v alone */
    assert_true(x == 0.5f && v == 123.0f);
}

/* GroupNorm's order of operations, written plainly: per example, per pixel, per group a double
 * sum from 0 over the group's channels, added to the group's total; the gradient likewise.
 * The backend's loops are restructured for speed and must still give these bits. */
static void gn_ref(const float *x, int n, int hw, int c, int groups, float eps, const float *gamma,
                   const float *beta, float *y, float *mean, float *rstd) {
    int cpg = c / groups;
    double cnt = (double)hw * cpg;
    for (int b = 0; b < n; b++) {
        const float *xb = x + (size_t)b * hw * c;
        for (int gi = 0; gi < groups; gi++) {
            double acc = 0, acc2 = 0;
            for (int p = 0; p < hw; p++) {
                double sum = 0;
                for (int k = 0; k < cpg; k++) sum += xb[(size_t)p * c + gi * cpg + k];
                acc += sum;
            }
            float m = (float)(acc / cnt);
            for (int p = 0; p < hw; p++) {
                double sum = 0;
                for (int k = 0; k < cpg; k++) {
                    double v = (double)xb[(size_t)p * c + gi * cpg + k] - (double)m;
                    sum += v * v;
                }
                acc2 += sum;
            }
            float r = (float)(1.0 / sqrt(acc2 / cnt + eps));
            mean[b * groups + gi] = m, rstd[b * groups + gi] = r;
            for (int p = 0; p < hw; p++)
                for (int k = 0; k < cpg; k++) {
                    size_t o = (size_t)b * hw * c + (size_t)p * c + gi * cpg + k;
                    y[o] = hs_ew_gn(x[o], m, r, gamma[gi * cpg + k], beta[gi * cpg + k]);
                }
        }
    }
}

static void gn_grad_ref(const float *dy, const float *x, int n, int hw, int c, int groups,
                        const float *gamma, const float *mean, const float *rstd, float *dx,
                        float *dgamma, float *dbeta) {
    int cpg = c / groups;
    double cnt = (double)hw * cpg;
    double *dg = calloc((size_t)2 * c, sizeof(double)), *db = dg + c;
    assert_non_null(dg);
    for (int b = 0; b < n; b++)
        for (int gi = 0; gi < groups; gi++) {
            float m = mean[b * groups + gi], r = rstd[b * groups + gi];
            double s1 = 0, s2 = 0;
            for (int p = 0; p < hw; p++) {
                double a1 = 0, a2 = 0;
                for (int k = 0; k < cpg; k++) {
                    size_t o = (size_t)b * hw * c + (size_t)p * c + gi * cpg + k;
                    float xhat = (x[o] - m) * r, g = dy[o] * gamma[gi * cpg + k];
                    a1 += g;
                    a2 += (double)g * xhat;
                }
                s1 += a1, s2 += a2;
            }
            float m1 = (float)(s1 / cnt), m2 = (float)(s2 / cnt);
            for (int p = 0; p < hw; p++)
                for (int k = 0; k < cpg; k++) {
                    size_t o = (size_t)b * hw * c + (size_t)p * c + gi * cpg + k;
                    float xhat = (x[o] - m) * r;
                    dx[o] = hs_ew_gn_grad(dy[o] * gamma[gi * cpg + k], xhat, r, m1, m2);
                }
        }
    /* The parameter gradients run over examples, then pixels, per channel. */
    for (int ch = 0; ch < c; ch++) {
        int gi = ch / cpg;
        for (int b = 0; b < n; b++)
            for (int p = 0; p < hw; p++) {
                size_t o = (size_t)b * hw * c + (size_t)p * c + ch;
                float xhat = (x[o] - mean[b * groups + gi]) * rstd[b * groups + gi];
                dg[ch] += (double)dy[o] * xhat;
                db[ch] += dy[o];
            }
        dgamma[ch] = (float)dg[ch], dbeta[ch] = (float)db[ch];
    }
    free(dg);
}

static void test_groupnorm_bits(void **state) {
    (void)state;
    const int shapes[][3] = {{16, 8, 25}, {32, 8, 9}, {64, 8, 4}, {12, 4, 7}, {16, 1, 5},
                             {16, 16, 3}, {24, 3, 6}};
    for (size_t t = 0; t < sizeof(shapes) / sizeof(shapes[0]); t++) {
        int c = shapes[t][0], groups = shapes[t][1], hw = shapes[t][2], n = 3;
        size_t len = (size_t)n * hw * c;
        float *buf = malloc(sizeof(float) * (8 * len + 8 * (size_t)c + 4 * (size_t)n * groups));
        assert_non_null(buf);
        float *x = buf, *dy = x + len, *y = dy + len, *yr = y + len, *dx = yr + len,
              *dxr = dx + len, *gamma = dxr + len, *beta = gamma + c, *dg = beta + c,
              *dgr = dg + c, *db = dgr + c, *dbr = db + c, *mean = dbr + c,
              *rstd = mean + n * groups, *meanr = rstd + n * groups, *rstdr = meanr + n * groups;
        fill_random(x, len, (uint32_t)t);
        for (size_t i = 0; i < len; i++) x[i] = x[i] * 3.0f + 1.5f;
        fill_random(dy, len, (uint32_t)t + 100);
        fill_random(gamma, (size_t)c, (uint32_t)t + 200);
        fill_random(beta, (size_t)c, (uint32_t)t + 300);
        assert_int_equal(be->ops->groupnorm(be, x, n, hw, c, groups, 1e-5f, gamma, beta, y, mean,
                                            rstd), 0);
        gn_ref(x, n, hw, c, groups, 1e-5f, gamma, beta, yr, meanr, rstdr);
        assert_memory_equal(mean, meanr, sizeof(float) * (size_t)n * groups);
        assert_memory_equal(rstd, rstdr, sizeof(float) * (size_t)n * groups);
        assert_memory_equal(y, yr, sizeof(float) * len);
        assert_int_equal(be->ops->groupnorm_grad(be, dy, x, n, hw, c, groups, gamma, mean, rstd,
                                                 dx, dg, db), 0);
        gn_grad_ref(dy, x, n, hw, c, groups, gamma, mean, rstd, dxr, dgr, dbr);
        assert_memory_equal(dx, dxr, sizeof(float) * len);
        assert_memory_equal(dg, dgr, sizeof(float) * (size_t)c);
        assert_memory_equal(db, dbr, sizeof(float) * (size_t)c);
        free(buf);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_all_transposes),
        cmocka_unit_test(test_vector_ops),
        cmocka_unit_test(test_bias_and_relu),
        cmocka_unit_test(test_softmax_xent),
        cmocka_unit_test(test_sgd_step),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_ew_header),
        cmocka_unit_test(test_groupnorm_bits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
