/* The node API with a caller-owned vector: three nodes (one thread each, one process, loopback)
 * whose callers do no local update, so the gossip alone must bring the vectors together; the
 * options' validation; metrics and round counters; checkpoints of the gossip state and a resume
 * from them; the defaults against `hearsay run`'s. Every wait is bounded by the nodes' own
 * timeouts and the meson timeout. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>

#include "hearsay/error.h"
#include "hearsay/node.h"
#include "node/node_internal.h"

#define N 3
#define D 1000

typedef struct run {
    const char *algo, *compress;
    long rounds;
    char dir[64];
    const char *extra[4]; /* name, value pairs */
} run;

typedef struct peer {
    const run *job;
    int rank;
    float x[D];
    int rc_start, rc_last;
    uint32_t id, id_before;
    int node_rank, rank_before;
    atomic_int steps, rc_done;
    hs_node *_Atomic node; /* for another thread's stop request */
    uint64_t round_after;
    char metrics[2048];
    int metrics_len;
    char msg[512];
} peer;

static void fill(float *x, int rank) {
    /* Different vectors per peer, a deterministic spread of about 1. */
    uint32_t s = 2654435761u * (uint32_t)(rank + 1);
    for (int k = 0; k < D; k++) {
        s = s * 1664525u + 1013904223u;
        x[k] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f + (float)rank;
    }
}

static double distance(peer *p) {
    double dist = 0;
    for (int k = 0; k < D; k++) {
        double m = 0;
        for (int i = 0; i < N; i++) m += p[i].x[k];
        m /= N;
        for (int i = 0; i < N; i++) dist += (p[i].x[k] - m) * (p[i].x[k] - m);
    }
    return dist;
}

static hs_node_options *options(const run *j, int rank) {
    hs_node_options *o;
    assert_int_equal(hs_node_options_new(&o), 0);
    char rv[128], r[16], rounds[32];
    snprintf(rv, sizeof(rv), "%s/rendezvous", j->dir);
    snprintf(r, sizeof(r), "%d", rank);
    snprintf(rounds, sizeof(rounds), "%ld", j->rounds);
    const char *kv[][2] = {{"insecure", "1"}, {"listen", "127.0.0.1:0"}, {"world", "3"},
                           {"rank", r}, {"rendezvous", rv}, {"rounds", rounds},
                           {"algo", j->algo}, {"compress", j->compress}, {"quiet", "1"},
                           {"same-start", "0"}, {"run-id", j->dir + 5}, {"join-timeout", "60000"},
                           /* vectors 1 apart are far apart for a training run's guard */
                           {"on-divergence", "warn"}};
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
        assert_int_equal(hs_node_options_set(o, kv[i][0], kv[i][1]), 0);
    for (int i = 0; i < 4 && j->extra[i]; i += 2)
        assert_int_equal(hs_node_options_set(o, j->extra[i], j->extra[i + 1]), 0);
    return o;
}

static void *peer_main(void *arg) {
    peer *p = arg;
    hs_node_options *o = options(p->job, p->rank);
    hs_node *n = NULL;
    int rc = hs_node_new(&n, o, D);
    hs_node_options_free(o);
    atomic_store(&p->node, n);
    p->id_before = hs_node_id(n);
    p->rank_before = hs_node_rank(n);
    if (rc == 0) rc = p->rc_start = hs_node_start(n, p->x, D);
    else p->rc_start = rc;
    p->id = hs_node_id(n);
    p->node_rank = hs_node_rank(n);
    while (rc == 0) {
        rc = hs_node_step(n, p->x, D);
        p->steps++;
    }
    p->rc_last = rc;
    atomic_store(&p->rc_done, 1);
    if (rc < 0) snprintf(p->msg, sizeof(p->msg), "%s", hs_error_message());
    if (n) {
        p->round_after = hs_node_round(n);
        p->metrics_len = hs_node_metrics_json(n, p->metrics, sizeof(p->metrics));
        hs_node_leave(n);
    }
    hs_node_free(n);
    return NULL;
}

static void run_job(const run *j, peer *p) {
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        memset(&p[i], 0, sizeof(p[i]));
        p[i].job = j;
        p[i].rank = i;
        fill(p[i].x, i);
    }
    for (int i = 0; i < N; i++) assert_int_equal(pthread_create(&th[i], NULL, peer_main, &p[i]), 0);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        if (p[i].rc_last != 1) fprintf(stderr, "peer %d: %d: %s\n", i, p[i].rc_last, p[i].msg);
        assert_int_equal(p[i].rc_start, 0);
        assert_int_equal(p[i].rc_last, 1); /* the job's last round */
        assert_int_equal(p[i].steps, j->rounds);
        /* Unknown before the start; then the rank asked for and an id of its own. */
        assert_int_equal(p[i].id_before, HS_NODE_NO_ID);
        assert_int_equal(p[i].rank_before, -1);
        assert_int_equal(p[i].node_rank, i);
        assert_true(p[i].id < N);
        for (int k = 0; k < i; k++) assert_int_not_equal(p[i].id, p[k].id);
    }
}

static void make_dir(run *j) {
    strcpy(j->dir, "/tmp/hs-node-XXXXXX");
    assert_non_null(mkdtemp(j->dir));
}

static void drop_dir(run *j) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", j->dir);
    assert_int_equal(system(cmd), 0);
}

static double start_distance(void) {
    static peer p[N];
    for (int i = 0; i < N; i++) fill(p[i].x, i);
    return distance(p);
}

static void test_dpsgd_consensus(void **state) {
    (void)state;
    static peer p[N];
    run j = {"dpsgd", "none", 30, "", {NULL}};
    make_dir(&j);
    run_job(&j, p);
    double d0 = start_distance(), d1 = distance(p);
    fprintf(stderr, "# dpsgd: distance %g -> %g\n", d0, d1);
    assert_true(d1 < d0 / 1000);
    /* Gossip with a doubly stochastic W keeps the average: the peers meet at their mean. */
    static peer p0[N];
    for (int i = 0; i < N; i++) fill(p0[i].x, i);
    for (int k = 0; k < D; k++) {
        double m0 = 0, m1 = 0;
        for (int i = 0; i < N; i++) {
            m0 += p0[i].x[k];
            m1 += p[i].x[k];
        }
        assert_true(fabs(m0 - m1) / N < 1e-4);
    }
    /* The record of the last round, as a line of --metrics would say it. */
    for (int i = 0; i < N; i++) {
        char want[48];
        snprintf(want, sizeof(want), "\"round\":%llu,", (unsigned long long)p[i].round_after);
        assert_true(p[i].metrics_len > 0);
        assert_int_equal(p[i].metrics_len, (int)strlen(p[i].metrics));
        assert_non_null(strstr(p[i].metrics, want));
        assert_non_null(strstr(p[i].metrics, "\"consensus\":"));
        assert_int_equal(p[i].round_after, p[0].round_after);
    }
    drop_dir(&j);
}

/* Runs job j to its end and checks that the gossip brought the vectors 1000x closer. */
static void converges(run *j, const char *what) {
    static peer p[N];
    make_dir(j);
    run_job(j, p);
    double d0 = start_distance(), d1 = distance(p);
    fprintf(stderr, "# %s: distance %g -> %g\n", what, d0, d1);
    assert_true(d1 < d0 / 1000);
    drop_dir(j);
}

static void test_choco_topk_consensus(void **state) {
    (void)state;
    run j = {"choco", "topk:0.1", 400, "", {NULL}};
    converges(&j, "choco topk:0.1");
}

/* Consensus only (the caller changes nothing between steps) with the outer Nesterov step on
 * the node API's vector: the peers still meet, at their mean; and as D-PSGD mixes exactly,
 * the outer momentum takes the caller's change only (none here), so the run gives the plain
 * D-PSGD job's bits (outer.c). */
static void test_outer_consensus(void **state) {
    (void)state;
    static peer p[N], p0[N], plain[N];
    run j = {"dpsgd", "none", 60, "", {"outer-lr", "0.7", "outer-momentum", "0.9"}};
    run jp = {"dpsgd", "none", 60, "", {NULL}};
    make_dir(&jp);
    run_job(&jp, plain);
    drop_dir(&jp);
    make_dir(&j);
    run_job(&j, p);
    for (int i = 0; i < N; i++) assert_memory_equal(p[i].x, plain[i].x, sizeof(p[i].x));
    double d0 = start_distance(), d1 = distance(p);
    fprintf(stderr, "# dpsgd with outer 0.7/0.9: distance %g -> %g\n", d0, d1);
    assert_true(d1 < d0 / 1000);
    for (int i = 0; i < N; i++) fill(p0[i].x, i);
    for (int k = 0; k < D; k++) {
        double m0 = 0, m1 = 0;
        for (int i = 0; i < N; i++) {
            m0 += p0[i].x[k];
            m1 += p[i].x[k];
        }
        assert_true(fabs(m0 - m1) / N < 1e-4);
    }
    drop_dir(&j);
}

static void expect_einval(const char *name, const char *value, const char *named) {
    hs_node_options *o;
    assert_int_equal(hs_node_options_new(&o), 0);
    assert_int_equal(hs_node_options_set(o, name, value), HS_EINVAL);
    if (!strstr(hs_error_message(), named)) fprintf(stderr, "message: %s\n", hs_error_message());
    assert_non_null(strstr(hs_error_message(), named));
    hs_node_options_free(o);
}

/* A value's own error keeps its text once, after the option's name. */
static void expect_message(const char *name, const char *value, const char *want) {
    hs_node_options *o;
    assert_int_equal(hs_node_options_new(&o), 0);
    assert_int_equal(hs_node_options_set(o, name, value), HS_EINVAL);
    const char *m = hs_error_message();
    if (strcmp(m, want)) fprintf(stderr, "message: %s\nwanted:  %s\n", m, want);
    assert_string_equal(m, want);
    hs_node_options_free(o);
}

static void test_option_messages(void **state) {
    (void)state;
    expect_message("compress", "topk:2.5x",
                   "node option compress: 'topk:2.5x': compressor \"topk:2.5x\": fraction "
                   "\"2.5x\" is not in (0, 1]");
    expect_message("compress", "topk:2.5",
                   "node option compress: 'topk:2.5': compressor \"topk:2.5\": fraction \"2.5\" "
                   "is not in (0, 1]");
    hs_node_options *o;
    assert_int_equal(hs_node_options_new(&o), 0);
    assert_int_equal(hs_node_options_set(o, "emulate", "delay=fast"), HS_EINVAL);
    const char *m = hs_error_message(), *p = "node option emulate: 'delay=fast': ";
    fprintf(stderr, "# %s\n", m);
    assert_int_equal(strncmp(m, p, strlen(p)), 0);
    assert_null(strstr(m + strlen(p), "node option"));
    assert_true(strlen(m) > strlen(p));
    hs_node_options_free(o);
}

static void test_option_errors(void **state) {
    (void)state;
    expect_einval("wrold", "3", "wrold");
    expect_einval("world", "0", "world");
    expect_einval("algo", "gossip", "algo");
    expect_einval("compress", "topk", "compress");
    expect_einval("gamma-c", "2", "gamma-c");
    expect_einval("insecure", "yes", "insecure");
    expect_einval("listen", "nowhere", "listen");
    /* Each value alone is fine; together they are checked by hs_node_new. */
    hs_node_options *o;
    hs_node *n = NULL;
    assert_int_equal(hs_node_options_new(&o), 0);
    assert_int_equal(hs_node_new(&n, o, 10), HS_EINVAL); /* no security mode */
    assert_non_null(strstr(hs_error_message(), "secret-file"));
    assert_int_equal(hs_node_options_set(o, "secret-file", "/nonexistent/job.key"), 0);
    assert_int_equal(hs_node_new(&n, o, 10), HS_EINVAL); /* checked before any start */
    assert_non_null(strstr(hs_error_message(), "secret-file /nonexistent/job.key"));
    assert_int_equal(hs_node_options_set(o, "secret-file", ""), 0); /* unset again */
    assert_int_equal(hs_node_options_set(o, "insecure", "1"), 0);
    assert_int_equal(hs_node_options_set(o, "algo", "dpsgd"), 0);
    assert_int_equal(hs_node_options_set(o, "gamma-c", "0.5"), 0);
    assert_int_equal(hs_node_new(&n, o, 10), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "gamma-c"));
    assert_int_equal(hs_node_options_set(o, "algo", "choco"), 0);
    assert_int_equal(hs_node_options_set(o, "world", "2"), 0);
    assert_int_equal(hs_node_options_set(o, "rank", "2"), 0);
    assert_int_equal(hs_node_new(&n, o, 10), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "rank"));
    assert_int_equal(hs_node_options_set(o, "rank", "1"), 0);
    assert_int_equal(hs_node_new(&n, o, 10), 0);
    /* Before the first round there is no record; a vector of another size is refused. */
    char buf[16];
    assert_int_equal(hs_node_metrics_json(n, buf, sizeof(buf)), HS_EINVAL);
    float x[4] = {0};
    assert_int_equal(hs_node_step(n, x, 4), HS_EINVAL);
    assert_int_equal(hs_node_round(n), 0);
    hs_node_free(n);
    hs_node_options_free(o);
    hs_node_free(NULL);
    hs_node_options_free(NULL);
}

/* The typed setters go through the string parser: same values accepted, same refused; the
 * option list is the table, and an unknown name's message lists every option. */
static void test_typed_setters(void **state) {
    (void)state;
    hs_node_options *o;
    assert_int_equal(hs_node_options_new(&o), 0);
    assert_int_equal(hs_node_options_set_int(o, "world", 4), 0);
    assert_int_equal(hs_node_options_set_int(o, "world", 0), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "world"));
    assert_int_equal(hs_node_options_set_double(o, "gamma-c", 0.25), 0);
    assert_int_equal(hs_node_options_set_double(o, "gamma-c", 2.0), HS_EINVAL);
    assert_int_equal(hs_node_options_set_bool(o, "insecure", 1), 0);
    assert_int_equal(hs_node_options_set_bool(o, "quiet", 0), 0);
    assert_int_equal(hs_node_options_set_int(o, "seed", -1), HS_EINVAL);
    hs_node *n = NULL;
    assert_int_equal(hs_node_options_set_int(o, "rank", 3), 0);
    assert_int_equal(hs_node_new(&n, o, 10), 0); /* world 4, rank 3, insecure: a whole node */
    hs_node_free(n);
    size_t count = 0;
    const char *def = "x";
    for (const char *name; (name = hs_node_option_name(count, &def)); count++) {
        hs_node_options *p;
        assert_int_equal(hs_node_options_new(&p), 0);
        if (def) assert_int_equal(hs_node_options_set(p, name, def), 0); /* its own default */
        hs_node_options_free(p);
    }
    assert_true(count > 30);
    assert_int_equal(hs_node_options_set(o, "lr", "0.1"), HS_EINVAL);
    const char *m = hs_error_message();
    for (size_t i = 0; i < count; i++) assert_non_null(strstr(m, hs_node_option_name(i, NULL)));
    assert_non_null(strstr(m, "own loop"));
    hs_node_options_free(o);
}

static void test_sgp_consensus(void **state) {
    (void)state;
    /* Callers that do no work run rounds as fast as the loop goes: SGP, which never waits by
     * default, would send its mass away for rounds on end before anything arrives. A bounded
     * staleness paces the peers as computing would. */
    run j = {"sgp", "none", 200, "", {"staleness", "1", NULL}};
    converges(&j, "sgp");
}

/* A stop request from another thread ends each node's run after its round with HS_EINTR.
 * (No checkpoints here: libuv closes sockets with a raw close syscall that ThreadSanitizer does
 * not see, so a checkpoint file on one node's thread that reuses a socket's descriptor number
 * is reported as a race; the stop's checkpoint is tested on one thread below.) */
static void test_stop_request(void **state) {
    (void)state;
    static peer p[N];
    pthread_t th[N];
    run j = {"dpsgd", "none", 0, "", {NULL}}; /* rounds 0: no end */
    make_dir(&j);
    for (int i = 0; i < N; i++) {
        memset(&p[i], 0, sizeof(p[i]));
        p[i].job = &j;
        p[i].rank = i;
        fill(p[i].x, i);
    }
    for (int i = 0; i < N; i++) assert_int_equal(pthread_create(&th[i], NULL, peer_main, &p[i]), 0);
    /* Until every node has run 5 rounds, or one has ended (its result then fails below). */
    for (int ready = 0; ready < N;) {
        ready = 0;
        for (int i = 0; i < N; i++)
            ready += atomic_load(&p[i].steps) >= 5 || atomic_load(&p[i].rc_done);
        usleep(1000);
    }
    /* A node that ended by itself is freed: the run failed (and is not stopped). */
    for (int i = 0; i < N; i++) assert_int_equal(atomic_load(&p[i].rc_done), 0);
    for (int i = 0; i < N; i++) hs_node_request_stop(atomic_load(&p[i].node), 0);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        assert_int_equal(p[i].rc_start, 0);
        assert_int_equal(p[i].rc_last, HS_EINTR);
        assert_true(p[i].steps >= 5);
    }
    drop_dir(&j);
}

/* One node alone whose caller adds 1 to its vector each round: checkpoints every 10 rounds hold
 * the vector, and a node resuming from the directory continues from the newest at its round. */
static hs_node *lone(const char *dir, const char *resume) {
    hs_node_options *o;
    hs_node *n = NULL;
    assert_int_equal(hs_node_options_new(&o), 0);
    const char *kv[][2] = {{"insecure", "1"}, {"algo", "choco"}, {"compress", "topk:0.1"},
                           {"rounds", "25"}, {"rank", "0"}, {"checkpoint-dir", dir},
                           {"checkpoint-every", "10"}, {"resume", resume}, {"quiet", "1"}};
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
        assert_int_equal(hs_node_options_set(o, kv[i][0], kv[i][1]), 0);
    assert_int_equal(hs_node_new(&n, o, D), 0);
    hs_node_options_free(o);
    return n;
}

static void test_checkpoint_resume(void **state) {
    (void)state;
    static float x[D], at20[D];
    run j = {"choco", "topk:0.1", 25, "", {NULL}};
    make_dir(&j);
    char dir[96];
    snprintf(dir, sizeof(dir), "%s/ck", j.dir);
    fill(x, 0);
    hs_node *n = lone(dir, "0");
    assert_int_equal(hs_node_start(n, x, D), 0);
    assert_int_equal(hs_node_round(n), 0);
    int rc = 0;
    while (rc == 0) {
        for (int k = 0; k < D; k++) x[k] += 1.0f;
        rc = hs_node_step(n, x, D);
        if (hs_node_round(n) == 20) memcpy(at20, x, sizeof(x));
    }
    assert_int_equal(rc, 1);
    assert_int_equal(hs_node_round(n), 25);
    hs_node_free(n);
    memset(x, 0, sizeof(x));
    n = lone(dir, "1");
    assert_int_equal(hs_node_start(n, x, D), 0);
    assert_int_equal(hs_node_round(n), 20);
    assert_memory_equal(x, at20, sizeof(x));
    /* A stop asking for a checkpoint, after two more rounds: the third ends the run, and a
     * node resuming continues from there. The job's end came with the checkpoints. */
    assert_int_equal(hs_node_step(n, x, D), 0);
    assert_int_equal(hs_node_step(n, x, D), 0);
    hs_node_request_stop(n, 1);
    assert_int_equal(hs_node_step(n, x, D), HS_EINTR);
    assert_int_equal(hs_node_round(n), 23);
    memcpy(at20, x, sizeof(x));
    hs_node_free(n);
    n = lone(dir, "1");
    assert_int_equal(hs_node_start(n, x, D), 0);
    assert_int_equal(hs_node_round(n), 23);
    assert_memory_equal(x, at20, sizeof(x));
    int steps = 0;
    for (rc = 0; rc == 0; steps++) rc = hs_node_step(n, x, D);
    assert_int_equal(rc, 1);
    assert_int_equal(steps, 2);
    hs_node_free(n);
    drop_dir(&j);
}

/* The defaults are `hearsay run`'s: the CLI starts from hs__node_cfg_defaults too, and the
 * algorithm's own compressor and topology fill in what is not set. */
static void test_defaults(void **state) {
    (void)state;
    hs_node_options *o;
    hs__node_cfg c;
    assert_int_equal(hs_node_options_new(&o), 0);
    assert_int_equal(hs_node_options_set(o, "insecure", "1"), 0);
    assert_int_equal(hs__node_options_resolve(o, 1000, &c), 0);
    assert_int_equal(c.algo.kind, HS_ALGO_CHOCO);
    assert_string_equal(c.algo.compress, hs_algo_kind_default_compress(HS_ALGO_CHOCO));
    assert_string_equal(c.net.topo_spec, "ring");
    assert_string_equal(c.net.listen, "127.0.0.1:0");
    assert_int_equal(c.net.security, HS_NET_INSECURE);
    assert_int_equal(c.world, 1);
    assert_int_equal(c.rank, -1);
    assert_int_equal(c.wait_new_only, 1);
    assert_int_equal(c.checkpoint_every, 100);
    assert_int_equal(c.guard.policy, HS_GUARD_STOP);
    assert_int_equal(c.algo.seed, 1);
    assert_int_equal(c.algo.recv_timeout_ms, 10000);
    assert_true(c.algo.gamma_c == 0.0f); /* automatic, resolved by the algorithm */
    assert_int_equal(c.algo.staleness, 0);
    /* The guard is told the step the algorithm will resolve 0 to; the default compressor's
     * (sign:512) is above the ring's cap, so a ring leaves it as the rule gives it. */
    hs_compressor *cm;
    float g;
    assert_int_equal(hs_compressor_new(&cm, c.algo.compress, 1000, c.algo.seed), 0);
    assert_int_equal(hs_algo_auto_gamma_c(cm, &g, NULL), 0);
    hs_compressor_free(cm);
    assert_int_equal(c.algo.max_degree, 2);
    assert_true(c.guard.gamma_c == hs_algo_scale_gamma_c(g, 2));
    /* A ring has at most 2 neighbours at any size: a peer that does not know the job's size
     * (--bootstrap alone) takes the same 1.5x the rule as the peers that do, or CHOCO's edges
     * would mix with two steps. Shown with top-1%, whose rule is below the cap. */
    assert_int_equal(hs_compressor_new(&cm, "topk:0.01", 1000, c.algo.seed), 0);
    assert_int_equal(hs_algo_auto_gamma_c(cm, &g, NULL), 0);
    hs_compressor_free(cm);
    hs_node_options *o4;
    assert_int_equal(hs_node_options_new(&o4), 0);
    assert_int_equal(hs_node_options_set(o4, "compress", "topk:0.01"), 0);
    assert_int_equal(hs_node_options_set(o4, "insecure", "1"), 0);
    if (hs__node_options_resolve(o4, 1000, &c) < 0) fail_msg("%s", hs_error_message());
    hs_node_options_free(o4);
    assert_int_equal(c.algo.max_degree, 2);
    assert_true(c.guard.gamma_c == hs_algo_scale_gamma_c(g, 2) && c.guard.gamma_c > g);
    float unknown_n = c.guard.gamma_c;
    /* With the job's size the peer knows its ring (2 neighbours) and takes 1.5x the rule, as
     * hs_algo_new will from the degree the configuration carries. */
    assert_int_equal(hs_node_options_new(&o4), 0);
    assert_int_equal(hs_node_options_set(o4, "compress", "topk:0.01"), 0);
    assert_int_equal(hs_node_options_set(o4, "world", "4"), 0);
    assert_int_equal(hs_node_options_set(o4, "insecure", "1"), 0);
    if (hs__node_options_resolve(o4, 1000, &c) < 0) fail_msg("%s", hs_error_message());
    hs_node_options_free(o4);
    assert_int_equal(c.algo.max_degree, 2);
    assert_true(c.guard.gamma_c == hs_algo_scale_gamma_c(g, 2) && c.guard.gamma_c > g);
    assert_true(c.guard.gamma_c == unknown_n);
    /* A generator whose degree grows with the size is not scaled, known size or not. */
    for (int world = 1; world <= 8; world += 7) {
        char w[8];
        snprintf(w, sizeof(w), "%d", world);
        assert_int_equal(hs_node_options_new(&o4), 0);
        assert_int_equal(hs_node_options_set(o4, "compress", "topk:0.01"), 0);
        assert_int_equal(hs_node_options_set(o4, "topology", "exponential"), 0);
        assert_int_equal(hs_node_options_set(o4, "world", w), 0);
        assert_int_equal(hs_node_options_set(o4, "insecure", "1"), 0);
        if (hs__node_options_resolve(o4, 1000, &c) < 0) fail_msg("%s", hs_error_message());
        hs_node_options_free(o4);
        assert_int_equal(c.algo.max_degree, 0);
        assert_true(c.guard.gamma_c == g);
    }
    assert_int_equal(hs_node_options_set(o, "algo", "sgp"), 0);
    assert_int_equal(hs__node_options_resolve(o, 1000, &c), 0);
    assert_string_equal(c.net.topo_spec, "onepeer-exp");
    assert_string_equal(c.algo.compress, "none");
    /* SGP waits for the shares of the round before unless told otherwise (issue 19: staleness 0
     * with momentum diverged on a loaded machine). */
    assert_int_equal(c.algo.staleness, 1);
    assert_int_equal(hs_node_options_set(o, "staleness", "0"), 0);
    assert_int_equal(hs__node_options_resolve(o, 1000, &c), 0);
    assert_int_equal(c.algo.staleness, 0);
    hs_node_options_free(o);
}

/* A compressor not given is the algorithm's, whichever order the options come in and however
 * often algo changes; one given stays. Read from the node hs_node_new made. */
static const char *node_compress(const char *const *kv) {
    hs_node_options *o;
    hs_node *n = NULL;
    assert_int_equal(hs_node_options_new(&o), 0);
    for (; *kv; kv += 2) assert_int_equal(hs_node_options_set(o, kv[0], kv[1]), 0);
    int rc = hs_node_new(&n, o, 1000);
    if (rc < 0) fprintf(stderr, "hs_node_new: %s\n", hs_error_message());
    assert_int_equal(rc, 0);
    hs_node_options_free(o);
    static char out[64];
    snprintf(out, sizeof(out), "%s", hs__node_config(n)->algo.compress);
    hs_node_free(n);
    return out;
}

static void test_default_compress_follows_algo(void **state) {
    (void)state;
    const char *algos[] = {"choco", "beer", "dcd", "dpsgd", "sgp"};
    for (size_t i = 0; i < sizeof(algos) / sizeof(algos[0]); i++) {
        hs_algo_kind k;
        assert_int_equal(hs_algo_kind_parse(algos[i], &k), 0);
        const char *want = hs_algo_kind_default_compress(k);
        const char *first[] = {"algo", algos[i], "insecure", "1", "seed", "3", NULL};
        const char *last[] = {"insecure", "1", "seed", "3", "algo", algos[i], NULL};
        const char *changed[] = {"algo", "dpsgd", "insecure", "1", "algo", algos[i], NULL};
        assert_string_equal(node_compress(first), want);
        assert_string_equal(node_compress(last), want);
        assert_string_equal(node_compress(changed), want);
    }
    /* Not "none", the algorithm configuration's own default. */
    assert_string_equal(node_compress((const char *[]){"algo", "dcd", "insecure", "1", NULL}),
                        "qsgd:16");
    const char *given[] = {"compress", "randk:0.1", "algo", "dcd", "insecure", "1", NULL};
    assert_string_equal(node_compress(given), "randk:0.1");
}


/* What a resolved configuration holds that an option can set, as text to compare. */
static void describe(const hs__node_cfg *c, char *out, size_t cap) {
#define S(x) ((x) ? (x) : "-")
    const hs_net_config *n = &c->net;
    const hs_algo_cfg *a = &c->algo;
    snprintf(out, cap,
             "listen %s advertise %s bootstrap %s secret %s ca %s cert %s key %s run-id %s "
             "topology %s security %d max-frame %zu max-buffered %zu pending %d/%d handshake %d "
             "peer-timeout %d heartbeat %d join %d snapshot %d seeds %llu/%llu emulate %d | "
             "algo %d compress %s gamma-c %g staleness %d recv %d seed %llu same-start %d | "
             "world %d rank %d rendezvous %s rounds %ld wait %d/%d/%d metrics %s quiet %d "
             "ck %s/%ld resume %d guard %d %g",
             S(n->listen), S(n->advertise), S(n->bootstrap), S(n->secret_file), S(n->ca_file),
             S(n->cert_file), S(n->key_file), S(n->run_id), S(n->topo_spec), (int)n->security,
             n->max_frame, n->max_buffered, n->max_conns, n->max_conns_per_addr,
             n->handshake_timeout_ms, n->peer_timeout_ms, n->heartbeat_ms, n->join_timeout_ms,
             n->snapshot_timeout_ms, (unsigned long long)n->seed,
             (unsigned long long)n->topo_seed,
             memcmp(&n->emulate, &(hs_net_emulation){0}, sizeof(n->emulate)) != 0, (int)a->kind,
             S(a->compress), (double)a->gamma_c, a->staleness, a->recv_timeout_ms,
             (unsigned long long)a->seed, a->same_start, c->world, c->rank, S(c->rendezvous),
             c->rounds, c->wait_peers, c->wait_new_only, c->wait_timeout_ms, S(c->metrics),
             c->quiet, S(c->checkpoint_dir), c->checkpoint_every, c->resume, (int)c->guard.policy,
             (double)c->guard.gamma_c);
#undef S
}

/* The configuration of the options insecure 1 and, when name is set, name = value;
 * HS_EINVAL when the value is not one the option takes. */
static int resolved(const char *name, const char *value, char *out, size_t cap) {
    hs_node_options *o;
    hs__node_cfg c;
    assert_int_equal(hs_node_options_new(&o), 0);
    assert_int_equal(hs_node_options_set(o, "insecure", "1"), 0);
    int err = name ? hs_node_options_set(o, name, value) : 0;
    if (err == 0) err = hs__node_options_resolve(o, 1000, &c);
    if (err == 0) describe(&c, out, cap);
    hs_node_options_free(o);
    return err;
}

/* One flag of `hearsay run --help`: its name, whether it takes a value, and its help text
 * (continuation lines included). */
typedef struct flag {
    char name[64];
    int takes_value;
    char help[1024];
} flag;

static int run_help(flag *f, int cap) {
    const char *root = getenv("HS_BUILD_ROOT");
    assert_non_null(root);
    char cmd[4200], line[2048];
    snprintf(cmd, sizeof(cmd), "timeout 20 '%s/hearsay' run --help", root);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int n = 0;
    while (fgets(line, sizeof(line), p)) {
        const char *t = line + strspn(line, " ");
        if (t - line >= 6 && !strncmp(t, "--", 2) && n < cap) {
            /* "--name[=WORD]": an optional value, a flag here (its default is "0"). */
            int len = (int)strcspn(t + 2, " [\n");
            snprintf(f[n].name, sizeof(f[n].name), "%.*s", len, t + 2);
            const char *rest = t + 2 + len;
            /* "--name META  help": a value when one space, not two, follows the name. */
            f[n].takes_value = rest[0] == ' ' && rest[1] != ' ';
            snprintf(f[n].help, sizeof(f[n].help), "%s", rest);
            n++;
        } else if (n > 0 && t - line > 20) { /* a continuation of the last flag's help */
            size_t l = strlen(f[n - 1].help);
            snprintf(f[n - 1].help + l, sizeof(f[n - 1].help) - l, " %s", t);
        }
    }
    assert_int_equal(pclose(p), 0);
    return n;
}

/* The default a help text states, as an option value: the first word after "(default: ",
 * and "64 MiB" as bytes. Empty when there is none. */
static void stated_default(const char *help, char *out, size_t cap) {
    out[0] = '\0';
    const char *d = strstr(help, "(default: ");
    if (!d) return;
    d += strlen("(default: ");
    int len = (int)strcspn(d, " ,;)\n");
    if (!strncmp(d + len, " MiB", 4))
        snprintf(out, cap, "%lld", atoll(d) << 20);
    else
        snprintf(out, cap, "%.*s", len, d);
}

/* Every option of the node is a flag of `hearsay run` with the same name and the same
 * default: the value run's --help calls the default, given to the node, changes nothing in
 * its configuration; a flag without a stated default is unset in the node too. */
static void test_options_match_run(void **state) {
    (void)state;
    static flag f[128];
    int nf = run_help(f, 128);
    assert_true(nf > 40);
    static char base[4096], got[4096];
    assert_int_equal(resolved(NULL, NULL, base, sizeof(base)), 0);
    /* Defaults run's help states in words, not as a value (checked by test_defaults). */
    const char *in_words[] = {"advertise", "gamma-c", "rank", "staleness", "wait-peers", NULL};
    int checked = 0;
    const char *def, *name;
    for (size_t i = 0; (name = hs__node_option(i, &def)); i++) {
        /* The node's own: a caller's vector has no other start, and no epochs to count. */
        if (!strcmp(name, "same-start")) continue;
        const flag *fl = NULL;
        for (int k = 0; k < nf && !fl; k++)
            if (!strcmp(f[k].name, name)) fl = &f[k];
        if (!fl) fprintf(stderr, "node option %s is not a flag of hearsay run\n", name);
        assert_non_null(fl);
        char v[128];
        stated_default(fl->help, v, sizeof(v));
        int words = 0;
        for (const char **w = in_words; *w; w++) words |= !strcmp(*w, name);
        if (!fl->takes_value) {
            /* A flag is off unless given. */
            if (!def || strcmp(def, "0")) fprintf(stderr, "node option %s: default %s\n", name,
                                                  def ? def : "unset");
            assert_non_null(def);
            assert_string_equal(def, "0");
        } else if (!v[0] || words) {
            /* rounds: run counts epochs when not given, the node runs until the caller leaves
             * (node.h says so). */
            if (strcmp(name, "rounds") && def)
                fprintf(stderr, "node option %s has default %s, run states none\n", name, def);
            assert_true(!strcmp(name, "rounds") || !def);
            if (words) assert_int_equal(resolved(name, v, got, sizeof(got)), HS_EINVAL);
        } else {
            int err = resolved(name, v, got, sizeof(got));
            if (err || strcmp(got, base))
                fprintf(stderr, "node option %s %s (run's default): %s\n  %s\nagainst unset:\n  "
                                "%s\n",
                        name, v, err ? hs_error_message() : "differs", got, base);
            assert_int_equal(err, 0);
            assert_string_equal(got, base);
            checked++;
        }
    }
    fprintf(stderr, "# %d defaults compared with hearsay run --help\n", checked);
    assert_true(checked >= 15);
}

/* Replicas start at the peer's own vector only for a fresh job's peer: a joiner of a running
 * job whose WELCOME held the terms only (job's end known, no model, steps 0) must not, nor a
 * restart's peer that may load another shard's checkpoint after the decision; a joiner let in
 * as the wait ended (its first round the job's first) must, like the peers it waited with. */
static void test_same_start_decision(void **state) {
    (void)state;
    const uint64_t none = (uint64_t)HS__NODE_NO_END;
    assert_true(hs__node_same_start(1, 0, 0, 0, 20, 0, 0));   /* first peer, waiting job */
    assert_true(hs__node_same_start(1, 0, 0, 0, 20, 4, 0));   /* joiner of a waiting job */
    assert_true(hs__node_same_start(1, 0, 0, 24, 20, 4, 0));  /* let in as the wait ended */
    assert_false(hs__node_same_start(1, 0, 0, 24, 20, 5, 0)); /* running job, terms only */
    assert_false(hs__node_same_start(1, 0, 0, 140, 100, 60, 0));
    assert_false(hs__node_same_start(0, 0, 0, 0, 20, 0, 0));  /* not wanted */
    assert_false(hs__node_same_start(1, 1, 0, 0, 20, 0, 0));  /* resumed from its checkpoint */
    assert_false(hs__node_same_start(1, 0, 1, 0, 20, 0, 0));  /* restart, no checkpoint yet */
    assert_false(hs__node_same_start(1, 0, 0, 0, 20, 0, 3));  /* adopted a trained model */
    assert_true(hs__node_same_start(1, 0, 0, none, HS__NODE_NO_END, 0, 0)); /* rounds 0 */
    assert_false(hs__node_same_start(1, 0, 0, none, HS__NODE_NO_END, 4, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_start_decision),
        cmocka_unit_test(test_option_errors),
        cmocka_unit_test(test_option_messages),
        cmocka_unit_test(test_typed_setters),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_default_compress_follows_algo),
        cmocka_unit_test(test_options_match_run),
        cmocka_unit_test(test_dpsgd_consensus),
        cmocka_unit_test(test_choco_topk_consensus),
        cmocka_unit_test(test_outer_consensus),
        cmocka_unit_test(test_sgp_consensus),
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_stop_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
