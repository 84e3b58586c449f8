/* One networked peer with the built-in trainer: a node (hearsay/node.h) runs the job and each
 * round's gossip, the trainer (hearsay/trainer.h) the local steps on this peer's shard between
 * them. This file is the glue: the shard, the trainer as the node's model, the loop, and the
 * result. The training thread never touches a socket (the runtime has its own loop thread). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "hearsay/model.h"
#include "hearsay/peer.h"
#include "node/node_internal.h"
#include "train/round.h"

/* A stop may come (from a signal handler) before the node exists: kept here and passed on. */
static volatile sig_atomic_t stop_requested, checkpoint_requested;
static hs_node *volatile running;

void hs_peer_request_stop(int checkpoint) {
    if (checkpoint) checkpoint_requested = 1;
    stop_requested = 1;
    hs_node *n = running;
    if (n) hs_node_request_stop(n, checkpoint);
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !stop_requested) {
    }
}

/* ---------------------------------------------------------------- the trainer as the model */

typedef struct peer_model {
    hs_trainer *t;
    hs_node *node;
    hs_backend *be;
    hs_trainer_cfg tc;
    hs_algo_cfg acfg;
    const hs_dataset *shard, *test;
    long eval_every;
    double slowdown;
} peer_model;

static hs_algo *m_algo(void *c) { return hs_trainer_algo(((peer_model *)c)->t); }
static float *m_x(void *c) { return hs_trainer_gossip_x(((peer_model *)c)->t); }
static int m_eval_ms(void *c, double *ms) { return hs__trainer_eval_ms(((peer_model *)c)->t, ms); }
static long m_steps(void *c) { return hs_trainer_steps(((peer_model *)c)->t); }
static int m_snapshot(void *c, hs_buf *out) {
    return hs_trainer_snapshot(((peer_model *)c)->t, out);
}
static int m_adopt(void *c, const uint8_t *p, size_t len) {
    return hs_trainer_adopt(((peer_model *)c)->t, p, len);
}
static int m_save(void *c, hs_buf *out) { return hs_trainer_save(((peer_model *)c)->t, out); }
static int m_load(void *c, const uint8_t *p, size_t len, int with_algo) {
    return hs_trainer_load(((peer_model *)c)->t, p, len, with_algo);
}
/* The round's local steps, as a straggler when told (this peer's compute takes `slowdown`
 * times as long), and what the node's metrics record of the round takes from them. */
static int m_local(void *c, uint64_t r) {
    peer_model *pm = c;
    hs_round_stats st;
    int err = hs_trainer_local(pm->t, r, &st);
    if (err < 0) return err;
    if (pm->slowdown > 1.0) sleep_s((pm->slowdown - 1.0) * st.compute_s);
    hs_node_report(pm->node, st.loss, NAN);
    /* Passes over this peer's shard, counting steps adopted from a snapshot. */
    hs__node_report_train(pm->node, st.lr,
                          (double)hs_trainer_steps(pm->t) /
                              (double)hs_trainer_steps_per_epoch(pm->t));
    return 0;
}

static int m_round_begin(void *c, uint64_t r) {
    (void)r;
    return hs_trainer_round_open(((peer_model *)c)->t);
}

/* After the gossip: the optimizer's round hook, then the test evaluation of the rounds that
 * have one, which the node's guard and metrics record of this round take. */
static int m_round_end(void *c, uint64_t r) {
    peer_model *pm = c;
    int err = hs_trainer_round_close(pm->t);
    if (err < 0 || pm->eval_every <= 0 || (r + 1) % (uint64_t)pm->eval_every) return err;
    double loss, acc;
    if ((err = hs_trainer_evaluate(pm->t, pm->test, &loss, &acc)) == 0)
        hs__node_report_test(pm->node, loss, acc);
    return err;
}

/* Removed and let in again under a new id: a new trainer, which adopts the job's snapshot. */
static int m_renew(void *c, uint32_t self) {
    peer_model *pm = c;
    hs_trainer_free(pm->t);
    pm->t = NULL;
    return hs_trainer_new(&pm->t, pm->be, &pm->tc, pm->shard, &pm->acfg, self);
}

static const hs__node_model trainer_model = {
    NULL, m_algo, m_x, m_eval_ms, m_steps, m_local, m_snapshot, m_adopt, m_save, m_load,
    m_round_begin, m_round_end, m_renew,
};

/* ---------------------------------------------------------------- the run */

static void node_cfg(const hs_peer_cfg *cfg, hs__node_cfg *nc) {
    memset(nc, 0, sizeof(*nc));
    nc->net = cfg->net;
    nc->algo = cfg->algo;
    nc->world = cfg->world;
    nc->rank = cfg->rank;
    nc->rendezvous = cfg->rendezvous;
    nc->rounds = cfg->rounds;
    nc->wait_peers = cfg->wait_peers;
    nc->wait_new_only = cfg->wait_new_only;
    nc->wait_timeout_ms = cfg->wait_timeout_ms;
    nc->metrics = cfg->metrics;
    nc->quiet = cfg->quiet;
    nc->checkpoint_dir = cfg->checkpoint_dir;
    nc->checkpoint_every = cfg->checkpoint_every;
    nc->resume = cfg->resume;
    nc->guard = cfg->guard;
}

/* Rounds until the job ends, a stop request is honoured, or the run diverges: the node's round
 * engine runs each round, the trainer's local steps included. Returns 0 or the error that
 * ended the run. */
static int train(hs_node *node, hs_peer_result *res) {
    for (;;) {
        int err = hs__node_step(node);
        if (err == 1 || err == HS_EDIVERGED) return 0;
        if (err == HS_EINTR && hs__node_stopped(node)) {
            res->stopped = 1;
            return 0;
        }
        if (err < 0) return err;
    }
}

int hs_peer_run(const hs_peer_cfg *cfg, hs_backend *be, const hs_dataset *train_set,
                const hs_dataset *test, hs_peer_result *res) {
    memset(res, 0, sizeof(*res));
    stop_requested = checkpoint_requested = 0;
    hs_node *node = NULL;
    hs_dataset *shard = NULL;
    peer_model pm = {NULL,    NULL, be, cfg->trainer, cfg->algo, NULL, test, cfg->eval_every,
                     cfg->slowdown};
    double t0 = hs__node_now();
    char sig[128];
    hs_model_spec_format(&cfg->trainer.model, sig, sizeof(sig));
    hs__node_cfg nc;
    node_cfg(cfg, &nc);
    int err = hs__node_new_cfg(&node, &nc, hs_model_spec_nparams(&cfg->trainer.model), sig);
    if (err < 0) return err;
    pm.node = running = node;
    if (stop_requested) hs_node_request_stop(node, checkpoint_requested);
    if ((err = hs__node_connect(node)) < 0) goto out;
    res->id = hs__node_self(node);
    int rank = hs__node_rank(node), world = cfg->world > 0 ? cfg->world : 1;
    uint32_t *idx;
    size_t cnt;
    err = hs_shard(train_set, &cfg->partition, rank, world, cfg->trainer.seed, &idx, &cnt);
    if (err < 0) goto out;
    err = hs_dataset_subset(&shard, train_set, idx, cnt);
    free(idx);
    if (err < 0) goto out;
    if (!cfg->quiet) HS_LOGI("shard %d of %d: %zu examples", rank, world, shard->n);
    pm.shard = shard;
    pm.tc.stream = (uint32_t)rank;
    /* The learning-rate schedule spans the job's rounds, as on the peer that started it. */
    long job_rounds = hs__node_job_rounds(node);
    if (job_rounds != cfg->rounds && cfg->rounds > 0)
        pm.tc.optim.total_steps = pm.tc.optim.total_steps / cfg->rounds * job_rounds;
    /* Replicas start equal to the common initialisation only for a peer that begins with the
     * job (the node decides); otherwise full replicas travel. */
    pm.acfg.same_start = 0;
    if ((err = hs_trainer_new(&pm.t, be, &pm.tc, shard, &pm.acfg, res->id)) < 0) goto out;
    hs__node_model m = trainer_model;
    m.ctx = &pm;
    err = hs__node_begin(node, &m);
    res->first_round = hs__node_first_round(node);
    if (err == HS_EINTR && hs__node_stopped(node)) res->stopped = 1;
    else if (err < 0 || (err == 0 && (err = train(node, res)) < 0))
        goto out;
    res->late = err == 1;
    res->id = hs__node_self(node);
    res->last_round = hs_node_round(node);
    if ((err = hs_trainer_evaluate(pm.t, test, &res->test_loss, &res->test_acc)) < 0) goto out;
    hs__node_report_test(node, res->test_loss, res->test_acc);
    char path[4096];
    if (cfg->save && ((err = hs__node_expand_id(cfg->save, res->id, path, sizeof(path))) < 0 ||
                      (err = hs_trainer_write_params(pm.t, path)) < 0))
        goto out;
    const char *advice, *reason = hs__node_diverged(node, &res->diverged_round, &advice);
    if (reason) {
        res->diverged = 1;
        snprintf(res->reason, sizeof(res->reason), "%s", reason);
        snprintf(res->advice, sizeof(res->advice), "%s", advice);
    }
    hs__node_bytes(node, &res->bytes_sent, &res->bytes_recv);
    res->wall_s = hs__node_now() - t0;
    /* Exit status 0 says this peer was a member of the one job until the end. */
    err = hs_node_leave(node);
out:
    running = NULL;
    hs_node_free(node);
    hs_trainer_free(pm.t);
    hs_dataset_free(shard);
    return err;
}
