/* One networked peer's gossip over a model it does not own (hearsay/node.h): start or join the
 * job, adopt its state, run each round's gossip phases around the owner's local update, publish
 * snapshots for joiners, checkpoint, watch for divergence, write the metrics, leave with BYE.
 * The owner is reached through hs__node_model: the caller's vector (vec.c) or the built-in
 * trainer (src/peer.c), so `hearsay run` and a library caller share this one path. The calling
 * thread never touches a socket (the runtime has its own loop thread); a signal handler may
 * only set the stop flags. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "core/error_internal.h"
#include "core/log.h"
#include "hearsay/checkpoint.h"
#include "hearsay/metrics.h"
#include "node/node_internal.h"
#include "train/round.h"


enum { ST_NEW, ST_CONNECTED, ST_RUNNING, ST_ENDED };

struct hs_node {
    hs__node_cfg cfg;
    hs_node_options *opts; /* the strings cfg points into, for a node made from options */
    size_t d;
    char sig[128];
    int state;
    hs_net_config nc; /* cfg.net as this node uses it (the address it joined through) */
    char rv_addr[320];
    int join_ms;
    hs_net *net;
    hs_net_welcome w;
    hs_buf *snap; /* the model's snapshot last published (at snap_t), while the runtime has it */
    hs_checkpoint ck;
    int have_ck, alone, restart; /* restart: a restarted job's round and timeline not agreed */
    hs_timeline tl; /* the job's, which this peer's checkpoints are written on */
    uint32_t self;
    int rank;
    hs__node_terms jt;
    hs__node_model m;
    hs__round eng; /* runs each round's phases on m (train/round.h) */
    hs_guard *guard;
    hs_metrics_file *metrics; /* NULL: no metrics file */
    hs_metrics_rec rec;       /* the last round's record (hs_node_metrics_json) */
    int have_rec;
    uint64_t r, first_round, rounds_done;
    int left, diverged, told, warned_unsharded, stopped;
    /* Set by hs_node_request_stop from any thread or a signal handler: lock-free atomics are
     * both thread-safe and async-signal-safe. */
    atomic_int stop, ck_req;
    double t0, t_round0, last_print, snap_t;
    /* Reported for the current round; NaN: not this round. */
    double loss, acc, lr, epoch, test_loss, test_acc;
    void *vec; /* the caller's-vector model of the public entries (vec.c) */
    void (*vec_free)(void *vec);
};

static void reset_reports(hs_node *n) {
    n->loss = n->acc = n->lr = n->epoch = n->test_loss = n->test_acc = NAN;
}

int hs__node_new_cfg(hs_node **out, const hs__node_cfg *cfg, size_t d, const char *sig) {
    *out = NULL;
    if (d == 0) return hs__err(HS_EINVAL, "node: a vector of 0 floats");
    hs_node *n = calloc(1, sizeof(*n));
    if (!n) return hs__err(HS_ENOMEM, "node: out of memory");
    n->cfg = *cfg;
    n->d = d;
    snprintf(n->sig, sizeof(n->sig), "%s", sig);
    n->t0 = hs__node_now();
    reset_reports(n);
    if (cfg->quiet) hs__log_quiet();
    *out = n;
    return 0;
}

int hs_node_new(hs_node **out, const hs_node_options *o, size_t d) {
    if (!out || !o) return hs__err(HS_EINVAL, "hs_node_new: no %s", out ? "options" : "output");
    *out = NULL;
    hs_node_options *copy = hs__node_options_dup(o);
    if (!copy) return HS_ENOMEM;
    hs__node_cfg cfg;
    char sig[64];
    /* A caller's model has no architecture to compare but its size. */
    snprintf(sig, sizeof(sig), "vector:%zu", d);
    int err = hs__node_options_resolve(copy, d, &cfg);
    if (err == 0) err = hs__node_new_cfg(out, &cfg, d, sig);
    if (err < 0) {
        hs_node_options_free(copy);
        return err;
    }
    (*out)->opts = copy;
    return 0;
}

uint32_t hs__node_self(const hs_node *n) { return n->self; }
int hs__node_rank(const hs_node *n) { return n->rank; }
long hs__node_job_rounds(const hs_node *n) { return (long)n->jt.rounds; }
uint64_t hs__node_first_round(const hs_node *n) { return n->first_round; }
int hs__node_stopped(const hs_node *n) { return n->stopped; }
uint64_t hs_node_round(const hs_node *n) { return n ? n->r : 0; }
/* Known once the job let this peer in (the first half of hs_node_start). */
uint32_t hs_node_id(const hs_node *n) {
    return n && n->state != ST_NEW ? n->self : HS_NODE_NO_ID;
}
int hs_node_rank(const hs_node *n) { return n && n->state != ST_NEW ? n->rank : -1; }

void hs__node_bytes(const hs_node *n, uint64_t *sent, uint64_t *recv) {
    /* The algorithm's payload, the one meaning of bytes_sent (docs/METRICS.md). */
    hs_algo_stats as;
    memset(&as, 0, sizeof(as));
    if (n->m.algo && n->m.ctx && n->m.algo(n->m.ctx)) hs_algo_get_stats(n->m.algo(n->m.ctx), &as);
    *sent = as.bytes_sent;
    *recv = as.bytes_recv;
}

void hs_node_report(hs_node *n, double loss, double accuracy) {
    if (!n) return;
    n->loss = loss;
    n->acc = accuracy;
}

void hs__node_report_train(hs_node *n, double lr, double epoch) {
    n->lr = lr;
    n->epoch = epoch;
}

void hs__node_report_test(hs_node *n, double loss, double accuracy) {
    n->test_loss = loss;
    n->test_acc = accuracy;
}

void hs_node_request_stop(hs_node *n, int checkpoint) {
    if (!n) return;
    if (checkpoint) atomic_store(&n->ck_req, 1);
    atomic_store(&n->stop, 1);
}

/* ---------------------------------------------------------------- snapshots and checkpoints */

static int write_checkpoint_to(hs_node *n, const char *dir, uint64_t round) {
    hs_checkpoint_info info = {round, n->jt.end, n->rank, n->self, n->sig, 0, NULL, NULL, &n->tl,
                               n->jt.end - (uint64_t)n->jt.rounds};
    return hs__node_ck_write(&n->m, n->net, &info, dir);
}

static int write_checkpoint(hs_node *n, uint64_t round) {
    return write_checkpoint_to(n, n->cfg.checkpoint_dir, round);
}

int hs_node_checkpoint(hs_node *n, const char *dir) {
    if (!n || !dir) return hs__err(HS_EINVAL, "hs_node_checkpoint: no %s", n ? "directory" : "node");
    if (n->state != ST_RUNNING && n->state != ST_ENDED)
        return hs__err(HS_EINVAL, "hs_node_checkpoint: the node has not started");
    int err = hs_checkpoint_dir_check(dir);
    return err < 0 ? err : write_checkpoint_to(n, dir, n->r);
}

/* Joiners get the terms and timeline, then (MODEL) the model's snapshot; with the terms alone
 * they keep their own model. RETERM: the model last published, unchanged since, under the
 * job's current terms (one copy of the model, not two, while a WELCOME still sends the old).
 * DROP: once no WELCOME holds it (refs: the node's, the runtime's) and joiners' wait is over
 * (at once for a large one), it goes, not to stay a copy of the model (WELCOMEs wait for one). */
enum { TERMS, MODEL, DROP, RETERM };
static int publish(hs_node *n, uint64_t round, int what) {
    if (what == DROP && (!n->snap || __atomic_load_n(&n->snap->refs, __ATOMIC_ACQUIRE) > 2 ||
                         hs_net_welcomes_pending(n->net) > 0 ||
                         (n->snap->len < HS__NODE_SNAP_KEEP_MAX &&
                          hs__node_now() - n->snap_t < 1e-3 * n->nc.snapshot_timeout_ms)))
        return 0;
    if (what == RETERM && !n->snap) what = MODEL;
    /* A caller's vector at step 0 is kept by its joiners (vec.c): no model to carry. */
    if (what == MODEL && n->vec && n->m.steps(n->m.ctx) == 0) what = TERMS;
    uint8_t t[HS__NODE_TERMS_BYTES];
    memcpy(t, &n->jt, 24); /* end, rounds, wait */
    hs__node_timeline_put(&n->tl, t + 24);
    hs_buf *b = NULL, *body = what == RETERM ? hs_buf_ref(n->snap) : NULL;
    int err = hs_buf_new(&b, sizeof(t));
    if (err == 0 && (err = hs_buf_append(b, t, sizeof(t))) == 0 && what == MODEL &&
        (err = hs_buf_new(&body, sizeof(float) * n->d + 4096)) == 0)
        err = n->m.snapshot(n->m.ctx, body);
    if (err == 0)
        err = what == DROP ? hs_net_withdraw_snapshot(n->net, round, b)
              : body       ? hs_net_publish_snapshot_parts(n->net, round, b, body)
                           : hs_net_publish_snapshot(n->net, round, b);
    if (err == 0 && what != TERMS) {
        hs_buf_unref(n->snap);
        n->snap = body ? hs_buf_ref(body) : NULL;
        n->snap_t = hs__node_now();
    }
    hs_buf_unref(b);
    hs_buf_unref(body);
    return err;
}

/* Adopts the job's state from a welcome snapshot (whose terms were read), as every joiner does:
 * the model, the optimizer and the step; its neighbours send it full replicas (same_start off). */
static int adopt_welcome(hs_node *n) {
    int err = n->m.adopt(n->m.ctx, n->w.snapshot->data + HS__NODE_TERMS_BYTES,
                         n->w.snapshot->len - HS__NODE_TERMS_BYTES);
    if (err < 0) return hs__err_prefix(err, "welcome snapshot");
    HS_LOGI("joined at round %llu with the model of round %llu (local step %ld)",
            (unsigned long long)n->w.join_round, (unsigned long long)n->w.snapshot_round,
            n->m.steps(n->m.ctx));
    /* Adopted: holding it on would keep a copy of the model (and optimizer) for the whole run. */
    hs_buf_unref(n->w.snapshot);
    n->w.snapshot = NULL;
    return 0;
}

/* ---------------------------------------------------------------- start */

int hs__node_connect(hs_node *n) {
    if (n->state != ST_NEW) return hs__err(HS_EINVAL, "node: started twice");
    const hs__node_cfg *cfg = &n->cfg;
    int err;
    if (cfg->resume) {
        if ((err = hs__node_resume_load(cfg, n->sig, &n->ck)) < 0) return err;
        n->have_ck = err;
        hs__node_ck_shed(&n->ck); /* read again to load it, once no WELCOME's model is here */
    }
    hs_net_config *nc = &n->nc;
    *nc = cfg->net;
    /* publish(DROP) times the withdrawal with the runtime's value: 0 is its default. */
    if (nc->snapshot_timeout_ms <= 0) nc->snapshot_timeout_ms = HS_NET_SNAPSHOT_TIMEOUT_MS;
    nc->model_sig = n->sig;
    nc->n_params = n->d;
    nc->algo = hs_algo_kind_name(cfg->algo.kind);
    nc->codec = cfg->algo.compress;
    /* They read in pieces (CHOCO, SGP a large model's messages): from the first message on,
     * not the second (the first, taken whole, would cost CHOCO half a vector at fp16). */
    nc->data_in_pieces = cfg->algo.kind == HS_ALGO_DPSGD || cfg->algo.kind == HS_ALGO_CHOCO ||
                         cfg->algo.kind == HS_ALGO_SGP;
    if (n->have_ck) nc->resume_round = n->ck.round, nc->resume_round_max = n->ck.end_round;
    /* A restarted job whose peers wait for each other (begin) trains on from the checkpoint's
     * round: nobody runs a round before the list that completes the wait, so it needs no margin. */
    if (n->have_ck && !cfg->wait_new_only && cfg->wait_peers > 1)
        nc->hold_members = cfg->wait_peers;
    const char *run_id = nc->run_id ? nc->run_id : "hearsay";
    n->join_ms = nc->join_timeout_ms > 0 ? nc->join_timeout_ms : HS__NODE_JOIN_TIMEOUT_MS;
    /* The first peer of a job: no address to join, and (with a rank) rank 0. A resumed peer is
     * never first while a member it knew still answers: it rejoins the running job. Without a
     * rank, a resumed peer has its checkpoint's: peers resumed together agree on the first. */
    int rank = cfg->rank >= 0 ? cfg->rank : n->have_ck ? n->ck.rank : -1;
    int first = !nc->bootstrap && rank <= 0;
    if (cfg->rendezvous && !nc->bootstrap && (!first || n->have_ck)) {
        if (!first && (err = hs__node_rendezvous_turn(cfg->rendezvous, run_id, rank, n->join_ms,
                                                      &n->stop)) < 0)
            return err;
        err = hs__node_join_rendezvous(cfg->rendezvous, run_id, nc, first ? 2000 : n->join_ms,
                                       n->rv_addr, sizeof(n->rv_addr), &n->net, &n->w,
                                       &n->stop);
        if (err == 0) {
            if (rank > 0) hs__node_rendezvous_mark(cfg->rendezvous, run_id, rank, n->rv_addr);
            nc->bootstrap = n->rv_addr;
            first = 0;
        } else if (!first || err == HS_EINTR) {
            return err;
        }
    }
    err = HS_ENOENT;
    if (n->net) err = 0;
    else if (!n->have_ck || nc->bootstrap) err = hs_net_start(&n->net, nc, &n->w);
    if (n->have_ck && !n->net) {
        err = hs__node_resume_rejoin(&n->ck, nc, n->join_ms, first, cfg->wait_peers, err,
                                     &n->net, &n->w, n->rv_addr, sizeof(n->rv_addr), &n->alone);
        first = first && n->alone;
        n->restart = n->alone && cfg->wait_peers > 1;
    }
    if (err < 0) return err;
    if (cfg->rendezvous && first) {
        char addr[320];
        hs__node_own_address(nc, n->net, addr, sizeof(addr));
        if ((err = hs__node_write_rendezvous(cfg->rendezvous, run_id, addr)) < 0) return err;
        HS_LOGI("wrote %s to %s", addr, cfg->rendezvous);
    }
    n->self = hs_net_self(n->net);
    hs__node_set_tag(n->self);
    int world = cfg->world > 0 ? cfg->world : 1;
    /* A resumed peer keeps the shard it trained on (named in its checkpoint). */
    n->rank = cfg->rank >= 0 ? cfg->rank % world
              : n->have_ck   ? n->ck.rank % world
                             : (int)(n->self % (uint32_t)world);
    hs__log_set_peer(n->rank, n->self);
    /* A writer killed mid-write left its temporary behind: it is of no use to anyone. */
    if (cfg->checkpoint_dir) hs_checkpoint_clean_tmp(cfg->checkpoint_dir, n->rank);
    /* The job's timeline: a joiner's from the welcome; a new job's is new, and a job restarted
     * from this peer's checkpoint branches from that checkpoint's. */
    const uint8_t *wtl = n->w.snapshot && n->w.snapshot->len >= HS__NODE_TERMS_BYTES
                             ? n->w.snapshot->data + 24 : NULL;
    hs__node_terms wj = {0, 1, 0};
    if (wtl && (err = hs__node_terms_read(&n->w, &wj)) < 0) return err;
    if (wj.wait < 0) n->restart = 1;
    if ((err = hs__node_resume_timeline(cfg, n->rank, n->sig, wtl, n->w.join_round,
                                        wtl && n->w.snapshot->len > HS__NODE_TERMS_BYTES,
                                        n->restart, &n->have_ck, &n->ck, &n->tl)) < 0)
        return err;
    hs__node_ck_shed(&n->ck);
    if ((err = hs__node_terms_pick(cfg, &n->w, &wj, wtl != NULL, n->restart, n->have_ck, &n->ck,
                                   &n->jt)) < 0)
        return err;
    /* The job's terms and timeline reach those who join before the first snapshot (taken
     * once the model exists): without them a joiner would start a timeline of its own. */
    if (!n->w.snapshot && (err = publish(n, n->have_ck ? n->ck.round : 0, TERMS)) < 0)
        return err;
    n->state = ST_CONNECTED;
    return 0;
}

static int round_top(hs_node *n);
static hs__round_model engine_model(hs_node *n);

/* A peer let in at or after the job's end (late, or let in again) has no round: the end test
 * (r + 1 == end) would never hold, and it would train for ever. It keeps the job's vector. */
static int past_end(hs_node *n, uint64_t r) {
    if (!n->jt.end || n->jt.rounds == HS__NODE_NO_END || r < n->jt.end) return 0;
    HS_LOGW("the job ended at round %llu, before this peer's round %llu: nothing to train",
            (unsigned long long)n->jt.end, (unsigned long long)r);
    n->state = ST_ENDED;
    return 1;
}

/* Compressor draws and a topology's schedule count from the job's first round (the terms'). */
static void set_first_round(hs_node *n) {
    hs_algo_set_first_round(n->m.algo(n->m.ctx), n->jt.end - (uint64_t)n->jt.rounds);
    hs_net_set_first_round(n->net, n->jt.end - (uint64_t)n->jt.rounds);
}

int hs__node_begin(hs_node *n, const hs__node_model *m) {
    if (n->state != ST_CONNECTED) return hs__err(HS_EINVAL, "node: not connected");
    n->m = *m;
    const hs__node_cfg *cfg = &n->cfg;
    int err;
    if (n->have_ck) {
        hs_buf_unref(n->w.snapshot); /* not adopted: gone before the checkpoint's bytes come */
        n->w.snapshot = NULL;
        if ((err = hs__node_ck_state(cfg, n->sig, &n->ck)) == 0)
            err = m->load(m->ctx, n->ck.state, n->ck.state_len, 0);
        hs__node_ck_shed(&n->ck); /* loaded: the file's bytes, a copy of the state, go */
        if (err < 0) return err;
        n->jt.end = n->ck.end_round;
        HS_LOGI("resumed model and optimizer at local step %ld", m->steps(m->ctx));
    } else if (n->w.snapshot && n->w.snapshot->len > HS__NODE_TERMS_BYTES &&
               (err = adopt_welcome(n)) < 0) {
        return err;
    } else if (n->w.snapshot && n->w.snapshot->len == HS__NODE_TERMS_BYTES && n->jt.end &&
               n->w.join_round + (uint64_t)n->jt.rounds > n->jt.end) {
        /* The job's snapshot was withdrawn and none came within the runtime's timeout: said,
         * since this peer then starts from its own vector, not the job's model. */
        HS_LOGW("joined at round %llu without the job's model (no snapshot in time): starting "
                "from this peer's own vector", (unsigned long long)n->w.join_round);
    }
    hs_buf_unref(n->w.snapshot); /* not adopted (a checkpoint was): no copy of a model to keep */
    n->w.snapshot = NULL;
    /* A joiner of a running job (even one without the job's model), a restarted or resumed
     * peer makes its neighbours send it full replicas, and sends its own. */
    hs_algo_set_same_start(m->algo(m->ctx),
                           hs__node_same_start(cfg->algo.same_start, n->have_ck, n->restart,
                                               n->jt.end, n->jt.rounds, n->w.join_round,
                                               m->steps(m->ctx)));
    if ((err = hs_guard_new(&n->guard, &cfg->guard)) < 0) return err;
    uint64_t r = n->alone ? n->ck.round : n->w.join_round;
    /* The wait: a peer that starts a job or joins one still waiting follows the job's rule
     * (the first peer's count); one joining a running job or resuming waits only when told to
     * explicitly. */
    int fresh = !n->have_ck && n->jt.end == 0;
    int n_wait = n->restart ? -(int)n->jt.wait
                 : fresh    ? (int)n->jt.wait
                 : cfg->wait_new_only ? 0
                                      : cfg->wait_peers;
    /* Without a wait the job's end is known now (its first round is this one). */
    if (!n->jt.end && n_wait <= 1) n->jt.end = r + (uint64_t)n->jt.rounds;
    n->first_round = n->r = r;
    if (past_end(n, r)) return 1;
    /* Members welcome joiners with the newest snapshot and hold a WELCOME until there is one:
     * publish before waiting for the others, or their joins stall. */
    if ((err = publish(n, r, MODEL)) < 0) return err;
    if (n_wait > 1) {
        if (!cfg->quiet)
            HS_LOGI("waiting for %d peers before the first round (at most %d ms: --join-timeout)",
                    n_wait, cfg->wait_timeout_ms);
        if ((err = hs__node_wait_members(n->net, n_wait, cfg->wait_timeout_ms, &n->stop)) < 0) {
            hs__err_prefix(err, "waiting for %d peers", n_wait);
            if (err == HS_EINTR && hs_net_leave(n->net, 2000) < 0)
                HS_LOGW("leave: %s", hs_error_message());
            n->left = err == HS_EINTR;
            return err;
        }
        /* Everyone starts at the round from which the full member list is in force, so the
         * first round already mixes with every neighbour. */
        if ((err = hs__node_start_round(n->net, &r)) < 0) return err;
        if (n->restart) {
            int what = RETERM; /* the model published before the wait, unless loaded now */
            if (hs__node_restart_agree(cfg, n->rank, n->sig, &n->tl, r, &n->ck, n->have_ck,
                                       n_wait) > 0) {
                what = MODEL;
                n->have_ck = 1;
                if ((err = hs__node_ck_state(cfg, n->sig, &n->ck)) == 0)
                    err = m->load(m->ctx, n->ck.state, n->ck.state_len, 0);
                hs__node_ck_shed(&n->ck); /* loaded, as above */
                if (err < 0) return err;
            }
            n->restart = 0;
            n->jt.wait = n_wait;
            if ((err = publish(n, r, what)) < 0) return err;
        }
        /* Every peer that waited computes the same first round, hence the same end; joiners
         * arriving from now on learn it from the snapshot, published again at once. */
        if (!n->jt.end) {
            n->jt.end = r + (uint64_t)n->jt.rounds;
            if ((err = publish(n, r, RETERM)) < 0) return err;
        }
    }
    /* A large snapshot that WELCOMEs still send goes before the round's message is made, not
     * beside it (on their connections the WELCOMEs go first anyway): node_open drops it. As
     * long as a joiner's own wait: the 4 GB WELCOME of a 1B model took 24 s on loaded cores,
     * and after the runtime's 5 s the first round was made beside it (3 vectors, not 2). */
    if (n->snap && n->snap->len >= HS__NODE_SNAP_KEEP_MAX)
        hs__node_await_unheld(n->net, n->snap, 2,
                              n->join_ms > n->nc.snapshot_timeout_ms ? n->join_ms
                                                                     : n->nc.snapshot_timeout_ms,
                              &n->stop);
    n->first_round = n->r = r;
    char path[4096];
    if (cfg->metrics &&
        ((err = hs__node_expand_id(cfg->metrics, n->self, path, sizeof(path))) < 0 ||
         (err = hs_metrics_open(&n->metrics, path, cfg->resume)) < 0))
        return err;
    /* rounds 0 has no end: its end round is a sentinel, not a number to show. */
    char end[48] = "with no end (rounds 0)";
    if (n->jt.rounds != HS__NODE_NO_END)
        snprintf(end, sizeof(end), "ending at round %llu", (unsigned long long)n->jt.end);
    if (!cfg->quiet)
        HS_LOGI("starting at round %llu, %s: shard %d of %d, %s, %s", (unsigned long long)r, end,
                n->rank, cfg->world > 0 ? cfg->world : 1, hs_algo_kind_name(cfg->algo.kind),
                cfg->algo.compress);
    n->t_round0 = n->last_print = hs__node_now();
    n->state = ST_RUNNING;
    set_first_round(n);
    hs__round_model rm = engine_model(n);
    hs__round_init(&n->eng, &rm, hs_net_exchange(n->net), r);
    if ((err = round_top(n)) < 0) n->state = ST_ENDED;
    return err;
}

/* ---------------------------------------------------------------- rounds */

/* Peers that do not split the data (no --world) each train on all of it: the usual mistake
 * when peers are started by hand, and nothing else would ever show it. Said once. */
static void warn_unsharded(hs_node *n) {
    if (n->warned_unsharded || n->cfg.world > 1 || n->vec) return;
    hs_net_stats ns;
    hs_net_stats_get(n->net, &ns);
    if (ns.n_members < 2) return;
    n->warned_unsharded = 1;
    HS_LOGW("the job has %d members but this peer has --world 1: it trains on the whole "
            "dataset, as does every member started without --world; give every peer --world N "
            "(and --rank R) to split the data into N shards",
            ns.n_members);
}

/* A failed exchange: when the job removed this peer, start over as a new member with the job's
 * state (its own is of no use to the job); any other failure ends the run. */
static int recover(hs_node *n, int err) {
    if (hs_net_in_job(n->net, 0) != HS_ECANCELED) return err;
    if ((err = hs__node_rejoin(&n->net, &n->nc, &n->w, n->join_ms, &n->stop)) < 0) return err;
    n->self = hs_net_self(n->net);
    hs__node_set_tag(n->self);
    hs__log_set_peer(n->rank, n->self);
    if ((err = n->m.renew(n->m.ctx, n->self)) < 0 || (err = hs__node_terms_read(&n->w, &n->jt)) < 0 ||
        (err = hs__node_timeline_get(n->w.snapshot->data + 24, &n->tl)) < 0)
        return err;
    /* A member at its first step welcomes with the terms alone (publish): this peer keeps its
     * vector, as a joiner does in hs__node_begin (adopting nothing would be a format error). */
    if (n->w.snapshot->len > HS__NODE_TERMS_BYTES && (err = adopt_welcome(n)) < 0) return err;
    hs_buf_unref(n->w.snapshot);
    n->w.snapshot = NULL;
    hs_algo_set_same_start(n->m.algo(n->m.ctx), 0);
    /* Let in by a member still waiting for the job's first members (terms without an end):
     * this peer waits with it, as a joiner does (hs__node_begin; published first, or joins
     * through it would stall), and ends where every peer that waited does. With no end it
     * would train on for ever, alone once the others finished. */
    uint64_t r = n->w.join_round;
    if ((err = publish(n, r, MODEL)) < 0) return err;
    if (!n->jt.end) {
        int wait = n->jt.wait < 0 ? -(int)n->jt.wait : (int)n->jt.wait;
        if (wait > 1 && (err = hs__node_wait_members(n->net, wait, n->cfg.wait_timeout_ms,
                                                     &n->stop)) < 0)
            return hs__err_prefix(err, "joined again: waiting for %d peers", wait);
        if ((err = hs__node_start_round(n->net, &r)) < 0) return err;
        n->jt.end = r + (uint64_t)n->jt.rounds;
        HS_LOGI("joined again before the job's first round: starting at round %llu, ending at "
                "round %llu", (unsigned long long)r, (unsigned long long)n->jt.end);
        if ((err = publish(n, r, RETERM)) < 0) return err;
    }
    set_first_round(n);
    n->r = r;
    return past_end(n, n->r);
}

/* Round n->r's open, before its local update: the stop request, the quorum, a snapshot for
 * joiners, then (the engine) the model's round open and the round's first phase, sent now so
 * that it travels while the owner computes. */
static int node_open(void *c, uint64_t r) {
    hs_node *n = c;
    if (n->stop) {
        n->stopped = 1;
        /* The last round's message may still be queued over a slow link: let it leave before
         * a checkpoint's copy of the state and the caller's copy of x (vec.c), as at the job's
         * end, but briefly: a stop must not hang on a stalled link. */
        hs__algo_settle(n->m.algo(n->m.ctx), hs_net_exchange(n->net), HS__NODE_STOP_SETTLE_MS);
        if (n->ck_req && n->cfg.checkpoint_dir) {
            n->ck_req = 0;
            if (write_checkpoint(n, r) < 0) HS_LOGW("%s", hs_error_message());
        }
        return hs__err(HS_EINTR, "stopped by a request before round %llu", (unsigned long long)r);
    }
    warn_unsharded(n);
    int err = hs__node_await_job(n->net, n->join_ms, &n->stop);
    if (err == 0) err = publish(n, r, hs_net_snapshot_wanted(n->net) ? MODEL : DROP);
    if (err == 0 && n->m.round_begin) err = n->m.round_begin(n->m.ctx, r);
    return err;
}

/* Removed and let in again (recover): the engine starts over at the round the job let this
 * peer in, on the new runtime's exchange. */
static void engine_restart(hs_node *n) {
    n->eng.ex = hs_net_exchange(n->net);
    hs__round_restart(&n->eng, n->r);
}

/* Opens round n->r (the engine's OPEN), recovering from a removal as often as it happens. */
static int round_top(hs_node *n) {
    for (;;) {
        int err = hs__round_run(&n->eng, HS__PH_LOCAL);
        if (err >= 0 || n->stopped) return err;
        if ((err = recover(n, err)) != 0) return err;
        engine_restart(n);
    }
}

/* What this node is at after `round` rounds: the one source of its metrics line and of its
 * progress line, so that the two agree (docs/METRICS.md). */
static void node_record(hs_node *n, hs_metrics_rec *m, uint64_t round) {
    hs_net_stats ns;
    hs_net_stats_get(n->net, &ns);
    hs_metrics_init(m);
    hs_metrics_set(m, HS_MF_PEER, n->self);
    hs_metrics_set(m, HS_MF_ROUND, (double)round);
    /* Passes over this peer's shard, counting steps adopted from a snapshot. */
    if (!isnan(n->epoch)) hs_metrics_set(m, HS_MF_EPOCH, n->epoch);
    hs_metrics_set(m, HS_MF_TIME, hs__node_now() - n->t0);
    hs_metrics_from_algo(m, n->m.algo(n->m.ctx));
    hs_metrics_from_net(m, &ns);
    double acc = !isnan(n->test_acc) ? n->test_acc : n->acc;
    if (!isnan(acc)) hs_metrics_set(m, HS_MF_TEST_ACC, acc);
    if (!isnan(n->test_loss)) hs_metrics_set(m, HS_MF_TEST_LOSS, n->test_loss);
}

/* The round's metrics record, kept for hs_node_metrics_json and appended to the metrics file
 * when there is one: the one place a node's metrics are made. */
static int record_round(hs_node *n, uint64_t r, double rate) {
    hs_metrics_rec *m = &n->rec;
    node_record(n, m, r + 1);
    if (!isnan(n->loss)) hs_metrics_set(m, HS_MF_LOSS, n->loss);
    if (!isnan(n->lr)) hs_metrics_set(m, HS_MF_LR, n->lr);
    hs_metrics_set(m, HS_MF_ROUNDS_PER_S, rate);
    n->have_rec = 1;
    return n->metrics ? hs_metrics_write(n->metrics, m) : 0;
}

int hs_node_metrics_json(const hs_node *n, char *buf, size_t cap) {
    if (!n || !n->have_rec) return hs__err(HS_EINVAL, "node: no round has run yet");
    size_t len = hs_metrics_format(&n->rec, NULL, 0);
    if (!buf || len + 1 > cap || len > INT_MAX)
        return hs__err(HS_ERANGE, "node metrics: %zu bytes do not fit in %zu", len + 1, cap);
    hs_metrics_format(&n->rec, buf, cap);
    return (int)len;
}

int hs__node_fail(hs_node *n, const char *what) {
    if (n->guard) hs_guard_fail(n->guard, (double)n->r + 1, what);
    n->diverged = 1;
    return hs__err(HS_EDIVERGED, "%s", what);
}

const char *hs__node_diverged(const hs_node *n, double *round, const char **advice) {
    if (!n->diverged || !n->guard) return NULL;
    *round = hs_guard_round(n->guard);
    *advice = hs_guard_advice(n->guard);
    return hs_guard_reason(n->guard);
}

/* The consensus estimate is measured against the neighbours in the mix: the guard compares
 * windows of one neighbourhood only, and warms up again from this peer's first round, a rejoin,
 * a change of members or a neighbour found gone before the view drops it (guard.c says why). */
static void guard_follow_view(hs_node *n, hs_exchange *ex, uint64_t r, uint64_t gone) {
    hs_peer_view v;
    if (ex->ops->view(ex, r, &v) == 0 && hs_guard_follow(n->guard, (double)r, v.epoch, gone))
        HS_LOGD("round %llu: members v%llu, %llu neighbours gone: the guard's growth check "
                "warms up again", (unsigned long long)r, (unsigned long long)v.epoch,
                (unsigned long long)gone);
}

static hs_algo *e_algo(void *c) {
    hs_node *n = c;
    return n->m.algo(n->m.ctx);
}
static float *e_x(void *c) {
    hs_node *n = c;
    return n->m.x(n->m.ctx);
}
static int e_local(void *c, uint64_t r, hs_round_stats *st) {
    (void)st;
    hs_node *n = c;
    return n->m.local ? n->m.local(n->m.ctx, r) : 0;
}
static int e_close(void *c, uint64_t r) {
    hs_node *n = c;
    return n->m.round_end ? n->m.round_end(n->m.ctx, r) : 0;
}

/* The round's end: checkpoint timing, the guard, the metrics record and the progress line,
 * a neighbour's divergence. 1 when the job ends with this round. */
static int node_end(void *c, uint64_t r) {
    hs_node *n = c;
    const hs__node_cfg *cfg = &n->cfg;
    hs_algo *a = n->m.algo(n->m.ctx);
    n->rounds_done++;
    int last = r + 1 == n->jt.end;
    if (cfg->checkpoint_dir && cfg->checkpoint_every > 0 &&
        (r + 1) % (uint64_t)cfg->checkpoint_every == 0 && !last &&
        write_checkpoint(n, r + 1) < 0)
        HS_LOGW("%s", hs_error_message()); /* training goes on without this checkpoint */
    hs_algo_stats as;
    hs_algo_get_stats(a, &as);
    guard_follow_view(n, hs_net_exchange(n->net), r, as.gone);
    double acc = !isnan(n->test_acc) ? n->test_acc : n->acc;
    /* A loss not reported (NaN) is not known to the guard (negative), not a broken run. */
    /* The model's mean square (z = x / w for SGP, the space its consensus estimate is measured
     * in) is the scale the guard compares that estimate with; non-finite when a parameter is. */
    double ms;
    int err = n->m.eval_ms(n->m.ctx, &ms);
    if (err < 0) return err;
    hs_guard_obs ob = {(double)r + 1, as.disagreement, ms,
                       isnan(n->loss) ? -1.0 : n->loss, acc};
    hs_guard_verdict verdict = hs_guard_observe(n->guard, &ob);
    if (verdict == HS_GUARD_DIVERGING)
        HS_LOGW("round %llu: the run is diverging: %s; %s; going on (--on-divergence warn)",
                (unsigned long long)r + 1, hs_guard_reason(n->guard), hs_guard_advice(n->guard));
    double now = hs__node_now();
    double rate = n->rounds_done / (now - n->t_round0 > 1e-9 ? now - n->t_round0 : 1e-9);
    if ((err = record_round(n, r, rate)) < 0) return err;
    if (!cfg->quiet && (!isnan(acc) || now - n->last_print > 5.0)) {
        /* A caller that reports no loss (NaN) gets none shown, not "loss nan". */
        const hs_metrics_rec *m = &n->rec;
        char accs[32] = "", losss[32] = "";
        if (!isnan(acc)) snprintf(accs, sizeof(accs), "  test acc %.2f%%", 100 * acc);
        if (!isnan(hs_metrics_get(m, HS_MF_LOSS)))
            snprintf(losss, sizeof(losss), "  loss %.4f", hs_metrics_get(m, HS_MF_LOSS));
        HS_LOGI("round %.0f/%llu%s%s  consensus %.3g  sent %.3f MB  %.1f rounds/s",
                hs_metrics_get(m, HS_MF_ROUND), (unsigned long long)n->jt.end, losss, accs,
                hs_metrics_get(m, HS_MF_CONSENSUS),
                hs_metrics_get(m, HS_MF_BYTES_SENT) / 1e6, hs_metrics_get(m, HS_MF_ROUNDS_PER_S));
        n->last_print = now;
    }
    reset_reports(n);
    n->r = r + 1;
    if (verdict == HS_GUARD_DIVERGED) {
        n->diverged = 1;
        return hs__err(HS_EDIVERGED, "%s", hs_guard_reason(n->guard));
    }
    /* A neighbour that diverged ran with the same settings: under policy stop the whole job
     * stops, each peer telling its own neighbours in turn. */
    uint32_t who;
    char why[400];
    if (!n->told && hs_net_nbr_diverged(n->net, &who, why, sizeof(why))) {
        n->told = 1;
        if (cfg->guard.policy == HS_GUARD_STOP) {
            char reason[480];
            snprintf(reason, sizeof(reason), "peer %u diverged: %s", who, why);
            return hs__node_fail(n, reason);
        }
        HS_LOGW("peer %u diverged (%s); going on (--on-divergence warn)", who, why);
    }
    return last;
}

static hs__round_model engine_model(hs_node *n) {
    hs__round_model m = {n, e_algo, e_x, node_open, e_local, e_close, node_end};
    return m;
}

/* The rest of round n->r from its local steps (the owner's, or none: the caller took them),
 * then the next round's open. */
static int step(hs_node *n) {
    if (n->state != ST_RUNNING)
        return hs__err(HS_EINVAL, "node: step %s", n->state == ST_ENDED ? "after the job's end"
                                                                        : "before hs_node_start");
    int err = hs__round_run(&n->eng, HS__PH_OPEN);
    if (err == 0) return round_top(n);
    if (err > 0) return err;
    switch (n->eng.next) {
    case HS__PH_PUSH:
    case HS__PH_PULL:
        /* Removed and let in again: this round is void, the next starts from the job's state. */
        if ((err = recover(n, err)) != 0) return err;
        reset_reports(n);
        engine_restart(n);
        return round_top(n);
    case HS__PH_LOCAL:
    case HS__PH_CLOSE: {
        /* A non-finite loss, or a non-finite outer momentum (the outer step's own check),
         * stops the run as the guard would, saying why. */
        if (err != HS_EDIVERGED) return err;
        char why[400]; /* hs__err must not format the buffer it writes */
        snprintf(why, sizeof(why), "%s", hs_error_message());
        return hs__node_fail(n, why);
    }
    default:
        return err;
    }
}

int hs__node_step(hs_node *n) {
    int rc = step(n);
    /* The job's end or an error: no round is open any more. */
    if ((rc < 0 && n->state == ST_RUNNING) || rc == 1) n->state = ST_ENDED;
    return rc;
}

/* ---------------------------------------------------------------- leave */

int hs_node_leave(hs_node *n) {
    if (!n || n->left || !n->net) return 0;
    n->left = 1;
    n->state = ST_ENDED;
    /* Removed by the job: nothing to say goodbye to, and the caller must know. */
    if (!n->stopped && hs_net_in_job(n->net, 0) == HS_ECANCELED) return HS_ECANCELED;
    double dround = 0;
    const char *advice = NULL, *reason = hs__node_diverged(n, &dround, &advice);
    if (reason) HS_LOGE("diverged at round %.0f: %s; %s", dround, reason, advice);
    if (n->ck_req && n->cfg.checkpoint_dir && n->m.save && write_checkpoint(n, n->r) < 0)
        HS_LOGW("%s", hs_error_message());
    if (n->metrics) {
        hs_metrics_rec m;
        node_record(n, &m, n->r);
        hs_metrics_set_str(&m, HS_MF_EVENT, reason ? "diverged" : n->stopped ? "stopped" : "done");
        if (reason) {
            hs_metrics_set_str(&m, HS_MF_REASON, reason);
            hs_metrics_set_str(&m, HS_MF_ADVICE, advice);
        }
        if (hs_metrics_write(n->metrics, &m) < 0) HS_LOGW("%s", hs_error_message());
    }
    /* Graceful: the round is complete, neighbours re-weight at once on BYE. */
    int err = reason ? hs_net_leave_diverged(n->net, 5000, reason) : hs_net_leave(n->net, 5000);
    if (err < 0) HS_LOGW("leave: %s", hs_error_message());
    return 0;
}

void hs_node_free(hs_node *n) {
    if (!n) return;
    if (n->state == ST_RUNNING || n->state == ST_ENDED) hs_node_leave(n);
    hs_metrics_close(n->metrics);
    hs_guard_free(n->guard);
    hs_net_free(n->net);
    hs_buf_unref(n->snap);
    hs_net_welcome_clear(&n->w);
    hs_checkpoint_clear(&n->ck);
    if (n->vec_free) n->vec_free(n->vec);
    hs_node_options_free(n->opts);
    free(n);
}

void *hs__node_vec(const hs_node *n) { return n->vec; }
void hs__node_set_vec(hs_node *n, void *v, void (*free_fn)(void *)) {
    n->vec = v;
    n->vec_free = free_fn;
}
size_t hs__node_dim(const hs_node *n) { return n->d; }
const hs__node_cfg *hs__node_config(const hs_node *n) { return &n->cfg; }
hs_net *hs__node_net(const hs_node *n) { return n->net; }
