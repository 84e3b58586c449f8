/* The CUDA backend against the CPU reference: every op of hs_backend_ops on seeded random
 * inputs of awkward sizes, then a few hundred MLP training steps on both backends.
 *
 * The element-wise ops without transcendentals (fill, scale, axpy, axpby, relu, relu_grad,
 * bias_add, sgd_step) must match bit for bit: both backends run src/tensor/ew.h without FMA
 * contraction. GEMM, the reductions and the softmax (expf/logf differ in the last place) must
 * agree within tol + |ref| * eps, with bounds derived from the summation lengths. The
 * reductions must also be deterministic: the same call twice gives the same bits.
 *
 * Exit-code protocol: 77 (skip, the reason on stdout) when this build has no CUDA backend or
 * the machine no GPU, as in CI (the rule in ../cuda_open.h: a GPU that cannot be opened fails).
 * `test_cuda_backend --self-check` runs everything with a second CPU backend in place of CUDA,
 * to check this test's own logic on a machine without a GPU; it says nothing about the GPU. */
#include <float.h>
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
#include "hearsay/tensor.h"

#include "../cuda_open.h"

static hs_backend *cpu; /* the reference */
static hs_backend *dev; /* the backend under test: CUDA (or CPU with --self-check) */
static int self_check;

/* Awkward vector lengths: a single element, less than a warp, not a multiple of any block
 * size, and long enough that grid-stride loops and multi-block reductions take several turns. */
static const size_t sizes[] = {1, 7, 1000, 100003};
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* ------------------------------------------------------------------ helpers */

static float *host_f(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    return p;
}

static void random_normal(float *x, size_t n, uint32_t stream, float scale) {
    hs_rng r;
    hs__rng_init(&r, 2024, HS_RNG_TEST, stream, 0);
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)hs__rng_normal(&r);
    /* Exact zeros and negative zeros exercise relu's and relu_grad's boundary. */
    if (n > 3) {
        x[n / 3] = 0.0f;
        x[n / 2] = -0.0f;
    }
}

/* Backend memory holding a copy of h (n floats). */
static float *dev_copy(hs_backend *be, const float *h, size_t n) {
    float *d;
    assert_int_equal(hs_be_alloc_f(be, n, &d), 0);
    assert_int_equal(hs_be_upload(be, d, h, sizeof(float) * n), 0);
    return d;
}

static void fetch(hs_backend *be, float *h, const float *d, size_t n) {
    assert_int_equal(hs_be_download(be, h, d, sizeof(float) * n), 0);
}

/* Fails with the first differing element unless got and ref have the same bits. */
static void expect_bits(const char *what, size_t size, const float *got, const float *ref,
                        size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], sizeof(float)) != 0 && bad++ == 0) first = i;
    if (bad)
        print_error("%s (n=%zu): %zu of %zu elements differ in their bits; first [%zu]: "
                    "%a (cuda) vs %a (cpu)\n",
                    what, size, bad, n, first, (double)got[first], (double)ref[first]);
    assert_int_equal(bad, 0);
}

/* Fails unless |got[i] - ref[i]| <= bound[i] (bound NULL: atol + rtol * |ref[i]|). */
static void expect_close(const char *what, const float *got, const float *ref, const double *bound,
                         double atol, double rtol, size_t n) {
    size_t bad = 0, first = 0;
    double first_lim = 0;
    for (size_t i = 0; i < n; i++) {
        double lim = bound ? bound[i] : atol + rtol * fabs((double)ref[i]);
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!(d <= lim) && bad++ == 0) {
            first = i;
            first_lim = lim;
        }
    }
    if (bad)
        print_error("%s: %zu of %zu elements out of tolerance; first [%zu]: %.9g (cuda) vs "
                    "%.9g (cpu), allowed %.3g\n",
                    what, bad, n, first, (double)got[first], (double)ref[first], first_lim);
    assert_int_equal(bad, 0);
}

/* ------------------------------------------------------------------ the backend object */

static void test_identity(void **state) {
    (void)state;
    if (self_check) skip();
    assert_int_equal(dev->device, HS_DEVICE_CUDA);
    assert_int_equal(dev->host_memory, 0);
    assert_string_equal(dev->ops->name, "cuda");
    assert_memory_equal(dev->description, "cuda (", 6);
    assert_non_null(strstr(dev->description, ", sm_"));
    assert_non_null(strstr(dev->description, " MiB)"));
}

/* Every op with nothing to do succeeds and touches nothing. */
static void test_empty(void **state) {
    (void)state;
    float one = 3.5f, *d = dev_copy(dev, &one, 1);
    double dot = -1;
    hs_sgd_hparams h = {0.1f, 0.9f, 0.0f, 0};
    const hs_backend_ops *o = dev->ops;
    assert_int_equal(o->fill(dev, d, 0, 1.0f), 0);
    assert_int_equal(o->scale(dev, d, 0, 2.0f), 0);
    assert_int_equal(o->axpy(dev, d, d, 0, 2.0f), 0);
    assert_int_equal(o->axpby(dev, d, d, 0, 2.0f, 3.0f), 0);
    assert_int_equal(o->dot(dev, d, d, 0, &dot), 0);
    assert_true(dot == 0.0);
    assert_int_equal(o->relu(dev, d, d, 0), 0);
    assert_int_equal(o->relu_grad(dev, d, d, d, 0), 0);
    assert_int_equal(o->bias_add(dev, d, d, 0, 1), 0);
    assert_int_equal(o->bias_add(dev, d, d, 1, 0), 0);
    assert_int_equal(o->bias_grad(dev, d, d, 1, 0), 0);
    assert_int_equal(o->sgd_step(dev, d, d, d, 0, &h), 0);
    assert_int_equal(o->gemm(dev, 0, 0, 0, 1, 1, 1.0f, d, 1, d, 1, 0.0f, d, 1), 0);
    assert_int_equal(o->gemm(dev, 0, 0, 1, 0, 1, 1.0f, d, 1, d, 1, 0.0f, d, 1), 0);
    double loss = -1;
    int correct = -1;
    assert_int_equal(o->softmax_xent(dev, d, NULL, 0, 10, d, 1.0f, &loss, &correct), 0);
    assert_true(loss == 0.0);
    assert_int_equal(correct, 0);
    assert_int_equal(o->copy(dev, d, d, 0), 0);
    assert_int_equal(o->upload(dev, d, &one, 0), 0);
    assert_int_equal(o->download(dev, &one, d, 0), 0);
    float back = 0;
    fetch(dev, &back, d, 1);
    assert_true(back == 3.5f);
    /* bias_grad over zero rows is zeros, as cpu.c's memset. */
    assert_int_equal(o->bias_grad(dev, d, d, 0, 1), 0);
    fetch(dev, &back, d, 1);
    assert_true(back == 0.0f);
    assert_int_equal(o->sync(dev), 0);
    hs_be_free(dev, d);
    hs_be_free(dev, NULL);
    void *z = NULL;
    assert_int_equal(o->alloc(dev, 0, &z), 0);
    hs_be_free(dev, z);
}

static void test_memory(void **state) {
    (void)state;
    for (size_t s = 0; s < N_SIZES; s++) {
        size_t n = sizes[s];
        float *h = host_f(n), *back = host_f(n), *d, *d2;
        /* alloc zeroes */
        assert_int_equal(hs_be_alloc_f(dev, n, &d), 0);
        fetch(dev, back, d, n);
        for (size_t i = 0; i < n; i++) assert_true(back[i] == 0.0f && !signbit(back[i]));
        /* upload and download round-trip every bit */
        random_normal(h, n, 1, 1.0f);
        assert_int_equal(hs_be_upload(dev, d, h, sizeof(float) * n), 0);
        fetch(dev, back, d, n);
        expect_bits("upload/download", n, back, h, n);
        /* copy within the backend */
        assert_int_equal(hs_be_alloc_f(dev, n, &d2), 0);
        assert_int_equal(hs_be_copy_f(dev, d2, d, n), 0);
        fetch(dev, back, d2, n);
        expect_bits("copy", n, back, h, n);
        /* overlapping copies behave as memmove, like cpu.c */
        if (n > 1) {
            assert_int_equal(hs_be_copy_f(dev, d + 1, d, n - 1), 0);
            memmove(h + 1, h, sizeof(float) * (n - 1));
            fetch(dev, back, d, n);
            expect_bits("overlapping copy up", n, back, h, n);
            assert_int_equal(hs_be_copy_f(dev, d, d + 1, n - 1), 0);
            memmove(h, h + 1, sizeof(float) * (n - 1));
            fetch(dev, back, d, n);
            expect_bits("overlapping copy down", n, back, h, n);
        }
        /* a byte-sized, unaligned transfer */
        if (n >= 8) {
            unsigned char bytes[5] = {1, 2, 3, 4, 5}, out[5] = {0};
            assert_int_equal(hs_be_upload(dev, (char *)d + 3, bytes, 5), 0);
            assert_int_equal(hs_be_download(dev, out, (const char *)d + 3, 5), 0);
            assert_memory_equal(out, bytes, 5);
        }
        assert_int_equal(dev->ops->sync(dev), 0);
        hs_be_free(dev, d);
        hs_be_free(dev, d2);
        free(h);
        free(back);
    }
}

/* ------------------------------------------------------------------ bit-exact element-wise */

/* Runs one vector op on both backends from the same inputs and compares the bits of its
 * outputs: y (always) and v (when sgd uses it). */
enum vop { V_FILL, V_SCALE, V_AXPY, V_AXPBY, V_RELU, V_RELU_INPLACE, V_RELU_GRAD,
           V_RELU_GRAD_INPLACE, V_SGD_PLAIN, V_SGD_HEAVY, V_SGD_NESTEROV, V_ADAMW, V_COUNT };
static const char *const vop_name[V_COUNT] = {
    "fill", "scale", "axpy", "axpby", "relu", "relu in place", "relu_grad",
    "relu_grad in place", "sgd_step (no momentum)", "sgd_step (heavy ball)",
    "sgd_step (nesterov)", "adamw_step"};

static void run_vop(hs_backend *be, enum vop op, float *y, float *x, float *w, float *v,
                    size_t n) {
    const hs_backend_ops *o = be->ops;
    hs_sgd_hparams plain = {0.05f, 0.0f, 1e-4f, 0};
    hs_sgd_hparams heavy = {0.1f, 0.9f, 5e-4f, 0};
    hs_sgd_hparams nest = {0.03f, 0.85f, 0.0f, 1};
    int err = 0;
    switch (op) {
    case V_FILL: err = o->fill(be, y, n, -1.25f); break;
    case V_SCALE: err = o->scale(be, y, n, 0.3f); break;
    case V_AXPY: err = o->axpy(be, y, x, n, -0.7f); break;
    case V_AXPBY: err = o->axpby(be, y, x, n, 1.1f, -0.35f); break;
    case V_RELU: err = o->relu(be, y, x, n); break;
    case V_RELU_INPLACE: err = o->relu(be, y, y, n); break;
    case V_RELU_GRAD: err = o->relu_grad(be, y, x, w, n); break;
    case V_RELU_GRAD_INPLACE: err = o->relu_grad(be, y, y, w, n); break;
    /* Several steps, so the velocity and the weight decay both matter. */
    case V_SGD_PLAIN:
        for (int t = 0; t < 3 && !err; t++) err = o->sgd_step(be, y, x, NULL, n, &plain);
        break;
    case V_SGD_HEAVY:
        for (int t = 0; t < 3 && !err; t++) err = o->sgd_step(be, y, x, v, n, &heavy);
        break;
    case V_SGD_NESTEROV:
        for (int t = 0; t < 3 && !err; t++) err = o->sgd_step(be, y, x, v, n, &nest);
        break;
    /* x is the gradient, w the first moment; the second moment must not be negative. Bias
     * corrections of steps 1..3 as hs_optim_step computes them. */
    case V_ADAMW:
        err = o->relu(be, v, v, n);
        for (int t = 1; t <= 3 && !err; t++) {
            hs_adamw_hparams h = {0.9f, 0.999f, 1e-8f, 1.0f - 1e-3f * 0.01f,
                                  (float)(1e-3 / (1.0 - pow(0.9, t))),
                                  (float)(1.0 / sqrt(1.0 - pow(0.999, t)))};
            err = o->adamw_step(be, y, x, w, v, n, &h);
        }
        break;
    default: fail();
    }
    assert_int_equal(err, 0);
}

static void test_elementwise_bits(void **state) {
    (void)state;
    for (size_t s = 0; s < N_SIZES; s++) {
        size_t n = sizes[s];
        float *hy = host_f(n), *hx = host_f(n), *hw = host_f(n), *hv = host_f(n);
        float *ry = host_f(n), *rv = host_f(n), *gy = host_f(n), *gv = host_f(n);
        random_normal(hy, n, 10, 2.0f);
        random_normal(hx, n, 11, 1.0f);
        random_normal(hw, n, 12, 1.0f);
        random_normal(hv, n, 13, 0.1f);
        for (int op = 0; op < V_COUNT; op++) {
            float *cy = dev_copy(cpu, hy, n), *cx = dev_copy(cpu, hx, n);
            float *cw = dev_copy(cpu, hw, n), *cv = dev_copy(cpu, hv, n);
            float *dy = dev_copy(dev, hy, n), *dx = dev_copy(dev, hx, n);
            float *dw = dev_copy(dev, hw, n), *dv = dev_copy(dev, hv, n);
            run_vop(cpu, (enum vop)op, cy, cx, cw, cv, n);
            run_vop(dev, (enum vop)op, dy, dx, dw, dv, n);
            fetch(cpu, ry, cy, n);
            fetch(dev, gy, dy, n);
            expect_bits(vop_name[op], n, gy, ry, n);
            fetch(cpu, rv, cv, n);
            fetch(dev, gv, dv, n);
            expect_bits(vop_name[op], n, gv, rv, n); /* velocity (untouched but by sgd, adamw) */
            fetch(cpu, rv, cw, n);
            fetch(dev, gv, dw, n);
            expect_bits(vop_name[op], n, gv, rv, n); /* adamw's first moment */
            hs_be_free(cpu, cy), hs_be_free(cpu, cx), hs_be_free(cpu, cw), hs_be_free(cpu, cv);
            hs_be_free(dev, dy), hs_be_free(dev, dx), hs_be_free(dev, dw), hs_be_free(dev, dv);
        }
        free(hy), free(hx), free(hw), free(hv), free(ry), free(rv), free(gy), free(gv);
    }
}

/* y[m x n] += b: a single IEEE add per element on both backends. */
static void test_bias_add_bits(void **state) {
    (void)state;
    static const int shapes[][2] = {{1, 1}, {7, 1}, {1, 7}, {7, 1000}, {1000, 7}, {3, 100003},
                                    {100003, 3}, {128, 256}};
    for (size_t c = 0; c < sizeof(shapes) / sizeof(shapes[0]); c++) {
        int m = shapes[c][0], n = shapes[c][1];
        size_t mn = (size_t)m * n;
        float *hy = host_f(mn), *hb = host_f((size_t)n), *ry = host_f(mn), *gy = host_f(mn);
        random_normal(hy, mn, 20, 1.0f);
        random_normal(hb, (size_t)n, 21, 1.0f);
        float *cy = dev_copy(cpu, hy, mn), *cb = dev_copy(cpu, hb, (size_t)n);
        float *dy = dev_copy(dev, hy, mn), *db = dev_copy(dev, hb, (size_t)n);
        assert_int_equal(cpu->ops->bias_add(cpu, cy, cb, m, n), 0);
        assert_int_equal(dev->ops->bias_add(dev, dy, db, m, n), 0);
        fetch(cpu, ry, cy, mn);
        fetch(dev, gy, dy, mn);
        char what[64];
        snprintf(what, sizeof(what), "bias_add %dx%d", m, n);
        expect_bits(what, mn, gy, ry, mn);
        hs_be_free(cpu, cy), hs_be_free(cpu, cb), hs_be_free(dev, dy), hs_be_free(dev, db);
        free(hy), free(hb), free(ry), free(gy);
    }
}

/* ------------------------------------------------------------------ reductions */

static void test_dot(void **state) {
    (void)state;
    /* 1000003 is past 1024 blocks of 256 threads: several elements per thread. */
    static const size_t dsizes[] = {1, 7, 1000, 100003, 1000003};
    for (size_t s = 0; s < sizeof(dsizes) / sizeof(dsizes[0]); s++) {
        size_t n = dsizes[s];
        float *hx = host_f(n), *hy = host_f(n);
        random_normal(hx, n, 30, 1.0f);
        random_normal(hy, n, 31, 3.0f);
        float *cx = dev_copy(cpu, hx, n), *cy = dev_copy(cpu, hy, n);
        float *dx = dev_copy(dev, hx, n), *dy = dev_copy(dev, hy, n);
        double ref, got, again, mag = 0;
        assert_int_equal(cpu->ops->dot(cpu, cx, cy, n, &ref), 0);
        assert_int_equal(dev->ops->dot(dev, dx, dy, n, &got), 0);
        assert_int_equal(dev->ops->dot(dev, dx, dy, n, &again), 0);
        for (size_t i = 0; i < n; i++) mag += fabs((double)hx[i] * hy[i]);
        /* Products of floats are exact in double; only the n additions round, in a different
         * order on each backend. */
        double lim = 2.0 * (double)(n + 1) * DBL_EPSILON * mag;
        if (!(fabs(got - ref) <= lim))
            print_error("dot n=%zu: %.17g (cuda) vs %.17g (cpu), allowed %.3g\n", n, got, ref,
                        lim);
        assert_true(fabs(got - ref) <= lim);
        assert_memory_equal(&got, &again, sizeof(double)); /* deterministic */
        hs_be_free(cpu, cx), hs_be_free(cpu, cy), hs_be_free(dev, dx), hs_be_free(dev, dy);
        free(hx), free(hy);
    }
}

static void test_bias_grad(void **state) {
    (void)state;
    /* 256 and 257 rows straddle the CUDA kernel's single-pass limit. */
    static const int shapes[][2] = {{1, 1}, {7, 1}, {1, 7}, {7, 1000}, {1000, 7}, {256, 10},
                                    {257, 10}, {3, 100003}, {100003, 3}, {128, 256}};
    for (size_t c = 0; c < sizeof(shapes) / sizeof(shapes[0]); c++) {
        int m = shapes[c][0], n = shapes[c][1];
        size_t mn = (size_t)m * n;
        float *hdy = host_f(mn), *ref = host_f((size_t)n), *got = host_f((size_t)n);
        float *again = host_f((size_t)n);
        double *lim = malloc(sizeof(double) * (size_t)n);
        assert_non_null(lim);
        random_normal(hdy, mn, 40, 1.0f);
        float *cdy = dev_copy(cpu, hdy, mn), *cdb, *ddb;
        float *ddy = dev_copy(dev, hdy, mn);
        assert_int_equal(hs_be_alloc_f(cpu, (size_t)n, &cdb), 0);
        assert_int_equal(hs_be_alloc_f(dev, (size_t)n, &ddb), 0);
        assert_int_equal(cpu->ops->bias_grad(cpu, cdb, cdy, m, n), 0);
        assert_int_equal(dev->ops->bias_grad(dev, ddb, ddy, m, n), 0);
        fetch(cpu, ref, cdb, (size_t)n);
        fetch(dev, got, ddb, (size_t)n);
        assert_int_equal(dev->ops->bias_grad(dev, ddb, ddy, m, n), 0);
        fetch(dev, again, ddb, (size_t)n);
        for (int j = 0; j < n; j++) {
            double mag = 0;
            for (int i = 0; i < m; i++) mag += fabs((double)hdy[(size_t)i * n + j]);
            /* two float sums of m terms in different orders */
            lim[j] = 2.0 * (m + 1) * (double)FLT_EPSILON * mag + FLT_MIN;
        }
        char what[64];
        snprintf(what, sizeof(what), "bias_grad %dx%d", m, n);
        expect_close(what, got, ref, lim, 0, 0, (size_t)n);
        expect_bits(what, (size_t)n, again, got, (size_t)n); /* deterministic */
        hs_be_free(cpu, cdy), hs_be_free(cpu, cdb), hs_be_free(dev, ddy), hs_be_free(dev, ddb);
        free(hdy), free(ref), free(got), free(again), free(lim);
    }
}

/* ------------------------------------------------------------------ GEMM */

/* One GEMM on both backends, with the CPU's result as reference and a bound from the
 * magnitudes: each backend's error is at most about k ulps of sum_p |a_ip b_pj| (and of beta
 * c), so twice that bounds their difference. A transposition or stride mistake is off by the
 * magnitude itself and cannot pass. */
static void check_gemm(int ta, int tb, int m, int n, int k, int pad, float alpha, float beta) {
    int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
    if (lda < 1) lda = 1;
    if (ldb < 1) ldb = 1;
    size_t na = (size_t)(ta ? k : m) * lda, nb = (size_t)(tb ? n : k) * ldb;
    size_t nc = (size_t)m * ldc;
    float *ha = host_f(na), *hb = host_f(nb), *hc = host_f(nc), *ref = host_f(nc);
    float *got = host_f(nc), *again = host_f(nc);
    double *lim = malloc(sizeof(double) * (nc ? nc : 1));
    assert_non_null(lim);
    random_normal(ha, na, 50, 1.0f);
    random_normal(hb, nb, 51, 1.0f);
    random_normal(hc, nc, 52, 1.0f);
    /* beta == 0 means C is not read (BLAS): NaNs there must not leak into the result. */
    if (beta == 0.0f)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) hc[(size_t)i * ldc + j] = NAN;
    float *ca = dev_copy(cpu, ha, na), *cb = dev_copy(cpu, hb, nb), *cc = dev_copy(cpu, hc, nc);
    float *da = dev_copy(dev, ha, na), *db = dev_copy(dev, hb, nb), *dc = dev_copy(dev, hc, nc);
    assert_int_equal(cpu->ops->gemm(cpu, ta, tb, m, n, k, alpha, ca, lda, cb, ldb, beta, cc, ldc),
                     0);
    assert_int_equal(dev->ops->gemm(dev, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc),
                     0);
    fetch(cpu, ref, cc, nc);
    fetch(dev, got, dc, nc);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            size_t ic = (size_t)i * ldc + j;
            if (j >= n) {
                lim[ic] = 0; /* padding between rows of C is left alone */
                continue;
            }
            double mag = 0;
            for (int p = 0; p < k; p++) {
                double av = ta ? ha[(size_t)p * lda + i] : ha[(size_t)i * lda + p];
                double bv = tb ? hb[(size_t)j * ldb + p] : hb[(size_t)p * ldb + j];
                mag += fabs(av * bv);
            }
            mag *= fabs((double)alpha);
            if (beta != 0.0f) mag += fabs((double)beta * hc[ic]);
            lim[ic] = 2.0 * (k + 2) * (double)FLT_EPSILON * mag + FLT_MIN;
        }
    char what[96];
    snprintf(what, sizeof(what), "gemm %s%s m=%d n=%d k=%d pad=%d alpha=%g beta=%g",
             ta ? "T" : "N", tb ? "T" : "N", m, n, k, pad, (double)alpha, (double)beta);
    expect_close(what, got, ref, lim, 0, 0, nc);
    /* Same inputs, same bits (cuBLAS without atomics). */
    assert_int_equal(hs_be_upload(dev, dc, hc, sizeof(float) * nc), 0);
    assert_int_equal(dev->ops->gemm(dev, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc),
                     0);
    fetch(dev, again, dc, nc);
    expect_bits(what, nc, again, got, nc);
    hs_be_free(cpu, ca), hs_be_free(cpu, cb), hs_be_free(cpu, cc);
    hs_be_free(dev, da), hs_be_free(dev, db), hs_be_free(dev, dc);
    free(ha), free(hb), free(hc), free(ref), free(got), free(again), free(lim);
}

static void test_gemm(void **state) {
    (void)state;
    /* m, n, k: degenerate, odd, tall, wide, long inner dimension, and the MLP's own shapes */
    static const int shapes[][3] = {{1, 1, 1},    {7, 1, 7},     {1, 7, 1000}, {7, 1000, 7},
                                    {1000, 7, 3}, {33, 65, 129}, {128, 256, 784},
                                    {256, 784, 128}, {3, 5, 100003}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                check_gemm(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 0, 1.0f, 0.0f);
    /* padded row strides, alpha and beta */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(ta, tb, 7, 13, 33, 3, 0.7f, -0.5f);
            check_gemm(ta, tb, 33, 7, 13, 5, -1.5f, 1.0f);
            check_gemm(ta, tb, 100, 3, 1, 1, 2.0f, 0.25f);
        }
    /* k == 0: C = beta * C, and beta == 0 zeroes C whatever it held */
    check_gemm(0, 0, 7, 5, 0, 2, 1.0f, 0.5f);
    check_gemm(1, 1, 7, 5, 0, 0, 1.0f, 0.0f);
    check_gemm(0, 1, 3, 4, 0, 0, 1.0f, 1.0f);
    assert_int_equal(dev->ops->gemm(dev, 0, 0, -1, 1, 1, 1, NULL, 1, NULL, 1, 0, NULL, 1),
                     HS_EINVAL);
}

/* ------------------------------------------------------------------ softmax cross-entropy */

/* Compares softmax_xent of the two backends on rows of logits[m x k]. mode 0: no gradient,
 * 1: gradient in a separate buffer, 2: gradient over the logits (as src/model does).
 * quantise rounds the logits to integers so many rows have ties for the arg-max. */
static void check_xent(int m, int k, int mode, int quantise) {
    size_t mk = (size_t)m * k;
    float *hz = host_f(mk), *ref = host_f(mk), *got = host_f(mk);
    int32_t *hy = malloc(sizeof(int32_t) * (size_t)m);
    assert_non_null(hy);
    random_normal(hz, mk, 60 + (uint32_t)quantise, 3.0f);
    hs_rng r;
    hs__rng_init(&r, 7, HS_RNG_TEST, 61, 0);
    for (int i = 0; i < m; i++) {
        if (quantise)
            for (int j = 0; j < k; j++) hz[(size_t)i * k + j] = rintf(hz[(size_t)i * k + j] / 3);
        hy[i] = (int32_t)hs__rng_uniform(&r, (uint32_t)k);
        /* Make about half the rows correct, so the count means something. */
        if (i % 2 == 0) hz[(size_t)i * k + hy[i]] += quantise ? 1.0f : 6.0f;
    }
    if (m > 2 && k > 1) /* a row of equal logits: the arg-max is index 0 */
        for (int j = 0; j < k; j++) hz[(size_t)2 * k + j] = 0.5f;
    float scale = 1.0f / (float)m;
    float *cz = dev_copy(cpu, hz, mk), *dz = dev_copy(dev, hz, mk), *cg = NULL, *dg = NULL;
    int32_t *cyl = NULL, *dyl;
    /* labels live in backend memory */
    assert_int_equal(cpu->ops->alloc(cpu, sizeof(int32_t) * (size_t)m, (void **)&cyl), 0);
    assert_int_equal(dev->ops->alloc(dev, sizeof(int32_t) * (size_t)m, (void **)&dyl), 0);
    assert_int_equal(hs_be_upload(cpu, cyl, hy, sizeof(int32_t) * (size_t)m), 0);
    assert_int_equal(hs_be_upload(dev, dyl, hy, sizeof(int32_t) * (size_t)m), 0);
    if (mode == 1) {
        assert_int_equal(hs_be_alloc_f(cpu, mk, &cg), 0);
        assert_int_equal(hs_be_alloc_f(dev, mk, &dg), 0);
    } else if (mode == 2) {
        cg = cz;
        dg = dz;
    }
    double lref, lgot, lagain;
    int cref, cgot, cagain;
    assert_int_equal(cpu->ops->softmax_xent(cpu, cz, cyl, m, k, cg, scale, &lref, &cref), 0);
    assert_int_equal(dev->ops->softmax_xent(dev, dz, dyl, m, k, dg, scale, &lgot, &cgot), 0);
    char what[96];
    snprintf(what, sizeof(what), "softmax_xent m=%d k=%d %s%s", m, k,
             mode == 0 ? "loss only" : mode == 1 ? "with gradient" : "gradient in place",
             quantise ? " (ties)" : "");
    /* The arg-max involves no arithmetic: exactly the same rows are correct. */
    if (cgot != cref) print_error("%s: %d correct (cuda) vs %d (cpu)\n", what, cgot, cref);
    assert_int_equal(cgot, cref);
    /* s = sum exp(z - max) is summed in a different order (and expf/logf differ by an ulp or
     * two), so allow k ulps of relative error in s per row. */
    double rtol = 1e-5 + (double)k * 6e-8;
    double llim = m * rtol + 1e-5 * fabs(lref);
    if (!(fabs(lgot - lref) <= llim))
        print_error("%s: loss sum %.17g (cuda) vs %.17g (cpu), allowed %.3g\n", what, lgot, lref,
                    llim);
    assert_true(fabs(lgot - lref) <= llim);
    if (mode) {
        fetch(cpu, ref, cg, mk);
        fetch(dev, got, dg, mk);
        expect_close(what, got, ref, NULL, fabs((double)scale) * rtol, rtol, mk);
    }
    if (mode != 2) { /* deterministic (the in-place call consumed its logits) */
        assert_int_equal(dev->ops->softmax_xent(dev, dz, dyl, m, k, dg, scale, &lagain, &cagain),
                         0);
        assert_memory_equal(&lagain, &lgot, sizeof(double));
        assert_int_equal(cagain, cgot);
        if (mode) {
            fetch(dev, ref, dg, mk);
            expect_bits(what, mk, ref, got, mk);
        }
    }
    if (mode == 1) hs_be_free(cpu, cg), hs_be_free(dev, dg);
    hs_be_free(cpu, cz), hs_be_free(dev, dz), hs_be_free(cpu, cyl), hs_be_free(dev, dyl);
    free(hz), free(ref), free(got), free(hy);
}

static void test_softmax_xent(void **state) {
    (void)state;
    static const int shapes[][2] = {{1, 1},   {1, 7},    {7, 10},    {1000, 10}, {128, 1000},
                                    {3, 100003}, {100003, 3}, {33, 33}};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (int mode = 0; mode < 3; mode++)
            for (int q = 0; q < 2; q++) check_xent(shapes[s][0], shapes[s][1], mode, q);
}

/* ------------------------------------------------------------------ errors */

static void test_errors(void **state) {
    (void)state;
    float *x;
    assert_int_equal(hs_be_alloc_f(dev, 8, &x), 0);
    hs_sgd_hparams h = {0.1f, 0.9f, 0.0f, 0};
    assert_int_equal(dev->ops->sgd_step(dev, x, x, NULL, 8, &h), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "velocity"));
    /* a label out of range: the error names it, as on the CPU */
    int32_t labels[2] = {1, 4}, *dl;
    assert_int_equal(dev->ops->alloc(dev, sizeof(labels), (void **)&dl), 0);
    assert_int_equal(hs_be_upload(dev, dl, labels, sizeof(labels)), 0);
    double loss;
    int correct;
    assert_int_equal(dev->ops->softmax_xent(dev, x, dl, 2, 4, NULL, 1.0f, &loss, &correct),
                     HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "label 4 of row 1"));
    /* the backend still works after a reported error */
    double d;
    assert_int_equal(dev->ops->dot(dev, x, x, 8, &d), 0);
    assert_true(d == 0.0);
    hs_be_free(dev, dl);
    hs_be_free(dev, x);
    /* device ordinals are checked */
    if (!self_check) {
        hs_backend *be2 = NULL;
        hs_backend_cfg cfg = {1, 4096};
        assert_int_equal(hs_backend_open(&be2, HS_DEVICE_CUDA, &cfg), HS_ENODEV);
        assert_non_null(strstr(hs_error_message(), "device 4096 does not exist"));
        cfg.device_id = -1;
        assert_int_equal(hs_backend_open(&be2, HS_DEVICE_CUDA, &cfg), HS_ENODEV);
        assert_null(be2);
    }
}

/* ------------------------------------------------------------------ training */

#define TRAIN_DIM 64
#define TRAIN_CLASSES 10
#define TRAIN_BATCH 64
#define TRAIN_STEPS 300

static hs_dataset *synth(size_t n, uint32_t split) {
    hs_dataset *ds;
    hs_synth_cfg c = {n, TRAIN_DIM, TRAIN_CLASSES, 4.0f, 11, split};
    assert_int_equal(hs_dataset_synthetic(&ds, &c), 0);
    return ds;
}

static void new_trainer(hs_backend *be, const char *hidden, hs_model **m, hs_optim **o) {
    hs_mlp_cfg mc;
    assert_int_equal(hs_mlp_cfg_parse(&mc, TRAIN_DIM, hidden, TRAIN_CLASSES), 0);
    assert_int_equal(hs_model_new(m, be, &mc, TRAIN_BATCH), 0);
    assert_int_equal(hs_model_init(*m, 5), 0);
    hs_optim_cfg oc;
    hs_optim_cfg_default(&oc);
    oc.lr = 0.05f;
    oc.momentum = 0.9f;
    oc.weight_decay = 1e-4f;
    oc.sched = HS_LR_CONST;
    assert_int_equal(hs_optim_new(o, be, hs_model_nparams(*m), &oc), 0);
}

static float *params_of(hs_model *m) {
    size_t n = hs_model_nparams(m);
    float *h = host_f(n);
    fetch(hs_model_backend(m), h, hs_model_params(m), n);
    return h;
}

/* The whole backward pass of one batch, compared element by element. On a linear model: with
 * hidden ReLUs, an input within rounding of 0 may switch sides on one backend and change that
 * unit's gradient for that example outright, which says nothing about either backend. */
static void test_first_gradient(void **state) {
    (void)state;
    hs_dataset *train = synth(TRAIN_BATCH, 0);
    hs_model *mc, *mg;
    hs_optim *oc, *og;
    new_trainer(cpu, "none", &mc, &oc);
    new_trainer(dev, "none", &mg, &og);
    int32_t y[TRAIN_BATCH];
    for (int i = 0; i < TRAIN_BATCH; i++) y[i] = train->y[i];
    hs_step_stats sc, sg;
    assert_int_equal(hs_model_grad(mc, train->x, y, TRAIN_BATCH, &sc), 0);
    assert_int_equal(hs_model_grad(mg, train->x, y, TRAIN_BATCH, &sg), 0);
    assert_true(fabs(sg.loss - sc.loss) <= 1e-5 * sc.loss);
    size_t np = hs_model_nparams(mc);
    float *gc = host_f(np), *gg = host_f(np);
    fetch(cpu, gc, hs_model_grads(mc), np);
    fetch(dev, gg, hs_model_grads(mg), np);
    double gmax = 0;
    for (size_t i = 0; i < np; i++)
        if (fabs((double)gc[i]) > gmax) gmax = fabs((double)gc[i]);
    /* dW sums TRAIN_BATCH products per element: a few ulps of the largest element covers it. */
    expect_close("first gradient (linear model)", gg, gc, NULL, 1e-4 * gmax, 1e-3, np);
    free(gc), free(gg);
    hs_optim_free(oc), hs_optim_free(og), hs_model_free(mc), hs_model_free(mg);
    hs_dataset_free(train);
}

/* The same batches through both backends in lock step. */
static void test_train_mlp(void **state) {
    (void)state;
    hs_dataset *train = synth(4096, 0), *test = synth(2000, 1);
    hs_model *mc, *mg;
    hs_optim *oc, *og;
    new_trainer(cpu, "128,64", &mc, &oc);
    new_trainer(dev, "128,64", &mg, &og);
    size_t np = hs_model_nparams(mc);
    /* Initialisation is drawn on the host: identical bits. */
    float *pc = params_of(mc), *pg = params_of(mg);
    expect_bits("initial parameters", np, pg, pc, np);
    free(pc), free(pg);

    hs_batcher *b;
    assert_int_equal(hs_batcher_new(&b, train, TRAIN_BATCH, 3, 0, 1), 0);
    double lc[TRAIN_STEPS], lg[TRAIN_STEPS];
    for (int t = 0; t < TRAIN_STEPS; t++) {
        const float *x;
        const int32_t *y;
        int bs = hs_batcher_next(b, &x, &y);
        assert_true(bs > 0);
        hs_step_stats sc, sg;
        assert_int_equal(hs_model_grad(mc, x, y, bs, &sc), 0);
        assert_int_equal(hs_model_grad(mg, x, y, bs, &sg), 0);
        lc[t] = sc.loss;
        lg[t] = sg.loss;
        if (t == 0) {
            /* One forward pass from the same parameters: GEMM rounding only. (A ReLU input
             * within rounding of 0 may switch sides, but its output is ~0 either way.) */
            if (!(fabs(lg[0] - lc[0]) <= 1e-4 * lc[0]))
                print_error("first loss %.9g (cuda) vs %.9g (cpu)\n", lg[0], lc[0]);
            assert_true(fabs(lg[0] - lc[0]) <= 1e-4 * lc[0]);
            /* Logits within rounding of a tie may pick another arg-max: allow one row. */
            assert_true(abs(sg.correct - sc.correct) <= 1);
        }
        assert_int_equal(hs_optim_step(oc, hs_model_params(mc), hs_model_grads(mc), t, NULL), 0);
        assert_int_equal(hs_optim_step(og, hs_model_params(mg), hs_model_grads(mg), t, NULL), 0);
    }
    /* Rounding differences grow over hundreds of steps, so compare the learning, not the
     * bits: late losses of both, and test accuracy. (Calibrated on the CPU: even a different
     * initialisation seed stays well inside these bounds on this task.) */
    double late_c = 0, late_g = 0;
    for (int t = TRAIN_STEPS - 20; t < TRAIN_STEPS; t++) late_c += lc[t] / 20, late_g += lg[t] / 20;
    double loss_c, loss_g, acc_c, acc_g;
    assert_int_equal(hs_model_evaluate(mc, test, &loss_c, &acc_c), 0);
    assert_int_equal(hs_model_evaluate(mg, test, &loss_g, &acc_g), 0);
    printf("# training: first loss %.4f (cpu) %.4f (cuda); last 20 steps %.4f (cpu) %.4f "
           "(cuda); test loss %.4f / %.4f, accuracy %.4f / %.4f\n",
           lc[0], lg[0], late_c, late_g, loss_c, loss_g, acc_c, acc_g);
    assert_true(late_g < 0.5 * lg[0]);                  /* it learns */
    assert_true(fabs(late_g - late_c) <= 0.05 + 0.25 * late_c);
    assert_true(acc_g >= 0.9);
    assert_true(fabs(acc_g - acc_c) <= 0.03);
    assert_true(fabs(loss_g - loss_c) <= 0.05 + 0.25 * loss_c);
    hs_batcher_free(b);
    hs_optim_free(oc), hs_optim_free(og), hs_model_free(mc), hs_model_free(mg);
    hs_dataset_free(train), hs_dataset_free(test);
}

/* Same seed, same backend: bit-identical parameters after N steps, on the device too. */
static void test_train_deterministic(void **state) {
    (void)state;
    hs_dataset *train = synth(1024, 0);
    float *p[2];
    size_t np = 0;
    for (int run = 0; run < 2; run++) {
        hs_model *m;
        hs_optim *o;
        hs_batcher *b;
        new_trainer(dev, "128,64", &m, &o);
        assert_int_equal(hs_batcher_new(&b, train, TRAIN_BATCH, 3, 0, 1), 0);
        for (int t = 0; t < 40; t++) {
            const float *x;
            const int32_t *y;
            int bs = hs_batcher_next(b, &x, &y);
            assert_int_equal(hs_model_grad(m, x, y, bs, NULL), 0);
            assert_int_equal(hs_optim_step(o, hs_model_params(m), hs_model_grads(m), t, NULL), 0);
        }
        p[run] = params_of(m);
        np = hs_model_nparams(m);
        hs_batcher_free(b);
        hs_optim_free(o);
        hs_model_free(m);
    }
    expect_bits("parameters of two identical runs", np, p[1], p[0], np);
    free(p[0]), free(p[1]);
    hs_dataset_free(train);
}

int main(int argc, char **argv) {
    self_check = argc > 1 && !strcmp(argv[1], "--self-check");
    hs_backend_cfg cfg = {1, 0};
    if (hs_backend_open(&cpu, HS_DEVICE_CPU, &cfg) < 0) {
        fprintf(stderr, "FAIL: cannot open the CPU backend: %s\n", hs_error_message());
        return 1;
    }
    int rc = self_check ? (hs_backend_open(&dev, HS_DEVICE_CPU, &cfg) < 0)
                        : cuda_test_open(&dev, &cfg);
    if (rc != 0) {
        hs_backend_close(cpu);
        return rc;
    }
    printf("# %s against %s%s\n", dev->description, cpu->description,
           self_check ? " (self-check: CPU in place of CUDA, tests this test only)" : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_elementwise_bits),
        cmocka_unit_test(test_bias_add_bits),
        cmocka_unit_test(test_dot),
        cmocka_unit_test(test_bias_grad),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_softmax_xent),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_first_gradient),
        cmocka_unit_test(test_train_mlp),
        cmocka_unit_test(test_train_deterministic),
    };
    int failed = cmocka_run_group_tests_name("cuda-backend", tests, NULL, NULL);
    hs_backend_close(dev);
    hs_backend_close(cpu);
    /* cmocka returns the number of failures, which must not read as 77 (skip). */
    return failed ? 1 : 0;
}
