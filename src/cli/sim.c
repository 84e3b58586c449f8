/* hearsay sim: n peers in one process, deterministic (seeded), with the same algorithm code as
 * networked peers. Synchronous algorithms run in lockstep; SGP runs in virtual time so that
 * stragglers (--slowdown) fall behind as they would on a network. Prints progress, writes
 * JSON-lines metrics, and ends with a summary; Ctrl-C stops after the current round. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/precheck.h"
#include "cli/runopts.h"
#include "hearsay/error.h"
#include "hearsay/guard.h"
#include "hearsay/metrics.h"
#include "hearsay/sim.h"

enum { S_N = 'n', S_LATENCY = 256, S_SAVE_DIR };

static const hs_cli_opt sim_opts[] = {
    {"peers", S_N, "N", "number of simulated peers (default: 8)"},
    {"slowdown", RO_SLOWDOWN, "F|I:F,..",
     "stragglers: F slows peer 0 F-fold; I:F slows peer I (virtual time)"},
    {"latency", S_LATENCY, "R", "message latency in rounds of a normal peer, for sgp (default: 0)"},
    {"save-dir", S_SAVE_DIR, "DIR", "write each peer's final model to DIR/peer-I.bin (raw float32)"},
    {NULL, 0, NULL, NULL},
};

typedef struct sim_args {
    hs_runopts ro;
    int n;
    double latency;
    const char *save_dir;
} sim_args;

static int handle(void *ctx, int key, const char *v) {
    sim_args *a = ctx;
    int rc = hs_runopts_handle(&a->ro, key, v);
    if (rc != 1) return rc;
    switch (key) {
    case S_N: return hs_cli_int("--peers", v, 1, 4096, &a->n);
    case S_LATENCY: return hs_cli_double("--latency", v, 0, 1e6, &a->latency);
    case S_SAVE_DIR: a->save_dir = v; return 0;
    }
    return hs_cli_usage_error("internal: unhandled option %d", key);
}

/* Progress in rounds of a normal-speed peer: the lockstep round, or in virtual time the earliest
 * clock (everyone has got that far). */
static double progress(hs_sim *sim, int sync) {
    double p = 0;
    for (int i = 0; i < hs_sim_n(sim); i++) {
        double c = sync ? (double)hs_sim_rounds(sim, i) : hs_sim_clock(sim, i);
        if (i == 0 || c < p) p = c;
    }
    return p;
}

typedef struct acc_stats {
    double mean, min, max, loss;
} acc_stats;

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
}

static void set_acc(hs_metrics_rec *m, const acc_stats *acc) {
    hs_metrics_set(m, HS_MF_TEST_ACC, acc->mean);
    hs_metrics_set(m, HS_MF_TEST_ACC_MIN, acc->min);
    hs_metrics_set(m, HS_MF_TEST_ACC_MAX, acc->max);
}

int hs_cmd_sim(int argc, char **argv) {
    sim_args a;
    memset(&a, 0, sizeof(a));
    hs_runopts_default(&a.ro);
    a.n = 8;
    const hs_cli_opt *tables[] = {sim_opts, hs_runopts_table, NULL};
    int rc = hs_cli_expand_config(&argc, &argv, tables);
    if (rc < 0) return -rc;
    rc = hs_cli_parse(argc, argv, "sim", "[options]",
                          "Simulate N decentralized peers in one process: the same algorithm code "
                          "as networked peers, deterministic for a given --seed.",
                          tables, handle, &a, NULL, 0, NULL);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    if ((rc = hs_runopts_finish(&a.ro)) < 0) return -rc;
    if ((rc = hs_cli_precheck(a.ro.model, a.ro.metrics, a.ro.topology, a.n, a.ro.seed)) < 0)
        return -rc;
    double *slow = calloc((size_t)a.n, sizeof(double));
    if (!slow) return HS_EXIT_FAIL;
    if ((rc = hs_runopts_slowdown(a.ro.slowdown, a.n, slow)) < 0) {
        free(slow);
        return -rc;
    }
    hs_cli_install_signals();
    int exit_code = HS_EXIT_FAIL, err;
    hs_backend *be = NULL;
    hs_dataset *train = NULL, *test = NULL;
    hs_sim *sim = NULL;
    hs_metrics_file *metrics = NULL;
    uint64_t *peer_rounds = NULL;
    hs_guard *guard = NULL;
    float *avg = NULL;
    if ((rc = hs_runopts_open(&a.ro, &be, &train, &test)) < 0) {
        exit_code = -rc;
        goto out;
    }
    size_t shard_n = train->n / (size_t)a.n;
    long rounds = hs_runopts_rounds(&a.ro, shard_n);
    long rpe = (long)ceil(ceil((double)shard_n / a.ro.batch) / a.ro.local_steps);
    if (rpe < 1) rpe = 1;
    hs_sim_cfg sc;
    memset(&sc, 0, sizeof(sc));
    sc.n = a.n;
    sc.topology = a.ro.topology;
    sc.algo = a.ro.algo;
    sc.partition = a.ro.partition;
    sc.seed = a.ro.seed;
    sc.slowdown = slow;
    sc.latency = a.latency;
    if ((rc = hs_runopts_trainer_cfg(&a.ro, train, rounds, &sc.trainer)) < 0) {
        exit_code = -rc;
        goto out;
    }
    if ((err = hs_sim_new(&sim, be, &sc, train)) < 0) {
        fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
        /* HS_ENOTSUP: the model needs a layer the --device lacks, a request that cannot be
         * met like a bad flag (hearsay train and run say the same). */
        exit_code = err == HS_EINVAL || err == HS_ENOTSUP ? HS_EXIT_USAGE : HS_EXIT_FAIL;
        goto out;
    }
    if (a.ro.metrics && (err = hs_metrics_open(&metrics, a.ro.metrics, 0)) < 0) {
        fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
        exit_code = HS_EXIT_USAGE;
        goto out;
    }
    long eval_every = a.ro.eval_every > 0 ? a.ro.eval_every : rpe;
    int sync = hs_algo_kind_synchronous(a.ro.algo.kind);
    if (!a.ro.quiet)
        printf("hearsay sim: %d peers, %s, %s, topology %s, %s shards of ~%zu examples; "
               "%ld rounds (%ld per epoch) of %d local step%s, batch %d\n",
               a.n, hs_algo_kind_name(a.ro.algo.kind), a.ro.compress, a.ro.topology,
               a.ro.partition_spec, shard_n, rounds, rpe, a.ro.local_steps,
               a.ro.local_steps > 1 ? "s" : "", a.ro.batch);
    if (!a.ro.quiet && hs_algo_kind_uses_gamma_c(a.ro.algo.kind)) {
        char why[320];
        hs_runopts_choco_step(&a.ro, a.n, hs_model_spec_nparams(&sc.trainer.model), why, sizeof(why));
        char an[16];
        hs_cli_upper(an, sizeof(an), hs_algo_kind_name(a.ro.algo.kind));
        printf("hearsay sim: %s consensus step gamma_c = %g (%s)\n", an,
               (double)hs_algo_gamma_c(hs_trainer_algo(hs_sim_trainer(sim, 0))), why);
    }
    if (!a.ro.quiet && a.ro.optim.momentum_kind == HS_MOMENTUM_QG)
        printf("hearsay sim: quasi-global momentum, beta %g%s\n", (double)a.ro.optim.momentum,
               a.ro.optim.nesterov ? ", Nesterov" : "");
    fflush(stdout);

    hs_guard_cfg gc;
    hs_runopts_guard_cfg(&a.ro, rpe, &gc);
    /* The guard's advice halves the step in use, not the 0 that means automatic. */
    if (hs_algo_kind_uses_gamma_c(a.ro.algo.kind))
        gc.gamma_c = hs_algo_gamma_c(hs_trainer_algo(hs_sim_trainer(sim, 0)));
    if ((err = hs_guard_new(&guard, &gc)) < 0 ||
        !(avg = malloc(sizeof(float) * hs_trainer_dim(hs_sim_trainer(sim, 0)))) ||
        !(peer_rounds = calloc((size_t)a.n, sizeof(*peer_rounds)))) {
        fprintf(stderr, "hearsay sim: out of memory\n");
        goto out;
    }
    double t0 = hs_cli_now(), cons = NAN, ms = NAN, observed = 0;
    acc_stats acc = {NAN, NAN, NAN, NAN};
    long next_eval = eval_every;
    int stopped = 0, diverged = 0;
    uint64_t steps = 0;
    double step_time = 0; /* in hs_sim_step only: training and gossip, not evaluation */
    for (;;) {
        if (hs_cli_interrupted()) {
            stopped = 1;
            break;
        }
        if (progress(sim, sync) >= (double)rounds) break;
        int peer;
        double ts = hs_cli_now();
        if ((err = hs_sim_step(sim, &peer)) < 0) {
            if (err == HS_EDIVERGED) {
                hs_guard_fail(guard, progress(sim, sync), hs_error_message());
                diverged = 1;
                break;
            }
            fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
            goto out;
        }
        step_time += hs_cli_now() - ts;
        steps++;
        double now = progress(sim, sync);
        int finished = now >= (double)rounds;
        int do_eval = now >= (double)next_eval || finished;
        /* The guard sees every round (the exact consensus costs O(n d), little next to a
         * round of training), the test accuracy where it is measured. */
        if (floor(now) <= observed && !do_eval) continue;
        observed = floor(now);
        double loss = 0;
        for (int i = 0; i < a.n; i++) loss += hs_sim_round_stats(sim, i)->loss;
        loss /= a.n;
        if ((err = consensus_of(sim, avg, &cons, &ms)) < 0) {
            fprintf(stderr, "hearsay sim: consensus: %s\n", hs_error_message());
            goto out;
        }
        if (do_eval && (err = evaluate_all(sim, test, &acc)) < 0) {
            fprintf(stderr, "hearsay sim: evaluate: %s\n", hs_error_message());
            goto out;
        }
        hs_guard_obs ob = {now, cons, ms, loss, do_eval ? acc.mean : NAN};
        hs_guard_verdict v = hs_guard_observe(guard, &ob);
        if (v == HS_GUARD_DIVERGING)
            fprintf(stderr, "hearsay sim: warning: round %.0f: %s; %s; going on "
                            "(--on-divergence warn)\n", now, hs_guard_reason(guard),
                    hs_guard_advice(guard));
        if (!do_eval && v != HS_GUARD_DIVERGED) continue;
        while (next_eval <= now) next_eval += eval_every;
        hs_metrics_rec rec;
        sim_record(&rec, sim, hs_cli_now() - t0);
        hs_metrics_set(&rec, HS_MF_ROUND, now);
        hs_metrics_set(&rec, HS_MF_EPOCH, now / rpe);
        hs_metrics_set(&rec, HS_MF_LOSS, loss);
        set_acc(&rec, &acc);
        hs_metrics_set(&rec, HS_MF_TEST_LOSS, acc.loss);
        hs_metrics_set(&rec, HS_MF_CONSENSUS, cons);
        if (!sync) {
            for (int i = 0; i < a.n; i++) peer_rounds[i] = hs_sim_rounds(sim, i);
            rec.peer_rounds = peer_rounds;
            rec.n_peer_rounds = a.n;
        }
        if (!a.ro.quiet && do_eval) {
            printf("round %.0f/%ld (epoch %.2f)  loss %.4f  acc mean %.2f%% min %.2f%% max %.2f%%  "
                   "consensus %.3g  sent %.3f MB/peer  %.1f s\n",
                   now, rounds, hs_metrics_get(&rec, HS_MF_EPOCH), loss, 100 * acc.mean,
                   100 * acc.min, 100 * acc.max, cons, hs_metrics_get(&rec, HS_MF_BYTES_SENT) / 1e6,
                   hs_metrics_get(&rec, HS_MF_TIME));
            fflush(stdout);
        }
        if (metrics && do_eval && (err = hs_metrics_write(metrics, &rec)) < 0) {
            fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
            goto out;
        }
        if (v == HS_GUARD_DIVERGED) {
            diverged = 1;
            break;
        }
        if (finished) break;
    }
    if (diverged) {
        /* The reason and the knob, on stderr and as the metrics' last record, so that a script
         * tells a diverged run from a finished or a killed one. */
        double r = hs_guard_round(guard);
        fprintf(stderr, "hearsay sim: diverged at round %.0f: %s; %s\n", r, hs_guard_reason(guard),
                hs_guard_advice(guard));
        if (metrics) {
            hs_metrics_rec rec;
            sim_record(&rec, sim, hs_cli_now() - t0);
            hs_metrics_set_str(&rec, HS_MF_EVENT, "diverged");
            hs_metrics_set_str(&rec, HS_MF_REASON, hs_guard_reason(guard));
            hs_metrics_set_str(&rec, HS_MF_ADVICE, hs_guard_advice(guard));
            hs_metrics_set(&rec, HS_MF_ROUND, r);
            hs_metrics_set(&rec, HS_MF_TEST_ACC, acc.mean);
            hs_metrics_set(&rec, HS_MF_CONSENSUS, cons);
            if ((err = hs_metrics_write(metrics, &rec)) < 0) {
                fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
                goto out;
            }
        }
        exit_code = HS_EXIT_DIVERGED;
        goto out;
    }
    {
        uint64_t rmin = UINT64_MAX, rmax = 0;
        for (int i = 0; i < a.n; i++) {
            uint64_t r = hs_sim_rounds(sim, i);
            rmin = r < rmin ? r : rmin;
            rmax = r > rmax ? r : rmax;
        }
        if (stopped && (err = evaluate_all(sim, test, &acc)) < 0) goto out;
        hs_metrics_rec rec;
        sim_record(&rec, sim, hs_cli_now() - t0);
        hs_metrics_set_str(&rec, HS_MF_EVENT, stopped ? "interrupted" : "done");
        set_acc(&rec, &acc);
        hs_metrics_set(&rec, HS_MF_CONSENSUS, cons);
        hs_metrics_set(&rec, HS_MF_ROUNDS_MIN, (double)rmin);
        hs_metrics_set(&rec, HS_MF_ROUNDS_MAX, (double)rmax);
        if (metrics && hs_metrics_write(metrics, &rec) < 0)
            fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
        double sent = hs_metrics_get(&rec, HS_MF_BYTES_SENT), el = hs_metrics_get(&rec, HS_MF_TIME);
        for (int i = 0; a.save_dir && i < a.n; i++) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/peer-%d.bin", a.save_dir, i);
            if ((err = hs_trainer_write_params(hs_sim_trainer(sim, i), path)) < 0) {
                fprintf(stderr, "hearsay sim: --save-dir: %s\n", hs_error_message());
                goto out;
            }
        }
        double samples = 0;
        for (int i = 0; i < a.n; i++)
            samples += (double)hs_trainer_steps(hs_sim_trainer(sim, i)) * a.ro.batch;
        printf("%s: test accuracy mean %.2f%% min %.2f%% max %.2f%% over %d peers; consensus %.3g; "
               "%.2f MB sent per peer (%.1f MB total); rounds per peer %llu..%llu; %.0f samples/s "
               "training and gossip; %.1f s\n",
               stopped ? "interrupted" : "final", 100 * acc.mean, 100 * acc.min, 100 * acc.max,
               a.n, cons, sent / 1e6, sent * a.n / 1e6, (unsigned long long)rmin,
               (unsigned long long)rmax, step_time > 0 ? samples / step_time : 0, el);
        fflush(stdout);
    }
    exit_code = stopped ? HS_EXIT_SIGINT : HS_EXIT_OK;
out:
    hs_metrics_close(metrics);
    free(peer_rounds);
    hs_guard_free(guard);
    free(avg);
    hs_sim_free(sim);
    hs_dataset_free(train);
    hs_dataset_free(test);
    hs_backend_close(be);
    free(slow);
    return exit_code;
}
