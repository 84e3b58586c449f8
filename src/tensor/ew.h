/* Element-wise arithmetic shared by the CPU backend (C) and the CUDA kernels: each function
 * computes one element, and both backends call these same definitions, so the CPU tests check
 * the arithmetic the GPU runs. Every operation is written as separate IEEE multiplies and adds:
 * the C build uses -ffp-contract=off and the CUDA build --fmad=false, so no compiler fuses
 * them into FMAs and both produce the same bits. (Transcendentals are the exception: expf/logf
 * differ between glibc and CUDA in the last place, which only the softmax uses.) */
#ifndef HS_TENSOR_EW_H
#define HS_TENSOR_EW_H

#include <math.h>
#include <stdint.h>

#include "core/hd.h"
#include "hearsay/tensor.h"

/* Adds one softmax_xent_acc call (its mean loss, correct count and rows) to the running
 * totals, remembering the first non-finite mean; returns the call's number. The CPU op, the
 * CUDA kernel and the CPU's batch lanes (which add their combined step at once) keep the same
 * books through it. */
HS_HD static int64_t hs_ew_xent_acc_add(hs_xent_acc *acc, double mean, int64_t correct,
                                        int64_t rows) {
    int64_t call = acc->calls + 1;
    acc->calls = call;
    if (!isfinite(mean) && !acc->nonfinite_call) {
        acc->nonfinite_call = call;
        acc->nonfinite_loss = mean;
    }
    acc->loss += mean;
    acc->correct += correct;
    acc->rows += rows;
    return call;
}

HS_HD static float hs_ew_relu(float x) { return x > 0.0f ? x : 0.0f; }

/* Gradient through ReLU given its output y. */
HS_HD static float hs_ew_relu_grad(float dy, float y) { return y > 0.0f ? dy : 0.0f; }

HS_HD static float hs_ew_axpy(float y, float a, float x) { return y + a * x; }

HS_HD static float hs_ew_axpby(float y, float a, float x, float b) { return a * x + b * y; }

/* SGD with momentum and weight decay, PyTorch's convention (dampening 0):
 *   g' = g + wd * x;  v = mu * v + g';  d = nesterov ? g' + mu * v : v;  x -= lr * d.
 * With mu == 0 the velocity is not read or written (v may point anywhere). */
HS_HD static void hs_ew_sgd(float *x, float g, float *v, float lr, float mu, float wd,
                            int nesterov) {
    float gp = g + wd * *x;
    float d = gp;
    if (mu != 0.0f) {
        float nv = mu * *v + gp;
        *v = nv;
        d = nesterov ? gp + mu * nv : nv;
    }
    *x = *x - lr * d;
}

/* AdamW (Loshchilov & Hutter 2019) in PyTorch's order of operations, with the per-step scalars
 * from the host (decay = 1 - lr * wd, step_size = lr / (1 - b1^t), inv_sqrt_bc2 =
 * 1 / sqrt(1 - b2^t)):
 *   x *= decay;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *   x -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps).
 * sqrtf and the division are correctly rounded in C and in CUDA (by default), so both backends
 * give the same bits. */
HS_HD static void hs_ew_adamw(float *x, float g, float *m, float *v, float b1, float b2,
                              float eps, float decay, float step_size, float inv_sqrt_bc2) {
    float nm = b1 * *m + (1.0f - b1) * g;
    float nv = b2 * *v + (1.0f - b2) * (g * g);
    *m = nm;
    *v = nv;
    float denom = sqrtf(nv) * inv_sqrt_bc2 + eps;
    *x = *x * decay - step_size * (nm / denom);
}

/* Softmax cross-entropy pieces for one row, given the row's max m and
 * s = sum_j exp(z_j - m): the loss of label y and the gradient of element j. */
HS_HD static float hs_ew_xent_loss(float zy, float m, float s) { return logf(s) - (zy - m); }

HS_HD static float hs_ew_xent_grad(float zj, float m, float inv_s, int is_label, float scale) {
    float p = expf(zj - m) * inv_s;
    return (p - (is_label ? 1.0f : 0.0f)) * scale;
}

/* GroupNorm of one element given its group's mean and 1 / sqrt(var + eps), then the channel's
 * affine transform. */
HS_HD static float hs_ew_gn(float x, float mean, float rstd, float gamma, float beta) {
    return (x - mean) * rstd * gamma + beta;
}

/* GroupNorm's input gradient for one element: with g = dy * gamma, xhat the normalised input,
 * m1 the group's mean of g and m2 its mean of g * xhat: rstd (g - m1 - xhat m2). */
HS_HD static float hs_ew_gn_grad(float g, float xhat, float rstd, float m1, float m2) {
    return rstd * (g - m1 - xhat * m2);
}

/* Where gather (hearsay/tensor.h) takes element e of an output row (0 <= e < c h w, in the
 * output's layout) for an example cropped at (dy, dx) out of its image padded by g->pad, then
 * flipped horizontally when flip: the offset in the channel-major example, or -1 in the zero
 * border. dy = dx = g->pad and flip = 0 give the example unchanged. The same expressions as
 * hs_augment_apply (src/data/batch.c), which the host batcher runs. */
HS_HD static long hs_ew_gather_src(const hs_gather_geom *g, long e, int dy, int dx, int flip) {
    long hw = (long)g->h * g->w, ch, p;
    if (g->nhwc) {
        ch = e % g->c;
        p = e / g->c;
    } else {
        ch = e / hw;
        p = e % hw;
    }
    int i = (int)(p / g->w), j = (int)(p % g->w);
    int si = i + dy - g->pad, sj = (flip ? g->w - 1 - j : j) + dx - g->pad;
    if (si < 0 || si >= g->h || sj < 0 || sj >= g->w) return -1;
    return (ch * g->h + si) * g->w + sj;
}

#endif
