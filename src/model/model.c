/* A model as a list of layers over one flat parameter vector and one flat gradient vector.
 * Forward keeps every layer's output (NHWC) for the backward pass, which walks the list in
 * reverse with two ping-pong gradient buffers plus one for a residual shortcut's branch. Every
 * op goes through the backend table, so the same code runs on any backend that has the ops.
 * For an MLP the ops and their order are exactly those of the original MLP code, so results
 * are bit-identical.
 * Lanes: on the CPU backend with --threads T > 1 a batch splits into T contiguous parts, each
 * run (forward, loss, backward) by a lane of the backend's pool on sub-models of its own that
 * read this model's parameters and write their own activations and gradients; the gradients
 * are then summed in lane order, so a result depends on T but never on the threads' timing.
 * The caller's thread runs lane 0 on this model itself. A model is used by one thread at a
 * time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/pool.h"
#include "core/rng.h"
#include "model/devshard.h"
#include "model/model_state.h"
#include "tensor/backend_internal.h"
#include "tensor/ew.h"

void hs_model_free(hs_model *m) {
    if (!m) return;
    hs_backend *be = m->be;
    for (int k = 1; m->lane && k < m->lanes; k++) hs_model_free(m->lane[k]);
    free(m->lane);
    free(m->part);
    if (!m->borrowed_params) hs_be_free(be, m->params);
    hs_be_free(be, m->grads);
    for (int i = 0; i < HS_MODEL_MAX_LAYERS; i++) {
        hs_be_free(be, m->buf[i]);
        hs_be_free(be, m->arg[i]);
        hs_be_free(be, m->mean[i]);
        hs_be_free(be, m->rstd[i]);
        hs_be_free(be, m->lcol[i]);
    }
    hs_be_free(be, m->d[0]);
    hs_be_free(be, m->d[1]);
    hs_be_free(be, m->skip);
    hs_be_free(be, m->col);
    hs_be_free(be, m->wflip);
    hs_be_free(be, m->input);
    hs_be_free(be, m->labels);
    free(m->host_x);
    free(m->host_labels);
    free(m);
}

/* The backend ops a layer kind needs, so that a backend without them is refused up front. */
static int check_ops(const hs_backend *be, hs_layer_kind k) {
    const hs_backend_ops *o = be->ops;
    int ok = 1;
    switch (k) {
    case HS_LAYER_LINEAR: ok = o->gemm && o->bias_add && o->bias_grad; break;
    case HS_LAYER_CONV2D: ok = o->gemm && o->im2col && o->col2im && o->bias_add && o->bias_grad; break;
    case HS_LAYER_MAXPOOL: ok = o->maxpool && o->maxpool_grad; break;
    case HS_LAYER_AVGPOOL: ok = o->avgpool && o->avgpool_grad; break;
    case HS_LAYER_RELU: ok = o->relu && o->relu_grad; break;
    case HS_LAYER_GROUPNORM: ok = o->groupnorm && o->groupnorm_grad; break;
    case HS_LAYER_RESIDUAL_ADD: ok = o->shortcut_add && o->shortcut_grad && o->axpy; break;
    default: break;
    }
    if (!ok)
        return hs__err(HS_ENOTSUP, "--device %s: %s is not implemented on this backend yet",
                       o->name, hs_layer_kind_name(k));
    return 0;
}

/* Memory for keeping every convolution's im2col rows from forward to backward (saving the
 * second im2col); above it, the rows are built again in the backward pass. */
#define KEEP_COL_BYTES ((size_t)256 << 20)

static hs_conv_geom geom(const hs_layer_spec *l, const hs__layer_shape *s) {
    hs_conv_geom g = {s->ic, s->ih, s->iw, l->kernel, l->stride, l->pad, s->oh, s->ow, 0};
    return g;
}

/* Decides which layers write their own buffer: a ReLU works in place on its input unless that
 * is the model's input (borrowed) or a tensor a residual layer keeps for its add. */
static void plan_buffers(hs_model *m, int *own) {
    const hs_model_spec *s = &m->spec;
    m->owner[0] = -1;
    int kept = -2; /* owner of the tensor an open residual keeps */
    for (int i = 0; i < s->n_layers; i++) {
        hs_layer_kind k = s->layer[i].kind;
        int in = m->owner[i];
        own[i] = 0;
        if (k == HS_LAYER_FLATTEN || k == HS_LAYER_RESIDUAL) {
            if (k == HS_LAYER_RESIDUAL) kept = in;
            m->owner[i + 1] = in;
            continue;
        }
        if (k == HS_LAYER_RELU && in >= 0 && in != kept) {
            m->owner[i + 1] = in;
            continue;
        }
        if (k == HS_LAYER_RESIDUAL_ADD) kept = -2;
        own[i] = 1;
        m->owner[i + 1] = i;
    }
}

/* A model taking up to max_batch examples whose per-example buffers hold lane_batch of them
 * (a lane's share); params borrows a parent's parameter vector when non-NULL. */
static int build(hs_model **out, hs_backend *be, const hs_model_spec *spec, int max_batch,
                 int lane_batch, float *params) {
    hs_model *m = calloc(1, sizeof(*m));
    if (!m) return hs__err(HS_ENOMEM, "model: out of memory");
    m->be = be;
    m->spec = *spec;
    m->max_batch = max_batch;
    m->lanes = 1;
    int err;
    if ((err = hs__model_spec_resolve(spec, m->sh, &m->nparams)) < 0) goto fail;
    const int L = spec->n_layers;
    /* maxcol: the floats of the largest rows buffer (a chunk of them on a host backend). */
    size_t maxf = hs__feat(spec->in_c, spec->in_h, spec->in_w), maxcol = 0, keep = 0, maxw = 0;
    m->first_param = L;
    int spatial = 0;
    for (int i = 0; i < L; i++) {
        const hs_layer_spec *l = &spec->layer[i];
        const hs__layer_shape *s = &m->sh[i];
        if ((err = check_ops(be, l->kind)) < 0) goto fail;
        if (s->nw + s->nb && m->first_param == L) m->first_param = i;
        size_t of = hs__feat(s->oc, s->oh, s->ow);
        if (of > maxf) maxf = of;
        if (hs__conv_needs_col(m, i)) {
            size_t cs = hs__feat(s->oh * s->ow, l->kernel * l->kernel, s->ic);
            keep += cs;
            if (hs__conv_row_lowered(m, i) && s->nw > maxw) maxw = s->nw;
            if (be->host_memory) {
                int step = hs__conv_col_chunk(m, i);
                cs = hs__conv_col_floats(m, i) * (size_t)(step < lane_batch ? step : lane_batch);
            } else {
                cs *= (size_t)lane_batch;
            }
            if (cs > maxcol) maxcol = cs;
        }
        if (l->kind != HS_LAYER_LINEAR && l->kind != HS_LAYER_RELU &&
            l->kind != HS_LAYER_FLATTEN)
            spatial = 1;
    }
    if ((size_t)max_batch * maxf > INT32_MAX) {
        err = hs__err(HS_EINVAL, "model %s: batch %d of %zu features is too large", spec->name,
                      max_batch, maxf);
        goto fail;
    }
    /* A first conv2d reads NCHW itself; anything else spatial wants NHWC. */
    m->transpose_in = spatial && spec->in_c > 1 && spec->in_h * spec->in_w > 1 &&
                      spec->layer[0].kind != HS_LAYER_CONV2D;
    int own[HS_MODEL_MAX_LAYERS];
    plan_buffers(m, own);
    size_t mb = (size_t)lane_batch;
    m->borrowed_params = params != NULL;
    m->params = params;
    if ((!params && (err = hs_be_alloc_f(be, m->nparams, &m->params)) < 0) ||
        (err = hs_be_alloc_f(be, m->nparams, &m->grads)) < 0)
        goto fail;
    for (int i = 0; i < L; i++) {
        const hs__layer_shape *s = &m->sh[i];
        const hs_layer_spec *l = &spec->layer[i];
        if (own[i] && (err = hs_be_alloc_f(be, mb * hs__feat(s->oc, s->oh, s->ow), &m->buf[i])) < 0)
            goto fail;
        if (l->kind == HS_LAYER_MAXPOOL &&
            (err = be->ops->alloc(be, sizeof(int32_t) * mb * hs__feat(s->oc, s->oh, s->ow),
                                  (void **)&m->arg[i])) < 0)
            goto fail;
        if (l->kind == HS_LAYER_GROUPNORM &&
            ((err = hs_be_alloc_f(be, mb * (size_t)l->groups, &m->mean[i])) < 0 ||
             (err = hs_be_alloc_f(be, mb * (size_t)l->groups, &m->rstd[i])) < 0))
            goto fail;
    }
    /* Host backends build rows chunk by chunk instead (cheaper than keeping them). */
    int keep_cols = !be->host_memory && keep * mb * sizeof(float) <= KEEP_COL_BYTES;
    for (int i = 0; keep_cols && i < L; i++) {
        const hs__layer_shape *s = &m->sh[i];
        const hs_layer_spec *l = &spec->layer[i];
        if (hs__conv_needs_col(m, i) &&
            (err = hs_be_alloc_f(be, mb * hs__feat(s->oh * s->ow, l->kernel * l->kernel, s->ic),
                                 &m->lcol[i])) < 0)
            goto fail;
    }
    if (keep_cols) maxcol = 0;
    if ((err = hs_be_alloc_f(be, mb * maxf, &m->d[0])) < 0 ||
        (err = hs_be_alloc_f(be, mb * maxf, &m->d[1])) < 0 ||
        (err = hs_be_alloc_f(be, mb * maxf, &m->skip)) < 0 ||
        (maxcol && (err = hs_be_alloc_f(be, maxcol, &m->col)) < 0) ||
        (maxw && (err = hs_be_alloc_f(be, maxw, &m->wflip)) < 0))
        goto fail;
    size_t in_f = hs__feat(spec->in_c, spec->in_h, spec->in_w);
    if (!be->host_memory && (err = hs_be_alloc_f(be, mb * in_f, &m->input)) < 0) goto fail;
    if (m->transpose_in && !(m->host_x = malloc(sizeof(float) * mb * in_f))) {
        err = hs__err(HS_ENOMEM, "model: out of memory");
        goto fail;
    }
    if (!be->host_memory &&
        (err = be->ops->alloc(be, sizeof(int32_t) * mb, (void **)&m->labels)) < 0)
        goto fail;
    if (!params && !(m->host_labels = malloc(sizeof(int32_t) * (size_t)max_batch))) {
        err = hs__err(HS_ENOMEM, "model: out of memory");
        goto fail;
    }
    *out = m;
    return 0;
fail:
    hs_model_free(m);
    return err;
}

int hs_model_new_spec(hs_model **out, hs_backend *be, const hs_model_spec *spec, int max_batch) {
    if (max_batch <= 0 || max_batch > 65536)
        return hs__err(HS_EINVAL, "model: batch size %d (expected 1..65536)", max_batch);
    hs__pool *pool = hs__cpu_pool(be);
    int lanes = pool ? hs__pool_lanes(pool) : 1;
    if (lanes > max_batch) lanes = max_batch; /* a lane past the batch never has an example */
    const int lb = (max_batch + lanes - 1) / lanes;
    hs_model *m = NULL;
    int err = build(&m, be, spec, max_batch, lb, NULL);
    if (err < 0 || lanes == 1) goto done;
    m->pool = pool;
    m->lanes = lanes;
    if (!(m->lane = calloc((size_t)lanes, sizeof(*m->lane))) ||
        !(m->part = calloc((size_t)lanes, sizeof(*m->part)))) {
        err = hs__err(HS_ENOMEM, "model: out of memory");
        goto done;
    }
    for (int k = 1; k < lanes && err >= 0; k++)
        err = build(&m->lane[k], be, spec, lb, lb, m->params);
done:
    if (err < 0) {
        hs_model_free(m);
        return err;
    }
    *out = m;
    return 0;
}

int hs_model_init(hs_model *m, uint64_t seed) {
    float *h = calloc(m->nparams ? m->nparams : 1, sizeof(float));
    if (!h) return hs__err(HS_ENOMEM, "model init: out of memory for %zu parameters", m->nparams);
    hs_rng r;
    hs__rng_init(&r, seed, HS_RNG_INIT, 0, 0);
    for (int i = 0; i < m->spec.n_layers; i++) {
        const hs__layer_shape *s = &m->sh[i];
        hs_layer_kind k = m->spec.layer[i].kind;
        if (k == HS_LAYER_GROUPNORM) {
            for (size_t j = 0; j < s->nw; j++) h[s->w_off + j] = 1.0f;
        } else if (s->nw) {
            /* Biases stay zero (calloc). */
            double std = sqrt(2.0 / (double)(s->nw / (size_t)s->oc));
            for (size_t j = 0; j < s->nw; j++) h[s->w_off + j] = (float)(std * hs__rng_normal(&r));
        }
    }
    int err = hs_be_upload(m->be, m->params, h, sizeof(float) * m->nparams);
    free(h);
    return err;
}

size_t hs_model_nparams(const hs_model *m) { return m->nparams; }
const hs_model_spec *hs_model_get_spec(const hs_model *m) { return &m->spec; }
hs_backend *hs_model_backend(const hs_model *m) { return m->be; }
float *hs_model_params(hs_model *m) { return m->params; }
float *hs_model_grads(hs_model *m) { return m->grads; }

/* Refuses a batch this model cannot take, before it is split into lanes (so that a message
 * names an example by its place in the whole batch). */
static int check_batch(const hs_model *m, const int32_t *y, int bs) {
    if (bs <= 0 || bs > m->max_batch)
        return hs__err(HS_EINVAL, "model: batch of %d examples (this model takes 1..%d)", bs,
                       m->max_batch);
    for (int i = 0; y && i < bs; i++)
        if (y[i] < 0 || y[i] >= m->spec.classes)
            return hs__err(HS_EINVAL, "model: label %d of example %d is not in [0, %d)", y[i], i,
                           m->spec.classes);
    return 0;
}

/* Places a checked batch where the backend can read it, NHWC where the model wants it;
 * returns the label pointer. */
static int stage_batch(hs_model *m, const float *x, const int32_t *y, int bs,
                       const int32_t **yin) {
    const int c = m->spec.in_c, hw = m->spec.in_h * m->spec.in_w;
    const size_t in_f = (size_t)c * hw;
    if (m->transpose_in) {
        for (int b = 0; b < bs; b++)
            for (int ch = 0; ch < c; ch++)
                for (int p = 0; p < hw; p++)
                    m->host_x[(size_t)b * in_f + (size_t)p * c + ch] =
                        x[(size_t)b * in_f + (size_t)ch * hw + p];
        x = m->host_x;
    }
    if (m->be->host_memory) {
        m->act[0] = (float *)(uintptr_t)x; /* read only: no layer writes its input */
        *yin = y;
        return 0;
    }
    int err = hs_be_upload(m->be, m->input, x, sizeof(float) * (size_t)bs * in_f);
    if (err < 0) return err;
    if ((err = hs_be_upload(m->be, m->labels, y, sizeof(int32_t) * (size_t)bs)) < 0) return err;
    m->act[0] = m->input;
    *yin = m->labels;
    return 0;
}

/* Whether layer i is a ReLU in place on the output of layer i - 1 that layer i - 1 rectifies
 * itself with a fused op (groupnorm_relu, shortcut_sum): its forward is then nothing, and its
 * backward reads the same rectified tensor. */
static int relu_fused(const hs_model *m, int i) {
    if (i <= 0 || i >= m->spec.n_layers || m->spec.layer[i].kind != HS_LAYER_RELU ||
        m->owner[i + 1] != m->owner[i] || m->owner[i] != i - 1)
        return 0;
    const hs_backend_ops *o = m->be->ops;
    hs_layer_kind k = m->spec.layer[i - 1].kind;
    return (k == HS_LAYER_GROUPNORM && o->groupnorm_relu) ||
           (k == HS_LAYER_RESIDUAL_ADD && o->shortcut_sum);
}

/* Whether the backward pass of the fused ReLU at layer i folds into its GroupNorm's gradient
 * (groupnorm_relu_grad): layer i's backward is then nothing. */
static int relu_grad_fused(const hs_model *m, int i) {
    return relu_fused(m, i) && m->spec.layer[i - 1].kind == HS_LAYER_GROUPNORM &&
           m->be->ops->groupnorm_relu_grad;
}

static int forward(hs_model *m, int bs) {
    hs_backend *be = m->be;
    const hs_backend_ops *o = be->ops;
    float *P = m->params;
    int err = 0;
    for (int i = 0; i < m->spec.n_layers && !err; i++) {
        const hs_layer_spec *l = &m->spec.layer[i];
        const hs__layer_shape *s = &m->sh[i];
        float *a = m->act[i];
        float *y = m->owner[i + 1] < 0 ? a : m->buf[m->owner[i + 1]];
        m->act[i + 1] = y;
        size_t in_f = hs__feat(s->ic, s->ih, s->iw), out_f = hs__feat(s->oc, s->oh, s->ow);
        switch (l->kind) {
        case HS_LAYER_LINEAR:
            err = o->gemm(be, 0, 1, bs, l->out, (int)in_f, 1.0f, a, (int)in_f, P + s->w_off,
                          (int)in_f, 0.0f, y, l->out);
            if (!err && s->nb) err = o->bias_add(be, y, P + s->b_off, bs, l->out);
            break;
        case HS_LAYER_CONV2D: {
            hs_conv_geom g = geom(l, s);
            g.chw_input = i == 0 && m->spec.in_c > 1;
            int M = bs * s->oh * s->ow, K = l->kernel * l->kernel * s->ic;
            const float *col = a;
            if (hs__conv_needs_col(m, i) && be->host_memory) {
                err = hs__conv_forward_host(m, i, &g, a, y, bs);
                if (!err && s->nb) err = o->bias_add(be, y, P + s->b_off, M, l->out);
                break;
            }
            if (hs__conv_needs_col(m, i)) {
                float *c = m->lcol[i] ? m->lcol[i] : m->col;
                err = o->im2col(be, a, &g, bs, c);
                col = c;
            }
            if (!err)
                err = o->gemm(be, 0, 1, M, l->out, K, 1.0f, col, K, P + s->w_off, K, 0.0f, y,
                              l->out);
            if (!err && s->nb) err = o->bias_add(be, y, P + s->b_off, M, l->out);
            break;
        }
        case HS_LAYER_MAXPOOL: {
            hs_conv_geom g = geom(l, s);
            err = o->maxpool(be, a, &g, bs, y, m->arg[i]);
            break;
        }
        case HS_LAYER_AVGPOOL: err = o->avgpool(be, a, bs, s->ih * s->iw, s->ic, y); break;
        case HS_LAYER_RELU:
            if (!relu_fused(m, i)) err = o->relu(be, y, a, (size_t)bs * out_f);
            break;
        case HS_LAYER_GROUPNORM:
            err = (relu_fused(m, i + 1) ? o->groupnorm_relu : o->groupnorm)(
                be, a, bs, s->ih * s->iw, s->ic, l->groups, HS_GROUPNORM_EPS, P + s->w_off,
                P + s->b_off, y, m->mean[i], m->rstd[i]);
            break;
        case HS_LAYER_FLATTEN:
        case HS_LAYER_RESIDUAL: break;
        case HS_LAYER_RESIDUAL_ADD: {
            const hs__layer_shape *r = &m->sh[s->res_from];
            hs_shortcut_geom sg = {r->ic, r->ih, r->iw, s->oc, s->oh, s->ow, s->res_stride};
            if (o->shortcut_sum) {
                err = o->shortcut_sum(be, y, a, m->act[s->res_from], &sg, bs,
                                      relu_fused(m, i + 1));
                break;
            }
            err = hs_be_copy_f(be, y, a, (size_t)bs * out_f);
            if (!err) err = o->shortcut_add(be, y, m->act[s->res_from], &sg, bs);
            break;
        }
        }
    }
    return err;
}

static int backward(hs_model *m, float *g, int bs) {
    hs_backend *be = m->be;
    const hs_backend_ops *o = be->ops;
    float *P = m->params, *G = m->grads;
    int err = 0;
    for (int i = m->spec.n_layers - 1; i >= m->first_param && !err; i--) {
        const hs_layer_spec *l = &m->spec.layer[i];
        const hs__layer_shape *s = &m->sh[i];
        const int need_dx = i > m->first_param;
        float *a = m->act[i];
        float *dx = g == m->d[0] ? m->d[1] : m->d[0];
        size_t in_f = hs__feat(s->ic, s->ih, s->iw), out_f = hs__feat(s->oc, s->oh, s->ow);
        switch (l->kind) {
        case HS_LAYER_LINEAR:
            /* dW = dY^T A;  db = column sums of dY;  dA = dY W. */
            err = o->gemm(be, 1, 0, l->out, (int)in_f, bs, 1.0f, g, l->out, a, (int)in_f, 0.0f,
                          G + s->w_off, (int)in_f);
            if (!err && s->nb) err = o->bias_grad(be, G + s->b_off, g, bs, l->out);
            if (!err && need_dx)
                err = o->gemm(be, 0, 0, bs, (int)in_f, l->out, 1.0f, g, l->out, P + s->w_off,
                              (int)in_f, 0.0f, dx, (int)in_f);
            g = dx;
            break;
        case HS_LAYER_CONV2D: {
            hs_conv_geom gm = geom(l, s);
            gm.chw_input = i == 0 && m->spec.in_c > 1;
            int M = bs * s->oh * s->ow, K = l->kernel * l->kernel * s->ic;
            int direct = !hs__conv_needs_col(m, i);
            if (!direct && be->host_memory) {
                err = hs__conv_backward_host(m, i, &gm, a, g, bs, need_dx, dx);
                if (!err && s->nb) err = o->bias_grad(be, G + s->b_off, g, M, l->out);
                g = dx;
                break;
            }
            const float *col = a;
            float *cbuf = m->lcol[i] ? m->lcol[i] : m->col;
            if (!direct) {
                /* Rows kept from the forward pass, or built again. */
                if (!m->lcol[i]) err = o->im2col(be, a, &gm, bs, m->col);
                col = cbuf;
            }
            if (!err)
                err = o->gemm(be, 1, 0, l->out, K, M, 1.0f, g, l->out, col, K, 0.0f,
                              G + s->w_off, K);
            if (!err && s->nb) err = o->bias_grad(be, G + s->b_off, g, M, l->out);
            if (!err && need_dx) {
                /* dcol = dY W, written over the col rows (no longer needed) or, for a 1x1
                 * convolution, straight into dA. */
                err = o->gemm(be, 0, 0, M, K, l->out, 1.0f, g, l->out, P + s->w_off, K, 0.0f,
                              direct ? dx : cbuf, K);
                if (!err && !direct) err = o->col2im(be, cbuf, &gm, bs, dx);
            }
            g = dx;
            break;
        }
        case HS_LAYER_MAXPOOL: {
            hs_conv_geom gm = geom(l, s);
            err = o->maxpool_grad(be, g, m->arg[i], &gm, bs, dx);
            g = dx;
            break;
        }
        case HS_LAYER_AVGPOOL:
            err = o->avgpool_grad(be, g, bs, s->ih * s->iw, s->ic, dx);
            g = dx;
            break;
        case HS_LAYER_RELU:
            if (!relu_grad_fused(m, i))
                err = o->relu_grad(be, g, g, m->act[i + 1], (size_t)bs * out_f);
            break;
        case HS_LAYER_GROUPNORM:
            if (relu_grad_fused(m, i + 1))
                err = o->groupnorm_relu_grad(be, g, m->act[i + 2], a, bs, s->ih * s->iw, s->ic,
                                             l->groups, P + s->w_off, m->mean[i], m->rstd[i], dx,
                                             G + s->w_off, G + s->b_off);
            else
                err = o->groupnorm_grad(be, g, a, bs, s->ih * s->iw, s->ic, l->groups,
                                        P + s->w_off, m->mean[i], m->rstd[i], dx, G + s->w_off,
                                        G + s->b_off);
            g = dx;
            break;
        case HS_LAYER_FLATTEN: break;
        case HS_LAYER_RESIDUAL_ADD: {
            /* The main branch gets dY unchanged; the shortcut's share waits in skip until the
             * backward pass reaches the residual layer. */
            const hs__layer_shape *r = &m->sh[s->res_from];
            hs_shortcut_geom sg = {r->ic, r->ih, r->iw, s->oc, s->oh, s->ow, s->res_stride};
            err = o->shortcut_grad(be, m->skip, g, &sg, bs);
            break;
        }
        case HS_LAYER_RESIDUAL: err = o->axpy(be, g, m->skip, (size_t)bs * in_f, 1.0f); break;
        }
    }
    return err;
}

/* What one pass over a batch does: from host rows in the caller's layout (staged first) or
 * from rows already in backend memory in the model's layout (the device shard's); with or
 * without the backward pass. */
typedef struct pass {
    const float *x;
    const int32_t *y;
    int bs;        /* the whole batch: the loss gradient is scaled by 1 / bs */
    int staged;    /* x and y are backend memory laid out for the model */
    int train;     /* backward too */
    hs_xent_acc *acc; /* when set, the loss goes into this backend buffer, not to the caller */
} pass;

/* Forward, loss and (when training) backward on n examples of the pass from example off;
 * returns the summed loss and the correct count of those examples. */
static int run_part(hs_model *m, const pass *ps, int off, int n, double *loss, int *correct) {
    const size_t in_f = hs__feat(m->spec.in_c, m->spec.in_h, m->spec.in_w);
    const float *x = ps->x + (size_t)off * in_f;
    const int32_t *yin = ps->y + off;
    int err = 0;
    if (ps->staged) m->act[0] = (float *)(uintptr_t)x; /* read only: no layer writes it */
    else err = stage_batch(m, x, yin, n, &yin);
    if (err < 0 || (err = forward(m, n)) < 0) return err;
    /* The logits' gradient overwrites them in place. */
    float *logits = m->act[m->spec.n_layers];
    float scale = ps->train ? 1.0f / (float)ps->bs : 0.0f;
    float *dlogits = ps->train ? logits : NULL;
    if (ps->acc)
        err = m->be->ops->softmax_xent_acc(m->be, logits, yin, n, m->spec.classes, dlogits,
                                           scale, ps->acc);
    else
        err = m->be->ops->softmax_xent(m->be, logits, yin, n, m->spec.classes, dlogits, scale,
                                       loss, correct);
    if (err < 0) return err;
    return ps->train ? backward(m, logits, n) : 0;
}

typedef struct lane_job {
    hs_model *m; /* the parent */
    const pass *ps;
} lane_job;

/* Lane k's share: its slice of the batch on its own sub-model, the error with its message
 * kept for the caller (a worker's message is on the worker's thread). */
static void lane_run(void *arg, int k) {
    lane_job *j = arg;
    if (k >= j->m->lanes) return; /* the pool has more lanes than this model's batch */
    lane_part *pt = &j->m->part[k];
    pt->err = 0;
    pt->loss = 0;
    pt->correct = 0;
    if (!pt->n) return;
    int err = run_part(k ? j->m->lane[k] : j->m, j->ps, pt->off, pt->n, &pt->loss, &pt->correct);
    if (err < 0) {
        pt->err = err;
        snprintf(pt->msg, sizeof(pt->msg), "%s", hs_error_message());
    }
}

/* Pool lane k's slice of the gradient sum: every element still adds lane 1, 2, ... to lane 0's
 * in that order, so the bits do not depend on how the vector is sliced. */
static void lane_sum(void *arg, int k) {
    const hs_model *m = ((lane_job *)arg)->m;
    const size_t n = m->nparams, T = (size_t)hs__pool_lanes(m->pool);
    const size_t lo = n * (size_t)k / T, hi = n * ((size_t)k + 1) / T;
    for (int l = 1; l < m->lanes && m->part[l].n; l++) {
        const float *gl = m->lane[l]->grads;
        for (size_t i = lo; i < hi; i++) m->grads[i] += gl[i];
    }
}

/* One pass over a checked batch: whole on one lane, or split into contiguous parts (the first
 * bs % lanes parts one example longer) whose gradients are summed in lane order. */
static int run_pass(hs_model *m, const pass *ps, hs_step_stats *st) {
    double loss = 0;
    int correct = 0, err;
    if (m->lanes == 1 || ps->bs == 1) {
        if ((err = run_part(m, ps, 0, ps->bs, &loss, &correct)) < 0) return err;
    } else {
        const int base = ps->bs / m->lanes, rem = ps->bs % m->lanes;
        for (int k = 0, off = 0; k < m->lanes; k++) {
            m->part[k].off = off;
            m->part[k].n = base + (k < rem);
            off += m->part[k].n;
        }
        /* The lanes return their losses; the step is added to acc once, below. */
        pass lp = *ps;
        lp.acc = NULL;
        lane_job j = {m, &lp};
        hs__pool_run(m->pool, lane_run, &j);
        for (int k = 0; k < m->lanes; k++) {
            const lane_part *pt = &m->part[k];
            if (pt->err < 0)
                return hs__err(pt->err, "lane %d of %d (examples %d..%d of %d): %s", k,
                               m->lanes, pt->off, pt->off + pt->n - 1, ps->bs, pt->msg);
        }
        for (int k = 0; k < m->lanes && m->part[k].n; k++) {
            loss += m->part[k].loss;
            correct += m->part[k].correct;
        }
        /* Lane 0 always has an example, and wrote this model's gradients. */
        if (ps->train) hs__pool_run(m->pool, lane_sum, &j);
        /* Lanes run on host backends only, so acc is host memory. */
        if (ps->acc) hs_ew_xent_acc_add(ps->acc, loss / ps->bs, correct, ps->bs);
    }
    if (st) {
        st->loss = loss / ps->bs;
        st->correct = correct;
        st->count = ps->bs;
    }
    return 0;
}

int hs_model_grad(hs_model *m, const float *x, const int32_t *y, int bs, hs_step_stats *st) {
    int err = check_batch(m, y, bs);
    if (err < 0) return err;
    pass ps = {x, y, bs, 0, 1, NULL};
    return run_pass(m, &ps, st);
}

int hs__model_grad_acc(hs_model *m, const float *x, const int32_t *y, int bs, hs_xent_acc *acc) {
    int err = check_batch(m, y, bs);
    if (err < 0) return err;
    pass ps = {x, y, bs, 0, 1, acc};
    return run_pass(m, &ps, NULL);
}

int hs__model_grad_dev(hs_model *m, const float *x, const int32_t *y, int bs,
                       hs_xent_acc *acc) {
    int err = check_batch(m, NULL, bs);
    if (err < 0) return err;
    pass ps = {x, y, bs, 1, 1, acc};
    return run_pass(m, &ps, NULL);
}

int hs__model_input_nhwc(const hs_model *m) { return m->transpose_in; }

int hs_model_eval_batch(hs_model *m, const float *x, const int32_t *y, int bs, hs_step_stats *st) {
    int err = check_batch(m, y, bs);
    if (err < 0) return err;
    pass ps = {x, y, bs, 0, 0, NULL};
    return run_pass(m, &ps, st);
}
int hs_model_evaluate(hs_model *m, const hs_dataset *ds, double *loss, double *accuracy) {
    const hs_model_spec *s = &m->spec;
    int dim = s->in_c * s->in_h * s->in_w;
    if (ds->dim != dim)
        return hs__err(HS_EINVAL, "evaluate: dataset %s has %d features, the model takes %d",
                       ds->name, ds->dim, dim);
    if (ds->n == 0) return hs__err(HS_EINVAL, "evaluate: dataset %s is empty", ds->name);
    double lsum = 0;
    size_t ok = 0;
    for (size_t i = 0; i < ds->n; i += (size_t)m->max_batch) {
        int bs = (int)(ds->n - i < (size_t)m->max_batch ? ds->n - i : (size_t)m->max_batch);
        for (int j = 0; j < bs; j++) m->host_labels[j] = ds->y[i + j];
        hs_step_stats st;
        int err = hs_model_eval_batch(m, ds->x + i * (size_t)ds->dim, m->host_labels, bs, &st);
        if (err < 0) return err;
        lsum += st.loss * bs;
        ok += (size_t)st.correct;
    }
    if (loss) *loss = lsum / (double)ds->n;
    if (accuracy) *accuracy = (double)ok / (double)ds->n;
    return 0;
}
