/* One peer's training loop (see hearsay/trainer.h). Keeps the algorithm's host vector x and
 * the optimizer's backend vector in step: on a host-memory backend they are one buffer (and,
 * unless the algorithm evaluates elsewhere than x, the model's own parameters). On CUDA an
 * algorithm with a device path (every one, hs__algo_to_device, bar an ef: compressor) gossips
 * the parameters where they are (SGP, which evaluates at x / w, an x beside them), so only
 * its messages cross, and the host copy of x is brought over when something reads it; the
 * others (and every algorithm under an outer step) have x uploaded after each mixing step and
 * downloaded after the local steps, through page-locked memory where the backend has it. The
 * shard stays on the device (model/devshard.h) so that the local steps copy nothing else;
 * their losses are summed there too and read once, at the round's end. One thread. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "core/clock.h"
#include "core/error_internal.h"
#include "hearsay/trainer.h"
#include "model/devshard.h"
#include "model/lossacc.h"
#include "train/outer.h"
#include "train/round.h"
#include "train/state.h"
#include "tensor/gossip_ops.h"

struct hs_trainer {
    hs_backend *be;
    hs_trainer_cfg cfg;
    hs_model *model;
    hs_optim *opt;
    hs_batcher *batch;
    hs__devshard *dev; /* the shard in backend memory, or NULL: batches from the host */
    hs__lossacc *loss; /* the local steps' loss, read at the round's end (or every step) */
    hs_algo *algo;
    hs__outer *outer; /* the outer step after the gossip, or NULL */
    size_t d;
    /* The optimizer always steps the model's parameters, which hold the evaluation point:
     * x itself, or where the algorithm evaluates elsewhere (hs_algo_kind_split_eval; SGP's
     * z = x / w) that point. Stepping z rather than x keeps the step size independent
     * of the push-sum weight (a peer whose weight shrinks, next to a straggler, would otherwise
     * take steps of lr / w on z and diverge), as the reference implementation does by
     * de-biasing the parameters around each gossip step. */
    int split_eval;
    float *x_host; /* the algorithm's x: the parameters themselves on a host backend without
                      split_eval, else a copy synchronised at the round's phase boundaries */
    int own_host; /* 1: x_host is malloc'd; 2: the backend's host_alloc */
    /* The algorithm gossips the parameters in backend memory (hs__algo_to_device): they are x
     * (with split_eval x_dev is, and the parameters its evaluation point), and x_host a copy
     * brought over when read, stale once x was handed out for a change. */
    int dev_gossip, x_stale;
    float *x_dev;
    long steps;
};

void hs_trainer_free(hs_trainer *t) {
    if (!t) return;
    if (t->own_host == 2) t->be->ops->host_free(t->be, t->x_host);
    else if (t->own_host) free(t->x_host);
    if (t->x_dev) hs_be_free(t->be, t->x_dev);
    hs_algo_free(t->algo);
    hs__outer_free(t->outer);
    hs__devshard_free(t->dev);
    hs__lossacc_free(t->loss);
    hs_batcher_free(t->batch);
    hs_optim_free(t->opt);
    hs_model_free(t->model);
    free(t);
}

int hs_trainer_new(hs_trainer **out, hs_backend *be, const hs_trainer_cfg *cfg,
                   const hs_dataset *shard, const hs_algo_cfg *acfg, uint32_t self) {
    if (cfg->local_steps < 1)
        return hs__err(HS_EINVAL, "--local-steps %d: must be >= 1", cfg->local_steps);
    int err = hs__outer_check(&cfg->outer);
    if (err < 0) return err;
    /* Quasi-global momentum is defined (Lin et al. 2021) and kept here for a mixing step that
     * averages models with a doubly stochastic W (the algorithm's qg_momentum property). */
    if (!acfg && cfg->outer.on)
        return hs__err(HS_EINVAL, "the outer step needs an algorithm to gossip with");
    if (cfg->optim.momentum_kind != HS_MOMENTUM_LOCAL && acfg &&
        !hs_algo_kind_qg_momentum(acfg->kind)) {
        char ok[96];
        hs_algo_kind_names(hs_algo_kind_qg_momentum, 1, ok, sizeof(ok));
        return hs__err(HS_EINVAL, "--momentum-kind %s applies to --algo %s, not %s",
                       hs_momentum_kind_name(cfg->optim.momentum_kind), ok,
                       hs_algo_kind_name(acfg->kind));
    }
    hs_trainer *t = calloc(1, sizeof(*t));
    if (!t) return hs__err(HS_ENOMEM, "trainer: out of memory");
    t->be = be;
    t->cfg = *cfg;
    if ((err = hs_model_new_spec(&t->model, be, &cfg->model, cfg->batch)) < 0 ||
        (err = hs_model_init(t->model, cfg->seed)) < 0)
        goto fail;
    t->d = hs_model_nparams(t->model);
    if ((err = hs_optim_new(&t->opt, be, t->d, &cfg->optim)) < 0 ||
        (err = hs_batcher_new(&t->batch, shard, cfg->batch, cfg->seed, cfg->stream, 0)) < 0 ||
        (err = hs_batcher_set_augment(t->batch, cfg->augment)) < 0 ||
        (err = hs__devshard_new(&t->dev, be, shard, t->model, cfg->batch)) < 0 ||
        (err = hs__lossacc_new(&t->loss, be)) < 0)
        goto fail;
    t->split_eval = acfg && hs_algo_kind_split_eval(acfg->kind);
    float *params = hs_model_params(t->model);
    if (be->host_memory && !t->split_eval) {
        t->x_host = params;
    } else {
        /* x crosses to the device and back every round: page-locked, the copies are DMA. */
        if (be->ops->host_alloc) {
            if ((err = be->ops->host_alloc(be, sizeof(float) * t->d, (void **)&t->x_host)) < 0)
                goto fail;
            t->own_host = 2;
        } else if ((t->x_host = malloc(sizeof(float) * t->d))) {
            t->own_host = 1;
        } else {
            err = hs__err(HS_ENOMEM, "trainer: out of memory");
            goto fail;
        }
        /* w starts at 1: x = z = the initial parameters. */
        if ((err = hs_be_download(be, t->x_host, params, sizeof(float) * t->d)) < 0) goto fail;
    }
    if ((acfg && (err = hs_algo_new(&t->algo, acfg, self, t->d, t->x_host)) < 0) ||
        (err = hs__outer_new(&t->outer, &cfg->outer, t->d)) < 0)
        goto fail;
    /* The outer step changes x on the host at every round's close: with it x stays on the
     * host path. (Quasi-global momentum only reads x there: one copy per round.) */
    if (t->algo && !be->host_memory && !cfg->outer.on) {
        if ((err = hs__algo_to_device(t->algo, be)) < 0) goto fail;
        t->dev_gossip = err;
        /* x apart from its evaluation point (the parameters, which hold x0 = z0 as w = 1). */
        if (err && t->split_eval &&
            ((err = hs_be_alloc_f(be, t->d, &t->x_dev)) < 0 ||
             (err = hs_be_copy_f(be, t->x_dev, params, t->d)) < 0))
            goto fail;
        err = 0;
    }
    *out = t;
    return 0;
fail:
    hs_trainer_free(t);
    return err;
}

/* The model as evaluated: x itself without an algorithm. */
static const float *eval_point(hs_trainer *t, const float *x) {
    return t->algo ? hs_algo_eval_point(t->algo, x) : x;
}

/* Where the device holds x in device gossip. */
static float *dev_x(hs_trainer *t) { return t->x_dev ? t->x_dev : hs_model_params(t->model); }

/* Brings x to its host copy when the gossip or the local steps changed it on the device. A
 * failed copy is the caller's error: the host copy is then an older x, and a checkpoint,
 * snapshot or momentum step taken from it would pass for a current one. */
static int fetch_x(hs_trainer *t) {
    if (!t->x_stale) return 0;
    int err = hs_be_download(t->be, t->x_host, dev_x(t), sizeof(float) * t->d);
    if (err < 0) return err;
    t->x_stale = 0;
    return 0;
}

/* Puts the evaluation point of x into the model's parameters, when they are not x itself. */
static int stage_params(hs_trainer *t) {
    float *params = hs_model_params(t->model);
    if (t->x_dev) return hs__algo_eval_point_be(t->algo, params, t->x_dev);
    if (params == t->x_host || t->dev_gossip) return 0;
    const float *p = eval_point(t, t->x_host);
    return hs_be_upload(t->be, params, p, sizeof(float) * t->d);
}

/* The reverse after the local steps: x from the parameters (x = w z for SGP). The outer step
 * takes the parameters as they are, before x = w z rounds them (device gossip, which keeps x on
 * the device, is never on with an outer step: hs_trainer_new). */
static int unstage_params(hs_trainer *t) {
    float *params = hs_model_params(t->model);
    t->x_stale = t->dev_gossip;
    if (t->x_dev) return hs__algo_from_eval_point_be(t->algo, t->x_dev, params);
    if (t->dev_gossip) return 0;
    if (params == t->x_host) return hs__outer_local_done(t->outer, t->algo, t->x_host);
    int err = hs_be_download(t->be, t->x_host, params, sizeof(float) * t->d);
    if (err < 0 || (err = hs__outer_local_done(t->outer, t->algo, t->x_host)) < 0) return err;
    if (t->algo) hs_algo_from_eval_point(t->algo, t->x_host);
    return 0;
}

int hs_trainer_set_x(hs_trainer *t, const float *x) {
    if (t->x_host != x) memmove(t->x_host, x, sizeof(float) * t->d);
    if (t->algo) hs_algo_reset_x(t->algo, t->x_host);
    if (!t->dev_gossip) return stage_params(t);
    t->x_stale = 0;
    int err = hs_be_upload(t->be, dev_x(t), t->x_host, sizeof(float) * t->d);
    return err < 0 ? err : stage_params(t);
}

/* The outer step's anchor is the model at the round's open, whatever set it (the last
 * round, a snapshot adopted, a checkpoint loaded). */
int hs_trainer_round_open(hs_trainer *t) {
    hs__outer_open(t->outer, t->algo, t->x_host);
    if (!hs_optim_needs_x(t->opt)) return 0; /* no copy from the device for nothing */
    int err = fetch_x(t);
    return err < 0 ? err : hs_optim_round_begin(t->opt, t->x_host);
}

/* After the gossip: the outer step, then quasi-global momentum's buffer takes the whole
 * round's change, outer step included. The parameters are brought up to date where they are
 * next needed (the local steps, evaluation), so that a round's mixing is not followed by a
 * copy it does not need. */
int hs_trainer_round_close(hs_trainer *t) {
    int err = hs__outer_step(t->outer, t->algo, t->x_host);
    if (err < 0 || !hs_optim_needs_x(t->opt) || (err = fetch_x(t)) < 0) return err;
    return hs_optim_round_end(t->opt, t->x_host);
}

float *hs_trainer_gossip_x(hs_trainer *t) {
    if (!t->dev_gossip) return t->x_host;
    t->x_stale = 1; /* handed out for the gossip to change */
    return dev_x(t);
}

/* The round's local steps queue their losses into t->loss; the host waits for them once, at
 * the round's end, where x comes back anyway (on a host backend, after every step: free, and
 * a divergence stops at its own step). A non-finite loss is HS_EDIVERGED naming its step. */
int hs_trainer_local(hs_trainer *t, uint64_t r, hs_round_stats *st) {
    (void)r;
    return hs_trainer_local_n(t, t->cfg.local_steps, st);
}

int hs_trainer_local_n(hs_trainer *t, int n, hs_round_stats *st) {
    if (n < 1) return hs__err(HS_EINVAL, "trainer: %d local steps", n);
    double t0 = hs__mono_s();
    int samples = 0, err;
    float lr = 0;
    /* Where the device holds x the steps change it there from here on, also when one fails. */
    t->x_stale = t->dev_gossip;
    if ((err = stage_params(t)) < 0) return err;
    float *params = hs_model_params(t->model);
    hs_xent_acc *buf = hs__lossacc_buf(t->loss), tot;
    long base = t->steps;
    for (int h = 0; h < n && err == 0; h++) {
        int bs = err = hs__devshard_grad(t->dev, t->batch, t->model, buf);
        if (err < 0 ||
            (err = hs_optim_step(t->opt, params, hs_model_grads(t->model), t->steps, &lr)) < 0)
            break;
        t->steps++;
        if (hs__lossacc_eager(t->loss))
            err = hs__lossacc_read(t->loss, base, t->steps, 0, &tot);
        samples += bs;
    }
    if (err < 0) {
        /* The next round starts from empty totals, whatever this one left in them. */
        hs__lossacc_clear(t->loss);
        return err;
    }
    if ((err = hs__lossacc_read(t->loss, base, t->steps, 1, &tot)) < 0 ||
        (err = unstage_params(t)) < 0)
        return err;
    if (st) {
        st->loss = tot.loss / n;
        st->samples = samples;
        st->lr = lr;
        st->compute_s = hs__mono_s() - t0;
    }
    return 0;
}

static hs_algo *rm_algo(void *c) { return ((hs_trainer *)c)->algo; }
static float *rm_x(void *c) { return hs_trainer_gossip_x(c); }
static int rm_open(void *c, uint64_t r) {
    (void)r;
    return hs_trainer_round_open(c);
}
static int rm_local(void *c, uint64_t r, hs_round_stats *st) { return hs_trainer_local(c, r, st); }
static int rm_close(void *c, uint64_t r) {
    (void)r;
    return hs_trainer_round_close(c);
}

hs__round_model hs__trainer_round_model(hs_trainer *t) {
    hs__round_model m = {t, rm_algo, rm_x, rm_open, rm_local, rm_close, NULL};
    return m;
}

int hs_trainer_evaluate(hs_trainer *t, const hs_dataset *ds, double *loss, double *accuracy) {
    int err = stage_params(t);
    if (err < 0) return err;
    return hs_model_evaluate(t->model, ds, loss, accuracy);
}

/* The copy is a cache of the device's x: reading it changes nothing the caller can see. */
const float *hs_trainer_x(const hs_trainer *t) {
    return fetch_x((hs_trainer *)t) < 0 ? NULL : t->x_host;
}
const float *hs_trainer_eval_x(hs_trainer *t) {
    return fetch_x(t) < 0 ? NULL : eval_point(t, t->x_host);
}

int hs__trainer_eval_ms(hs_trainer *t, double *ms) {
    const hs_gossip_ops *go = t->be->ops->gossip;
    double sq;
    int err;
    if (t->x_stale && go && go->sumsq) {
        /* With split_eval the parameters take z = x / w there, as the next local steps would. */
        if ((err = stage_params(t)) < 0 ||
            (err = go->sumsq(t->be, t->x_dev ? hs_model_params(t->model) : dev_x(t), t->d,
                             &sq)) < 0)
            return err;
    } else {
        const float *z = hs_trainer_eval_x(t);
        if (!z) return HS_ECUDA; /* the model's copy from the device failed, its message set */
        sq = hs__sum_sq(z, t->d);
    }
    *ms = sq / (double)(t->d ? t->d : 1);
    return 0;
}
size_t hs_trainer_dim(const hs_trainer *t) { return t->d; }
hs_algo *hs_trainer_algo(hs_trainer *t) { return t->algo; }
hs_model *hs_trainer_model(hs_trainer *t) { return t->model; }
long hs_trainer_steps(const hs_trainer *t) { return t->steps; }
long hs_trainer_steps_per_epoch(const hs_trainer *t) { return hs_batcher_steps_per_epoch(t->batch); }

int hs_trainer_write_params(hs_trainer *t, const char *path) {
    int err = fetch_x(t);
    if (err < 0) return err;
    const float *z = eval_point(t, t->x_host);
    FILE *f = fopen(path, "wb");
    if (!f) return hs__err(HS_EIO, "%s: %s", path, strerror(errno));
    size_t n = fwrite(z, sizeof(float), t->d, f);
    if ((fclose(f) | (n != t->d)) != 0) return hs__err(HS_EIO, "%s: %s", path, strerror(errno));
    return 0;
}

/* ---------------------------------------------------------------- checkpoints */

/* The optimizer's state as checkpoints and snapshots carry it: u32 kind (hs_optim_kind in the
 * low byte, the momentum kind plus one in the second, 0 in files from before it), u32
 * number of vectors (0: plain SGD, 1: SGD's velocity, 2: AdamW's m then v), u64 step count,
 * then the vectors (d floats each). */
static int put_optim(void *ctx, hs_buf *out) {
    hs_trainer *t = ctx;
    int err, nv = hs_optim_nstate(t->opt);
    const hs_optim_cfg *oc = hs_optim_config(t->opt);
    /* The momentum kind rides in the kind word's second byte, plus one: files written before
     * it was recorded have 0 there and are judged by their count of vectors alone. */
    uint32_t word = (uint32_t)oc->kind | (uint32_t)(oc->momentum_kind + 1) << 8;
    if ((err = hs__put_u32(out, word)) < 0 ||
        (err = hs__put_u32(out, (uint32_t)nv)) < 0 ||
        (err = hs__put_u64(out, hs_optim_count(t->opt))) < 0)
        return err;
    for (int i = 0; i < nv; i++) {
        size_t at = out->len;
        if ((err = hs_buf_reserve(out, out->len + sizeof(float) * t->d)) < 0) return err;
        if ((err = hs_be_download(t->be, out->data + at, hs_optim_state(t->opt, i),
                                  sizeof(float) * t->d)) < 0)
            return err;
        out->len += sizeof(float) * t->d;
    }
    return 0;
}

/* Reads and checks an optimizer state against this trainer's optimizer into host memory
 * (state: 2 d floats), changing nothing. */
static int get_optim(hs_trainer *t, const uint8_t **p, const uint8_t *end, const char *what,
                     float *state, uint64_t *count) {
    uint32_t word, nv;
    int err;
    if ((err = hs__get_u32(p, end, &word)) < 0 || (err = hs__get_u32(p, end, &nv)) < 0 ||
        (err = hs__get_u64(p, end, count)) < 0)
        return err;
    const hs_optim_cfg *oc = hs_optim_config(t->opt);
    int want = hs_optim_nstate(t->opt);
    uint32_t kind = word & 0xff, mk = word >> 8; /* mk: momentum kind + 1, 0 if not recorded */
    if (mk > (uint32_t)HS_MOMENTUM_HYBRID + 1)
        return hs__err(HS_EFORMAT, "%s: optimizer word 0x%x names no momentum kind", what, word);
    /* local and qg keep one vector each, so only the recorded kind tells their files apart:
     * qg's buffer taken for heavy ball's (or the reverse) would resume with the wrong
     * momentum and no word said. Older files are judged by the count: CHOCO's default went
     * from qg (1) to hybrid (2) and then to local (1). The recorded kind means something
     * only for SGD's buffers (AdamW writes its configuration's unused one): it is compared and
     * named only then. */
    int file_mk = mk && nv && kind == HS_OPTIM_SGD;
    if (kind != (uint32_t)oc->kind || nv != (uint32_t)want ||
        (file_mk && mk - 1 != (uint32_t)oc->momentum_kind))
        return hs__err(HS_EMISMATCH, "%s: optimizer %s with %u state vectors%s%s%s, this run %s "
                                     "with %d (--momentum-kind %s): --optimizer, --momentum and "
                                     "--momentum-kind must be those of the run that wrote it "
                                     "(sgd with momentum keeps 2 vectors under hybrid, 1 under "
                                     "local or qg; choco's default was hybrid before local)",
                       what, kind <= 1 ? hs_optim_kind_name((hs_optim_kind)kind) : "unknown",
                       nv, file_mk ? " (--momentum-kind " : "",
                       file_mk ? hs_momentum_kind_name((hs_momentum_kind)(mk - 1)) : "",
                       file_mk ? ")" : "", hs_optim_kind_name(oc->kind), want,
                       hs_momentum_kind_name(oc->momentum_kind));
    if (*count > (uint64_t)1 << 48)
        return hs__err(HS_EFORMAT, "%s: optimizer step %llu", what, (unsigned long long)*count);
    for (uint32_t i = 0; i < nv; i++)
        if ((err = hs__get_floats(p, end, state + (size_t)i * t->d, t->d)) < 0) return err;
    if (oc->kind == HS_OPTIM_ADAMW)
        for (size_t k = 0; k < t->d; k++)
            if (state[t->d + k] < 0.0f)
                return hs__err(HS_EFORMAT, "%s: AdamW second moment %zu is negative (%g)", what,
                               k, (double)state[t->d + k]);
    return 0;
}

/* Installs a state that get_optim accepted. */
static int set_optim(hs_trainer *t, const float *state, uint64_t count) {
    int err;
    for (int i = 0; i < hs_optim_nstate(t->opt); i++)
        if ((err = hs_be_upload(t->be, hs_optim_state(t->opt, i), state + (size_t)i * t->d,
                                sizeof(float) * t->d)) < 0)
            return err;
    hs_optim_set_count(t->opt, count);
    return 0;
}

/* The parts of this trainer's checkpoint state and snapshot (train/state.h): the model as
 * evaluated (x / w for SGP, so that a peer resuming with a fresh algorithm state starts from
 * the model itself), the optimizer's state (in a snapshot only when it has one), the outer
 * section (its anchor is the model), the algorithm's state. */
static int parts(hs_trainer *t, int optim, hs__state_parts *s) {
    int err = fetch_x(t);
    hs__state_parts p = {t->d, (uint64_t)t->steps, eval_point(t, t->x_host),
                         optim ? put_optim : NULL, t, t->outer, t->algo};
    *s = p;
    return err;
}

int hs_trainer_save(hs_trainer *t, hs_buf *out) {
    hs__state_parts s;
    int err = parts(t, 1, &s);
    return err < 0 ? err
                   : hs__state_put_checkpoint(out, HS__TRAINER_STATE_MAGIC,
                                              HS__TRAINER_STATE_VERSION, &s);
}

int hs_trainer_load(hs_trainer *t, const uint8_t *p, size_t len, int with_algo) {
    const uint8_t *end = p + len;
    uint64_t steps, alen, count = 0;
    const uint8_t *mom;
    int err = hs__state_get_head(&p, end, HS__TRAINER_STATE_MAGIC, HS__TRAINER_STATE_VERSION,
                                 t->d, "trainer state", &steps);
    if (err < 0) return err;
    float *x = malloc(sizeof(float) * t->d), *st = malloc(sizeof(float) * 2 * t->d);
    if (!x || !st) {
        err = hs__err(HS_ENOMEM, "trainer state: out of memory");
        goto out;
    }
    if ((err = hs__get_floats(&p, end, x, t->d)) < 0 ||
        (err = get_optim(t, &p, end, "trainer state", st, &count)) < 0 ||
        (err = hs__outer_parse(t->outer, &p, end, "trainer state", &mom)) < 0)
        goto out;
    if ((err = hs__get_u64(&p, end, &alen)) < 0) goto out;
    if (alen != (uint64_t)(end - p)) {
        err = hs__err(HS_EFORMAT, "trainer state: algorithm state of %llu bytes, %zu left",
                      (unsigned long long)alen, (size_t)(end - p));
        goto out;
    }
    /* The algorithm validates its whole state before changing anything; after it, nothing
     * here can fail but a device copy. */
    if (with_algo && t->algo) {
        if ((err = hs_algo_load(t->algo, p, (size_t)alen)) < 0) goto out;
        hs_algo_from_eval_point(t->algo, x); /* x = w z with the restored push-sum weight */
    }
    if ((err = hs_trainer_set_x(t, x)) < 0 || (err = set_optim(t, st, count)) < 0) goto out;
    hs__outer_install(t->outer, mom);
    t->steps = (long)steps;
    err = hs_batcher_seek(t->batch, t->steps);
out:
    free(x);
    free(st);
    return err;
}

int hs_trainer_snapshot(hs_trainer *t, hs_buf *out) {
    hs__state_parts s;
    int err = parts(t, hs_optim_nstate(t->opt) > 0, &s);
    return err < 0 ? err : hs__state_put_snapshot(out, &s);
}

int hs_trainer_set_steps(hs_trainer *t, long steps) {
    if (steps < 0) return hs__err(HS_EINVAL, "trainer: step %ld", steps);
    t->steps = steps;
    return hs_batcher_seek(t->batch, steps);
}

int hs_trainer_adopt(hs_trainer *t, const uint8_t *p, size_t len) {
    const uint8_t *end = p + len;
    uint64_t steps, count = 0;
    int err = hs__state_get_head(&p, end, HS__SNAPSHOT_MAGIC, 0, t->d, "model snapshot", &steps);
    if (err < 0) return err;
    if ((size_t)(end - p) < sizeof(float) * t->d)
        return hs__err(HS_EFORMAT, "model snapshot: %zu bytes of parameters, expected %zu",
                       (size_t)(end - p), sizeof(float) * t->d);
    float *x = malloc(sizeof(float) * t->d), *st = malloc(sizeof(float) * 2 * t->d);
    int has_state = 0;
    if (!x || !st) {
        err = hs__err(HS_ENOMEM, "model snapshot: out of memory");
        goto out;
    }
    if ((err = hs__get_floats(&p, end, x, t->d)) < 0) goto out;
    if (p != end && !hs__outer_at(p, end)) {
        if ((err = get_optim(t, &p, end, "model snapshot", st, &count)) < 0) goto out;
        has_state = 1;
    }
    /* The outer section is there exactly when the job has an outer step. */
    const uint8_t *mom = NULL;
    if ((err = hs__outer_parse(t->outer, &p, end, "model snapshot", &mom)) < 0) goto out;
    if (p != end) {
        err = hs__err(HS_EFORMAT, "model snapshot: %zu bytes after the %s", (size_t)(end - p),
                      t->outer ? "outer optimizer state" : "optimizer state");
        goto out;
    }
    if ((err = hs_trainer_set_x(t, x)) == 0 && (!has_state || (err = set_optim(t, st, count)) == 0))
        err = hs_trainer_set_steps(t, (long)steps);
    if (err == 0) hs__outer_install(t->outer, mom);
out:
    free(x);
    free(st);
    return err;
}
