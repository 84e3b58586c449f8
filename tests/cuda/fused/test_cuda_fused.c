/* The CUDA backend's fused ops and GEMM precisions against the CPU reference.
 *
 * Fused ops: groupnorm_relu must give the bits of the device's own groupnorm followed by relu
 * (the same kernel with the rectifier in its last pass) and agree with the CPU's
 * groupnorm_relu within GroupNorm's tolerance (its statistics are double sums in another
 * order); groupnorm_relu_grad likewise against relu_grad then groupnorm_grad; shortcut_sum,
 * with and without the ReLU, in place (y == a) or not, must match the CPU's bits, as must the
 * three unfused ops it replaces.
 *
 * Precisions: a BF16 or TF32 GEMM must equal the FP32 GEMM of the inputs rounded to nearest
 * even at 8 (BF16) or 11 (TF32) significant bits, within FP32 summation error, and differ from
 * the unrounded product by more than that (so that a GEMM that skipped the rounding fails).
 * The reference rounding here is written with frexpf/rintf, independently of the kernels' bit
 * arithmetic. On a GPU, TF32 is the tensor cores' own rounding, which need not be to nearest
 * even: there the bound is that of any 11-bit rounding, and a GEMM of aligned sizes (m, n, k
 * multiples of 8, which cuBLAS's tensor-op kernels take) must have more than a quarter of its
 * results off the FP32 product by over 2^-14 of the sum of magnitudes, which FP32 sums never
 * are (k 2^-24 of it): else TF32 was not applied. Back at FP32, the GEMM gives the bits it
 * gave before. Every test is back at FP32 before an assertion can fail, so that a failure
 * leaves no reduced precision to the tests after it.
 *
 * Loss curves: cnn-small trains for HS_CURVE_STEPS steps (default 200) from one initial state
 * at FP32, TF32 and BF16 on the same batches; the BF16 and TF32 mean losses over each window
 * of 50 steps must stay within 0.1 + 10% of FP32's. Under the emulator the arithmetic of both
 * is emulated (precision.cuh), so this is a check of the rounding's effect on training, not of
 * the tensor cores.
 *
 * Exit-code protocol as test_cuda_backend: 77 (skip) only as ../cuda_open.h allows. */
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
static int emulated;    /* dev is ../shared/tools/cuda-emu: TF32 is rounded to nearest even */

static float *host_f(size_t n) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    return p;
}

static float *random_host(size_t n, uint32_t stream, float scale, float offset) {
    float *x = host_f(n);
    hs_rng r;
    hs__rng_init(&r, 23, HS_RNG_TEST, stream, 0);
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)hs__rng_normal(&r) + offset;
    return x;
}

static float *dev_copy(const float *h, size_t n) {
    float *d;
    assert_int_equal(hs_be_alloc_f(dev, n, &d), 0);
    assert_int_equal(hs_be_upload(dev, d, h, sizeof(float) * n), 0);
    return d;
}

/* Device memory filled with NaN, so that an element a kernel does not write shows. */
static float *dev_nan(size_t n) {
    float *d;
    assert_int_equal(hs_be_alloc_f(dev, n, &d), 0);
    assert_int_equal(dev->ops->fill(dev, d, n, NAN), 0);
    return d;
}

static float *fetch_f(const float *d, size_t n) {
    float *h = host_f(n);
    assert_int_equal(hs_be_download(dev, h, d, sizeof(float) * n), 0);
    return h;
}

/* ------------------------------------------------------------------ groupnorm_relu */

static void check_groupnorm_relu(int n, int hw, int c, int groups, uint32_t seed) {
    size_t nx = (size_t)n * hw * c, ns = (size_t)n * groups;
    const float eps = 1e-5f;
    float *x = random_host(nx, seed, 2.0f, 0.3f);
    float *gamma = random_host((size_t)c, seed + 1, 0.5f, 1.0f);
    float *beta = random_host((size_t)c, seed + 2, 0.5f, 0.0f);
    float *ry = host_f(nx), *rm = host_f(ns), *rr = host_f(ns);
    assert_non_null(cpu->ops->groupnorm_relu);
    assert_non_null(dev->ops->groupnorm_relu);
    assert_int_equal(
        cpu->ops->groupnorm_relu(cpu, x, n, hw, c, groups, eps, gamma, beta, ry, rm, rr), 0);
    float *dx = dev_copy(x, nx), *dg = dev_copy(gamma, (size_t)c), *db = dev_copy(beta, (size_t)c);
    float *fy = dev_nan(nx), *fm = dev_nan(ns), *fr = dev_nan(ns);
    float *uy = dev_nan(nx), *um = dev_nan(ns), *ur = dev_nan(ns);
    assert_int_equal(dev->ops->groupnorm_relu(dev, dx, n, hw, c, groups, eps, dg, db, fy, fm, fr),
                     0);
    assert_int_equal(dev->ops->groupnorm(dev, dx, n, hw, c, groups, eps, dg, db, uy, um, ur), 0);
    assert_int_equal(dev->ops->relu(dev, uy, uy, nx), 0);
    float *gy = fetch_f(fy, nx), *gm = fetch_f(fm, ns), *gr = fetch_f(fr, ns);
    float *hy = fetch_f(uy, nx), *hm = fetch_f(um, ns), *hr = fetch_f(ur, ns);
    expect_bits("groupnorm_relu y vs groupnorm + relu", gy, hy, nx);
    expect_bits("groupnorm_relu mean vs groupnorm", gm, hm, ns);
    expect_bits("groupnorm_relu rstd vs groupnorm", gr, hr, ns);
    size_t bad = 0, zeros = 0;
    for (size_t i = 0; i < nx; i++) {
        bad += !(fabsf(gy[i] - ry[i]) <= 1e-5f + 1e-5f * fabsf(ry[i]));
        zeros += gy[i] == 0.0f;
    }
    for (size_t i = 0; i < ns; i++)
        bad += !(fabsf(gm[i] - rm[i]) <= 1e-6f * (1 + fabsf(rm[i])) &&
                 fabsf(gr[i] - rr[i]) <= 1e-6f + 1e-6f * fabsf(rr[i]));
    if (bad)
        print_error("groupnorm_relu n=%d hw=%d c=%d: %zu values off the CPU's\n", n, hw, c, bad);
    assert_int_equal(bad, 0);
    assert_true(zeros > 0 && zeros < nx); /* the rectifier did something, not everything */
    free(x), free(gamma), free(beta), free(ry), free(rm), free(rr);
    free(gy), free(gm), free(gr), free(hy), free(hm), free(hr);
    float *bufs[] = {dx, dg, db, fy, fm, fr, uy, um, ur};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) hs_be_free(dev, bufs[i]);
}

static void test_groupnorm_relu(void **state) {
    (void)state;
    check_groupnorm_relu(3, 7 * 7, 16, 4, 10);
    check_groupnorm_relu(2, 1, 8, 8, 11);   /* one element per group */
    check_groupnorm_relu(1, 600, 6, 2, 12); /* more elements than a block's threads */
}

/* groupnorm_relu_grad: the device's relu_grad then groupnorm_grad, bit for bit, dy untouched;
 * and the CPU's two ops within GroupNorm's gradient tolerance (test_cuda_conv's). */
static void check_groupnorm_relu_grad(int n, int hw, int c, int groups, uint32_t seed) {
    size_t nx = (size_t)n * hw * c, ns = (size_t)n * groups;
    const float eps = 1e-5f;
    float *x = random_host(nx, seed, 2.0f, 0.3f), *dy = random_host(nx, seed + 3, 1.0f, 0.0f);
    float *gamma = random_host((size_t)c, seed + 1, 0.5f, 1.0f);
    float *beta = random_host((size_t)c, seed + 2, 0.5f, 0.0f);
    float *ry = host_f(nx), *rm = host_f(ns), *rr = host_f(ns), *rdy = host_f(nx);
    float *rdx = host_f(nx), *rdg = host_f((size_t)c), *rdb = host_f((size_t)c);
    assert_int_equal(
        cpu->ops->groupnorm_relu(cpu, x, n, hw, c, groups, eps, gamma, beta, ry, rm, rr), 0);
    assert_int_equal(cpu->ops->relu_grad(cpu, rdy, dy, ry, nx), 0);
    assert_int_equal(cpu->ops->groupnorm_grad(cpu, rdy, x, n, hw, c, groups, gamma, rm, rr, rdx,
                                              rdg, rdb), 0);
    assert_non_null(dev->ops->groupnorm_relu_grad);
    float *dx_ = dev_copy(x, nx), *ddy = dev_copy(dy, nx), *dg = dev_copy(gamma, (size_t)c);
    float *db = dev_copy(beta, (size_t)c), *y = dev_nan(nx), *m = dev_nan(ns), *r = dev_nan(ns);
    float *out[2][3], *got[2][3];
    size_t len[3] = {nx, (size_t)c, (size_t)c};
    assert_int_equal(dev->ops->groupnorm_relu(dev, dx_, n, hw, c, groups, eps, dg, db, y, m, r), 0);
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 3; i++) out[f][i] = dev_nan(len[i]);
    assert_int_equal(dev->ops->groupnorm_relu_grad(dev, ddy, y, dx_, n, hw, c, groups, dg, m, r,
                                                   out[0][0], out[0][1], out[0][2]), 0);
    float *dy_after = fetch_f(ddy, nx);
    expect_bits("groupnorm_relu_grad leaves dy", dy_after, dy, nx);
    assert_int_equal(dev->ops->relu_grad(dev, ddy, ddy, y, nx), 0);
    assert_int_equal(dev->ops->groupnorm_grad(dev, ddy, dx_, n, hw, c, groups, dg, m, r,
                                              out[1][0], out[1][1], out[1][2]), 0);
    static const char *const name[3] = {"dx", "dgamma", "dbeta"};
    const float *ref[3] = {rdx, rdg, rdb};
    for (int i = 0; i < 3; i++) {
        char what[96];
        snprintf(what, sizeof(what), "groupnorm_relu_grad %s vs relu_grad + groupnorm_grad",
                 name[i]);
        got[0][i] = fetch_f(out[0][i], len[i]);
        got[1][i] = fetch_f(out[1][i], len[i]);
        expect_bits(what, got[0][i], got[1][i], len[i]);
        size_t bad = 0;
        for (size_t j = 0; j < len[i]; j++)
            bad += !(fabsf(got[0][i][j] - ref[i][j]) <= (i ? 1e-4f : 2e-5f) +
                                                          (i ? 1e-5f : 1e-4f) * fabsf(ref[i][j]));
        if (bad) print_error("groupnorm_relu_grad %s: %zu values off the CPU's\n", name[i], bad);
        assert_int_equal(bad, 0);
        free(got[0][i]), free(got[1][i]);
        hs_be_free(dev, out[0][i]), hs_be_free(dev, out[1][i]);
    }
    free(x), free(dy), free(gamma), free(beta), free(ry), free(rm), free(rr), free(rdy);
    free(rdx), free(rdg), free(rdb), free(dy_after);
    float *bufs[] = {dx_, ddy, dg, db, y, m, r};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) hs_be_free(dev, bufs[i]);
}

static void test_groupnorm_relu_grad(void **state) {
    (void)state;
    check_groupnorm_relu_grad(3, 7 * 7, 16, 4, 20);
    check_groupnorm_relu_grad(1, 600, 6, 2, 21);
}

/* ------------------------------------------------------------------ shortcut_sum */

static void check_shortcut_sum(int n, hs_shortcut_geom s, int relu, int in_place, uint32_t seed) {
    size_t nx = (size_t)n * s.h * s.w * s.c, ny = (size_t)n * s.oh * s.ow * s.oc;
    float *x = random_host(nx, seed, 1, 0), *a = random_host(ny, seed + 1, 1, 0);
    float *ry = host_f(ny), *uy = host_f(ny);
    assert_int_equal(cpu->ops->shortcut_sum(cpu, ry, a, x, &s, n, relu), 0);
    /* The unfused sequence the model runs without shortcut_sum, on the CPU. */
    memcpy(uy, a, sizeof(float) * ny);
    assert_int_equal(cpu->ops->shortcut_add(cpu, uy, x, &s, n), 0);
    if (relu) assert_int_equal(cpu->ops->relu(cpu, uy, uy, ny), 0);
    expect_bits("cpu shortcut_sum vs copy + shortcut_add + relu", ry, uy, ny);
    float *dx = dev_copy(x, nx), *da = dev_copy(a, ny), *dy = in_place ? da : dev_nan(ny);
    assert_int_equal(dev->ops->shortcut_sum(dev, dy, da, dx, &s, n, relu), 0);
    float *gy = fetch_f(dy, ny);
    char what[96];
    snprintf(what, sizeof(what), "shortcut_sum %dx%dx%d -> %dx%dx%d s=%d%s%s", s.h, s.w, s.c, s.oh,
             s.ow, s.oc, s.stride, relu ? " relu" : "", in_place ? " in place" : "");
    expect_bits(what, gy, ry, ny);
    free(x), free(a), free(ry), free(uy), free(gy);
    hs_be_free(dev, dx), hs_be_free(dev, da);
    if (!in_place) hs_be_free(dev, dy);
}

static void test_shortcut_sum(void **state) {
    (void)state;
    assert_non_null(dev->ops->shortcut_sum);
    for (int relu = 0; relu < 2; relu++)
        for (int in_place = 0; in_place < 2; in_place++) {
            check_shortcut_sum(3, (hs_shortcut_geom){6, 5, 7, 6, 5, 7, 1}, relu, in_place, 40);
            check_shortcut_sum(2, (hs_shortcut_geom){4, 8, 8, 8, 4, 4, 2}, relu, in_place, 41);
            check_shortcut_sum(2, (hs_shortcut_geom){3, 7, 9, 5, 4, 5, 2}, relu, in_place, 42);
        }
}

/* ------------------------------------------------------------------ GEMM precision */

/* x rounded to nearest even at `bits` significant bits (8: BF16, 11: TF32), through the
 * exponent rather than the bit pattern: rintf rounds ties to even in the default mode. */
static float round_sig(float x, int bits) {
    if (!isfinite(x) || x == 0.0f) return x;
    int e;
    float m = frexpf(x, &e); /* x = m 2^e, 0.5 <= |m| < 1 */
    return ldexpf(rintf(ldexpf(m, bits)), e - bits);
}

static void test_round_reference(void **state) {
    (void)state;
    /* 1 + 2^-8 lies halfway between two BF16 values: ties go to the even one, 1. */
    assert_true(round_sig(1.0f + 0x1p-8f, 8) == 1.0f);
    assert_true(round_sig(1.0f + 3 * 0x1p-8f, 8) == 1.0f + 0x1p-6f);
    assert_true(round_sig(-1.0f - 0x1.8p-8f, 8) == -1.0f - 0x1p-7f);
    assert_true(round_sig(1.0f + 0x1p-11f, 11) == 1.0f);
    assert_true(round_sig(1.0f + 0x1.8p-11f, 11) == 1.0f + 0x1p-10f);
}

/* C = op(A) op(B) of m x n x k at precision p on dev, against the CPU's FP32 GEMM of the
 * inputs rounded as p rounds them. */
static void check_gemm(hs_precision p, int ta, int tb, int m, int n, int k, uint32_t seed) {
    const int bits = p == HS_PRECISION_BF16 ? 8 : 11;
    /* The GPU's TF32 conversion is its own: any rounding to 11 bits is within 2^-11. */
    const int exact_rounding = p == HS_PRECISION_BF16 || emulated;
    size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    int lda = ta ? m : k, ldb = tb ? k : n;
    float *a = random_host(na, seed, 1, 0), *b = random_host(nb, seed + 1, 1, 0);
    float *ar = host_f(na), *br = host_f(nb), *ref = host_f(nc), *exact = host_f(nc);
    float *aa = host_f(na), *ab = host_f(nb), *bound = host_f(nc);
    for (size_t i = 0; i < na; i++) ar[i] = round_sig(a[i], bits), aa[i] = fabsf(a[i]);
    for (size_t i = 0; i < nb; i++) br[i] = round_sig(b[i], bits), ab[i] = fabsf(b[i]);
    assert_int_equal(cpu->ops->gemm(cpu, ta, tb, m, n, k, 1.0f, ar, lda, br, ldb, 0.0f, ref, n), 0);
    assert_int_equal(cpu->ops->gemm(cpu, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, exact, n), 0);
    assert_int_equal(cpu->ops->gemm(cpu, ta, tb, m, n, k, 1.0f, aa, lda, ab, ldb, 0.0f, bound, n),
                     0);
    float *da = dev_copy(a, na), *db = dev_copy(b, nb), *dc = dev_nan(nc);
    int set = hs_backend_set_precision(dev, p);
    int rc = set < 0 ? set
                     : dev->ops->gemm(dev, ta, tb, m, n, k, 1.0f, da, lda, db, ldb, 0.0f, dc, n);
    assert_int_equal(hs_backend_set_precision(dev, HS_PRECISION_FP32), 0);
    assert_int_equal(set, 0);
    assert_int_equal(rc, 0);
    float *got = fetch_f(dc, nc);
    /* FP32 sums of k products: k 2^-24 relative to the sum of magnitudes; the rounding of
     * inputs, when it is not the reference's, 2 2^-bits of it. */
    double rel = (k + 2) * 0x1p-24 + (exact_rounding ? 0.0 : 2.0 * ldexp(1.0, -bits));
    size_t bad = 0, first = 0, closer = 0, far = 0;
    for (size_t i = 0; i < nc; i++) {
        double tol = rel * bound[i] + 1e-30;
        if (!(fabs((double)got[i] - ref[i]) <= tol) && bad++ == 0) first = i;
        closer += fabs((double)got[i] - ref[i]) < fabs((double)got[i] - exact[i]);
        far += fabs((double)got[i] - exact[i]) > 0x1p-14 * bound[i];
    }
    if (bad)
        print_error("%s gemm %dx%dx%d%s%s: %zu of %zu off the rounded reference; first [%zu] "
                    "%.9g vs %.9g\n",
                    hs_precision_name(p), m, n, k, ta ? " A^T" : "", tb ? " B^T" : "", bad, nc,
                    first, (double)got[first], (double)ref[first]);
    assert_int_equal(bad, 0);
    /* The inputs were rounded as the reference rounds them: most results are nearer the
     * rounded product than the exact one (a GEMM that skipped the rounding has none). The
     * GPU's own TF32 rounding is held to the bound above only. */
    if (exact_rounding && !(closer > nc / 2))
        print_error("%s gemm %dx%dx%d: only %zu of %zu results nearer the rounded product\n",
                    hs_precision_name(p), m, n, k, closer, nc);
    if (exact_rounding) assert_true(closer > nc / 2);
    /* TF32 applied at all, wherever it rounds (header); the emulator's rounding too. */
    if (p == HS_PRECISION_TF32 && m % 8 == 0 && n % 8 == 0 && k % 8 == 0) {
        printf("# tf32 gemm %dx%dx%d: %zu of %zu results off the fp32 product by over 2^-14 "
               "of the magnitudes' sum\n", m, n, k, far, nc);
        assert_true(far > nc / 4);
    }
    free(a), free(b), free(ar), free(br), free(ref), free(exact), free(aa), free(ab), free(bound);
    free(got);
    hs_be_free(dev, da), hs_be_free(dev, db), hs_be_free(dev, dc);
}

static void test_gemm_precision(void **state) {
    (void)state;
    for (int p = HS_PRECISION_TF32; p <= HS_PRECISION_BF16; p++)
        for (int t = 0; t < 4; t++) {
            check_gemm((hs_precision)p, t & 1, t >> 1, 37, 29, 53, (uint32_t)(60 + t));
            check_gemm((hs_precision)p, t & 1, t >> 1, 130, 65, 300, (uint32_t)(70 + t));
        }
    /* Aligned, with k small enough that TF32's input rounding, about 2^-11 / sqrt(k) of the
     * magnitudes' sum, clearly exceeds 2^-14 of it in most results. */
    check_gemm(HS_PRECISION_TF32, 0, 0, 64, 64, 32, 95);
}

/* Back at FP32 the GEMM is the one it was; the CPU has FP32 only; names round-trip. */
static void test_precision_switch(void **state) {
    (void)state;
    const int m = 33, n = 17, k = 45;
    float *a = random_host((size_t)m * k, 80, 1, 0), *b = random_host((size_t)k * n, 81, 1, 0);
    float *da = dev_copy(a, (size_t)m * k), *db = dev_copy(b, (size_t)k * n);
    float *c0 = dev_nan((size_t)m * n), *c1 = dev_nan((size_t)m * n);
    assert_int_equal(dev->ops->gemm(dev, 0, 0, m, n, k, 1.0f, da, k, db, n, 0.0f, c0, n), 0);
    int set = hs_backend_set_precision(dev, HS_PRECISION_BF16);
    int named = strstr(dev->description, "bf16") != NULL;
    assert_int_equal(hs_backend_set_precision(dev, HS_PRECISION_FP32), 0);
    assert_int_equal(set, 0);
    assert_true(named);
    assert_null(strstr(dev->description, "bf16"));
    assert_int_equal(dev->ops->gemm(dev, 0, 0, m, n, k, 1.0f, da, k, db, n, 0.0f, c1, n), 0);
    float *h0 = fetch_f(c0, (size_t)m * n), *h1 = fetch_f(c1, (size_t)m * n);
    expect_bits("fp32 gemm after bf16 and back", h1, h0, (size_t)m * n);
    free(a), free(b), free(h0), free(h1);
    hs_be_free(dev, da), hs_be_free(dev, db), hs_be_free(dev, c0), hs_be_free(dev, c1);

    assert_int_equal(hs_backend_set_precision(cpu, HS_PRECISION_FP32), 0);
    assert_int_equal(hs_backend_set_precision(cpu, HS_PRECISION_BF16), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "--device cuda"));
    assert_int_equal(hs_backend_set_precision(dev, (hs_precision)7), HS_EINVAL);
    for (int p = 0; p < 3; p++) {
        hs_precision q;
        assert_int_equal(hs_precision_parse(hs_precision_name((hs_precision)p), &q), 0);
        assert_int_equal((int)q, p);
    }
    hs_precision q;
    assert_int_equal(hs_precision_parse("fp16", &q), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "fp16"));
}

/* ------------------------------------------------------------------ loss curves */

#define CURVE_BATCH 8
#define CURVE_WINDOW 50

/* Ten classes of 28 x 28 images: a fixed random template per class plus noise, so that
 * cnn-small learns within a few hundred steps. */
static void curve_batch(const float *templ, long step, float *x, int32_t *y) {
    hs_rng r;
    hs__rng_init(&r, 31, HS_RNG_TEST, 900, (uint64_t)step);
    for (int i = 0; i < CURVE_BATCH; i++) {
        y[i] = (int32_t)hs_rng_below(hs__rng_u32(&r), 10);
        for (int p = 0; p < 28 * 28; p++)
            x[i * 784 + p] = 0.6f * templ[y[i] * 784 + p] + 1.0f * (float)hs__rng_normal(&r);
    }
}

static void train_curve(hs_precision p, const float *templ, long steps, double *loss) {
    hs_model_spec spec;
    assert_int_equal(hs_model_spec_parse(&spec, "cnn-small", NULL, 1, 28, 28, 10), 0);
    hs_model *m;
    hs_optim *o;
    hs_optim_cfg oc;
    hs_optim_cfg_default(&oc);
    oc.lr = 0.005f;
    oc.sched = HS_LR_CONST;
    oc.warmup_steps = 20; /* cnn-small's first steps from the initial state are large */
    assert_int_equal(hs_model_new_spec(&m, dev, &spec, CURVE_BATCH), 0);
    assert_int_equal(hs_model_init(m, 5), 0);
    assert_int_equal(hs_optim_new(&o, dev, hs_model_nparams(m), &oc), 0);
    float x[CURVE_BATCH * 784];
    int32_t y[CURVE_BATCH];
    /* At p only here: a failure is asserted after the return to FP32. */
    int err = hs_backend_set_precision(dev, p);
    long t = 0;
    for (; t < steps && err == 0; t++) {
        hs_step_stats st;
        curve_batch(templ, t, x, y);
        if ((err = hs_model_grad(m, x, y, CURVE_BATCH, &st)) < 0 ||
            (err = hs_optim_step(o, hs_model_params(m), hs_model_grads(m), t, NULL)) < 0)
            break;
        loss[t] = st.loss;
        if (getenv("HS_CURVE_PRINT")) /* the whole curve, for a plot */
            printf("# %s step %ld loss %.5f\n", hs_precision_name(p), t, st.loss);
    }
    assert_int_equal(hs_backend_set_precision(dev, HS_PRECISION_FP32), 0);
    hs_optim_free(o);
    hs_model_free(m);
    if (err < 0) fail_msg("%s, step %ld: %s", hs_precision_name(p), t, hs_error_message());
}

static void test_loss_curves(void **state) {
    (void)state;
    const char *env = getenv("HS_CURVE_STEPS");
    long steps = env ? atol(env) : 200;
    if (steps < CURVE_WINDOW) steps = CURVE_WINDOW;
    float *templ = random_host(10 * 784, 90, 1.0f, 0.0f);
    double *loss[3];
    for (int p = 0; p < 3; p++) {
        loss[p] = calloc((size_t)steps, sizeof(double));
        assert_non_null(loss[p]);
        train_curve((hs_precision)p, templ, steps, loss[p]);
    }
    double worst[3] = {0, 0, 0}, first = 0, last = 0;
    for (long w = 0; w + CURVE_WINDOW <= steps; w += CURVE_WINDOW) {
        double mean[3] = {0, 0, 0};
        for (int p = 0; p < 3; p++) {
            for (long t = w; t < w + CURVE_WINDOW; t++) mean[p] += loss[p][t] / CURVE_WINDOW;
            double d = fabs(mean[p] - mean[0]);
            if (d > worst[p]) worst[p] = d;
            assert_true(isfinite(mean[p]));
            if (p && !(d <= 0.1 + 0.1 * mean[0]))
                print_error("%s: steps %ld-%ld mean loss %.4f, fp32 %.4f\n",
                            hs_precision_name((hs_precision)p), w, w + CURVE_WINDOW - 1, mean[p],
                            mean[0]);
            if (p) assert_true(d <= 0.1 + 0.1 * mean[0]);
        }
        if (w == 0) first = mean[0];
        last = mean[0];
    }
    printf("# cnn-small, %ld steps of %d: fp32 mean loss %.4f (first %d) -> %.4f (last); largest "
           "window difference tf32 %.4f, bf16 %.4f\n",
           steps, CURVE_BATCH, first, CURVE_WINDOW, last, worst[1], worst[2]);
    /* It learned: a curve that stays flat would track anything. */
    if (steps >= 4 * CURVE_WINDOW) assert_true(last < 0.75 * first);
    for (int p = 0; p < 3; p++) free(loss[p]);
    free(templ);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    hs_backend_cfg cfg = {1, 0};
    if (hs_backend_open(&cpu, HS_DEVICE_CPU, &cfg) < 0) {
        fprintf(stderr, "FAIL: cannot open the CPU backend: %s\n", hs_error_message());
        return 1;
    }
    int rc = cuda_test_open(&dev, &cfg);
    if (rc != 0) {
        hs_backend_close(cpu);
        return rc;
    }
    emulated = strstr(dev->description, "EMULATED") != NULL;
    printf("# %s against %s\n", dev->description, cpu->description);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groupnorm_relu),  cmocka_unit_test(test_groupnorm_relu_grad),
        cmocka_unit_test(test_shortcut_sum),
        cmocka_unit_test(test_round_reference), cmocka_unit_test(test_gemm_precision),
        cmocka_unit_test(test_precision_switch), cmocka_unit_test(test_loss_curves),
    };
    int failed = cmocka_run_group_tests_name("cuda-fused", tests, NULL, NULL);
    hs_backend_close(dev);
    hs_backend_close(cpu);
    return failed ? 1 : 0;
}
