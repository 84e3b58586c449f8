/* The simulator driver: n trainers on one backend, sharded from one dataset, over an
 * hs_simnet. Synchronous algorithms advance in lockstep phases; SGP advances the peer with the
 * earliest virtual clock, one round at a time. Single-threaded and deterministic. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "hearsay/sim.h"
#include "sim/linktime.h"
#include "train/round.h"

struct hs_sim {
    hs_sim_cfg cfg;
    int n;
    int sync;
    hs_topo *topo;
    hs_simnet *net;
    hs_dataset **shards;
    hs_trainer **tr;
    hs__round *eng; /* one round engine per peer */
    double *clock, *slow;
    /* With a link profile (hs__sim_set_links): clocks in seconds, slow[i] peer i's compute
     * seconds per round, unit a normal peer's. Without: clocks in rounds, unit 1. */
    hs__linktime *links;
    double unit, step_s;
};

void hs_sim_free(hs_sim *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        if (s->tr) hs_trainer_free(s->tr[i]);
        if (s->shards) hs_dataset_free(s->shards[i]);
    }
    free(s->tr);
    free(s->shards);
    hs_simnet_free(s->net);
    hs_topo_free(s->topo);
    free(s->eng);
    free(s->clock);
    free(s->slow);
    hs__linktime_free(s->links);
    free(s);
}

int hs_sim_new(hs_sim **out, hs_backend *be, const hs_sim_cfg *cfg, const hs_dataset *train) {
    if (cfg->n < 1 || cfg->n > 4096) return hs__err(HS_EINVAL, "-n %d: must be in 1..4096", cfg->n);
    hs_sim *s = calloc(1, sizeof(*s));
    if (!s) return hs__err(HS_ENOMEM, "simulator: out of memory");
    s->cfg = *cfg;
    s->n = cfg->n;
    s->sync = hs_algo_kind_synchronous(cfg->algo.kind);
    s->unit = 1.0;
    int err;
    if ((err = hs_topo_new(&s->topo, cfg->topology, cfg->n, cfg->seed)) < 0) goto fail;
    if (hs_topo_n(s->topo) != cfg->n) {
        err = hs__err(HS_EINVAL, "topology %s has %d peers, -n is %d", cfg->topology,
                      hs_topo_n(s->topo), cfg->n);
        goto fail;
    }
    if ((err = hs_algo_check_topology(cfg->algo.kind, hs_topo_directed(s->topo),
                                      hs_topo_period(s->topo), hs_topo_name(s->topo))) < 0)
        goto fail;
    /* The mixing matrix's gap is an input of the automatic CHOCO step; the simulator knows it. */
    if (hs_algo_kind_uses_gamma_c(s->cfg.algo.kind) && s->cfg.algo.gamma_c == 0.0f && !(s->cfg.algo.gap > 0) &&
        (err = hs_algo_cfg_set_topology(&s->cfg.algo, s->topo)) < 0)
        goto fail;
    /* The step's degree by the rule the networked peers follow (they may not know the size). */
    hs_algo_cfg_set_step_degree(&s->cfg.algo, cfg->topology);
    if ((err = hs_simnet_new(&s->net, s->topo)) < 0) goto fail;
    hs_simnet_set_latency(s->net, cfg->latency);
    s->shards = calloc((size_t)s->n, sizeof(*s->shards));
    s->tr = calloc((size_t)s->n, sizeof(*s->tr));
    s->eng = calloc((size_t)s->n, sizeof(*s->eng));
    s->clock = calloc((size_t)s->n, sizeof(*s->clock));
    s->slow = calloc((size_t)s->n, sizeof(*s->slow));
    if (!s->shards || !s->tr || !s->eng || !s->clock || !s->slow) {
        err = hs__err(HS_ENOMEM, "simulator: out of memory");
        goto fail;
    }
    for (int i = 0; i < s->n; i++) {
        s->slow[i] = cfg->slowdown ? cfg->slowdown[i] : 1.0;
        if (!(s->slow[i] >= 1.0) || !isfinite(s->slow[i])) {
            err = hs__err(HS_EINVAL, "--slowdown of peer %d is %g: must be >= 1", i, s->slow[i]);
            goto fail;
        }
        uint32_t *idx;
        size_t cnt;
        if ((err = hs_shard(train, &cfg->partition, i, s->n, cfg->seed, &idx, &cnt)) < 0) goto fail;
        err = hs_dataset_subset(&s->shards[i], train, idx, cnt);
        free(idx);
        if (err < 0) goto fail;
        hs_trainer_cfg tc = cfg->trainer;
        tc.stream = (uint32_t)i;
        hs_backend *bi = cfg->peer_be && cfg->peer_be[i] ? cfg->peer_be[i] : be;
        if ((err = hs_trainer_new(&s->tr[i], bi, &tc, s->shards[i], &s->cfg.algo, (uint32_t)i)) < 0) {
            hs__err_prefix(err, "peer %d", i);
            goto fail;
        }
        hs__round_model m = hs__trainer_round_model(s->tr[i]);
        hs__round_init(&s->eng[i], &m, hs_simnet_exchange(s->net, i), 0);
    }
    *out = s;
    return 0;
fail:
    hs_sim_free(s);
    return err;
}

/* A lockstep round in virtual time: a peer's begin leaves at its clock, its push once its
 * compute is done, and its pull waits for the neighbours' messages to arrive (the exchange moves
 * its clock), so each peer's clock is its own and a slow link holds up only whoever waits for
 * it and, through them, the rest. The same phases in the same order as without links. */
static int sync_step_links(hs_sim *s) {
    int err;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < s->n; i++) {
            if (!hs_simnet_alive(s->net, i)) continue;
            uint64_t r = s->eng[i].r;
            if (pass) {
                err = hs__round_run(&s->eng[i], HS__PH_OPEN);
                s->clock[i] = hs_simnet_clock(s->net, i);
            } else {
                hs_simnet_set_clock(s->net, i, s->clock[i]);
                if ((err = hs__round_run(&s->eng[i], HS__PH_LOCAL)) >= 0) {
                    hs_simnet_set_clock(s->net, i, s->clock[i] + s->slow[i]);
                    err = hs__round_run(&s->eng[i], HS__PH_PULL);
                }
            }
            if (err < 0) return hs__err_prefix(err, "peer %d, round %llu", i, (unsigned long long)r);
        }
    }
    return 0;
}

int hs_sim_step(hs_sim *s, int *peer) {
    int err;
    if (s->sync && s->links) {
        if (peer) *peer = -1;
        return sync_step_links(s);
    }
    if (s->sync) {
        /* One lockstep round: every live peer's open, local steps and push (back to back while
         * its vectors are in cache), then every pull and the round's end, so no receive waits. */
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < s->n; i++) {
                if (!hs_simnet_alive(s->net, i)) continue;
                uint64_t r = s->eng[i].r;
                if ((err = hs__round_run(&s->eng[i], pass ? HS__PH_OPEN : HS__PH_PULL)) < 0)
                    return hs__err_prefix(err, "peer %d, round %llu", i, (unsigned long long)r);
                if (pass) s->clock[i] += 1.0;
            }
        }
        if (peer) *peer = -1;
        return 0;
    }
    int best = -1;
    for (int i = 0; i < s->n; i++)
        if (hs_simnet_alive(s->net, i) && (best < 0 || s->clock[i] < s->clock[best])) best = i;
    if (best < 0) return hs__err(HS_EINVAL, "simulator: no peer is alive");
    uint64_t r = s->eng[best].r;
    /* The round's messages go out, and arrived ones are taken, when its compute is done. */
    hs_simnet_set_clock(s->net, best, s->clock[best] + s->slow[best]);
    if ((err = hs__round_run(&s->eng[best], HS__PH_OPEN)) < 0)
        return hs__err_prefix(err, "peer %d, round %llu", best, (unsigned long long)r);
    s->clock[best] = hs_simnet_clock(s->net, best);
    if (peer) *peer = best;
    return 0;
}

int hs__sim_set_links(hs_sim *s, const hs__wan_profile *p, double step_s) {
    if (p->n != s->n)
        return hs__err(HS_EINVAL, "--links: the profile %s has %d peers, --peers is %d", p->name,
                       p->n, s->n);
    if (!(step_s > 0) || !isfinite(step_s))
        return hs__err(HS_EINVAL, "--step-time %g: must be > 0", step_s);
    int err = hs__linktime_new(&s->links, p);
    if (err < 0) return err;
    hs__simnet_set_links(s->net, s->links);
    s->step_s = step_s;
    int steps = s->cfg.trainer.local_steps > 0 ? s->cfg.trainer.local_steps : 1;
    s->unit = step_s * steps;
    for (int i = 0; i < s->n; i++) s->slow[i] *= p->compute[i] * s->unit;
    return 0;
}

void hs__sim_set_link_headers(hs_sim *s, int headers) {
    if (s->links) hs__linktime_set_headers(s->links, headers);
}

int hs__sim_set_link_tcp(hs_sim *s, const char *model) {
    return s->links ? hs__linktime_set_tcp(s->links, model) : 0;
}

double hs__sim_progress(const hs_sim *s, int i) {
    if (s->sync) return (double)s->eng[i].r;
    /* With links a peer's clock also counts its waits, so its progress is its rounds, each
     * worth its compute in rounds of a normal peer (what its clock counts without links). */
    return s->links ? (double)s->eng[i].r * (s->slow[i] / s->unit) : s->clock[i];
}

double hs__sim_vtime(const hs_sim *s) {
    if (!s->links) return NAN;
    double t = 0;
    for (int i = 0; i < s->n; i++)
        if (hs_simnet_alive(s->net, i) && s->clock[i] > t) t = s->clock[i];
    return t;
}

double hs__sim_ddp_time(const hs_sim *s, long steps, double *allreduce_s) {
    if (!s->links) return NAN;
    double slowest = 0, ar = hs__linktime_allreduce(s->links, 4 * hs_trainer_dim(s->tr[0]));
    /* Every step waits for the slowest peer's compute, then for the all-reduce. */
    for (int i = 0; i < s->n; i++) slowest = s->slow[i] > slowest ? s->slow[i] : slowest;
    slowest *= s->step_s / s->unit;
    if (allreduce_s) *allreduce_s = ar;
    return ar < 0 ? NAN : (double)steps * (slowest + ar);
}

int hs_sim_n(const hs_sim *s) { return s->n; }
hs_trainer *hs_sim_trainer(hs_sim *s, int i) { return s->tr[i]; }
hs_simnet *hs_sim_net(hs_sim *s) { return s->net; }
uint64_t hs_sim_rounds(const hs_sim *s, int i) { return s->eng[i].r; }
double hs_sim_clock(const hs_sim *s, int i) { return s->clock[i]; }
size_t hs_sim_shard_size(const hs_sim *s, int i) { return s->shards[i]->n; }
const hs_round_stats *hs_sim_round_stats(const hs_sim *s, int i) { return &s->eng[i].st; }

int hs_sim_consensus(hs_sim *s, double *dist, float *avg) {
    size_t d = hs_trainer_dim(s->tr[0]);
    double *mean = calloc(d, sizeof(double));
    if (!mean) return hs__err(HS_ENOMEM, "simulator: out of memory");
    int alive = 0;
    for (int i = 0; i < s->n; i++) {
        if (!hs_simnet_alive(s->net, i)) continue;
        const float *z = hs_trainer_eval_x(s->tr[i]);
        if (!z) {
            free(mean);
            return HS_ECUDA; /* the device copy failed, its message set */
        }
        for (size_t k = 0; k < d; k++) mean[k] += z[k];
        alive++;
    }
    for (size_t k = 0; k < d; k++) mean[k] /= alive;
    double sum = 0;
    for (int i = 0; i < s->n; i++) {
        if (!hs_simnet_alive(s->net, i)) continue;
        const float *z = hs_trainer_eval_x(s->tr[i]); /* current now: copied above */
        for (size_t k = 0; k < d; k++) {
            double e = z[k] - mean[k];
            sum += e * e;
        }
    }
    if (avg)
        for (size_t k = 0; k < d; k++) avg[k] = (float)mean[k];
    free(mean);
    *dist = sum / ((double)alive * (double)d);
    return 0;
}
