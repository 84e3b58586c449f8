/* hearsay sim: n peers in one process, deterministic (seeded), with the same algorithm code as
 * networked peers. Synchronous algorithms run in lockstep; SGP runs in virtual time so that
 * stragglers (--slowdown) fall behind as they would on a network; --links times every round in
 * seconds with a link profile's delays, rates and compute factors (docs/WAN.md). Prints progress,
 * writes JSON-lines metrics, and ends with a summary; Ctrl-C stops after the current round. */
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
#include "sim/job.h"
#include "sim/linktime.h"
#include "wan/profile.h"

enum {
    S_N = 'n',
    S_LATENCY = 256,
    S_SAVE_DIR,
    S_LINKS,
    S_STEP_TIME,
    S_CPU_PEERS,
    S_LINK_HEADERS,
    S_LINK_TCP
};

static const hs_cli_opt sim_opts[] = {
    {"peers", S_N, "N", "number of simulated peers (default: 8)"},
    {"slowdown", RO_SLOWDOWN, "F|I:F,..",
     "stragglers: F slows peer 0 F-fold; I:F slows peer I (virtual time)"},
    {"latency", S_LATENCY, "R", "message latency in rounds of a normal peer, for sgp (default: 0)"},
    {"save-dir", S_SAVE_DIR, "DIR", "write each peer's final model to DIR/peer-I.bin (raw float32)"},
    {"links", S_LINKS, "FILE",
     "link profile of tools/wan (docs/WAN.md): virtual time in seconds with its per-link delays "
     "and rates and per-peer compute factors; also prints DDP's ring all-reduce time"},
    {"step-time", S_STEP_TIME, "S",
     "with --links: seconds of one local step of a peer of compute factor 1 (default: 0.01)"},
    {"cpu-peers", S_CPU_PEERS, "I,J,..",
     "with --device cuda: these peers train and gossip on the CPU, the others on the GPU (one "
     "job of both kinds)"},
    {"link-headers", S_LINK_HEADERS, "BYTES",
     "with --links: IP and TCP header bytes each packet adds to a message (default: 52, as "
     "Linux with TCP timestamps; 0: a message costs its payload only)"},
    {"link-tcp", S_LINK_TCP, "MODEL",
     "with --links: fluid (every link passes its full rate), reno or bbr: the share of a busy "
     "link TCP gets, as measured with that congestion control in tools/wan (docs/WAN.md; "
     "default: fluid)"},
    {NULL, 0, NULL, NULL},
};

typedef struct sim_args {
    hs_runopts ro;
    int n;
    double latency, step_time;
    int latency_set, step_time_set, link_headers, link_headers_set;
    const char *save_dir, *links, *cpu_peers, *link_tcp;
    long rounds;
} sim_args;

static int handle(void *ctx, int key, const char *v) {
    sim_args *a = ctx;
    int rc = hs__runopts_handle(&a->ro, key, v);
    if (rc != 1) return rc;
    switch (key) {
    case S_N: return hs__cli_int("--peers", v, 1, 4096, &a->n);
    case S_LATENCY:
        a->latency_set = 1;
        return hs__cli_double("--latency", v, 0, 1e6, &a->latency);
    case S_SAVE_DIR: a->save_dir = v; return 0;
    case S_LINKS: a->links = v; return 0;
    case S_CPU_PEERS: a->cpu_peers = v; return 0;
    case S_STEP_TIME:
        a->step_time_set = 1;
        return hs__cli_double("--step-time", v, 1e-9, 1e6, &a->step_time);
    case S_LINK_HEADERS:
        a->link_headers_set = 1;
        return hs__cli_int("--link-headers", v, 0, 1000, &a->link_headers);
    case S_LINK_TCP: a->link_tcp = v; return 0;
    }
    return hs__cli_usage_error("internal: unhandled option %d", key);
}

/* --cpu-peers: peer_be[i] = cpu for each listed peer i of n. */
static int parse_cpu_peers(const char *s, int n, hs_backend *cpu, hs_backend **peer_be) {
    const char *p = s;
    for (;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= n || (*end && *end != ','))
            return hs__cli_usage_error("--cpu-peers '%s': expected peer numbers 0..%d separated "
                                       "by commas", s, n - 1);
        peer_be[v] = cpu;
        if (!*end) return 0;
        p = end + 1;
    }
}

/* The progress line of an evaluated round. */
static void on_record(void *ctx, const hs_metrics_rec *rec) {
    const sim_args *a = ctx;
    if (a->ro.quiet) return;
    printf("round %.0f/%ld (epoch %.2f)  loss %.4f  acc mean %.2f%% min %.2f%% max %.2f%%  "
           "consensus %.3g  sent %.3f MB/peer  %.1f s%s",
           hs_metrics_get(rec, HS_MF_ROUND), a->rounds, hs_metrics_get(rec, HS_MF_EPOCH),
           hs_metrics_get(rec, HS_MF_LOSS), 100 * hs_metrics_get(rec, HS_MF_TEST_ACC),
           100 * hs_metrics_get(rec, HS_MF_TEST_ACC_MIN),
           100 * hs_metrics_get(rec, HS_MF_TEST_ACC_MAX), hs_metrics_get(rec, HS_MF_CONSENSUS),
           hs_metrics_get(rec, HS_MF_BYTES_SENT) / 1e6, hs_metrics_get(rec, HS_MF_TIME),
           a->links ? "" : "\n");
    if (a->links) printf("  virtual time %.3f s\n", hs_metrics_get(rec, HS_MF_VTIME));
    fflush(stdout);
}

static void on_warning(void *ctx, double round, const char *reason, const char *advice) {
    (void)ctx;
    fprintf(stderr, "hearsay sim: warning: round %.0f: %s; %s; going on "
                    "(--on-divergence warn)\n", round, reason, advice);
}

int hs__cmd_sim(int argc, char **argv) {
    sim_args a;
    memset(&a, 0, sizeof(a));
    hs__runopts_default(&a.ro);
    a.n = 8;
    a.step_time = 0.01;
    a.link_headers = HS__LINKTIME_TCP_HEADERS;
    const hs_cli_opt *tables[] = {sim_opts, hs_runopts_table, NULL};
    int rc = hs__cli_expand_config(&argc, &argv, tables);
    if (rc < 0) return -rc;
    rc = hs__cli_parse(argc, argv, "sim", "[options]",
                          "Simulate N decentralized peers in one process: the same algorithm code "
                          "as networked peers, deterministic for a given --seed.",
                          tables, handle, &a, NULL, 0, NULL);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    if ((rc = hs__runopts_finish(&a.ro)) < 0) return -rc;
    if (a.links && a.latency_set)
        return -hs__cli_usage_error("--latency and --links: the profile's delays replace --latency");
    if (!a.links && a.step_time_set) return -hs__cli_usage_error("--step-time needs --links");
    if (!a.links && a.link_headers_set) return -hs__cli_usage_error("--link-headers needs --links");
    if (!a.links && a.link_tcp) return -hs__cli_usage_error("--link-tcp needs --links");
    if ((rc = hs__cli_precheck(a.ro.model, a.ro.metrics, a.ro.topology, a.n, a.ro.seed)) < 0)
        return -rc;
    double *slow = calloc((size_t)a.n, sizeof(double));
    if (!slow) return HS_EXIT_FAIL;
    if ((rc = hs__runopts_slowdown(a.ro.slowdown, a.n, slow)) < 0) {
        free(slow);
        return -rc;
    }
    hs__cli_install_signals();
    int exit_code = HS_EXIT_FAIL, err;
    hs_backend *be = NULL, *cpu = NULL, **peer_be = NULL;
    hs_dataset *train = NULL, *test = NULL;
    hs_sim *sim = NULL;
    hs_metrics_file *metrics = NULL;
    hs__wan_profile *profile = NULL;
    if (a.links && (err = hs__wan_profile_load(&profile, a.links)) < 0) {
        fprintf(stderr, "hearsay sim: --links: %s\n", hs_error_message());
        exit_code = err == HS_ENOMEM ? HS_EXIT_FAIL : HS_EXIT_USAGE;
        goto out;
    }
    if ((rc = hs__runopts_open(&a.ro, &be, &train, &test)) < 0) {
        exit_code = -rc;
        goto out;
    }
    if (a.cpu_peers) {
        hs_backend_cfg bc = {a.ro.threads, 0};
        if (be->host_memory) {
            exit_code = -hs__cli_usage_error("--cpu-peers: every peer is on the CPU already "
                                             "(use --device cuda)");
            goto out;
        }
        if (!(peer_be = calloc((size_t)a.n, sizeof(*peer_be)))) goto out;
        if (hs_backend_open(&cpu, HS_DEVICE_CPU, &bc) < 0) {
            fprintf(stderr, "hearsay sim: --cpu-peers: %s\n", hs_error_message());
            goto out;
        }
        if ((rc = parse_cpu_peers(a.cpu_peers, a.n, cpu, peer_be)) < 0) {
            exit_code = -rc;
            goto out;
        }
    }
    size_t shard_n = train->n / (size_t)a.n;
    long rounds = a.rounds = hs__runopts_rounds(&a.ro, shard_n);
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
    sc.peer_be = peer_be;
    if ((rc = hs__runopts_trainer_cfg(&a.ro, train, rounds, &sc.trainer)) < 0) {
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
    if (profile && (err = hs__sim_set_links(sim, profile, a.step_time)) < 0) {
        fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
        exit_code = err == HS_EINVAL ? HS_EXIT_USAGE : HS_EXIT_FAIL;
        goto out;
    }
    if (profile && a.link_headers >= profile->mtu) {
        exit_code = -hs__cli_usage_error("--link-headers %d: must be below the profile's mtu %d",
                                         a.link_headers, profile->mtu);
        goto out;
    }
    if (profile) hs__sim_set_link_headers(sim, a.link_headers);
    if (a.link_tcp && hs__sim_set_link_tcp(sim, a.link_tcp) < 0) {
        exit_code = -hs__cli_usage_error("--link-tcp %s", hs_error_message());
        goto out;
    }
    if (a.ro.metrics && (err = hs_metrics_open(&metrics, a.ro.metrics, 0)) < 0) {
        fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
        exit_code = HS_EXIT_USAGE;
        goto out;
    }
    if (!a.ro.quiet)
        printf("hearsay sim: %d peers, %s, %s, topology %s, %s shards of ~%zu examples; "
               "%ld rounds (%ld per epoch) of %d local step%s, batch %d\n",
               a.n, hs_algo_kind_name(a.ro.algo.kind), a.ro.compress, a.ro.topology,
               a.ro.partition_spec, shard_n, rounds, rpe, a.ro.local_steps,
               a.ro.local_steps > 1 ? "s" : "", a.ro.batch);
    if (!a.ro.quiet && hs_algo_kind_uses_gamma_c(a.ro.algo.kind)) {
        char why[320];
        hs__runopts_choco_step(&a.ro, a.n, hs_model_spec_nparams(&sc.trainer.model), why, sizeof(why));
        char an[16];
        hs__cli_upper(an, sizeof(an), hs_algo_kind_name(a.ro.algo.kind));
        printf("hearsay sim: %s consensus step gamma_c = %g (%s)\n", an,
               (double)hs_algo_gamma_c(hs_trainer_algo(hs_sim_trainer(sim, 0))), why);
    }
    if (!a.ro.quiet && a.ro.optim.momentum_kind != HS_MOMENTUM_LOCAL)
        printf("hearsay sim: %s momentum, beta %g%s\n",
               a.ro.optim.momentum_kind == HS_MOMENTUM_QG
                   ? "quasi-global"
                   : "hybrid (heavy ball on the gradients, quasi-global on the gossip)",
               (double)a.ro.optim.momentum, a.ro.optim.nesterov ? ", Nesterov" : "");
    fflush(stdout);

    hs__sim_job_cfg jc = {rounds, rpe, a.ro.local_steps,
                          a.ro.eval_every > 0 ? a.ro.eval_every : rpe, test, {0}, metrics,
                          on_record, on_warning, hs__cli_interrupted, hs__cli_now, &a};
    hs__runopts_guard_cfg(&a.ro, rpe, &jc.guard);
    hs__sim_job_result res;
    if ((err = hs__sim_job_run(sim, &jc, &res)) < 0) {
        fprintf(stderr, "hearsay sim: %s\n", hs_error_message());
        goto out;
    }
    if (res.diverged) {
        fprintf(stderr, "hearsay sim: diverged at round %.0f: %s; %s\n", res.diverged_round,
                res.reason, res.advice);
        exit_code = HS_EXIT_DIVERGED;
        goto out;
    }
    for (int i = 0; a.save_dir && i < a.n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/peer-%d.bin", a.save_dir, i);
        if ((err = hs_trainer_write_params(hs_sim_trainer(sim, i), path)) < 0) {
            fprintf(stderr, "hearsay sim: --save-dir: %s\n", hs_error_message());
            goto out;
        }
    }
    double samples = 0, sent = res.sent_per_peer;
    for (int i = 0; i < a.n; i++)
        samples += (double)hs_trainer_steps(hs_sim_trainer(sim, i)) * a.ro.batch;
    printf("%s: test accuracy mean %.2f%% min %.2f%% max %.2f%% over %d peers; consensus %.3g; "
           "%.2f MB sent per peer (%.1f MB total); rounds per peer %llu..%llu; %.0f samples/s "
           "training and gossip; %.1f s",
           res.stopped ? "interrupted" : "final", 100 * res.acc_mean, 100 * res.acc_min,
           100 * res.acc_max, a.n, res.consensus, sent / 1e6, sent * a.n / 1e6,
           (unsigned long long)res.rounds_min, (unsigned long long)res.rounds_max,
           res.step_time_s > 0 ? samples / res.step_time_s : 0, res.time_s);
    if (profile)
        printf("; virtual time %.6f s (step %g s); DDP's ring all-reduce model, same steps: "
               "%.6f s (%.6f s per all-reduce of %.3f MB)",
               res.vtime_s, a.step_time, res.ddp_vtime_s, res.ddp_allreduce_s,
               4e-6 * (double)hs_trainer_dim(hs_sim_trainer(sim, 0)));
    printf("\n");
    fflush(stdout);
    exit_code = res.stopped ? HS_EXIT_SIGINT : HS_EXIT_OK;
out:
    hs_metrics_close(metrics);
    hs_sim_free(sim);
    hs__wan_profile_free(profile);
    hs_dataset_free(train);
    hs_dataset_free(test);
    hs_backend_close(be);
    hs_backend_close(cpu);
    free(peer_be);
    free(slow);
    return exit_code;
}
