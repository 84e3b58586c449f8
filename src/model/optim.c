/* SGD with momentum, weight decay and a learning-rate schedule, and AdamW, over one flat vector.
 * The arithmetic is the backend's sgd_step (hs_ew_sgd) or adamw_step (hs_ew_adamw); this file
 * owns the state vectors and computes the per-step scalars. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "hearsay/model.h"

struct hs_optim {
    hs_backend *be;
    size_t n;
    hs_optim_cfg cfg;
    float *v; /* SGD: velocity, NULL without momentum; AdamW: second moment (backend memory) */
    float *m; /* AdamW: first moment */
    uint64_t t; /* AdamW: steps taken, for the bias correction */
    /* Quasi-global momentum: v holds mhat (the state that checkpoints and snapshots carry);
     * each step works on q = copy of mhat, which the backend's SGD step turns into
     * beta mhat + g, so the step and its Nesterov form are the backend's own arithmetic. */
    float *q;      /* backend memory, n floats (HYBRID: scratch of a device's round end) */
    float *x0;     /* host: x at the start of the round (QG) */
    float *dh;     /* host: the round's direction, for a backend without host memory */
    double lr_sum; /* learning rates of the steps since round_begin */
    /* Hybrid momentum: v is the heavy ball's velocity, mg the gossip's buffer (the second
     * state vector), xm x after the round's last local step; backend memory, n floats. */
    float *mg, *xm;
};

void hs_optim_cfg_default(hs_optim_cfg *c) {
    memset(c, 0, sizeof(*c));
    c->lr = 0.05f;
    c->momentum = 0.9f;
    c->weight_decay = 0.0f;
    c->nesterov = 0;
    c->sched = HS_LR_COSINE;
    c->warmup_steps = 0;
    c->total_steps = 0;
    c->step_size = 0;
    c->step_gamma = 0.1f;
    c->lr_min = 0.0f;
    c->kind = HS_OPTIM_SGD;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    c->eps = 1e-8f;
}

int hs_optim_kind_parse(const char *s, hs_optim_kind *out) {
    if (!strcmp(s, "sgd")) *out = HS_OPTIM_SGD;
    else if (!strcmp(s, "adamw")) *out = HS_OPTIM_ADAMW;
    else return hs__err(HS_EINVAL, "--optimizer '%s': expected sgd or adamw", s);
    return 0;
}

const char *hs_optim_kind_name(hs_optim_kind k) { return k == HS_OPTIM_ADAMW ? "adamw" : "sgd"; }

int hs_momentum_kind_parse(const char *s, hs_momentum_kind *out) {
    if (!strcmp(s, "local")) *out = HS_MOMENTUM_LOCAL;
    else if (!strcmp(s, "qg")) *out = HS_MOMENTUM_QG;
    else if (!strcmp(s, "hybrid")) *out = HS_MOMENTUM_HYBRID;
    else return hs__err(HS_EINVAL, "--momentum-kind '%s': expected local, qg or hybrid", s);
    return 0;
}

const char *hs_momentum_kind_name(hs_momentum_kind k) {
    return k == HS_MOMENTUM_QG ? "qg" : k == HS_MOMENTUM_HYBRID ? "hybrid" : "local";
}

int hs_lr_sched_parse(const char *s, hs_lr_sched *out) {
    if (!strcmp(s, "const") || !strcmp(s, "constant")) *out = HS_LR_CONST;
    else if (!strcmp(s, "cosine")) *out = HS_LR_COSINE;
    else if (!strcmp(s, "step")) *out = HS_LR_STEP;
    else return hs__err(HS_EINVAL, "--lr-schedule '%s': expected const, cosine or step", s);
    return 0;
}

float hs_optim_lr(const hs_optim_cfg *c, long t) {
    if (t < 0) t = 0;
    if (c->warmup_steps > 0 && t < c->warmup_steps)
        return c->lr * (float)(t + 1) / (float)c->warmup_steps;
    long s = t - c->warmup_steps;
    switch (c->sched) {
    case HS_LR_COSINE: {
        long T = c->total_steps - c->warmup_steps;
        if (T <= 0) return c->lr;
        double f = s >= T ? 1.0 : (double)s / (double)T;
        return (float)(c->lr_min + (c->lr - c->lr_min) * 0.5 * (1.0 + cos(M_PI * f)));
    }
    case HS_LR_STEP:
        if (c->step_size <= 0) return c->lr;
        return c->lr * powf(c->step_gamma, (float)(s / c->step_size));
    case HS_LR_CONST:
    default:
        return c->lr;
    }
}

int hs_optim_new(hs_optim **out, hs_backend *be, size_t n, const hs_optim_cfg *cfg) {
    if (!(cfg->lr >= 0.0f) || !isfinite(cfg->lr))
        return hs__err(HS_EINVAL, "--lr %g: must be a finite number >= 0", (double)cfg->lr);
    if (!(cfg->momentum >= 0.0f && cfg->momentum < 1.0f))
        return hs__err(HS_EINVAL, "--momentum %g: must be in [0, 1)", (double)cfg->momentum);
    if (!(cfg->weight_decay >= 0.0f) || !isfinite(cfg->weight_decay))
        return hs__err(HS_EINVAL, "--weight-decay %g: must be a finite number >= 0",
                       (double)cfg->weight_decay);
    int adamw = cfg->kind == HS_OPTIM_ADAMW;
    if (cfg->kind != HS_OPTIM_SGD && !adamw)
        return hs__err(HS_EINVAL, "optimizer: unknown kind %d", (int)cfg->kind);
    if (cfg->nesterov && (adamw || cfg->momentum == 0.0f))
        return hs__err(HS_EINVAL, "--nesterov needs --optimizer sgd and --momentum > 0");
    if (cfg->momentum_kind != HS_MOMENTUM_LOCAL && cfg->momentum_kind != HS_MOMENTUM_QG &&
        cfg->momentum_kind != HS_MOMENTUM_HYBRID)
        return hs__err(HS_EINVAL, "optimizer: unknown momentum kind %d", (int)cfg->momentum_kind);
    int qg = cfg->momentum_kind == HS_MOMENTUM_QG, hyb = cfg->momentum_kind == HS_MOMENTUM_HYBRID;
    if ((qg || hyb) && (adamw || cfg->momentum == 0.0f))
        return hs__err(HS_EINVAL, "--momentum-kind %s needs --optimizer sgd and --momentum > 0 "
                                  "(it changes what the momentum buffer accumulates)",
                       hs_momentum_kind_name(cfg->momentum_kind));
    if (adamw) {
        if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f) || !(cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f))
            return hs__err(HS_EINVAL, "adamw: betas %g, %g must be in [0, 1)", (double)cfg->beta1,
                           (double)cfg->beta2);
        if (!(cfg->eps > 0.0f) || !isfinite(cfg->eps))
            return hs__err(HS_EINVAL, "adamw: epsilon %g must be a finite number > 0",
                           (double)cfg->eps);
        if (!be->ops->adamw_step)
            return hs__err(HS_EINVAL, "--optimizer adamw: the %s backend has no AdamW step (use "
                                      "--device cpu or --optimizer sgd)",
                           be->ops->name);
    }
    hs_optim *o = calloc(1, sizeof(*o));
    if (!o) return hs__err(HS_ENOMEM, "optimizer: out of memory");
    o->be = be;
    o->n = n;
    o->cfg = *cfg;
    int err = 0;
    if (adamw || cfg->momentum != 0.0f) err = hs_be_alloc_f(be, n, &o->v);
    if (err == 0 && adamw) err = hs_be_alloc_f(be, n, &o->m);
    if (err == 0 && (qg || hyb)) {
        err = hs_be_alloc_f(be, n, &o->q);
        if (err == 0 && hyb && (err = hs_be_alloc_f(be, n, &o->mg)) == 0)
            err = hs_be_alloc_f(be, n, &o->xm);
        if (err == 0 && ((qg && !(o->x0 = malloc(sizeof(float) * n))) ||
                         (!be->host_memory && !(o->dh = malloc(sizeof(float) * n)))))
            err = hs__err(HS_ENOMEM, "optimizer: out of memory for %zu parameters", n);
    }
    if (err < 0) {
        hs_optim_free(o);
        return err;
    }
    *out = o;
    return 0;
}

void hs_optim_free(hs_optim *o) {
    if (!o) return;
    hs_be_free(o->be, o->v);
    hs_be_free(o->be, o->m);
    hs_be_free(o->be, o->q);
    hs_be_free(o->be, o->mg);
    hs_be_free(o->be, o->xm);
    free(o->x0);
    free(o->dh);
    free(o);
}

/* b^k by squaring: plain IEEE multiplies, so every machine gets the same bits (pow() is not
 * correctly rounded in every libm). */
static double ipow(float b, uint64_t k) {
    double r = 1.0, p = (double)b;
    for (; k; k >>= 1) {
        if (k & 1) r *= p;
        p *= p;
    }
    return r;
}

int hs_optim_step(hs_optim *o, float *x, const float *g, long t, float *lr_out) {
    float lr = hs_optim_lr(&o->cfg, t);
    if (lr_out) *lr_out = lr;
    if (o->cfg.kind == HS_OPTIM_ADAMW) {
        /* The bias corrections in double on the host, as PyTorch computes them. */
        uint64_t k = o->t + 1;
        double bc1 = 1.0 - ipow(o->cfg.beta1, k), bc2 = 1.0 - ipow(o->cfg.beta2, k);
        hs_adamw_hparams h = {o->cfg.beta1,
                              o->cfg.beta2,
                              o->cfg.eps,
                              (float)(1.0 - (double)lr * (double)o->cfg.weight_decay),
                              (float)((double)lr / bc1),
                              (float)(1.0 / sqrt(bc2))};
        int err = o->be->ops->adamw_step(o->be, x, g, o->m, o->v, o->n, &h);
        if (err == 0) o->t = k;
        return err;
    }
    hs_sgd_hparams h = {lr, o->cfg.momentum, o->cfg.weight_decay, o->cfg.nesterov};
    if (o->mg) {
        /* Hybrid: the heavy ball's step, then the gossip buffer's share, then x as the gossip
         * will find it (its share of the round is measured from there). */
        int err = o->be->ops->sgd_step(o->be, x, g, o->v, o->n, &h);
        if (err == 0) err = o->be->ops->axpby(o->be, x, o->mg, o->n, -lr * o->cfg.momentum, 1.0f);
        if (err == 0) err = hs_be_copy_f(o->be, o->xm, x, o->n);
        o->lr_sum += (double)lr;
        return err;
    }
    if (!o->q) return o->be->ops->sgd_step(o->be, x, g, o->v, o->n, &h);
    int err = hs_be_copy_f(o->be, o->q, o->v, o->n);
    if (err < 0) return err;
    o->lr_sum += (double)lr;
    return o->be->ops->sgd_step(o->be, x, g, o->q, o->n, &h);
}

int hs_optim_needs_x(const hs_optim *o) { return o->q != NULL; }

int hs_optim_round_begin(hs_optim *o, const float *x_host) {
    if (!o->q) return 0;
    if (o->x0) memcpy(o->x0, x_host, sizeof(float) * o->n);
    o->lr_sum = 0.0;
    return 0;
}

/* mg = beta (2 - beta) mg + (1 - beta) (xm - x_end) / lr_sum: QG's update of its buffer
 * (mhat' = beta mhat + (1 - beta)(beta mhat + d)) with d the gossip's share of the round. */
static int hybrid_round_end(hs_optim *o, const float *x_host, float inv) {
    float mu = o->cfg.momentum, a = mu * (2.0f - mu), c = 1.0f - mu;
    size_t n = o->n;
    if (o->be->host_memory) {
        float *mg = o->mg;
        const float *xm = o->xm;
        for (size_t k = 0; k < n; k++) mg[k] = a * mg[k] + c * ((xm[k] - x_host[k]) * inv);
        return 0;
    }
    int err = hs_be_download(o->be, o->dh, o->xm, sizeof(float) * n);
    if (err < 0) return err;
    for (size_t k = 0; k < n; k++) o->dh[k] = (o->dh[k] - x_host[k]) * inv;
    if ((err = hs_be_upload(o->be, o->q, o->dh, sizeof(float) * n)) < 0) return err;
    return o->be->ops->axpby(o->be, o->mg, o->q, n, c, a);
}

int hs_optim_round_end(hs_optim *o, const float *x_host) {
    if (!o->q || !(o->lr_sum > 0.0)) return 0;
    /* Algorithm 1's d = (x_t - x_{t+1}) / eta, with the round's summed step sizes for eta so
     * that several local steps (or a scheduled lr) give the per-step scale of the gradients
     * the buffer stands for. */
    float inv = (float)(1.0 / o->lr_sum), mu = o->cfg.momentum, c = 1.0f - mu;
    /* Rates summing below 1 / FLT_MAX (a subnormal lr) have no float inverse: 0 * inf would
     * fill the buffer with NaN. Such a round adds nothing, as one at lr 0. */
    if (isinf(inv)) return 0;
    const float *x0 = o->x0;
    size_t n = o->n;
    if (o->mg) return hybrid_round_end(o, x_host, inv);
    if (o->be->host_memory) {
        float *v = o->v;
        for (size_t k = 0; k < n; k++) v[k] = mu * v[k] + c * ((x0[k] - x_host[k]) * inv);
        return 0;
    }
    for (size_t k = 0; k < n; k++) o->dh[k] = (x0[k] - x_host[k]) * inv;
    int err = hs_be_upload(o->be, o->q, o->dh, sizeof(float) * n);
    if (err < 0) return err;
    return o->be->ops->axpby(o->be, o->v, o->q, n, c, mu);
}

float *hs_optim_velocity(hs_optim *o) { return o->cfg.kind == HS_OPTIM_SGD ? o->v : NULL; }

int hs_optim_nstate(const hs_optim *o) {
    return o->cfg.kind == HS_OPTIM_ADAMW || o->mg ? 2 : o->v != NULL;
}

float *hs_optim_state(hs_optim *o, int i) {
    if (o->cfg.kind == HS_OPTIM_ADAMW) return i == 0 ? o->m : i == 1 ? o->v : NULL;
    return i == 0 ? o->v : i == 1 ? o->mg : NULL;
}

uint64_t hs_optim_count(const hs_optim *o) { return o->t; }
void hs_optim_set_count(hs_optim *o, uint64_t t) { o->t = t; }
const hs_optim_cfg *hs_optim_config(const hs_optim *o) { return &o->cfg; }
