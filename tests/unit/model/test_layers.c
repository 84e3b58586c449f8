/* Unit tests of the layer engine: a finite-difference gradient check of every layer type and of
 * each named model against a double-precision reference written here from the documented
 * layouts (NHWC activations, conv weights out x kh x kw x in, GroupNorm gamma then beta), and
 * bit-identical training for the same seed and threads. */
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
#include "model/model_internal.h"

static hs_backend *open_cpu(int threads) {
    hs_backend *be;
    hs_backend_cfg cfg = {threads, 0};
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &cfg), 0);
    return be;
}

/* Optional ops the CPU backend is opened without by open_stripped, as a backend that predates
 * them: the model then takes the paths it takes on such a backend. */
enum { STRIP_IM2ROW = 1, STRIP_FUSED = 2 };
static int strip;

/* open_cpu with the ops in `strip` removed; tab (the table used) must outlive the backend. */
static hs_backend *open_stripped(int threads, hs_backend_ops *tab) {
    hs_backend *be = open_cpu(threads);
    *tab = *be->ops;
    if (strip & STRIP_IM2ROW) tab->im2row = NULL;
    if (strip & STRIP_FUSED) tab->groupnorm_relu = NULL, tab->shortcut_sum = NULL;
    be->ops = tab;
    return be;
}

/* ---------------------------------------------------------------- double reference */

/* The mean softmax cross-entropy of the batch under parameters p, in double throughout. */
static double ref_loss(const hs_model_spec *s, const hs__layer_shape *sh, const double *p,
                       const float *x, const int32_t *y, int bs) {
    size_t maxf = (size_t)s->in_c * s->in_h * s->in_w;
    for (int i = 0; i < s->n_layers; i++) {
        size_t f = (size_t)sh[i].oc * sh[i].oh * sh[i].ow;
        if (f > maxf) maxf = f;
    }
    double *cur = malloc(sizeof(double) * maxf), *nxt = malloc(sizeof(double) * maxf);
    double *saved = malloc(sizeof(double) * maxf);
    assert_non_null(cur), assert_non_null(nxt), assert_non_null(saved);
    double total = 0;
    const int C = s->in_c, H = s->in_h, W = s->in_w;
    for (int b = 0; b < bs; b++) {
        const float *xb = x + (size_t)b * C * H * W;
        for (int ch = 0; ch < C; ch++)
            for (int i = 0; i < H; i++)
                for (int j = 0; j < W; j++)
                    cur[((size_t)i * W + j) * C + ch] = xb[((size_t)ch * H + i) * W + j];
        for (int li = 0; li < s->n_layers; li++) {
            const hs_layer_spec *l = &s->layer[li];
            const hs__layer_shape *q = &sh[li];
            const int ic = q->ic, ih = q->ih, iw = q->iw, oc = q->oc, oh = q->oh, ow = q->ow;
            const double *wt = p + q->w_off, *bi = p + q->b_off;
            size_t in_f = (size_t)ic * ih * iw, out_f = (size_t)oc * oh * ow;
            switch (l->kind) {
            case HS_LAYER_LINEAR:
                for (int o = 0; o < oc; o++) {
                    double a = q->nb ? bi[o] : 0;
                    for (size_t k = 0; k < in_f; k++) a += wt[(size_t)o * in_f + k] * cur[k];
                    nxt[o] = a;
                }
                break;
            case HS_LAYER_CONV2D:
            case HS_LAYER_MAXPOOL:
                for (int i = 0; i < oh; i++)
                    for (int j = 0; j < ow; j++)
                        for (int o = 0; o < oc; o++) {
                            int conv = l->kind == HS_LAYER_CONV2D;
                            double a = conv ? (q->nb ? bi[o] : 0) : -INFINITY;
                            for (int kh = 0; kh < l->kernel; kh++)
                                for (int kw = 0; kw < l->kernel; kw++) {
                                    int hi = i * l->stride - l->pad + kh;
                                    int wi = j * l->stride - l->pad + kw;
                                    if (hi < 0 || hi >= ih || wi < 0 || wi >= iw) continue;
                                    const double *v = cur + ((size_t)hi * iw + wi) * ic;
                                    if (!conv) {
                                        if (v[o] > a) a = v[o];
                                        continue;
                                    }
                                    for (int ci = 0; ci < ic; ci++)
                                        a += wt[(((size_t)o * l->kernel + kh) * l->kernel + kw) *
                                                    ic + ci] * v[ci];
                                }
                            nxt[((size_t)i * ow + j) * oc + o] = a;
                        }
                break;
            case HS_LAYER_AVGPOOL:
                for (int ch = 0; ch < ic; ch++) {
                    double a = 0;
                    for (int k = 0; k < ih * iw; k++) a += cur[(size_t)k * ic + ch];
                    nxt[ch] = a / (ih * iw);
                }
                break;
            case HS_LAYER_RELU:
                for (size_t k = 0; k < out_f; k++) nxt[k] = cur[k] > 0 ? cur[k] : 0;
                break;
            case HS_LAYER_GROUPNORM: {
                int cpg = ic / l->groups;
                for (int g = 0; g < l->groups; g++) {
                    double m = 0, v = 0, cnt = (double)ih * iw * cpg;
                    for (int k = 0; k < ih * iw; k++)
                        for (int ch = g * cpg; ch < (g + 1) * cpg; ch++) m += cur[(size_t)k * ic + ch];
                    m /= cnt;
                    for (int k = 0; k < ih * iw; k++)
                        for (int ch = g * cpg; ch < (g + 1) * cpg; ch++) {
                            double d = cur[(size_t)k * ic + ch] - m;
                            v += d * d;
                        }
                    double r = 1.0 / sqrt(v / cnt + (double)HS_GROUPNORM_EPS);
                    for (int k = 0; k < ih * iw; k++)
                        for (int ch = g * cpg; ch < (g + 1) * cpg; ch++) {
                            size_t o = (size_t)k * ic + ch;
                            nxt[o] = (cur[o] - m) * r * wt[ch] + bi[ch];
                        }
                }
                break;
            }
            case HS_LAYER_FLATTEN: memcpy(nxt, cur, sizeof(double) * in_f); break;
            case HS_LAYER_RESIDUAL:
                memcpy(saved, cur, sizeof(double) * in_f);
                memcpy(nxt, cur, sizeof(double) * in_f);
                break;
            case HS_LAYER_RESIDUAL_ADD: {
                const hs__layer_shape *r = &sh[q->res_from];
                memcpy(nxt, cur, sizeof(double) * out_f);
                for (int i = 0; i < oh; i++)
                    for (int j = 0; j < ow; j++)
                        for (int ch = 0; ch < r->ic; ch++)
                            nxt[((size_t)i * ow + j) * oc + ch] +=
                                saved[(((size_t)i * q->res_stride) * r->iw +
                                       (size_t)j * q->res_stride) * r->ic + ch];
                break;
            }
            }
            double *t = cur;
            cur = nxt;
            nxt = t;
        }
        double mx = -INFINITY, se = 0;
        for (int k = 0; k < s->classes; k++) mx = cur[k] > mx ? cur[k] : mx;
        for (int k = 0; k < s->classes; k++) se += exp(cur[k] - mx);
        total += log(se) + mx - cur[y[b]];
    }
    free(cur), free(nxt), free(saved);
    return total / bs;
}

/* ---------------------------------------------------------------- gradient check */

/* Checks `per` parameters of every parameter tensor (first, last, and seeded picks) of the
 * model s: the analytic float gradient against the central difference of the double reference
 * with step 1e-5. Pass: relative error below 1e-3, or absolute below 1e-6 where the gradient
 * is smaller than 1e-3. Also checks the float forward's loss against the reference. */
static void gradcheck(const hs_model_spec *s, int bs, int per, uint64_t seed) {
    hs__layer_shape sh[HS_MODEL_MAX_LAYERS];
    size_t np = 0;
    assert_int_equal(hs__model_spec_resolve(s, sh, &np), 0);
    hs_backend_ops tab;
    hs_backend *be = open_stripped(1, &tab);
    hs_model *m;
    assert_int_equal(hs_model_new_spec(&m, be, s, bs), 0);
    assert_int_equal(hs_model_init(m, seed), 0);
    assert_int_equal(hs_model_nparams(m), np);
    float *pf = hs_model_params(m);
    hs_rng r;
    hs__rng_init(&r, seed, 99, 0, 0);
    /* Non-trivial biases and affine parameters, so their gradients are exercised off the
     * initial values. */
    for (int i = 0; i < s->n_layers; i++) {
        if (s->layer[i].kind == HS_LAYER_GROUPNORM)
            for (size_t j = 0; j < sh[i].nw; j++)
                pf[sh[i].w_off + j] = (float)(1.0 + 0.3 * hs__rng_normal(&r));
        for (size_t j = 0; j < sh[i].nb; j++) pf[sh[i].b_off + j] = (float)(0.2 * hs__rng_normal(&r));
    }
    size_t in_f = (size_t)s->in_c * s->in_h * s->in_w;
    float *x = malloc(sizeof(float) * in_f * bs);
    int32_t *y = malloc(sizeof(int32_t) * bs);
    double *pd = malloc(sizeof(double) * np);
    assert_non_null(x), assert_non_null(y), assert_non_null(pd);
    for (size_t i = 0; i < in_f * bs; i++) x[i] = (float)hs__rng_normal(&r);
    for (int b = 0; b < bs; b++) y[b] = (int32_t)hs__rng_uniform(&r, (uint32_t)s->classes);
    hs_step_stats st;
    assert_int_equal(hs_model_grad(m, x, y, bs, &st), 0);
    const float *g = hs_model_grads(m);
    for (size_t i = 0; i < np; i++) pd[i] = pf[i];
    double l0 = ref_loss(s, sh, pd, x, y, bs);
    if (fabs(l0 - st.loss) > 1e-4 * fmax(1.0, fabs(l0)))
        fail_msg("model %s: loss %.8f, reference %.8f", s->name, st.loss, l0);
    int checked = 0;
    double worst = 0;
    for (int i = 0; i < s->n_layers; i++)
        for (int part = 0; part < 2; part++) {
            size_t off = part ? sh[i].b_off : sh[i].w_off, n = part ? sh[i].nb : sh[i].nw;
            for (int k = 0; k < per && n; k++) {
                size_t j = off + (k == 0 ? 0 : k == 1 ? n - 1 : hs__rng_uniform(&r, (uint32_t)n));
                const double h = 1e-5;
                double keep = pd[j];
                pd[j] = keep + h;
                double lp = ref_loss(s, sh, pd, x, y, bs);
                pd[j] = keep - h;
                double lm = ref_loss(s, sh, pd, x, y, bs);
                pd[j] = keep;
                double num = (lp - lm) / (2 * h), an = g[j];
                double scale = fmax(fabs(num), fabs(an));
                double rel = scale > 0 ? fabs(num - an) / scale : 0;
                int ok = rel < 1e-3 || (scale < 1e-3 && fabs(num - an) < 1e-6);
                if (!ok)
                    fail_msg("model %s: layer %d (%s) %s[%zu]: analytic %.9g, numeric %.9g "
                             "(relative error %.2e)",
                             s->name, i + 1, hs_layer_kind_name(s->layer[i].kind),
                             part ? "bias" : "weight", j - off, an, num, rel);
                if (scale >= 1e-3 && rel > worst) worst = rel;
                checked++;
            }
        }
    print_message("# %s: %d gradients checked, worst relative error %.2e\n", s->name, checked,
                  worst);
    assert_true(checked > 0);
    free(x), free(y), free(pd);
    hs_model_free(m);
    hs_backend_close(be);
}

static hs_layer_spec L(hs_layer_kind k, int out, int kernel, int stride, int pad, int bias,
                       int groups) {
    hs_layer_spec l = {k, out, kernel, stride, pad, bias, groups};
    return l;
}
#define LIN(o) L(HS_LAYER_LINEAR, o, 0, 0, 0, 1, 0)
#define CONV(o, k, s, p, b) L(HS_LAYER_CONV2D, o, k, s, p, b, 0)
#define POOL(k, s) L(HS_LAYER_MAXPOOL, 0, k, s, 0, 0, 0)
#define RELU L(HS_LAYER_RELU, 0, 0, 0, 0, 0, 0)
#define GN(g) L(HS_LAYER_GROUPNORM, 0, 0, 0, 0, 0, g)
#define AVG L(HS_LAYER_AVGPOOL, 0, 0, 0, 0, 0, 0)
#define FLAT L(HS_LAYER_FLATTEN, 0, 0, 0, 0, 0, 0)
#define RES L(HS_LAYER_RESIDUAL, 0, 0, 0, 0, 0, 0)
#define ADD L(HS_LAYER_RESIDUAL_ADD, 0, 0, 0, 0, 0, 0)

static hs_model_spec make(const char *name, int c, int h, int w, int classes, int n,
                          const hs_layer_spec *layers) {
    hs_model_spec s;
    memset(&s, 0, sizeof(s));
    snprintf(s.name, sizeof(s.name), "%s", name);
    s.in_c = c, s.in_h = h, s.in_w = w, s.classes = classes, s.n_layers = n;
    memcpy(s.layer, layers, sizeof(hs_layer_spec) * (size_t)n);
    return s;
}
#define MAKE(name, c, h, w, k, ...)                                                            \
    make(name, c, h, w, k, (int)(sizeof((hs_layer_spec[]){__VA_ARGS__}) / sizeof(hs_layer_spec)), \
         (hs_layer_spec[]){__VA_ARGS__})

/* One small model per layer type, each with the layer between parameterised layers so both
 * its input gradient and the parameters around it are checked. */
static void test_gradcheck_layers(void **state) {
    (void)state;
    hs_model_spec s;
    s = MAKE("linear-relu", 1, 1, 9, 4, LIN(7), RELU, LIN(5), RELU, LIN(4));
    gradcheck(&s, 3, 6, 1);
    /* conv2d: padded 3x3 on 2 NCHW input channels, strided without padding, 1x1, no bias. */
    s = MAKE("conv2d", 2, 7, 6, 3, CONV(4, 3, 1, 1, 1), RELU, CONV(5, 3, 2, 0, 0), RELU,
             CONV(3, 1, 1, 0, 1), FLAT, LIN(3));
    gradcheck(&s, 3, 6, 2);
    s = MAKE("maxpool", 1, 8, 8, 3, CONV(3, 3, 1, 1, 1), POOL(2, 2), CONV(4, 3, 1, 1, 1),
             POOL(3, 2), LIN(3));
    gradcheck(&s, 3, 6, 3);
    /* Pooling straight off a 2-channel input: the engine transposes it to NHWC first. */
    s = MAKE("maxpool-input", 2, 6, 6, 3, POOL(2, 2), CONV(4, 3, 1, 1, 1), AVG, LIN(3));
    gradcheck(&s, 3, 6, 4);
    s = MAKE("avgpool", 3, 5, 5, 4, CONV(6, 3, 1, 1, 1), RELU, AVG, FLAT, LIN(4));
    gradcheck(&s, 3, 6, 5);
    s = MAKE("groupnorm", 1, 6, 6, 3, CONV(6, 3, 1, 1, 0), GN(3), RELU, CONV(4, 3, 2, 1, 0),
             GN(1), RELU, LIN(3));
    gradcheck(&s, 3, 6, 6);
    /* Residuals: identity shortcut, then a strided one with zero-padded channels. */
    s = MAKE("residual", 2, 6, 6, 3, CONV(4, 3, 1, 1, 1), RELU, RES, CONV(4, 3, 1, 1, 0),
             GN(2), ADD, RELU, RES, CONV(8, 3, 2, 1, 0), GN(4), RELU, CONV(8, 3, 1, 1, 1), ADD,
             RELU, AVG, LIN(3));
    gradcheck(&s, 3, 6, 7);
    /* Convolutions the CPU computes a few examples at a time (512 KB of im2col rows per
     * chunk): the first layer's rows (27 floats a pixel, 110 KB an example) in chunks of 4 and
     * 1, the second's (144 floats a pixel, 590 KB) one example each, with its input gradient,
     * so the weight gradient accumulates over partial and single-example chunks. */
    s = MAKE("conv2d-chunked", 3, 32, 32, 3, CONV(16, 3, 1, 1, 0), GN(4), RELU,
             CONV(16, 3, 1, 1, 1), RELU, AVG, LIN(3));
    gradcheck(&s, 5, 4, 8);
    /* Stride-1 convolutions the CPU runs as k GEMMs over im2row's kernel rows, with the input
     * gradient as a convolution of dY with the flipped kernel: pad 1 and pad 0 with more
     * output than input channels, a 5x5 with pad 2 and fewer; then a 1x1 (no rows) and a
     * strided layer (im2col), after the first layer's NCHW input (im2col). */
    s = MAKE("conv2d-rows", 2, 7, 6, 3, CONV(3, 3, 1, 1, 1), RELU, CONV(5, 3, 1, 1, 1), RELU,
             CONV(6, 3, 1, 0, 0), GN(2), CONV(4, 5, 1, 2, 1), RELU, CONV(4, 1, 1, 0, 0),
             CONV(3, 3, 2, 1, 1), FLAT, LIN(3));
    gradcheck(&s, 3, 6, 9);
    /* Kernel rows built a few examples at a time: 16 -> 8 channels at 32x32 (dY's rows are
     * the shorter; 2 examples a chunk), 5 examples in chunks of 2, 2 and 1. */
    s = MAKE("conv2d-rows-chunked", 3, 32, 32, 3, CONV(16, 3, 1, 1, 0), RELU,
             CONV(8, 3, 1, 1, 1), RELU, CONV(16, 3, 1, 1, 0), AVG, LIN(3));
    gradcheck(&s, 5, 4, 10);
    /* The same model on a backend without im2row (every convolution through im2col) nor the
     * fused ops. */
    strip = STRIP_IM2ROW | STRIP_FUSED;
    s = MAKE("conv2d-rows/im2col", 2, 7, 6, 3, CONV(3, 3, 1, 1, 1), RELU, CONV(5, 3, 1, 1, 1),
             RELU, CONV(6, 3, 1, 0, 0), GN(2), CONV(4, 5, 1, 2, 1), RELU, CONV(4, 1, 1, 0, 0),
             CONV(3, 3, 2, 1, 1), FLAT, LIN(3));
    gradcheck(&s, 3, 6, 9);
    strip = 0;
}

/* im2row's row (b, i + kh, j) is kernel row kh of im2col's row (b, i, j), bit for bit, for
 * stride-1 geometries with and without padding, NHWC and NCHW input. */
static void test_im2row(void **state) {
    (void)state;
    hs_backend *be = open_cpu(1);
    const hs_conv_geom gs[] = {{16, 6, 5, 3, 1, 1, 4, 3, 0}, {3, 7, 6, 3, 1, 1, 7, 6, 1},
                               {5, 6, 7, 5, 1, 2, 6, 7, 0}, {4, 5, 5, 3, 1, 0, 3, 3, 0},
                               {7, 4, 6, 2, 1, 1, 5, 7, 0}};
    const int n = 2;
    for (size_t t = 0; t < sizeof(gs) / sizeof(gs[0]); t++) {
        hs_conv_geom g = gs[t];
        g.oh = g.h + 2 * g.pad - g.k + 1, g.ow = g.w + 2 * g.pad - g.k + 1;
        const int rh = g.oh + g.k - 1, kc = g.k * g.c;
        size_t xf = (size_t)n * g.c * g.h * g.w, cf = (size_t)n * g.oh * g.ow * g.k * kc;
        size_t rf = (size_t)n * rh * g.ow * kc;
        float *x = malloc(sizeof(float) * xf), *col = malloc(sizeof(float) * cf);
        float *rows = malloc(sizeof(float) * rf);
        assert_non_null(x), assert_non_null(col), assert_non_null(rows);
        for (size_t i = 0; i < xf; i++) x[i] = (float)i + 1.0f;
        for (size_t i = 0; i < rf; i++) rows[i] = -1.0f; /* every entry must be written */
        assert_int_equal(be->ops->im2col(be, x, &g, n, col), 0);
        assert_int_equal(be->ops->im2row(be, x, &g, n, rows), 0);
        for (int b = 0; b < n; b++)
            for (int i = 0; i < g.oh; i++)
                for (int j = 0; j < g.ow; j++)
                    for (int kh = 0; kh < g.k; kh++) {
                        const float *c = col + (((size_t)b * g.oh + i) * g.ow + j) * g.k * kc +
                                         (size_t)kh * kc;
                        const float *r = rows + (((size_t)b * rh + i + kh) * g.ow + j) * kc;
                        if (memcmp(c, r, sizeof(float) * (size_t)kc))
                            fail_msg("geometry %zu: example %d (%d, %d) kernel row %d differs", t,
                                     b, i, j, kh);
                    }
        for (size_t i = 0; i < rf; i++) assert_true(rows[i] >= 0.0f);
        free(x), free(col), free(rows);
    }
    hs_conv_geom g2 = {4, 6, 6, 3, 2, 1, 3, 3, 0};
    float dummy[4];
    assert_int_equal(be->ops->im2row(be, dummy, &g2, 1, dummy), HS_EINVAL);
    hs_backend_close(be);
}

static void test_gradcheck_named(void **state) {
    (void)state;
    hs_model_spec s;
    assert_int_equal(hs_model_spec_parse(&s, "mlp", "16,8", 1, 5, 5, 4), 0);
    gradcheck(&s, 3, 8, 11);
    assert_int_equal(hs_model_spec_parse(&s, "cnn-small", NULL, 1, 28, 28, 10), 0);
    gradcheck(&s, 2, 8, 12);
    /* ResNet-20 on a small colour input (strides take 8x8 to 2x2). */
    assert_int_equal(hs_model_spec_parse(&s, "resnet20", NULL, 3, 8, 8, 4), 0);
    gradcheck(&s, 2, 3, 13);
}

/* ---------------------------------------------------------------- determinism */

/* Trains 3 SGD steps with momentum from seed and returns the parameters (malloc'd). */
static float *train_steps(const hs_model_spec *s, int threads, uint64_t seed, size_t *np) {
    hs_backend_ops tab;
    hs_backend *be = open_stripped(threads, &tab);
    hs_model *m;
    hs_optim *o;
    const int bs = 8;
    assert_int_equal(hs_model_new_spec(&m, be, s, bs), 0);
    assert_int_equal(hs_model_init(m, seed), 0);
    hs_optim_cfg oc;
    hs_optim_cfg_default(&oc);
    oc.lr = 0.05f;
    oc.momentum = 0.9f;
    oc.weight_decay = 1e-4f;
    *np = hs_model_nparams(m);
    assert_int_equal(hs_optim_new(&o, be, *np, &oc), 0);
    size_t in_f = (size_t)s->in_c * s->in_h * s->in_w;
    float *x = malloc(sizeof(float) * in_f * bs);
    int32_t y[8];
    hs_rng r;
    hs__rng_init(&r, seed, 98, 0, 0);
    for (int step = 0; step < 3; step++) {
        for (size_t i = 0; i < in_f * bs; i++) x[i] = (float)hs__rng_normal(&r);
        for (int b = 0; b < bs; b++) y[b] = (int32_t)hs__rng_uniform(&r, (uint32_t)s->classes);
        assert_int_equal(hs_model_grad(m, x, y, bs, NULL), 0);
        assert_int_equal(hs_optim_step(o, hs_model_params(m), hs_model_grads(m), step, NULL), 0);
    }
    float *out = malloc(sizeof(float) * *np);
    memcpy(out, hs_model_params(m), sizeof(float) * *np);
    free(x);
    hs_optim_free(o);
    hs_model_free(m);
    hs_backend_close(be);
    return out;
}

static void test_determinism(void **state) {
    (void)state;
    hs_model_spec specs[4];
    assert_int_equal(hs_model_spec_parse(&specs[0], "mlp", "32", 1, 6, 6, 5), 0);
    assert_int_equal(hs_model_spec_parse(&specs[1], "cnn-small", NULL, 1, 28, 28, 10), 0);
    assert_int_equal(hs_model_spec_parse(&specs[2], "resnet20", NULL, 3, 8, 8, 5), 0);
    specs[3] = MAKE("json-like", 2, 6, 6, 3, POOL(2, 2), CONV(4, 3, 1, 1, 1), GN(2), RELU, RES,
                    CONV(4, 1, 1, 0, 0), ADD, AVG, LIN(3));
    for (int k = 0; k < 4; k++)
        for (int threads = 1; threads <= 2; threads++) {
            size_t n1, n2, n3;
            float *a = train_steps(&specs[k], threads, 7, &n1);
            float *b = train_steps(&specs[k], threads, 7, &n2);
            float *c = train_steps(&specs[k], threads, 8, &n3);
            assert_int_equal(n1, n2);
            if (memcmp(a, b, sizeof(float) * n1))
                fail_msg("model %s, %d threads: two runs with seed 7 differ", specs[k].name,
                         threads);
            assert_true(memcmp(a, c, sizeof(float) * n1) != 0);
            for (size_t i = 0; i < n1; i++) assert_true(isfinite(a[i]));
            free(a), free(b), free(c);
        }
}

/* The fused ops (a ReLU folded into the GroupNorm or the residual add before it) give the
 * bits of the two passes they replace: resnet20 (adds that pad channels, then a ReLU), and a
 * model that also has a residual layer between a GroupNorm or an add and its ReLU (kept
 * tensors: nothing fuses there). */
static void test_fused_bits(void **state) {
    (void)state;
    hs_model_spec specs[2];
    assert_int_equal(hs_model_spec_parse(&specs[0], "resnet20", NULL, 3, 8, 8, 5), 0);
    specs[1] = MAKE("fuse-edges", 2, 6, 6, 3, CONV(4, 3, 1, 1, 1), GN(2), RES, RELU,
                    CONV(6, 3, 2, 1, 0), GN(3), ADD, RES, RELU, CONV(6, 3, 1, 1, 0), GN(2), RELU,
                    ADD, RELU, AVG, LIN(3));
    for (int k = 0; k < 2; k++) {
        size_t n1, n2;
        float *a = train_steps(&specs[k], 1, 7, &n1);
        strip = STRIP_FUSED;
        float *b = train_steps(&specs[k], 1, 7, &n2);
        strip = 0;
        assert_int_equal(n1, n2);
        if (memcmp(a, b, sizeof(float) * n1))
            fail_msg("model %s: parameters with and without the fused ops differ", specs[k].name);
        free(a), free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck_layers),
        cmocka_unit_test(test_im2row),
        cmocka_unit_test(test_gradcheck_named),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_fused_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
