/* The CUDA backend's convolutional-layer ops against the CPU reference (src/tensor/cpu_conv.c),
 * then the whole gradient of cnn-small and of a small residual network on both backends.
 *
 * im2col, col2im, maxpool (values and arg-max), maxpool_grad, avgpool, avgpool_grad,
 * shortcut_add and shortcut_grad must match bit for bit: the kernels gather in the CPU's order.
 * So must gather, the device shard's batch draw (with and without crops and flips, in both
 * layouts), which only moves floats. GroupNorm's statistics are double sums in another order, so its outputs must agree within a
 * few float ulps, and be the same bits when run twice. A model's gradient also goes through
 * GEMM (cuBLAS on a GPU), so it must agree within a relative L2 error of 1e-3.
 *
 * Exit-code protocol as test_cuda_backend: 77 (skip) only as ../cuda_open.h allows;
 * `--self-check` runs it with a second CPU backend. */
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
#include "hearsay/model.h"
#include "hearsay/tensor.h"

#include "../cuda_open.h"
#include "../expect_bits.h"

static hs_backend *cpu; /* the reference */
static hs_backend *dev; /* the backend under test */

static float *host_f(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    return p;
}

/* quant > 0 rounds to multiples of 1/quant, so that pooling windows hold ties. */
static float *random_host(size_t n, uint32_t stream, float scale, float offset, float quant) {
    float *x = host_f(n);
    hs_rng r;
    hs__rng_init(&r, 77, HS_RNG_TEST, stream, 0);
    for (size_t i = 0; i < n; i++) {
        float v = scale * (float)hs__rng_normal(&r);
        if (quant > 0) v = roundf(v * quant) / quant;
        x[i] = v + offset;
    }
    return x;
}

static void *dev_copy(hs_backend *be, const void *h, size_t bytes) {
    void *d;
    assert_int_equal(be->ops->alloc(be, bytes, &d), 0);
    assert_int_equal(hs_be_upload(be, d, h, bytes), 0);
    return d;
}

/* Device memory filled with NaN, so that an element a kernel does not write shows. */
static float *dev_nan(hs_backend *be, size_t n) {
    float *d;
    assert_int_equal(hs_be_alloc_f(be, n, &d), 0);
    assert_int_equal(be->ops->fill(be, d, n, NAN), 0);
    return d;
}

static float *fetch_f(hs_backend *be, const float *d, size_t n) {
    float *h = host_f(n);
    assert_int_equal(hs_be_download(be, h, d, sizeof(float) * n), 0);
    return h;
}

static void expect_close(const char *what, const float *got, const float *ref, double atol,
                         double rtol, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!(d <= atol + rtol * fabs((double)ref[i])) && bad++ == 0) first = i;
    }
    if (bad)
        print_error("%s: %zu of %zu elements out of tolerance; first [%zu]: %.9g (dev) vs "
                    "%.9g (cpu)\n",
                    what, bad, n, first, (double)got[first], (double)ref[first]);
    assert_int_equal(bad, 0);
}

static hs_conv_geom geom(int c, int h, int w, int k, int stride, int pad, int chw) {
    hs_conv_geom g = {c, h, w, k, stride, pad, 0, 0, chw};
    g.oh = (h + 2 * pad - k) / stride + 1;
    g.ow = (w + 2 * pad - k) / stride + 1;
    return g;
}

/* ------------------------------------------------------------------ im2col / col2im */

static void check_im2col(int n, hs_conv_geom g, uint32_t seed) {
    size_t nx = (size_t)n * g.c * g.h * g.w;
    size_t ncol = (size_t)n * g.oh * g.ow * g.k * g.k * g.c;
    float *x = random_host(nx, seed, 1.0f, 0.0f, 0);
    float *col = random_host(ncol, seed + 1, 1.0f, 0, 0);
    float *rc = host_f(ncol), *rdx = host_f(nx);
    assert_int_equal(cpu->ops->im2col(cpu, x, &g, n, rc), 0);
    assert_int_equal(cpu->ops->col2im(cpu, col, &g, n, rdx), 0);
    float *dx_ = dev_copy(dev, x, sizeof(float) * nx);
    float *dcol = dev_copy(dev, col, sizeof(float) * ncol);
    float *dc = dev_nan(dev, ncol), *ddx = dev_nan(dev, nx);
    assert_int_equal(dev->ops->im2col(dev, dx_, &g, n, dc), 0);
    assert_int_equal(dev->ops->col2im(dev, dcol, &g, n, ddx), 0);
    float *gc = fetch_f(dev, dc, ncol), *gdx = fetch_f(dev, ddx, nx);
    char what[160];
    snprintf(what, sizeof(what), "im2col n=%d c=%d %dx%d k=%d s=%d p=%d%s", n, g.c, g.h, g.w, g.k,
             g.stride, g.pad, g.chw_input ? " chw" : "");
    expect_bits(what, gc, rc, ncol);
    if (!g.chw_input) {
        memcpy(what, "col2im", 6);
        expect_bits(what, gdx, rdx, nx);
    }
    free(x), free(col), free(rc), free(rdx), free(gc), free(gdx);
    hs_be_free(dev, dx_), hs_be_free(dev, dcol), hs_be_free(dev, dc), hs_be_free(dev, ddx);
}

static void test_im2col(void **state) {
    (void)state;
    check_im2col(3, geom(5, 7, 6, 3, 1, 1, 0), 1);  /* cnn-small's conv, odd sizes */
    check_im2col(2, geom(3, 9, 8, 3, 2, 1, 0), 2);  /* stride 2 */
    check_im2col(2, geom(3, 9, 8, 3, 2, 1, 1), 3);  /* the model's NCHW input */
    check_im2col(1, geom(4, 5, 5, 1, 2, 0, 0), 4);  /* 1x1, stride 2 */
    check_im2col(2, geom(2, 4, 3, 5, 1, 2, 0), 5);  /* kernel wider than the image */
    check_im2col(1, geom(1, 6, 6, 2, 3, 0, 0), 6);  /* stride > kernel: gaps */
}

/* ------------------------------------------------------------------ pooling */

static void check_maxpool(int n, hs_conv_geom g, uint32_t seed) {
    size_t nx = (size_t)n * g.c * g.h * g.w, ny = (size_t)n * g.oh * g.ow * g.c;
    /* Quantised to quarters: ties in most windows, so the first-maximum rule is checked. */
    float *x = random_host(nx, seed, 1.0f, 0.0f, 4.0f), *dy = random_host(ny, seed + 1, 1, 0, 0);
    float *ry = host_f(ny), *rdx = host_f(nx);
    int32_t *ra = malloc(sizeof(int32_t) * ny), *ga = malloc(sizeof(int32_t) * ny), *da;
    assert_int_equal(cpu->ops->maxpool(cpu, x, &g, n, ry, ra), 0);
    assert_int_equal(cpu->ops->maxpool_grad(cpu, dy, ra, &g, n, rdx), 0);
    float *dxx = dev_copy(dev, x, sizeof(float) * nx), *ddy = dev_copy(dev, dy, sizeof(float) * ny);
    float *dyo = dev_nan(dev, ny), *ddx = dev_nan(dev, nx);
    assert_int_equal(dev->ops->alloc(dev, sizeof(int32_t) * ny, (void **)&da), 0);
    assert_int_equal(dev->ops->maxpool(dev, dxx, &g, n, dyo, da), 0);
    assert_int_equal(dev->ops->maxpool_grad(dev, ddy, da, &g, n, ddx), 0);
    float *gy = fetch_f(dev, dyo, ny), *gdx = fetch_f(dev, ddx, nx);
    assert_int_equal(hs_be_download(dev, ga, da, sizeof(int32_t) * ny), 0);
    expect_bits("maxpool", gy, ry, ny);
    assert_memory_equal(ga, ra, sizeof(int32_t) * ny);
    expect_bits("maxpool_grad", gdx, rdx, nx);
    free(x), free(dy), free(ry), free(rdx), free(ra), free(ga), free(gy), free(gdx);
    hs_be_free(dev, dxx), hs_be_free(dev, ddy), hs_be_free(dev, dyo), hs_be_free(dev, ddx);
    hs_be_free(dev, da);
}

static void test_maxpool(void **state) {
    (void)state;
    check_maxpool(3, geom(5, 7, 7, 2, 2, 0, 0), 10); /* odd size: the last row is dropped */
    check_maxpool(2, geom(3, 9, 8, 3, 2, 0, 0), 11); /* overlapping windows add up */
    check_maxpool(2, geom(4, 6, 6, 3, 1, 0, 0), 12);
}

static void test_avgpool(void **state) {
    (void)state;
    const int n = 3, hw = 7 * 7, c = 19;
    size_t nx = (size_t)n * hw * c, ny = (size_t)n * c;
    float *x = random_host(nx, 20, 1.0f, 0.5f, 0), *dy = random_host(ny, 21, 1.0f, 0.0f, 0);
    float *ry = host_f(ny), *rdx = host_f(nx);
    assert_int_equal(cpu->ops->avgpool(cpu, x, n, hw, c, ry), 0);
    assert_int_equal(cpu->ops->avgpool_grad(cpu, dy, n, hw, c, rdx), 0);
    float *dxx = dev_copy(dev, x, sizeof(float) * nx), *ddy = dev_copy(dev, dy, sizeof(float) * ny);
    float *dyo = dev_nan(dev, ny), *ddx = dev_nan(dev, nx);
    assert_int_equal(dev->ops->avgpool(dev, dxx, n, hw, c, dyo), 0);
    assert_int_equal(dev->ops->avgpool_grad(dev, ddy, n, hw, c, ddx), 0);
    float *gy = fetch_f(dev, dyo, ny), *gdx = fetch_f(dev, ddx, nx);
    expect_bits("avgpool", gy, ry, ny);
    expect_bits("avgpool_grad", gdx, rdx, nx);
    free(x), free(dy), free(ry), free(rdx), free(gy), free(gdx);
    hs_be_free(dev, dxx), hs_be_free(dev, ddy), hs_be_free(dev, dyo), hs_be_free(dev, ddx);
}

/* ------------------------------------------------------------------ GroupNorm */

/* Forward and backward on one shape; the device results twice, which must be the same bits. */
static void check_groupnorm(int n, int hw, int c, int groups, float offset, uint32_t seed) {
    size_t nx = (size_t)n * hw * c, ns = (size_t)n * groups;
    const float eps = 1e-5f;
    float *x = random_host(nx, seed, 2.0f, offset, 0), *dy = random_host(nx, seed + 1, 1, 0, 0);
    float *gamma = random_host((size_t)c, seed + 2, 0.5f, 1.0f, 0);
    float *beta = random_host((size_t)c, seed + 3, 0.5f, 0.0f, 0);
    float *ref[7], *got[2][7];
    size_t len[7] = {nx, ns, ns, nx, (size_t)c, (size_t)c, 0};
    for (int i = 0; i < 6; i++) ref[i] = host_f(len[i]);
    assert_int_equal(cpu->ops->groupnorm(cpu, x, n, hw, c, groups, eps, gamma, beta, ref[0],
                                         ref[1], ref[2]), 0);
    assert_int_equal(cpu->ops->groupnorm_grad(cpu, dy, x, n, hw, c, groups, gamma, ref[1], ref[2],
                                              ref[3], ref[4], ref[5]), 0);
    float *dx_ = dev_copy(dev, x, sizeof(float) * nx), *ddy = dev_copy(dev, dy, sizeof(float) * nx);
    float *dg = dev_copy(dev, gamma, sizeof(float) * c);
    float *db = dev_copy(dev, beta, sizeof(float) * c);
    for (int run = 0; run < 2; run++) {
        float *d[6];
        for (int i = 0; i < 6; i++) d[i] = dev_nan(dev, len[i]);
        assert_int_equal(dev->ops->groupnorm(dev, dx_, n, hw, c, groups, eps, dg, db, d[0], d[1],
                                             d[2]), 0);
        assert_int_equal(dev->ops->groupnorm_grad(dev, ddy, dx_, n, hw, c, groups, dg, d[1], d[2],
                                                  d[3], d[4], d[5]), 0);
        for (int i = 0; i < 6; i++) {
            got[run][i] = fetch_f(dev, d[i], len[i]);
            hs_be_free(dev, d[i]);
        }
    }
    static const char *const name[6] = {"groupnorm y", "groupnorm mean", "groupnorm rstd",
                                        "groupnorm_grad dx", "groupnorm_grad dgamma",
                                        "groupnorm_grad dbeta"};
    /* y, mean and rstd: a float ulp or two of the statistics; dx adds the means of the
     * gradient (cancelling sums, so an absolute bound of the dy scale); dgamma and dbeta sum
     * n * hw terms of size ~1 in double, rounded once. */
    const double atol[6] = {1e-5, 1e-6 * (1 + fabs(offset)), 1e-6, 2e-5, 1e-4, 1e-4};
    const double rtol[6] = {1e-5, 1e-6, 1e-6, 1e-4, 1e-5, 1e-5};
    for (int i = 0; i < 6; i++) {
        char what[128];
        snprintf(what, sizeof(what), "%s (n=%d hw=%d c=%d groups=%d offset=%g)", name[i], n, hw,
                 c, groups, (double)offset);
        expect_close(what, got[0][i], ref[i], atol[i], rtol[i], len[i]);
        expect_bits(what, got[1][i], got[0][i], len[i]);
        free(got[0][i]), free(got[1][i]), free(ref[i]);
    }
    free(x), free(dy), free(gamma), free(beta);
    hs_be_free(dev, dx_), hs_be_free(dev, ddy), hs_be_free(dev, dg), hs_be_free(dev, db);
}

static void test_groupnorm(void **state) {
    (void)state;
    check_groupnorm(3, 7 * 7, 16, 4, 0.0f, 30);
    check_groupnorm(2, 5 * 3, 12, 3, 50.0f, 31); /* a mean large against the spread */
    check_groupnorm(2, 1, 8, 8, 0.0f, 32);        /* one element per group: rstd 1/sqrt(eps) */
    check_groupnorm(1, 600, 6, 2, 0.0f, 33);      /* more elements than a block's threads */
}

/* ------------------------------------------------------------------ residual shortcut */

static void check_shortcut(int n, hs_shortcut_geom s, uint32_t seed) {
    size_t nx = (size_t)n * s.h * s.w * s.c, ny = (size_t)n * s.oh * s.ow * s.oc;
    float *x = random_host(nx, seed, 1, 0, 0), *y = random_host(ny, seed + 1, 1, 0, 0);
    float *dy = random_host(ny, seed + 2, 1, 0, 0), *rdx = host_f(nx);
    float *dyy = dev_copy(dev, y, sizeof(float) * ny), *dxx = dev_copy(dev, x, sizeof(float) * nx);
    float *ddy = dev_copy(dev, dy, sizeof(float) * ny), *ddx = dev_nan(dev, nx);
    assert_int_equal(cpu->ops->shortcut_add(cpu, y, x, &s, n), 0);
    assert_int_equal(cpu->ops->shortcut_grad(cpu, rdx, dy, &s, n), 0);
    assert_int_equal(dev->ops->shortcut_add(dev, dyy, dxx, &s, n), 0);
    assert_int_equal(dev->ops->shortcut_grad(dev, ddx, ddy, &s, n), 0);
    float *gy = fetch_f(dev, dyy, ny), *gdx = fetch_f(dev, ddx, nx);
    expect_bits("shortcut_add", gy, y, ny);
    expect_bits("shortcut_grad", gdx, rdx, nx);
    free(x), free(y), free(dy), free(rdx), free(gy), free(gdx);
    hs_be_free(dev, dyy), hs_be_free(dev, dxx), hs_be_free(dev, ddy), hs_be_free(dev, ddx);
}

static void test_shortcut(void **state) {
    (void)state;
    check_shortcut(3, (hs_shortcut_geom){6, 5, 7, 6, 5, 7, 1}, 40);   /* identity */
    check_shortcut(2, (hs_shortcut_geom){4, 8, 8, 8, 4, 4, 2}, 41);   /* ResNet's option A */
    check_shortcut(2, (hs_shortcut_geom){3, 7, 9, 5, 4, 5, 2}, 42);   /* odd sizes */
}

/* ------------------------------------------------------------------ whole models */

/* One batch's loss and gradient on both backends from the same initial parameters. */
static void check_model_grad(const char *model, int c, int h, int w, int bs) {
    hs_model_spec spec;
    assert_int_equal(hs_model_spec_parse(&spec, model, NULL, c, h, w, 10), 0);
    hs_model *mc, *md;
    assert_int_equal(hs_model_new_spec(&mc, cpu, &spec, bs), 0);
    int err = hs_model_new_spec(&md, dev, &spec, bs);
    if (err < 0) print_error("%s on %s: %s\n", model, dev->description, hs_error_message());
    assert_int_equal(err, 0);
    assert_int_equal(hs_model_init(mc, 9), 0);
    assert_int_equal(hs_model_init(md, 9), 0);
    float *x = random_host((size_t)bs * c * h * w, 50, 1.0f, 0.0f, 0);
    int32_t *y = malloc(sizeof(int32_t) * bs);
    for (int i = 0; i < bs; i++) y[i] = (i * 7) % 10;
    hs_step_stats sc, sd;
    assert_int_equal(hs_model_grad(mc, x, y, bs, &sc), 0);
    assert_int_equal(hs_model_grad(md, x, y, bs, &sd), 0);
    size_t np = hs_model_nparams(mc);
    float *gc = fetch_f(cpu, hs_model_grads(mc), np), *gd = fetch_f(dev, hs_model_grads(md), np);
    double num = 0, den = 0;
    for (size_t i = 0; i < np; i++) {
        double d = (double)gd[i] - gc[i];
        num += d * d;
        den += (double)gc[i] * gc[i];
    }
    double rel = sqrt(num / den);
    printf("# %s, batch %d: loss %.7f (cpu) %.7f (dev); gradient relative L2 error %.3g\n", model,
           bs, sc.loss, sd.loss, rel);
    assert_true(fabs(sd.loss - sc.loss) <= 1e-5 * sc.loss);
    assert_true(den > 0);
    assert_true(rel < 1e-3);
    free(x), free(y), free(gc), free(gd);
    hs_model_free(mc), hs_model_free(md);
}

/* ------------------------------------------------------------------ gather */

static void check_gather(int c, int h, int w, int nhwc, int with_aug, size_t rows, int n) {
    size_t dim = (size_t)c * h * w;
    float *src = random_host(rows * dim, (uint32_t)(c * 100 + h), 1.0f, 0.0f, 0);
    uint8_t *labels = malloc(rows), *aug = malloc(3 * rows);
    uint32_t *idx = malloc(sizeof(uint32_t) * (size_t)n);
    assert_non_null(labels), assert_non_null(aug), assert_non_null(idx);
    hs_rng r;
    hs__rng_init(&r, 5, HS_RNG_TEST, (uint32_t)rows, 0);
    for (size_t k = 0; k < rows; k++) {
        labels[k] = (uint8_t)hs_rng_below(hs__rng_u32(&r), 10);
        for (int j = 0; j < 2; j++) aug[3 * k + j] = (uint8_t)hs_rng_below(hs__rng_u32(&r), 9);
        aug[3 * k + 2] = (uint8_t)(hs__rng_u32(&r) >> 31);
    }
    /* Indices in no order, the last row included. */
    for (int i = 0; i < n; i++) idx[i] = (uint32_t)(((size_t)i * 7919 + 3) % rows);
    idx[n - 1] = (uint32_t)(rows - 1);
    hs_gather_geom g = {c, h, w, nhwc, 4};
    float *rx = host_f((size_t)n * dim);
    int32_t *ry = malloc(sizeof(int32_t) * (size_t)n), *gy = malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(ry), assert_non_null(gy);
    assert_int_equal(cpu->ops->gather(cpu, src, labels, idx, with_aug ? aug : NULL, &g, n, rx, ry),
                     0);
    float *dsrc = dev_copy(dev, src, sizeof(float) * rows * dim);
    uint8_t *dlab = dev_copy(dev, labels, rows), *daug = dev_copy(dev, aug, 3 * rows);
    uint32_t *didx = dev_copy(dev, idx, sizeof(uint32_t) * (size_t)n);
    float *dx = dev_nan(dev, (size_t)n * dim);
    int32_t *dy;
    assert_int_equal(dev->ops->alloc(dev, sizeof(int32_t) * (size_t)n, (void **)&dy), 0);
    assert_int_equal(
        dev->ops->gather(dev, dsrc, dlab, didx, with_aug ? daug : NULL, &g, n, dx, dy), 0);
    float *gx = fetch_f(dev, dx, (size_t)n * dim);
    assert_int_equal(hs_be_download(dev, gy, dy, sizeof(int32_t) * (size_t)n), 0);
    char what[96];
    snprintf(what, sizeof(what), "gather %dx%dx%d%s%s, %d of %zu rows", c, h, w,
             nhwc ? " nhwc" : "", with_aug ? " augmented" : "", n, rows);
    expect_bits(what, gx, rx, (size_t)n * dim);
    assert_memory_equal(gy, ry, sizeof(int32_t) * (size_t)n);
    free(src), free(labels), free(aug), free(idx), free(rx), free(ry), free(gy), free(gx);
    hs_be_free(dev, dsrc), hs_be_free(dev, dlab), hs_be_free(dev, daug), hs_be_free(dev, didx);
    hs_be_free(dev, dx), hs_be_free(dev, dy);
}

static void test_gather(void **state) {
    (void)state;
    for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int aug = 0; aug < 2; aug++) {
            check_gather(3, 5, 7, nhwc, aug, 11, 6);
            check_gather(3, 32, 32, nhwc, aug, 40, 33);
        }
    check_gather(1, 28, 28, 0, 1, 9, 9);
    check_gather(1, 1, 784, 0, 0, 9, 4);
}

/* Page-locked host memory: zeroed, and a download lands in it. */
static void test_host_alloc(void **state) {
    (void)state;
    if (!dev->ops->host_alloc) skip();
    float *h, *src = random_host(1000, 9, 1.0f, 0.0f, 0);
    assert_int_equal(dev->ops->host_alloc(dev, sizeof(float) * 1000, (void **)&h), 0);
    for (int i = 0; i < 1000; i++) assert_true(h[i] == 0.0f);
    float *d = dev_copy(dev, src, sizeof(float) * 1000);
    assert_int_equal(hs_be_download(dev, h, d, sizeof(float) * 1000), 0);
    assert_memory_equal(h, src, sizeof(float) * 1000);
    dev->ops->host_free(dev, h);
    dev->ops->host_free(dev, NULL);
    hs_be_free(dev, d);
    free(src);
}

static void test_cnn_small_grad(void **state) {
    (void)state;
    check_model_grad("cnn-small", 1, 28, 28, 8);
}

static void test_resnet20_grad(void **state) {
    (void)state;
    check_model_grad("resnet20", 3, 32, 32, 2);
}

int main(int argc, char **argv) {
    int self_check = argc > 1 && !strcmp(argv[1], "--self-check");
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
    printf("# %s against %s\n", dev->description, cpu->description);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_im2col),      cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_avgpool),     cmocka_unit_test(test_groupnorm),
        cmocka_unit_test(test_shortcut),    cmocka_unit_test(test_cnn_small_grad),
        cmocka_unit_test(test_resnet20_grad), cmocka_unit_test(test_gather),
        cmocka_unit_test(test_host_alloc),
    };
    int failed = cmocka_run_group_tests_name("cuda-conv", tests, NULL, NULL);
    hs_backend_close(dev);
    hs_backend_close(cpu);
    return failed ? 1 : 0;
}
