/* A simulated job's loop (sim/job.h): rounds, the guard, evaluations and the metrics record.
 * The guard sees every round (the exact consensus costs O(n d), little next to a round of
 * training), the test accuracy where it is measured. Single-threaded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "sim/job.h"
#include "sim/linktime.h"

typedef struct acc_stats {
    double mean, min, max, loss;
} acc_stats;

/* Progress in rounds of a normal-speed peer: the lockstep round, or in virtual time the least
 * peer's (everyone has got that far; hs__sim_progress). */
static double progress(hs_sim *sim) {
    double p = 0;
    for (int i = 0; i < hs_sim_n(sim); i++) {
        double c = hs__sim_progress(sim, i);
        if (i == 0 || c < p) p = c;
    }
    return p;
}

static int evaluate_all(hs_sim *sim, const hs_dataset *test, acc_stats *st) {
    st->mean = st->loss = 0;
    st->min = 1;
    st->max = 0;
    int n = hs_sim_n(sim), alive = 0;
    for (int i = 0; i < n; i++) {
        if (!hs_simnet_alive(hs_sim_net(sim), i)) continue;
        double loss, acc;
        int err = hs_trainer_evaluate(hs_sim_trainer(sim, i), test, &loss, &acc);
        if (err < 0) return err;
        st->mean += acc;
        st->loss += loss;
        st->min = acc < st->min ? acc : st->min;
        st->max = acc > st->max ? acc : st->max;
        alive++;
    }
    st->mean /= alive;
    st->loss /= alive;
    return 0;
}

/* The exact consensus distance and the mean square of the average model (its scale). */
static int consensus_of(hs_sim *sim, float *avg, double *cons, double *ms) {
    int err = hs_sim_consensus(sim, cons, avg);
    if (err < 0) return err;
    size_t d = hs_trainer_dim(hs_sim_trainer(sim, 0));
    double s = 0;
    for (size_t k = 0; k < d; k++) s += (double)avg[k] * avg[k];
    *ms = s / (double)d;
    return 0;
}

/* The job's record (docs/METRICS.md): per-peer numbers are means over the peers, bytes rounded
 * to a byte. The one source of the metrics line, the progress line and the summary. */
static void sim_record(hs_metrics_rec *m, hs_sim *sim, double time) {
    int n = hs_sim_n(sim);
    double sent = 0, recv = 0;
    for (int i = 0; i < n; i++) {
        hs_algo_stats as;
        hs_algo_get_stats(hs_trainer_algo(hs_sim_trainer(sim, i)), &as);
        sent += (double)as.bytes_sent;
        recv += (double)as.bytes_recv;
    }
    hs_metrics_init(m);
    hs_metrics_set(m, HS_MF_TIME, time);
    hs_metrics_set(m, HS_MF_BYTES_SENT, nearbyint(sent / n));
    hs_metrics_set(m, HS_MF_BYTES_RECV, nearbyint(recv / n));
    double vt = hs__sim_vtime(sim);
    if (!isnan(vt)) hs_metrics_set(m, HS_MF_VTIME, vt);
}

static void set_acc(hs_metrics_rec *m, const acc_stats *acc) {
    hs_metrics_set(m, HS_MF_TEST_ACC, acc->mean);
    hs_metrics_set(m, HS_MF_TEST_ACC_MIN, acc->min);
    hs_metrics_set(m, HS_MF_TEST_ACC_MAX, acc->max);
}

typedef struct job {
    hs_sim *sim;
    const hs__sim_job_cfg *cfg;
    hs_guard *guard;
    float *avg;
    uint64_t *peer_rounds;
    int n, sync;
    double t0, cons, now;
    acc_stats acc;
} job;

static double wall(const job *j) { return j->cfg->now ? j->cfg->now() : 0; }

/* One observation after a step: the guard's verdict, and the record of an evaluated round.
 * Returns 1 when the guard says the run diverged. */
static int observe(job *j, long *next_eval, int finished) {
    const hs__sim_job_cfg *cfg = j->cfg;
    int do_eval = j->now >= (double)*next_eval || finished;
    double loss = 0, ms = NAN;
    for (int i = 0; i < j->n; i++) loss += hs_sim_round_stats(j->sim, i)->loss;
    loss /= j->n;
    int err = consensus_of(j->sim, j->avg, &j->cons, &ms);
    if (err < 0) return hs__err_prefix(err, "consensus");
    if (do_eval && (err = evaluate_all(j->sim, cfg->test, &j->acc)) < 0)
        return hs__err_prefix(err, "evaluate");
    hs_guard_obs ob = {j->now, j->cons, ms, loss, do_eval ? j->acc.mean : NAN};
    hs_guard_verdict v = hs_guard_observe(j->guard, &ob);
    if (v == HS_GUARD_DIVERGING && cfg->on_warning)
        cfg->on_warning(cfg->ctx, j->now, hs_guard_reason(j->guard), hs_guard_advice(j->guard));
    if (!do_eval && v != HS_GUARD_DIVERGED) return 0;
    while (*next_eval <= j->now) *next_eval += cfg->eval_every;
    hs_metrics_rec rec;
    sim_record(&rec, j->sim, wall(j) - j->t0);
    hs_metrics_set(&rec, HS_MF_ROUND, j->now);
    hs_metrics_set(&rec, HS_MF_EPOCH, j->now / cfg->rpe);
    hs_metrics_set(&rec, HS_MF_LOSS, loss);
    set_acc(&rec, &j->acc);
    hs_metrics_set(&rec, HS_MF_TEST_LOSS, j->acc.loss);
    hs_metrics_set(&rec, HS_MF_CONSENSUS, j->cons);
    if (!j->sync) {
        for (int i = 0; i < j->n; i++) j->peer_rounds[i] = hs_sim_rounds(j->sim, i);
        rec.peer_rounds = j->peer_rounds;
        rec.n_peer_rounds = j->n;
    }
    if (do_eval && cfg->on_record) cfg->on_record(cfg->ctx, &rec);
    if (cfg->metrics && do_eval && (err = hs_metrics_write(cfg->metrics, &rec)) < 0) return err;
    return v == HS_GUARD_DIVERGED;
}

/* The reason and the knob as the metrics' last record, so that a script tells a diverged run
 * from a finished or a killed one. */
static int end_diverged(job *j, hs__sim_job_result *res) {
    res->diverged = 1;
    res->diverged_round = hs_guard_round(j->guard);
    snprintf(res->reason, sizeof(res->reason), "%s", hs_guard_reason(j->guard));
    snprintf(res->advice, sizeof(res->advice), "%s", hs_guard_advice(j->guard));
    if (!j->cfg->metrics) return 0;
    hs_metrics_rec rec;
    sim_record(&rec, j->sim, wall(j) - j->t0);
    hs_metrics_set_str(&rec, HS_MF_EVENT, "diverged");
    hs_metrics_set_str(&rec, HS_MF_REASON, res->reason);
    hs_metrics_set_str(&rec, HS_MF_ADVICE, res->advice);
    hs_metrics_set(&rec, HS_MF_ROUND, res->diverged_round);
    hs_metrics_set(&rec, HS_MF_TEST_ACC, j->acc.mean);
    hs_metrics_set(&rec, HS_MF_CONSENSUS, j->cons);
    return hs_metrics_write(j->cfg->metrics, &rec);
}

static int end_done(job *j, hs__sim_job_result *res) {
    int err;
    res->rounds_min = UINT64_MAX;
    res->rounds_max = 0;
    for (int i = 0; i < j->n; i++) {
        uint64_t r = hs_sim_rounds(j->sim, i);
        res->rounds_min = r < res->rounds_min ? r : res->rounds_min;
        res->rounds_max = r > res->rounds_max ? r : res->rounds_max;
    }
    if (res->stopped && (err = evaluate_all(j->sim, j->cfg->test, &j->acc)) < 0) return err;
    hs_metrics_rec rec;
    sim_record(&rec, j->sim, wall(j) - j->t0);
    hs_metrics_set_str(&rec, HS_MF_EVENT, res->stopped ? "interrupted" : "done");
    set_acc(&rec, &j->acc);
    hs_metrics_set(&rec, HS_MF_CONSENSUS, j->cons);
    hs_metrics_set(&rec, HS_MF_ROUNDS_MIN, (double)res->rounds_min);
    hs_metrics_set(&rec, HS_MF_ROUNDS_MAX, (double)res->rounds_max);
    res->acc_mean = j->acc.mean;
    res->acc_min = j->acc.min;
    res->acc_max = j->acc.max;
    res->consensus = j->cons;
    res->sent_per_peer = hs_metrics_get(&rec, HS_MF_BYTES_SENT);
    res->time_s = hs_metrics_get(&rec, HS_MF_TIME);
    res->vtime_s = hs__sim_vtime(j->sim);
    /* DDP's steps: the same optimizer steps as a peer that ran the job's rounds. */
    res->ddp_vtime_s = hs__sim_ddp_time(j->sim, j->cfg->rounds * j->cfg->local_steps,
                                        &res->ddp_allreduce_s);
    if (!isnan(res->ddp_vtime_s)) hs_metrics_set(&rec, HS_MF_VTIME_DDP, res->ddp_vtime_s);
    /* A failed last record is said, not fatal: the run itself finished. */
    if (j->cfg->metrics && hs_metrics_write(j->cfg->metrics, &rec) < 0)
        HS_LOGW("%s", hs_error_message());
    return 0;
}

int hs__sim_job_run(hs_sim *sim, const hs__sim_job_cfg *cfg, hs__sim_job_result *res) {
    memset(res, 0, sizeof(*res));
    job j = {sim, cfg, NULL, NULL, NULL, hs_sim_n(sim), 0, 0, NAN, 0, {NAN, NAN, NAN, NAN}};
    hs_trainer *t0 = hs_sim_trainer(sim, 0);
    j.sync = hs_algo_kind_synchronous(hs_algo_kind_of(hs_trainer_algo(t0)));
    hs_guard_cfg gc = cfg->guard;
    /* The guard's advice halves the step in use, not the 0 that means automatic. */
    if (hs_algo_kind_uses_gamma_c(gc.algo)) gc.gamma_c = hs_algo_gamma_c(hs_trainer_algo(t0));
    int err;
    if ((err = hs_guard_new(&j.guard, &gc)) < 0) return err;
    if (!(j.avg = malloc(sizeof(float) * hs_trainer_dim(t0))) ||
        !(j.peer_rounds = calloc((size_t)j.n, sizeof(*j.peer_rounds)))) {
        err = hs__err(HS_ENOMEM, "simulator: out of memory");
        goto out;
    }
    j.t0 = wall(&j);
    long next_eval = cfg->eval_every;
    double observed = 0;
    for (;;) {
        if (cfg->interrupted && cfg->interrupted()) {
            res->stopped = 1;
            break;
        }
        if (progress(sim) >= (double)cfg->rounds) break;
        double ts = wall(&j);
        if ((err = hs_sim_step(sim, NULL)) < 0) {
            if (err != HS_EDIVERGED) goto out;
            hs_guard_fail(j.guard, progress(sim), hs_error_message());
            err = end_diverged(&j, res);
            goto out;
        }
        res->step_time_s += wall(&j) - ts;
        j.now = progress(sim);
        int finished = j.now >= (double)cfg->rounds;
        if (floor(j.now) <= observed && !(j.now >= (double)next_eval || finished)) continue;
        observed = floor(j.now);
        if ((err = observe(&j, &next_eval, finished)) < 0) goto out;
        if (err == 1) {
            err = end_diverged(&j, res);
            goto out;
        }
        if (finished) break;
    }
    err = end_done(&j, res);
out:
    hs_guard_free(j.guard);
    free(j.avg);
    free(j.peer_rounds);
    return err;
}
