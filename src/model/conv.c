/* How a convolution runs on a host backend: which layers are lowered to im2col rows or to
 * im2row's kernel rows, how many examples are lowered at a time, and the GEMMs over them for
 * the forward pass, the weight gradient and the input gradient. */
#include <string.h>

#include "model/model_state.h"

static int is_conv_1x1(const hs_layer_spec *l) {
    return l->kernel == 1 && l->stride == 1 && l->pad == 0;
}

/* Whether conv layer i reads im2col rows (not a 1x1 convolution straight off NHWC). */
int hs__conv_needs_col(const hs_model *m, int i) {
    const hs_layer_spec *l = &m->spec.layer[i];
    return l->kind == HS_LAYER_CONV2D && !(is_conv_1x1(l) && !(i == 0 && m->spec.in_c > 1));
}

/* Whether conv layer i runs on this host backend as k GEMMs over im2row's kernel rows
 * (hs__conv_forward_host): stride 1 and an NHWC input. Its input gradient is then the
 * convolution of dY with the flipped kernel and padding k - 1 - pad (>= 0: the spec keeps pad
 * below k), k more GEMMs that write dx directly, in place of dcol = dY W (K = out, the shape
 * OpenBLAS is slowest at) and col2im's zeroing and scatter. */
int hs__conv_row_lowered(const hs_model *m, int i) {
    const hs_layer_spec *l = &m->spec.layer[i];
    return m->be->host_memory && m->be->ops->im2row && hs__conv_needs_col(m, i) &&
           l->stride == 1 && !(i == 0 && m->spec.in_c > 1);
}

/* Floats of lowered rows per example of conv layer i on a host backend: im2col's, or for a
 * row-lowered layer the larger of im2row's rows of its input and of dY. */
size_t hs__conv_col_floats(const hs_model *m, int i) {
    const hs__layer_shape *s = &m->sh[i];
    const int k = m->spec.layer[i].kernel;
    if (!hs__conv_row_lowered(m, i)) return hs__feat(s->oh * s->ow, k * k, s->ic);
    size_t fx = hs__feat(s->oh + k - 1, s->ow, k * s->ic);
    size_t fd = hs__feat(s->ih + k - 1, s->iw, k * s->oc);
    return fx > fd ? fx : fd;
}

/* Bytes of im2col rows a host backend builds at a time: small enough that the GEMM that
 * consumes them reads them from the cache (the rows of a whole batch, 778 MB for resnet20 at
 * batch 128, would go through memory twice per pass). */
#define COL_CHUNK_BYTES ((size_t)512 << 10)

/* Examples per chunk of conv layer i's rows: at least one. */
int hs__conv_col_chunk(const hs_model *m, int i) {
    size_t per = hs__conv_col_floats(m, i) * sizeof(float);
    return per >= COL_CHUNK_BYTES ? 1 : (int)(COL_CHUNK_BYTES / per);
}

/* y_b = sum over kh of rows_b[kh ow ..] wt_kh for one example of a row-lowered convolution:
 * rows_b holds (oh + k - 1) ow rows of kc floats (im2row), wt is the (k kc) x out kernel with
 * kernel row kh in rows kh kc .., y_b is oh ow x out. Not transposed, so that OpenBLAS takes
 * its small-matrix kernel for these shapes (about 110 GFLOPS here against 40 to 90 for
 * rows_b w_kh^T, measured alone). */
static int conv_rows_gemm(hs_backend *be, const float *rows_b, const float *wt, int k, int kc,
                          int oh, int ow, int out, float *y_b) {
    int err = 0;
    for (int kh = 0; kh < k && !err; kh++)
        err = be->ops->gemm(be, 0, 0, oh * ow, out, kc, 1.0f, rows_b + (size_t)kh * ow * kc, kc,
                            wt + (size_t)kh * kc * out, out, kh ? 1.0f : 0.0f, y_b, out);
    return err;
}

/* Y = A * W for conv layer i on a host backend, a chunk of examples at a time: im2col rows
 * and one GEMM (each output element the same dot product over K as in one GEMM over the
 * batch), or for a row-lowered layer im2row rows and k GEMMs per example against the
 * transposed kernel (conv_rows_gemm). */
int hs__conv_forward_host(hs_model *m, int i, const hs_conv_geom *gm, const float *a, float *y,
                          int bs) {
    hs_backend *be = m->be;
    const hs__layer_shape *s = &m->sh[i];
    const int out = m->spec.layer[i].out, rows = s->oh * s->ow, k = gm->k;
    const int K = k * k * s->ic, by_rows = hs__conv_row_lowered(m, i);
    const size_t in_f = hs__feat(s->ic, s->ih, s->iw);
    const size_t rx = hs__feat(s->oh + k - 1, s->ow, k * s->ic);
    const float *W = m->params + s->w_off;
    const int step = hs__conv_col_chunk(m, i);
    if (by_rows) /* wt[t][co] = W[co][t] (host memory) */
        for (int co = 0; co < out; co++)
            for (int t = 0; t < K; t++) m->wflip[(size_t)t * out + co] = W[(size_t)co * K + t];
    int err = 0;
    for (int b = 0; b < bs && !err; b += step) {
        int nb = bs - b < step ? bs - b : step;
        float *yb = y + (size_t)b * rows * out;
        if (!by_rows) {
            err = be->ops->im2col(be, a + (size_t)b * in_f, gm, nb, m->col);
            if (!err)
                err = be->ops->gemm(be, 0, 1, nb * rows, out, K, 1.0f, m->col, K, W, K, 0.0f, yb,
                                    out);
            continue;
        }
        err = be->ops->im2row(be, a + (size_t)b * in_f, gm, nb, m->col);
        for (int e = 0; e < nb && !err; e++)
            err = conv_rows_gemm(be, m->col + e * rx, m->wflip, k, k * s->ic, s->oh, s->ow, out,
                                 yb + (size_t)e * rows * out);
    }
    return err;
}

/* wt[kh][kw][co][ci] = w[co][k-1-kh][k-1-kw][ci]: the (k k out) x in kernel that maps dY to dx
 * by a stride-1 convolution with padding k - 1 - pad (host memory). */
static void flip_kernel(const float *w, int out, int k, int in, float *wt) {
    for (int kh = 0; kh < k; kh++)
        for (int kw = 0; kw < k; kw++)
            for (int co = 0; co < out; co++)
                memcpy(wt + (((size_t)kh * k + kw) * out + co) * in,
                       w + (((size_t)co * k + (k - 1 - kh)) * k + (k - 1 - kw)) * in,
                       sizeof(float) * (size_t)in);
}

/* The weight gradient and (if need_dx) the input gradient of conv layer i on a host backend,
 * a chunk of examples at a time, accumulating dW over the chunks in batch order.
 * im2col layers: the chunk's rows feed dW += dY_chunk^T col, then are overwritten by
 * dcol = dY_chunk W and scattered into dx by col2im while still in the cache.
 * Row-lowered layers: per example and kernel row kh, dW_kh += dY_b^T rows_b[kh ow ..]; then
 * dx_b is the row-lowered convolution of dY_b with the flipped kernel. */
int hs__conv_backward_host(hs_model *m, int i, const hs_conv_geom *gm, const float *a,
                           const float *g, int bs, int need_dx, float *dx) {
    hs_backend *be = m->be;
    const hs__layer_shape *s = &m->sh[i];
    const int out = m->spec.layer[i].out, rows = s->oh * s->ow, k = gm->k;
    const int K = k * k * s->ic, kc = k * s->ic, by_rows = hs__conv_row_lowered(m, i);
    const size_t in_f = hs__feat(s->ic, s->ih, s->iw), rx = hs__feat(s->oh + k - 1, s->ow, kc);
    const size_t rd = hs__feat(s->ih + k - 1, s->iw, k * out);
    const float *W = m->params + s->w_off;
    float *dW = m->grads + s->w_off;
    const int step = hs__conv_col_chunk(m, i);
    /* dY as the input of a convolution back to the input's shape. */
    hs_conv_geom gd = {out, s->oh, s->ow, k, 1, k - 1 - gm->pad, s->ih, s->iw, 0};
    if (by_rows && need_dx) flip_kernel(W, out, k, s->ic, m->wflip);
    int err = 0;
    for (int b = 0; b < bs && !err; b += step) {
        int nb = bs - b < step ? bs - b : step;
        const float *gb = g + (size_t)b * rows * out;
        float *dxb = dx + (size_t)b * in_f;
        if (!by_rows) {
            err = be->ops->im2col(be, a + (size_t)b * in_f, gm, nb, m->col);
            if (!err)
                err = be->ops->gemm(be, 1, 0, out, K, nb * rows, 1.0f, gb, out, m->col, K,
                                    b ? 1.0f : 0.0f, dW, K);
            if (!err && need_dx)
                err = be->ops->gemm(be, 0, 0, nb * rows, K, out, 1.0f, gb, out, W, K, 0.0f,
                                    m->col, K);
            if (!err && need_dx) err = be->ops->col2im(be, m->col, gm, nb, dxb);
            continue;
        }
        err = be->ops->im2row(be, a + (size_t)b * in_f, gm, nb, m->col);
        for (int e = 0; e < nb && !err; e++)
            for (int kh = 0; kh < k && !err; kh++)
                err = be->ops->gemm(be, 1, 0, out, kc, rows, 1.0f, gb + (size_t)e * rows * out,
                                    out, m->col + e * rx + (size_t)kh * s->ow * kc, kc,
                                    b + e ? 1.0f : 0.0f, dW + (size_t)kh * kc, K);
        if (err || !need_dx) continue;
        err = be->ops->im2row(be, gb, &gd, nb, m->col);
        for (int e = 0; e < nb && !err; e++)
            err = conv_rows_gemm(be, m->col + e * rd, m->wflip, k, k * out, s->ih, s->iw, s->ic,
                                 dxb + (size_t)e * in_f);
    }
    return err;
}
