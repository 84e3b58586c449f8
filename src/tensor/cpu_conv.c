/* The CPU backend's convolutional-layer ops (im2col, pooling, GroupNorm, residual shortcut):
 * plain loops over NHWC activations, the reference for other backends. Sums that decide a
 * result (GroupNorm statistics, parameter gradients) run in double in a fixed order, so a
 * result depends on nothing but the inputs; the vectorised clones (HS_VECTOR_CLONES) only copy,
 * compare and add element by element, so every ISA gives the same bits. Called from the
 * training thread only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/hd.h"
#include "tensor/backend_internal.h"
#include "tensor/ew.h"

/* Short copies and sums inline: a patch row is often only a few floats (one channel, 3 wide, or
 * 3 x 16 channels), where a libc call costs more than the copy. GCC turns copy and zero-fill
 * loops back into memcpy/memset calls unless told not to (NO_LIBCALLS, on the functions these
 * inline into: they do no floating-point arithmetic that other options would change). */
#define NO_LIBCALLS __attribute__((optimize("no-tree-loop-distribute-patterns")))
static inline void copyf(float *restrict d, const float *restrict s, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) memcpy(d + i, s + i, 16 * sizeof(float));
    for (; i + 4 <= n; i += 4) memcpy(d + i, s + i, 4 * sizeof(float));
    for (; i < n; i++) memcpy(d + i, s + i, sizeof(float));
}

static inline void zerof(float *d, int n) {
    static const float zero[16];
    int i = 0;
    for (; i + 16 <= n; i += 16) memcpy(d + i, zero, 16 * sizeof(float));
    for (; i + 4 <= n; i += 4) memcpy(d + i, zero, 4 * sizeof(float));
    for (; i < n; i++) d[i] = 0.0f;
}

static inline void addf(float *restrict d, const float *restrict s, int n) {
    for (int i = 0; i < n; i++) d[i] += s[i];
}

/* One kernel row of a patch: the k * c floats of input row hi at columns w0 .. w0 + k - 1
 * (k * c consecutive floats of NHWC x when inside the image), zero outside it. */
static inline void kernel_row(float *restrict row, const float *restrict xb, const hs_conv_geom *g,
                              int hi, int w0) {
    const int c = g->c, h = g->h, w = g->w, k = g->k;
    if (hi < 0 || hi >= h) {
        zerof(row, k * c);
        return;
    }
    if (!g->chw_input && w0 >= 0 && w0 + k <= w) {
        copyf(row, xb + ((size_t)hi * w + w0) * c, k * c);
        return;
    }
    for (int kw = 0; kw < k; kw++) {
        int wi = w0 + kw;
        float *r = row + (size_t)kw * c;
        if (wi < 0 || wi >= w) {
            zerof(r, c);
        } else if (!g->chw_input) {
            copyf(r, xb + ((size_t)hi * w + wi) * c, c);
        } else {
            for (int ch = 0; ch < c; ch++) r[ch] = xb[((size_t)ch * h + hi) * w + wi];
        }
    }
}

HS_VECTOR_CLONES NO_LIBCALLS
int hs__cpu_im2col(hs_backend *be, const float *x, const hs_conv_geom *g, int n, float *col) {
    (void)be;
    const int k = g->k;
    const size_t kc = (size_t)k * k * g->c;
    for (int b = 0; b < n; b++) {
        const float *xb = x + (size_t)b * g->c * g->h * g->w;
        for (int i = 0; i < g->oh; i++)
            for (int j = 0; j < g->ow; j++) {
                float *row = col + (((size_t)b * g->oh + i) * g->ow + j) * kc;
                for (int kh = 0; kh < k; kh++, row += (size_t)k * g->c)
                    kernel_row(row, xb, g, i * g->stride - g->pad + kh, j * g->stride - g->pad);
            }
    }
    return 0;
}

HS_VECTOR_CLONES NO_LIBCALLS
int hs__cpu_im2row(hs_backend *be, const float *x, const hs_conv_geom *g, int n, float *rows) {
    (void)be;
    if (g->stride != 1)
        return hs__err(HS_EINVAL, "im2row: stride %d (only stride-1 convolutions)", g->stride);
    const int rh = g->oh + g->k - 1;
    const size_t kc = (size_t)g->k * g->c;
    for (int b = 0; b < n; b++) {
        const float *xb = x + (size_t)b * g->c * g->h * g->w;
        for (int r = 0; r < rh; r++)
            for (int j = 0; j < g->ow; j++)
                kernel_row(rows + (((size_t)b * rh + r) * g->ow + j) * kc, xb, g, r - g->pad,
                           j - g->pad);
    }
    return 0;
}

HS_VECTOR_CLONES
int hs__cpu_col2im(hs_backend *be, const float *col, const hs_conv_geom *g, int n, float *dx) {
    (void)be;
    const int c = g->c, h = g->h, w = g->w, k = g->k;
    const size_t kc = (size_t)k * k * c;
    memset(dx, 0, sizeof(float) * (size_t)n * c * h * w);
    for (int b = 0; b < n; b++) {
        float *db = dx + (size_t)b * c * h * w;
        for (int i = 0; i < g->oh; i++)
            for (int j = 0; j < g->ow; j++) {
                const float *row = col + (((size_t)b * g->oh + i) * g->ow + j) * kc;
                const int w0 = j * g->stride - g->pad;
                for (int kh = 0; kh < k; kh++, row += (size_t)k * c) {
                    int hi = i * g->stride - g->pad + kh;
                    if (hi < 0 || hi >= h) continue;
                    if (w0 >= 0 && w0 + k <= w) {
                        addf(db + ((size_t)hi * w + w0) * c, row, k * c);
                        continue;
                    }
                    for (int kw = 0; kw < k; kw++) {
                        int wi = w0 + kw;
                        if (wi >= 0 && wi < w)
                            addf(db + ((size_t)hi * w + wi) * c, row + (size_t)kw * c, c);
                    }
                }
            }
    }
    return 0;
}

/* One window position folded into the running maximum of c channels. Strictly greater keeps
 * the first maximum; restrict and no branches let it vectorise. */
static inline void pool_fold(float *restrict yo, int32_t *restrict ao, const float *restrict xs,
                             int32_t base, int c) {
    for (int ch = 0; ch < c; ch++) {
        int gt = xs[ch] > yo[ch];
        yo[ch] = gt ? xs[ch] : yo[ch];
        ao[ch] = gt ? base + ch : ao[ch];
    }
}

HS_VECTOR_CLONES
int hs__cpu_maxpool(hs_backend *be, const float *x, const hs_conv_geom *g, int n, float *y,
                    int32_t *arg) {
    (void)be;
    const int c = g->c, h = g->h, w = g->w;
    for (int b = 0; b < n; b++)
        for (int i = 0; i < g->oh; i++)
            for (int j = 0; j < g->ow; j++) {
                float *yo = y + (((size_t)b * g->oh + i) * g->ow + j) * c;
                int32_t *ao = arg + (((size_t)b * g->oh + i) * g->ow + j) * c;
                size_t s0 = (((size_t)b * h + (size_t)i * g->stride) * w +
                             (size_t)j * g->stride) * c;
                for (int ch = 0; ch < c; ch++) {
                    yo[ch] = x[s0 + ch];
                    ao[ch] = (int32_t)(s0 + (size_t)ch);
                }
                for (int kh = 0; kh < g->k; kh++)
                    for (int kw = kh ? 0 : 1; kw < g->k; kw++) {
                        size_t s = s0 + ((size_t)kh * w + kw) * c;
                        pool_fold(yo, ao, x + s, (int32_t)s, c);
                    }
            }
    return 0;
}

int hs__cpu_maxpool_grad(hs_backend *be, const float *dy, const int32_t *arg,
                         const hs_conv_geom *g, int n, float *dx) {
    (void)be;
    memset(dx, 0, sizeof(float) * (size_t)n * g->c * g->h * g->w);
    size_t m = (size_t)n * g->oh * g->ow * g->c;
    for (size_t i = 0; i < m; i++) dx[arg[i]] += dy[i];
    return 0;
}

int hs__cpu_avgpool(hs_backend *be, const float *x, int n, int hw, int c, float *y) {
    (void)be;
    for (int b = 0; b < n; b++) {
        float *yb = y + (size_t)b * c;
        const float *xb = x + (size_t)b * hw * c;
        memset(yb, 0, sizeof(float) * (size_t)c);
        for (int p = 0; p < hw; p++)
            for (int ch = 0; ch < c; ch++) yb[ch] += xb[(size_t)p * c + ch];
        float inv = 1.0f / (float)hw;
        for (int ch = 0; ch < c; ch++) yb[ch] = yb[ch] * inv;
    }
    return 0;
}

int hs__cpu_avgpool_grad(hs_backend *be, const float *dy, int n, int hw, int c, float *dx) {
    (void)be;
    float inv = 1.0f / (float)hw;
    for (int b = 0; b < n; b++)
        for (int p = 0; p < hw; p++)
            for (int ch = 0; ch < c; ch++)
                dx[((size_t)b * hw + p) * c + ch] = dy[(size_t)b * c + ch] * inv;
    return 0;
}

/* GroupNorm walks NHWC pixel by pixel and, within a pixel, group by group over the group's
 * consecutive channels. Statistics and parameter gradients accumulate in double in that fixed
 * order: within a pixel a group's sum starts at 0 and adds its channels in turn, and the pixel
 * sums add up over the pixels. Element-wise work runs over a pixel's c contiguous channels
 * with each channel's group statistics spread out per channel, so it vectorises; the group
 * sums are specialised for the common channels-per-group counts so that their short loops
 * unroll. Every path performs the same IEEE operations in the same order. */

#define GN_ALWAYS_INLINE static inline __attribute__((always_inline))

/* acc[gi] += the pixel's group sums of v (c floats; f applied to each as a double). */
GN_ALWAYS_INLINE void gn_group_sums(const float *restrict v, int groups, int cpg,
                                    double *restrict acc) {
    for (int gi = 0; gi < groups; gi++) {
        double sum = 0;
        for (int k = 0; k < cpg; k++) sum += v[gi * cpg + k];
        acc[gi] += sum;
    }
}

/* acc[gi] += the pixel's group sums of (v - mean[gi])^2, in double. */
GN_ALWAYS_INLINE void gn_group_sq(const float *restrict v, const float *restrict mean, int groups,
                                  int cpg, double *restrict acc) {
    for (int gi = 0; gi < groups; gi++) {
        double m = mean[gi], sum = 0;
        for (int k = 0; k < cpg; k++) {
            double d = (double)v[gi * cpg + k] - m;
            sum += d * d;
        }
        acc[gi] += sum;
    }
}

/* acc[gi] += the pixel's group sums of u (as doubles), and acc2[gi] of u * w in double. */
GN_ALWAYS_INLINE void gn_group_dot(const float *restrict u, const float *restrict w, int groups,
                                   int cpg, double *restrict acc, double *restrict acc2) {
    for (int gi = 0; gi < groups; gi++) {
        double a1 = 0, a2 = 0;
        for (int k = 0; k < cpg; k++) {
            a1 += u[gi * cpg + k];
            a2 += (double)u[gi * cpg + k] * w[gi * cpg + k];
        }
        acc[gi] += a1;
        acc2[gi] += a2;
    }
}

/* The statistics of one example, for a constant cpg once inlined. */
GN_ALWAYS_INLINE void gn_stats(const float *xb, int hw, int c, int groups, int cpg, float eps,
                               double *acc, float *mb, float *rb) {
    const double cnt = (double)hw * cpg;
    /* Two passes (mean, then squared deviations) keep the variance accurate when the mean is
     * large against the spread. */
    memset(acc, 0, sizeof(double) * (size_t)groups);
    for (int p = 0; p < hw; p++) gn_group_sums(xb + (size_t)p * c, groups, cpg, acc);
    for (int gi = 0; gi < groups; gi++) mb[gi] = (float)(acc[gi] / cnt);
    memset(acc, 0, sizeof(double) * (size_t)groups);
    for (int p = 0; p < hw; p++) gn_group_sq(xb + (size_t)p * c, mb, groups, cpg, acc);
    for (int gi = 0; gi < groups; gi++) rb[gi] = (float)(1.0 / sqrt(acc[gi] / cnt + eps));
}

/* gn_stats with cpg a compile-time constant where it is a usual one. Inlined, so that the
 * group sums compile inside each ISA clone of the callers rather than once for the baseline. */
GN_ALWAYS_INLINE void gn_stats_any(const float *xb, int hw, int c, int groups, int cpg, float eps,
                         double *acc, float *mb, float *rb) {
    switch (cpg) {
    case 1: gn_stats(xb, hw, c, groups, 1, eps, acc, mb, rb); break;
    case 2: gn_stats(xb, hw, c, groups, 2, eps, acc, mb, rb); break;
    case 4: gn_stats(xb, hw, c, groups, 4, eps, acc, mb, rb); break;
    case 8: gn_stats(xb, hw, c, groups, 8, eps, acc, mb, rb); break;
    default: gn_stats(xb, hw, c, groups, cpg, eps, acc, mb, rb); break;
    }
}

GN_ALWAYS_INLINE void gn_dot_any(const float *u, const float *w, int groups, int cpg, double *acc,
                       double *acc2) {
    switch (cpg) {
    case 1: gn_group_dot(u, w, groups, 1, acc, acc2); break;
    case 2: gn_group_dot(u, w, groups, 2, acc, acc2); break;
    case 4: gn_group_dot(u, w, groups, 4, acc, acc2); break;
    case 8: gn_group_dot(u, w, groups, 8, acc, acc2); break;
    default: gn_group_dot(u, w, groups, cpg, acc, acc2); break;
    }
}

/* Each channel's copy of its group's value. */
static void gn_spread(const float *g, int groups, int cpg, float *c) {
    for (int gi = 0; gi < groups; gi++)
        for (int k = 0; k < cpg; k++) c[gi * cpg + k] = g[gi];
}

/* groupnorm, then max(., 0) on each output when relu (the ReLU that follows, in one pass). */
GN_ALWAYS_INLINE int gn_forward(const float *x, int n, int hw, int c, int groups, float eps,
                                const float *gamma, const float *beta, float *y, float *mean,
                                float *rstd, int relu) {
    const int cpg = c / groups;
    double *acc = malloc(sizeof(double) * (size_t)groups);
    float *mc = malloc(sizeof(float) * (size_t)2 * c);
    if (!acc || !mc) {
        free(acc);
        free(mc);
        return hs__err(HS_ENOMEM, "groupnorm: out of memory for %d channels", c);
    }
    float *rc = mc + c;
    for (int b = 0; b < n; b++) {
        const float *xb = x + (size_t)b * hw * c;
        float *yb = y + (size_t)b * hw * c;
        float *mb = mean + (size_t)b * groups, *rb = rstd + (size_t)b * groups;
        gn_stats_any(xb, hw, c, groups, cpg, eps, acc, mb, rb);
        gn_spread(mb, groups, cpg, mc);
        gn_spread(rb, groups, cpg, rc);
        for (int p = 0; p < hw; p++) {
            const float *restrict xp = xb + (size_t)p * c;
            float *restrict yp = yb + (size_t)p * c;
            if (relu)
                for (int ch = 0; ch < c; ch++)
                    yp[ch] = hs_ew_relu(hs_ew_gn(xp[ch], mc[ch], rc[ch], gamma[ch], beta[ch]));
            else
                for (int ch = 0; ch < c; ch++)
                    yp[ch] = hs_ew_gn(xp[ch], mc[ch], rc[ch], gamma[ch], beta[ch]);
        }
    }
    free(acc);
    free(mc);
    return 0;
}

HS_VECTOR_CLONES
int hs__cpu_groupnorm(hs_backend *be, const float *x, int n, int hw, int c, int groups, float eps,
                      const float *gamma, const float *beta, float *y, float *mean, float *rstd) {
    (void)be;
    return gn_forward(x, n, hw, c, groups, eps, gamma, beta, y, mean, rstd, 0);
}

HS_VECTOR_CLONES
int hs__cpu_groupnorm_relu(hs_backend *be, const float *x, int n, int hw, int c, int groups,
                           float eps, const float *gamma, const float *beta, float *y,
                           float *mean, float *rstd) {
    (void)be;
    return gn_forward(x, n, hw, c, groups, eps, gamma, beta, y, mean, rstd, 1);
}

HS_VECTOR_CLONES
int hs__cpu_groupnorm_grad(hs_backend *be, const float *dy, const float *x, int n, int hw, int c,
                           int groups, const float *gamma, const float *mean, const float *rstd,
                           float *dx, float *dgamma, float *dbeta) {
    (void)be;
    const int cpg = c / groups;
    double *acc = calloc((size_t)2 * groups + (size_t)2 * c, sizeof(double));
    float *tmp = malloc(sizeof(float) * (size_t)6 * c);
    if (!acc || !tmp) {
        free(acc);
        free(tmp);
        return hs__err(HS_ENOMEM, "groupnorm: out of memory for %d channels", c);
    }
    double *s1 = acc, *s2 = acc + groups, *dg = acc + 2 * groups, *dbt = dg + c;
    /* Per channel: the group's mean, rstd, and the two gradient means; a pixel's g and xhat. */
    float *mc = tmp, *rc = mc + c, *m1c = rc + c, *m2c = m1c + c, *gp = m2c + c, *xh = gp + c;
    const double cnt = (double)hw * cpg;
    for (int b = 0; b < n; b++) {
        const float *xb = x + (size_t)b * hw * c, *dyb = dy + (size_t)b * hw * c;
        float *dxb = dx + (size_t)b * hw * c;
        gn_spread(mean + (size_t)b * groups, groups, cpg, mc);
        gn_spread(rstd + (size_t)b * groups, groups, cpg, rc);
        memset(s1, 0, sizeof(double) * (size_t)2 * groups);
        for (int p = 0; p < hw; p++) {
            const float *restrict xp = xb + (size_t)p * c, *restrict dp = dyb + (size_t)p * c;
            for (int ch = 0; ch < c; ch++) {
                float xhat = (xp[ch] - mc[ch]) * rc[ch];
                xh[ch] = xhat;
                gp[ch] = dp[ch] * gamma[ch];
                dg[ch] += (double)dp[ch] * xhat;
                dbt[ch] += dp[ch];
            }
            gn_dot_any(gp, xh, groups, cpg, s1, s2);
        }
        for (int gi = 0; gi < groups; gi++) {
            float m1 = (float)(s1[gi] / cnt), m2 = (float)(s2[gi] / cnt);
            for (int k = 0; k < cpg; k++) {
                m1c[gi * cpg + k] = m1;
                m2c[gi * cpg + k] = m2;
            }
        }
        for (int p = 0; p < hw; p++) {
            const float *restrict xp = xb + (size_t)p * c, *restrict dp = dyb + (size_t)p * c;
            float *restrict dxp = dxb + (size_t)p * c;
            for (int ch = 0; ch < c; ch++) {
                float xhat = (xp[ch] - mc[ch]) * rc[ch];
                dxp[ch] = hs_ew_gn_grad(dp[ch] * gamma[ch], xhat, rc[ch], m1c[ch], m2c[ch]);
            }
        }
    }
    for (int ch = 0; ch < c; ch++) {
        dgamma[ch] = (float)dg[ch];
        dbeta[ch] = (float)dbt[ch];
    }
    free(acc);
    free(tmp);
    return 0;
}


/* One output pixel of shortcut_sum: yo = ao + xi over the first c channels, ao beyond. */
static inline void sum_pixel(float *yo, const float *ao, const float *restrict xi, int c, int oc,
                             int relu) {
    if (relu) {
        for (int ch = 0; ch < c; ch++) yo[ch] = hs_ew_relu(ao[ch] + xi[ch]);
        for (int ch = c; ch < oc; ch++) yo[ch] = hs_ew_relu(ao[ch]);
    } else {
        for (int ch = 0; ch < c; ch++) yo[ch] = ao[ch] + xi[ch];
        for (int ch = c; ch < oc; ch++) yo[ch] = ao[ch];
    }
}

HS_VECTOR_CLONES
int hs__cpu_shortcut_sum(hs_backend *be, float *y, const float *a, const float *x,
                         const hs_shortcut_geom *s, int n, int relu) {
    (void)be;
    for (int b = 0; b < n; b++)
        for (int i = 0; i < s->oh; i++)
            for (int j = 0; j < s->ow; j++) {
                size_t o = (((size_t)b * s->oh + i) * s->ow + j) * s->oc;
                const float *xi = x + (((size_t)b * s->h + (size_t)i * s->stride) * s->w +
                                       (size_t)j * s->stride) * s->c;
                sum_pixel(y + o, a + o, xi, s->c, s->oc, relu);
            }
    return 0;
}

/* y += the shortcut of x: shortcut_sum with y as its own a (the same additions). */
int hs__cpu_shortcut_add(hs_backend *be, float *y, const float *x, const hs_shortcut_geom *s,
                         int n) {
    return hs__cpu_shortcut_sum(be, y, y, x, s, n, 0);
}

int hs__cpu_shortcut_grad(hs_backend *be, float *dx, const float *dy, const hs_shortcut_geom *s,
                          int n) {
    (void)be;
    memset(dx, 0, sizeof(float) * (size_t)n * s->h * s->w * s->c);
    for (int b = 0; b < n; b++)
        for (int i = 0; i < s->oh; i++)
            for (int j = 0; j < s->ow; j++) {
                const float *dyo = dy + (((size_t)b * s->oh + i) * s->ow + j) * s->oc;
                float *dxi = dx + (((size_t)b * s->h + (size_t)i * s->stride) * s->w +
                                   (size_t)j * s->stride) * s->c;
                memcpy(dxi, dyo, sizeof(float) * (size_t)s->c);
            }
    return 0;
}
