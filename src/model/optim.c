/* SGD with momentum, weight decay and a learning-rate schedule over one flat vector. The
 * arithmetic is the backend's sgd_step (hs_ew_sgd); this file only owns the velocity and
 * computes the rate. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "hearsay/model.h"

struct hs_optim {
    hs_backend *be;
    size_t n;
    hs_optim_cfg cfg;
    float *v; /* velocity, backend memory; NULL without momentum */
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
    if (cfg->nesterov && cfg->momentum == 0.0f)
        return hs__err(HS_EINVAL, "--nesterov needs --momentum > 0");
    hs_optim *o = calloc(1, sizeof(*o));
    if (!o) return hs__err(HS_ENOMEM, "optimizer: out of memory");
    o->be = be;
    o->n = n;
    o->cfg = *cfg;
    if (cfg->momentum != 0.0f) {
        int err = hs_be_alloc_f(be, n, &o->v);
        if (err < 0) {
            free(o);
            return err;
        }
    }
    *out = o;
    return 0;
}

void hs_optim_free(hs_optim *o) {
    if (!o) return;
    hs_be_free(o->be, o->v);
    free(o);
}

int hs_optim_step(hs_optim *o, float *x, const float *g, long t, float *lr_out) {
    hs_sgd_hparams h = {hs_optim_lr(&o->cfg, t), o->cfg.momentum, o->cfg.weight_decay,
                        o->cfg.nesterov};
    if (lr_out) *lr_out = h.lr;
    return o->be->ops->sgd_step(o->be, x, g, o->v, o->n, &h);
}

float *hs_optim_velocity(hs_optim *o) { return o->v; }
const hs_optim_cfg *hs_optim_config(const hs_optim *o) { return &o->cfg; }
