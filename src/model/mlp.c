/* Multilayer perceptron over one flat parameter vector (and one flat gradient vector).
 * Forward: A_{l+1} = relu(A_l W_l^T + b_l), logits without relu. Backward by the chain rule
 * with two ping-pong buffers for dZ/dA. Every op goes through the backend table, so the same
 * code runs on the CPU and on CUDA. Single-threaded per model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/rng.h"
#include "hearsay/model.h"

struct hs_model {
    hs_backend *be;
    hs_mlp_cfg cfg;
    int max_batch;
    size_t nparams;
    float *params, *grads;              /* backend memory */
    size_t w_off[HS_MLP_MAX_LAYERS];    /* offsets of W_l and b_l in the flat vectors */
    size_t b_off[HS_MLP_MAX_LAYERS];
    float *act[HS_MLP_MAX_LAYERS + 1];  /* act[0] = input copy (unused on host backends) */
    float *dbuf[2];                     /* gradient ping-pong, max_batch * max width */
    int32_t *labels;                    /* device labels (unused on host backends) */
    int32_t *host_labels;               /* host scratch for evaluate() */
};

void hs_mlp_cfg_default(hs_mlp_cfg *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->n_layers = 3;
    cfg->width[0] = 784;
    cfg->width[1] = 256;
    cfg->width[2] = 128;
    cfg->width[3] = 10;
}

int hs_mlp_cfg_parse(hs_mlp_cfg *cfg, int n_in, const char *hidden, int n_out) {
    memset(cfg, 0, sizeof(*cfg));
    if (n_in <= 0 || n_out <= 0)
        return hs__err(HS_EINVAL, "model: input width %d and output width %d must be positive",
                       n_in, n_out);
    cfg->width[0] = n_in;
    int l = 0;
    if (hidden && *hidden && strcmp(hidden, "none") != 0) {
        const char *p = hidden;
        for (;;) {
            char *end;
            long w = strtol(p, &end, 10);
            if (end == p || (*end && *end != ','))
                return hs__err(HS_EINVAL, "--hidden '%s': '%.*s' is not a layer width", hidden,
                               (int)strcspn(p, ","), p);
            if (w <= 0 || w > 1 << 20)
                return hs__err(HS_EINVAL, "--hidden '%s': layer width %ld must be in 1..%d",
                               hidden, w, 1 << 20);
            if (l + 1 >= HS_MLP_MAX_LAYERS)
                return hs__err(HS_EINVAL, "--hidden '%s': at most %d hidden layers", hidden,
                               HS_MLP_MAX_LAYERS - 1);
            cfg->width[++l] = (int)w;
            if (!*end) break;
            p = end + 1;
        }
    }
    cfg->width[++l] = n_out;
    cfg->n_layers = l;
    return 0;
}

void hs_mlp_cfg_format(const hs_mlp_cfg *cfg, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "mlp:");
    for (int l = 0; l <= cfg->n_layers && o < len; l++)
        o += (size_t)snprintf(buf + o, len - o, l ? "-%d" : "%d", cfg->width[l]);
}

size_t hs_mlp_cfg_nparams(const hs_mlp_cfg *cfg) {
    size_t n = 0;
    for (int l = 0; l < cfg->n_layers; l++)
        n += (size_t)cfg->width[l + 1] * (size_t)cfg->width[l] + (size_t)cfg->width[l + 1];
    return n;
}

void hs_model_free(hs_model *m) {
    if (!m) return;
    hs_backend *be = m->be;
    hs_be_free(be, m->params);
    hs_be_free(be, m->grads);
    for (int l = 0; l <= HS_MLP_MAX_LAYERS; l++) hs_be_free(be, m->act[l]);
    hs_be_free(be, m->dbuf[0]);
    hs_be_free(be, m->dbuf[1]);
    hs_be_free(be, m->labels);
    free(m->host_labels);
    free(m);
}

int hs_model_new(hs_model **out, hs_backend *be, const hs_mlp_cfg *cfg, int max_batch) {
    if (cfg->n_layers < 1 || cfg->n_layers > HS_MLP_MAX_LAYERS)
        return hs__err(HS_EINVAL, "model: %d layers (expected 1..%d)", cfg->n_layers,
                       HS_MLP_MAX_LAYERS);
    for (int l = 0; l <= cfg->n_layers; l++)
        if (cfg->width[l] <= 0)
            return hs__err(HS_EINVAL, "model: layer %d has width %d", l, cfg->width[l]);
    if (max_batch <= 0) return hs__err(HS_EINVAL, "model: batch size %d", max_batch);
    hs_model *m = calloc(1, sizeof(*m));
    if (!m) return hs__err(HS_ENOMEM, "model: out of memory");
    m->be = be;
    m->cfg = *cfg;
    m->max_batch = max_batch;
    size_t off = 0;
    int maxw = 0;
    for (int l = 0; l < cfg->n_layers; l++) {
        m->w_off[l] = off;
        off += (size_t)cfg->width[l + 1] * (size_t)cfg->width[l];
        m->b_off[l] = off;
        off += (size_t)cfg->width[l + 1];
    }
    for (int l = 0; l <= cfg->n_layers; l++)
        if (cfg->width[l] > maxw) maxw = cfg->width[l];
    m->nparams = off;
    int err;
    if ((err = hs_be_alloc_f(be, off, &m->params)) < 0) goto fail;
    if ((err = hs_be_alloc_f(be, off, &m->grads)) < 0) goto fail;
    for (int l = be->host_memory ? 1 : 0; l <= cfg->n_layers; l++)
        if ((err = hs_be_alloc_f(be, (size_t)max_batch * cfg->width[l], &m->act[l])) < 0)
            goto fail;
    for (int i = 0; i < 2; i++)
        if ((err = hs_be_alloc_f(be, (size_t)max_batch * maxw, &m->dbuf[i])) < 0) goto fail;
    if (!be->host_memory &&
        (err = be->ops->alloc(be, sizeof(int32_t) * (size_t)max_batch, (void **)&m->labels)) < 0)
        goto fail;
    if (!(m->host_labels = malloc(sizeof(int32_t) * (size_t)max_batch))) {
        err = hs__err(HS_ENOMEM, "model: out of memory");
        goto fail;
    }
    *out = m;
    return 0;
fail:
    hs_model_free(m);
    return err;
}

int hs_model_init(hs_model *m, uint64_t seed) {
    float *h = malloc(sizeof(float) * m->nparams);
    if (!h) return hs__err(HS_ENOMEM, "model init: out of memory for %zu parameters", m->nparams);
    hs_rng r;
    hs_rng_init(&r, seed, HS_RNG_INIT, 0, 0);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        size_t nw = (size_t)m->cfg.width[l + 1] * m->cfg.width[l];
        double std = sqrt(2.0 / m->cfg.width[l]);
        for (size_t i = 0; i < nw; i++) h[m->w_off[l] + i] = (float)(std * hs_rng_normal(&r));
        memset(h + m->b_off[l], 0, sizeof(float) * (size_t)m->cfg.width[l + 1]);
    }
    int err = hs_be_upload(m->be, m->params, h, sizeof(float) * m->nparams);
    free(h);
    return err;
}

size_t hs_model_nparams(const hs_model *m) { return m->nparams; }
const hs_mlp_cfg *hs_model_cfg(const hs_model *m) { return &m->cfg; }
hs_backend *hs_model_backend(const hs_model *m) { return m->be; }
float *hs_model_params(hs_model *m) { return m->params; }
float *hs_model_grads(hs_model *m) { return m->grads; }

/* Places the batch where the backend can read it; returns the input and label pointers. */
static int stage_batch(hs_model *m, const float *x, const int32_t *y, int bs, const float **xin,
                       const int32_t **yin) {
    if (bs <= 0 || bs > m->max_batch)
        return hs__err(HS_EINVAL, "model: batch of %d examples (this model takes 1..%d)", bs,
                       m->max_batch);
    for (int i = 0; i < bs; i++)
        if (y[i] < 0 || y[i] >= m->cfg.width[m->cfg.n_layers])
            return hs__err(HS_EINVAL, "model: label %d of example %d is not in [0, %d)", y[i], i,
                           m->cfg.width[m->cfg.n_layers]);
    if (m->be->host_memory) {
        *xin = x;
        *yin = y;
        return 0;
    }
    int err = hs_be_upload(m->be, m->act[0], x, sizeof(float) * (size_t)bs * m->cfg.width[0]);
    if (err < 0) return err;
    if ((err = hs_be_upload(m->be, m->labels, y, sizeof(int32_t) * (size_t)bs)) < 0) return err;
    *xin = m->act[0];
    *yin = m->labels;
    return 0;
}

static int forward(hs_model *m, const float *xin, int bs) {
    hs_backend *be = m->be;
    const hs_backend_ops *o = be->ops;
    const float *a = xin;
    int err;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        int in = m->cfg.width[l], outw = m->cfg.width[l + 1];
        float *z = m->act[l + 1];
        if ((err = o->gemm(be, 0, 1, bs, outw, in, 1.0f, a, in, m->params + m->w_off[l], in, 0.0f,
                           z, outw)) < 0)
            return err;
        if ((err = o->bias_add(be, z, m->params + m->b_off[l], bs, outw)) < 0) return err;
        if (l + 1 < m->cfg.n_layers && (err = o->relu(be, z, z, (size_t)bs * outw)) < 0)
            return err;
        a = z;
    }
    return 0;
}

int hs_model_grad(hs_model *m, const float *x, const int32_t *y, int bs, hs_step_stats *st) {
    const float *xin;
    const int32_t *yin;
    int err = stage_batch(m, x, y, bs, &xin, &yin);
    if (err < 0) return err;
    if ((err = forward(m, xin, bs)) < 0) return err;
    hs_backend *be = m->be;
    const hs_backend_ops *o = be->ops;
    int L = m->cfg.n_layers;
    double loss = 0;
    int correct = 0;
    /* dZ of the last layer overwrites the logits in place. */
    float *dz = m->act[L];
    if ((err = o->softmax_xent(be, m->act[L], yin, bs, m->cfg.width[L], dz, 1.0f / (float)bs,
                               &loss, &correct)) < 0)
        return err;
    int cur = 0;
    for (int l = L - 1; l >= 0; l--) {
        int in = m->cfg.width[l], outw = m->cfg.width[l + 1];
        const float *a = l ? m->act[l] : xin;
        /* dW_l = dZ^T A_l;  db_l = column sums of dZ. */
        if ((err = o->gemm(be, 1, 0, outw, in, bs, 1.0f, dz, outw, a, in, 0.0f,
                           m->grads + m->w_off[l], in)) < 0)
            return err;
        if ((err = o->bias_grad(be, m->grads + m->b_off[l], dz, bs, outw)) < 0) return err;
        if (l == 0) break; /* no gradient for the input */
        /* dA_l = dZ W_l, then through the ReLU that produced A_l. */
        float *da = m->dbuf[cur];
        cur ^= 1;
        if ((err = o->gemm(be, 0, 0, bs, in, outw, 1.0f, dz, outw, m->params + m->w_off[l], in,
                           0.0f, da, in)) < 0)
            return err;
        if ((err = o->relu_grad(be, da, da, m->act[l], (size_t)bs * in)) < 0) return err;
        dz = da;
    }
    if (st) {
        st->loss = loss / bs;
        st->correct = correct;
        st->count = bs;
    }
    return 0;
}

int hs_model_eval_batch(hs_model *m, const float *x, const int32_t *y, int bs, hs_step_stats *st) {
    const float *xin;
    const int32_t *yin;
    int err = stage_batch(m, x, y, bs, &xin, &yin);
    if (err < 0) return err;
    if ((err = forward(m, xin, bs)) < 0) return err;
    int L = m->cfg.n_layers;
    double loss = 0;
    int correct = 0;
    if ((err = m->be->ops->softmax_xent(m->be, m->act[L], yin, bs, m->cfg.width[L], NULL, 0.0f,
                                        &loss, &correct)) < 0)
        return err;
    if (st) {
        st->loss = loss / bs;
        st->correct = correct;
        st->count = bs;
    }
    return 0;
}

int hs_model_evaluate(hs_model *m, const hs_dataset *ds, double *loss, double *accuracy) {
    if (ds->dim != m->cfg.width[0])
        return hs__err(HS_EINVAL, "evaluate: dataset %s has %d features, the model takes %d",
                       ds->name, ds->dim, m->cfg.width[0]);
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
