/* Consensus-only tests of the five algorithms in the simulator's exchange (learning rate 0,
 * random starting vectors, no model): the network average is kept, the consensus distance
 * shrinks 1000x within a number of rounds set by the topology's spectral gap, push-sum
 * conserves mass (shares in flight included) and its z_i reach the true average. Plus the
 * refusals, churn, checkpoint round trips, and BEER's gradient tracking on peers whose local
 * optima differ. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "hearsay/algo.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"

typedef struct net {
    int n;
    size_t d;
    hs_topo *topo;
    hs_simnet *sim;
    hs_algo **a;
    float **x;
} net;

/* n peers on `spec`, each with its own random vector of d floats (consensus experiments do
 * not share a starting point, so the first round sends full replicas). */
static void net_new(net *nt, const char *spec, int n, size_t d, hs_algo_cfg *cfg) {
    nt->n = n;
    nt->d = d;
    assert_int_equal(hs_topo_new(&nt->topo, spec, n, 5), 0);
    assert_int_equal(hs_simnet_new(&nt->sim, nt->topo), 0);
    nt->a = calloc((size_t)n, sizeof(*nt->a));
    nt->x = calloc((size_t)n, sizeof(*nt->x));
    cfg->same_start = 0;
    cfg->seed = 77;
    for (int i = 0; i < n; i++) {
        nt->x[i] = malloc(sizeof(float) * d);
        hs_rng r;
        hs__rng_init(&r, 123, HS_RNG_TEST, (uint32_t)i, 0);
        for (size_t k = 0; k < d; k++) nt->x[i][k] = (float)hs__rng_normal(&r) + (float)i * 0.1f;
        int err = hs_algo_new(&nt->a[i], cfg, (uint32_t)i, d, nt->x[i]);
        if (err) fail_msg("hs_algo_new: %s", hs_error_message());
    }
}

static void net_free(net *nt) {
    for (int i = 0; i < nt->n; i++) {
        hs_algo_free(nt->a[i]);
        free(nt->x[i]);
    }
    free(nt->a);
    free(nt->x);
    hs_simnet_free(nt->sim);
    hs_topo_free(nt->topo);
}

/* One round with no local update: every begin, every push, every pull (virtual time r + 1). */
static void net_round(net *nt, uint64_t r) {
    for (int i = 0; i < nt->n; i++) {
        if (!hs_simnet_alive(nt->sim, i)) continue;
        int err = hs_algo_begin(nt->a[i], hs_simnet_exchange(nt->sim, i), r, nt->x[i]);
        if (err) fail_msg("begin peer %d round %llu: %s", i, (unsigned long long)r, hs_error_message());
    }
    for (int i = 0; i < nt->n; i++) {
        if (!hs_simnet_alive(nt->sim, i)) continue;
        hs_simnet_set_clock(nt->sim, i, (double)r + 1);
        int err = hs_algo_push(nt->a[i], hs_simnet_exchange(nt->sim, i), r, nt->x[i]);
        if (err) fail_msg("push peer %d round %llu: %s", i, (unsigned long long)r, hs_error_message());
    }
    for (int i = 0; i < nt->n; i++) {
        if (!hs_simnet_alive(nt->sim, i)) continue;
        int err = hs_algo_pull(nt->a[i], hs_simnet_exchange(nt->sim, i), r, nt->x[i]);
        if (err) fail_msg("pull peer %d round %llu: %s", i, (unsigned long long)r, hs_error_message());
    }
}

/* Average (of the evaluation points z_i) in double, and the consensus distance
 * (1/n) sum_i ||z_i - avg||^2. */
static double net_stats(net *nt, double *avg) {
    size_t d = nt->d;
    int alive = 0;
    memset(avg, 0, sizeof(double) * d);
    for (int i = 0; i < nt->n; i++) {
        if (!hs_simnet_alive(nt->sim, i)) continue;
        const float *z = hs_algo_eval_point(nt->a[i], nt->x[i]);
        for (size_t k = 0; k < d; k++) avg[k] += z[k];
        alive++;
    }
    for (size_t k = 0; k < d; k++) avg[k] /= alive;
    double dist = 0;
    for (int i = 0; i < nt->n; i++) {
        if (!hs_simnet_alive(nt->sim, i)) continue;
        const float *z = hs_algo_eval_point(nt->a[i], nt->x[i]);
        for (size_t k = 0; k < d; k++) dist += (z[k] - avg[k]) * (z[k] - avg[k]);
    }
    return dist / alive;
}

static double rel_diff(const double *a, const double *b, size_t d) {
    double num = 0, den = 0;
    for (size_t k = 0; k < d; k++) {
        num += (a[k] - b[k]) * (a[k] - b[k]);
        den += b[k] * b[k];
    }
    return sqrt(num / den);
}

/* Spectral gap 1 - max_{i>=2} |lambda_i| of the topology's matrix, by power iteration on the
 * part orthogonal to the all-ones vector (W symmetric doubly stochastic). The topology module
 * has its own LAPACK-based gap; this independent estimate keeps the test self-contained. */
static double gap_of(const hs_topo *t) {
    int n = hs_topo_n(t);
    double *W = malloc(sizeof(double) * (size_t)n * n), *v = malloc(sizeof(double) * n),
           *u = malloc(sizeof(double) * n);
    assert_int_equal(hs_topo_matrix(t, 0, W), 0);
    hs_rng r;
    hs__rng_init(&r, 1, HS_RNG_TEST, 99, 0);
    for (int i = 0; i < n; i++) v[i] = hs__rng_normal(&r);
    double lam = 0;
    for (int it = 0; it < 20000; it++) {
        double m = 0;
        for (int i = 0; i < n; i++) m += v[i];
        for (int i = 0; i < n; i++) v[i] -= m / n;
        double nv = 0;
        for (int i = 0; i < n; i++) {
            u[i] = 0;
            for (int j = 0; j < n; j++) u[i] += W[i * n + j] * v[j];
            nv += v[i] * v[i];
        }
        double nu = 0;
        for (int i = 0; i < n; i++) nu += u[i] * u[i];
        lam = sqrt(nu / nv);
        for (int i = 0; i < n; i++) v[i] = u[i] / sqrt(nu);
    }
    free(W);
    free(v);
    free(u);
    return 1.0 - lam;
}

typedef struct cons_case {
    const char *algo, *compress, *topo;
    int n;
    size_t d;
    float gamma_c;
    double delta; /* the compressor's quality: E||C(x) - x||^2 <= (1 - delta) ||x||^2 */
} cons_case;

/* Runs until the consensus distance falls 1000x, checking the average every round. Exact
 * gossip contracts the distance by at least (1 - gap)^2 per round, so it needs
 * R0 = ln(1000) / (-2 ln(1 - gap)) rounds. CHOCO's rate (Koloskova et al. 2019, Theorem 2)
 * scales with gamma_c * delta, so a case may take 1.2 R0 / (gamma_c * delta) rounds. delta is
 * k/d for top-k; 1 / (1 + min(d/s^2, sqrt(d)/s)) for QSGD with s levels (Alistarh et al.
 * 2017, Lemma 3.1); about 2/pi for the scaled sign of Gaussian-like vectors. */
static void run_consensus(const cons_case *c, int exact_average) {
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    assert_int_equal(hs_algo_kind_parse(c->algo, &cfg.kind), 0);
    cfg.compress = c->compress;
    cfg.gamma_c = c->gamma_c;
    net nt;
    net_new(&nt, c->topo, c->n, c->d, &cfg);
    double gap = gap_of(nt.topo);
    double r0 = log(1000.0) / (-2.0 * log(1.0 - gap));
    double slack = 1.2 / (c->gamma_c * c->delta);
    int budget = (int)ceil(slack * r0) + 10;
    double *avg0 = malloc(sizeof(double) * c->d), *avg = malloc(sizeof(double) * c->d);
    double d0 = net_stats(&nt, avg0), dist = d0, worst_avg = 0;
    int r;
    for (r = 0; r < budget && dist > d0 / 1000.0; r++) {
        net_round(&nt, (uint64_t)r);
        dist = net_stats(&nt, avg);
        double e = rel_diff(avg, avg0, c->d);
        if (e > worst_avg) worst_avg = e;
    }
    printf("# %s %s on %s n=%d: gap %.4f, 1000x in %d rounds (exact gossip bound %.0f, budget %d), "
           "average drift %.2e\n",
           c->algo, c->compress, c->topo, c->n, gap, r, r0, budget, worst_avg);
    if (dist > d0 / 1000.0)
        fail_msg("%s/%s on %s: distance %.3g of %.3g after %d rounds", c->algo, c->compress,
                 c->topo, dist, d0, r);
    if (exact_average && worst_avg > 1e-5) fail_msg("average drifted by %.3g", worst_avg);
    free(avg0);
    free(avg);
    net_free(&nt);
}

static void test_consensus_dpsgd(void **state) {
    (void)state;
    const cons_case cases[] = {
        {"dpsgd", "none", "ring", 16, 50, 1, 1},
        {"dpsgd", "none", "ring", 64, 20, 1, 1},
        {"dpsgd", "none", "torus:8x8", 64, 20, 1, 1},
        {"dpsgd", "none", "exponential", 64, 20, 1, 1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) run_consensus(&cases[i], 1);
}

/* D-PSGD with one neighbour mixes without scratch vectors (dpsgd.c): from the two messages
 * where they are (none), or in x_r's own storage (fp16). Two peers, a local update between
 * begin and pull, the result to the bit x + w (C(x_j,r) - x_r) as the general case computes it
 * (fp16's decoded value taken from hs_compress_apply). */
static void test_dpsgd_pair_in_place(void **state) {
    (void)state;
    const char *comps[] = {"none", "fp16"};
    for (size_t c = 0; c < 2; c++) {
        hs_algo_cfg cfg;
        hs_algo_cfg_default(&cfg);
        assert_int_equal(hs_algo_kind_parse("dpsgd", &cfg.kind), 0);
        cfg.compress = comps[c];
        net nt;
        size_t d = 1003;
        net_new(&nt, "ring", 2, d, &cfg);
        double W[4];
        assert_int_equal(hs_topo_matrix(nt.topo, 0, W), 0);
        hs_compressor *comp;
        assert_int_equal(hs_compressor_new(&comp, comps[c], d, 77), 0);
        for (uint64_t r = 0; r < 3; r++) {
            float *xr[2], *cx[2], *want[2];
            for (int i = 0; i < 2; i++) {
                xr[i] = malloc(sizeof(float) * d);
                cx[i] = malloc(sizeof(float) * d);
                want[i] = malloc(sizeof(float) * d);
                memcpy(xr[i], nt.x[i], sizeof(float) * d);
                assert_int_equal(hs_compress_apply(comp, xr[i], d, (uint32_t)i, r, cx[i]), 0);
                assert_int_equal(hs_algo_begin(nt.a[i], hs_simnet_exchange(nt.sim, i), r, nt.x[i]), 0);
                for (size_t k = 0; k < d; k++) nt.x[i][k] -= 0.01f * (nt.x[i][k] - (float)i);
            }
            for (int i = 0; i < 2; i++) {
                float w = (float)W[i * 2 + (1 - i)];
                for (size_t k = 0; k < d; k++)
                    want[i][k] = nt.x[i][k] + (0.0f + w * (cx[1 - i][k] - xr[i][k]));
                hs_simnet_set_clock(nt.sim, i, (double)r + 1);
                assert_int_equal(hs_algo_push(nt.a[i], hs_simnet_exchange(nt.sim, i), r, nt.x[i]), 0);
            }
            for (int i = 0; i < 2; i++)
                assert_int_equal(hs_algo_pull(nt.a[i], hs_simnet_exchange(nt.sim, i), r, nt.x[i]), 0);
            for (int i = 0; i < 2; i++) {
                for (size_t k = 0; k < d; k++)
                    if (nt.x[i][k] != want[i][k])
                        fail_msg("%s round %llu peer %d [%zu]: %.9g, want %.9g", comps[c],
                                 (unsigned long long)r, i, k, (double)nt.x[i][k],
                                 (double)want[i][k]);
                free(xr[i]);
                free(cx[i]);
                free(want[i]);
            }
        }
        /* A compressor other than none is not asked for its values each round: the thread's
         * last error is not clobbered by a refusal nobody reads. */
        assert_null(strstr(hs_error_message(), "not the values themselves"));
        hs_compressor_free(comp);
        net_free(&nt);
    }
}

static void test_consensus_choco(void **state) {
    (void)state;
    /* gamma_c = 1 with exact messages is plain gossip. */
    const cons_case cases[] = {
        {"choco", "none", "ring", 16, 50, 1.0f, 1},
        {"choco", "topk:0.25", "ring", 16, 64, 0.4f, 0.25},
        {"choco", "topk:0.1", "torus:4x4", 16, 100, 0.2f, 0.1},
        {"choco", "qsgd:16", "exponential", 64, 20, 0.5f, 1 / (1 + 20.0 / 256)},
        {"choco", "sign", "ring", 8, 64, 0.2f, 0.63},
        {"choco", "topk:0.25", "torus:8x8", 64, 16, 0.4f, 0.25},
        /* 4 levels in a bucket of 256: sent times s / sqrt(B) = 1/4 (hs__compress_replica_scale),
         * a contraction of delta 1/4 (1 - 1/4); the average stays exact only if every replica
         * took the same scaled bytes as its sender's own xhat. */
        {"choco", "qsgd:4", "ring", 16, 256, 0.2f, 0.1875},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) run_consensus(&cases[i], 1);
}

static void test_consensus_dcd(void **state) {
    (void)state;
    /* With exact messages DCD keeps the average exactly; with an unbiased random compressor
     * only in expectation (checked below), so only its distance is asserted here. */
    const cons_case exact[] = {
        {"dcd", "none", "ring", 16, 50, 1, 1},
        {"dcd", "none", "torus:8x8", 64, 20, 1, 1},
    };
    for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++) run_consensus(&exact[i], 1);
    const cons_case noisy[] = {
        {"dcd", "qsgd:256", "exponential", 16, 50, 1, 1 / (1 + 50.0 / 65536)},
    };
    for (size_t i = 0; i < sizeof(noisy) / sizeof(noisy[0]); i++) run_consensus(&noisy[i], 0);
}

static void test_consensus_beer(void **state) {
    (void)state;
    /* With learning rate 0 the tracker stays 0 and BEER's model update is CHOCO's gossip. */
    const cons_case cases[] = {
        {"beer", "none", "ring", 16, 50, 1.0f, 1},
        {"beer", "topk:0.25", "ring", 16, 64, 0.4f, 0.25},
        {"beer", "topk:0.1", "torus:8x8", 64, 100, 0.2f, 0.1},
        {"beer", "qsgd:16", "exponential", 64, 20, 0.5f, 1 / (1 + 20.0 / 256)},
        {"beer", "randk:0.25:unscaled", "exponential", 32, 64, 0.2f, 0.25},
        {"beer", "qsgd:4", "ring", 16, 256, 0.2f, 0.1875}, /* rescaled, as for choco */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) run_consensus(&cases[i], 1);
}

/* Per-peer least squares f_i(x) = 1/2 ||x - c_i||^2 with different targets c_i: the global
 * optimum is the mean of the c_i, while each peer's local gradient pulls it to its own c_i.
 * One local SGD step of size eta per round. Returns the largest relative distance
 * ||x_i - mean c|| / ||mean c|| over the peers after `rounds` rounds. With kill_at > 0 the last
 * peer crashes before that round, and the optimum is the survivors' mean. */
static double run_heterogeneous(hs_algo_kind kind, const char *compress, float gamma_c,
                                float eta, int rounds, int kill_at) {
    enum { N = 8, D = 40 };
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = kind;
    cfg.compress = compress;
    cfg.gamma_c = gamma_c;
    cfg.seed = 3;
    hs_topo *topo;
    hs_simnet *sim;
    assert_int_equal(hs_topo_new(&topo, "ring", N, 5), 0);
    assert_int_equal(hs_simnet_new(&sim, topo), 0);
    static float x[N][D], c[N][D];
    double opt[D] = {0};
    hs_algo *a[N];
    for (int i = 0; i < N; i++) {
        hs_rng r;
        hs__rng_init(&r, 9, HS_RNG_TEST, (uint32_t)i, 1);
        for (int k = 0; k < D; k++) {
            c[i][k] = (float)(2.0 * hs__rng_normal(&r) + (k % 4 == 0 ? 1.0 : 0.0) + 0.5 * i);
            opt[k] += c[i][k] / (double)N;
            x[i][k] = 0;
        }
        if (hs_algo_new(&a[i], &cfg, (uint32_t)i, D, x[i]) < 0)
            fail_msg("hs_algo_new: %s", hs_error_message());
    }
    int alive = N;
    for (int r = 0; r < rounds; r++) {
        if (r == kill_at && kill_at > 0) {
            assert_int_equal(hs_simnet_kill(sim, N - 1), 0);
            alive = N - 1;
            for (int k = 0; k < D; k++) opt[k] = (opt[k] * N - c[N - 1][k]) / alive;
        }
        for (int i = 0; i < alive; i++) {
            hs_exchange *ex = hs_simnet_exchange(sim, i);
            assert_int_equal(hs_algo_begin(a[i], ex, (uint64_t)r, x[i]), 0);
            for (int k = 0; k < D; k++) x[i][k] = x[i][k] - eta * (x[i][k] - c[i][k]);
            hs_simnet_set_clock(sim, i, (double)r + 1);
            if (hs_algo_push(a[i], ex, (uint64_t)r, x[i]) < 0)
                fail_msg("push: %s", hs_error_message());
        }
        for (int i = 0; i < alive; i++)
            if (hs_algo_pull(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i]) < 0)
                fail_msg("pull: %s", hs_error_message());
    }
    double worst = 0, on = 0;
    for (int k = 0; k < D; k++) on += opt[k] * opt[k];
    for (int i = 0; i < N; i++) {
        double e = 0;
        for (int k = 0; k < D; k++) e += (x[i][k] - opt[k]) * (x[i][k] - opt[k]);
        if (i < alive && sqrt(e / on) > worst) worst = sqrt(e / on);
        hs_algo_free(a[i]);
    }
    hs_simnet_free(sim);
    hs_topo_free(topo);
    return worst;
}

/* What gradient tracking is for: with the same step sizes and top-10%, CHOCO's peers stay
 * pulled towards their own targets, BEER's reach the global optimum. */
static void test_beer_tracks_gradient(void **state) {
    (void)state;
    const float gamma_c = 0.2f, eta = 0.05f;
    const int rounds = 3000;
    double beer = run_heterogeneous(HS_ALGO_BEER, "topk:0.1", gamma_c, eta, rounds, 0);
    double choco = run_heterogeneous(HS_ALGO_CHOCO, "topk:0.1", gamma_c, eta, rounds, 0);
    printf("# ring n=8, topk:0.1, gamma_c %g, eta %g, %d rounds: worst relative distance to the "
           "global optimum: beer %.2e, choco %.2e\n",
           (double)gamma_c, (double)eta, rounds, beer, choco);
    if (!(beer < 1e-3)) fail_msg("beer: relative distance %.3g to the optimum", beer);
    /* BEER keeps its mixes as running sums and rebuilds them from the replicas every 64
     * rounds; without the rebuilds their rounding builds up in the tracker and this run ends
     * at 5.1e-6 (9.6e-7 with both mixes summed afresh every round, 1.0e-6 with the rebuilds). */
    if (!(beer < 2e-6)) fail_msg("beer: relative distance %.3g: rounding built up", beer);
    if (!(choco > 1e-2)) fail_msg("choco: relative distance %.3g: expected a bias", choco);
    /* A crash takes the peer's share of the tracked sum with it; the survivors restart their
     * trackers at the membership change and reach their own global optimum (without the
     * restart their average drifts: 0.2 relative after the same rounds). The survivors form a
     * path, whose spectral gap is smaller than the ring's: more rounds. */
    double crash = run_heterogeneous(HS_ALGO_BEER, "topk:0.1", gamma_c, eta, 6000, 500);
    printf("# beer, peer 7 crashes at round 500 of 6000: worst relative distance to the survivors' "
           "optimum %.2e\n", crash);
    if (!(crash < 1e-3)) fail_msg("beer after a crash: relative distance %.3g", crash);
}

/* DCD with an unbiased compressor: the average moves by sum_i C(z_i) - z_i per round, a
 * zero-mean error whose size shrinks with the z_i. Over the whole run it stays within a few
 * standard deviations of QSGD's noise, i.e. far below the vectors' spread. */
static void test_dcd_average_in_expectation(void **state) {
    (void)state;
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_DCD;
    cfg.compress = "qsgd:256";
    net nt;
    net_new(&nt, "exponential", 16, 64, &cfg);
    double avg0[64], avg[64];
    double d0 = net_stats(&nt, avg0);
    for (int r = 0; r < 60; r++) net_round(&nt, (uint64_t)r);
    net_stats(&nt, avg);
    double e = rel_diff(avg, avg0, 64);
    printf("# dcd qsgd:256: average drift %.2e after 60 rounds (spread %.2e)\n", e, sqrt(d0));
    assert_true(e < 0.02);
    net_free(&nt);
}

static void test_dcd_refuses_biased(void **state) {
    (void)state;
    float x[10] = {0};
    hs_algo *a;
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_DCD;
    const char *biased[] = {"topk:0.1", "sign", "ef:qsgd:16", "fp16"};
    for (int i = 0; i < 4; i++) {
        cfg.compress = biased[i];
        assert_int_equal(hs_algo_new(&a, &cfg, 0, 10, x), HS_EINVAL);
        assert_non_null(strstr(hs_error_message(), "unbiased"));
    }
    cfg.compress = "qsgd:16";
    assert_int_equal(hs_algo_new(&a, &cfg, 0, 10, x), 0);
    hs_algo_free(a);
    cfg.compress = "bogus:1";
    assert_true(hs_algo_new(&a, &cfg, 0, 10, x) < 0);
    assert_non_null(strstr(hs_error_message(), "bogus"));
    cfg.kind = HS_ALGO_CHOCO;
    cfg.compress = "topk:0.1";
    const float bad_steps[] = {-0.1f, 1.5f, NAN};
    for (int i = 0; i < 3; i++) {
        cfg.gamma_c = bad_steps[i];
        assert_int_equal(hs_algo_new(&a, &cfg, 0, 10, x), HS_EINVAL);
        assert_non_null(strstr(hs_error_message(), "--gamma-c"));
    }
    hs_algo_kind k;
    assert_int_equal(hs_algo_kind_parse("adpsgd", &k), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "adpsgd"));
}

/* The gap a simulator or a peer passes in: the topology's own (shown with the automatic step;
 * the step's rule is tested in test_step.c). */
static void test_default_gamma_c(void **state) {
    (void)state;
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    assert_true(cfg.gamma_c == 0.0f);
    hs_topo *t;
    assert_int_equal(hs_topo_new(&t, "ring", 8, 1), 0);
    assert_int_equal(hs_algo_cfg_set_topology(&cfg, t), 0);
    assert_true(fabs(cfg.gap - 0.195262146) < 1e-6);
    hs_topo_free(t);
}

/* Each refused combination fails hs_algo_new with its reason and fix; what stays allowed
 * passes. */
static void test_compressor_rules(void **state) {
    (void)state;
    struct {
        const char *algo, *compress, *why, *fix;
    } refused[] = {
        {"choco", "randk:0.01", "contraction", "randk:0.01:unscaled or topk:0.01"},
        {"choco", "ef:topk:0.01", "already compensates", "--compress topk:0.01"},
        {"choco", "ef:sign", "already compensates", "--compress sign"},
        {"sgp", "ef:qsgd:16", "mass", "--compress qsgd:16:512"},
        {"dpsgd", "topk:0.1", "drops information", "--algo choco"},
        {"dpsgd", "sign:64", "drops information", "ef:sign:64"},
        {"dpsgd", "randk:0.1:unscaled", "drops information", "ef:randk"},
        {"dcd", "topk:0.1", "unbiased", "--algo choco"},
        {"dcd", "ef:randk:0.1", "unbiased", "qsgd"},
    };
    float x[1000] = {0};
    hs_algo *a;
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        hs_algo_cfg cfg;
        hs_algo_cfg_default(&cfg);
        assert_int_equal(hs_algo_kind_parse(refused[i].algo, &cfg.kind), 0);
        cfg.compress = refused[i].compress;
        assert_int_equal(hs_algo_new(&a, &cfg, 0, 1000, x), HS_EINVAL);
        const char *m = hs_error_message();
        if (!strstr(m, refused[i].why) || !strstr(m, refused[i].fix))
            fail_msg("%s %s: '%s' lacks '%s' or '%s'", refused[i].algo, refused[i].compress, m,
                     refused[i].why, refused[i].fix);
    }
    const char *allowed[][2] = {
        {"choco", "none"},           {"choco", "fp16"},          {"choco", "topk:0.01:fp16"},
        {"choco", "randk:0.1:unscaled"}, {"choco", "qsgd:4:64"}, {"choco", "sign:64"},
        {"choco", "randk:1.0"},      {"dpsgd", "none"},          {"dpsgd", "fp16"},
        {"dpsgd", "bf16"},           {"dpsgd", "ef:topk:0.1"},   {"dpsgd", "ef:sign"},
        {"dpsgd", "topk:1.0"},       {"dpsgd", "qsgd:16"},       {"dcd", "qsgd:16"},
        {"dcd", "randk:0.1"},        {"sgp", "topk:0.1"},        {"sgp", "sign"},
    };
    for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++) {
        hs_algo_cfg cfg;
        hs_algo_cfg_default(&cfg);
        assert_int_equal(hs_algo_kind_parse(allowed[i][0], &cfg.kind), 0);
        cfg.compress = allowed[i][1];
        if (hs_algo_new(&a, &cfg, 0, 1000, x) != 0)
            fail_msg("%s %s refused: %s", allowed[i][0], allowed[i][1], hs_error_message());
        hs_algo_free(a);
    }
}

/* Push-sum on the time-varying one-peer exponential graph: the weights of all peers plus the
 * shares in flight sum to n every round, and every z_i reaches the true average. */
static void run_sgp(const char *spec, int n, const char *compress, double latency) {
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_SGP;
    cfg.compress = compress;
    net nt;
    net_new(&nt, spec, n, 32, &cfg);
    hs_simnet_set_latency(nt.sim, latency);
    double avg0[32], avg[32];
    double d0 = net_stats(&nt, avg0), dist = d0, worst_mass = 0;
    int r;
    for (r = 0; r < 3000 && dist > d0 * 1e-6; r++) {
        net_round(&nt, (uint64_t)r);
        double mass = hs_simnet_inflight_weight(nt.sim);
        for (int i = 0; i < n; i++) {
            hs_algo_stats st;
            hs_algo_get_stats(nt.a[i], &st);
            mass += st.push_weight;
        }
        if (fabs(mass - n) > worst_mass) worst_mass = fabs(mass - n);
        dist = net_stats(&nt, avg);
    }
    /* The numerators too: sum_i x_i (plus x in flight) stays sum_i x_i(0); checked through
     * the limit: z_i -> sum x / sum w = the initial average. */
    double e = rel_diff(avg, avg0, 32);
    printf("# sgp %s %s n=%d latency %.0f: distance 1e-6 of start in %d rounds, |sum w - n| <= %.1e, "
           "z average off by %.1e\n", compress, spec, n, latency, r, worst_mass, e);
    assert_true(worst_mass < 1e-6);
    assert_true(dist <= d0 * 1e-6);
    assert_true(e < 1e-4);
    net_free(&nt);
}

static void test_sgp_push_sum(void **state) {
    (void)state;
    run_sgp("onepeer-exp", 16, "none", 0);
    run_sgp("onepeer-exp", 64, "none", 0);
    run_sgp("onepeer-exp", 16, "none", 2.5); /* shares arrive rounds late */
    run_sgp("ring", 16, "none", 0);           /* undirected graphs are column stochastic too */
    run_sgp("exponential", 16, "fp16", 0);    /* lossy shares leave their error at home */
}

/* Bounded staleness with a straggler: peer 0 runs one round while the others run four, and
 * (as a process that is really slower would) sends each share only after they have passed that
 * round. Its two out-neighbours on the ring wait for it once, find it lagging, and never wait
 * for it again while it stays behind (its later shares are added whenever they come); peers
 * that keep up are never waited for in vain; the straggler, always behind, never waits. The
 * simulator's receive waits for any share already sent, so the schedule is driven here. */
static void sgp_round(net *nt, int p, uint64_t r, double clock) {
    hs_exchange *ex = hs_simnet_exchange(nt->sim, p);
    hs_simnet_set_clock(nt->sim, p, clock);
    int err = hs_algo_begin(nt->a[p], ex, r, nt->x[p]);
    if (!err) err = hs_algo_end(nt->a[p], ex, r, nt->x[p]);
    if (err) fail_msg("peer %d round %llu: %s", p, (unsigned long long)r, hs_error_message());
}

static void test_sgp_straggler_waited_once(void **state) {
    (void)state;
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_SGP;
    cfg.staleness = 2;
    net nt;
    net_new(&nt, "ring", 8, 16, &cfg);
    uint64_t slow_rounds = 0;
    for (uint64_t t = 0; t < 400; t++) {
        for (int p = 1; p < 8; p++) sgp_round(&nt, p, t, (double)t + 1);
        if (t % 4 == 3) sgp_round(&nt, 0, slow_rounds++, (double)t + 1);
    }
    for (int i = 0; i < 8; i++) {
        hs_algo_stats st;
        hs_algo_get_stats(nt.a[i], &st);
        printf("# peer %d: %llu waits, %llu timed out\n", i, (unsigned long long)st.waits,
               (unsigned long long)st.wait_timeouts);
        assert_int_equal(st.wait_timeouts, i == 1 || i == 7 ? 1 : 0);
        assert_true(st.waits == st.wait_timeouts); /* a kept-up share is already there */
        assert_true(st.push_weight > 0);
    }
    net_free(&nt);
}

/* A peer that crashes mid-run: the survivors' views become the restricted topology
 * (Metropolis-Hastings, doubly stochastic), and they still reach consensus among themselves. */
static void test_churn_choco(void **state) {
    (void)state;
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_CHOCO;
    cfg.compress = "topk:0.5";
    cfg.gamma_c = 0.5f;
    net nt;
    net_new(&nt, "torus:4x4", 16, 32, &cfg);
    double avg[32];
    for (int r = 0; r < 20; r++) net_round(&nt, (uint64_t)r);
    assert_int_equal(hs_simnet_kill(nt.sim, 5), 0);
    /* Every survivor's row of the new matrix sums to 1 and it is symmetric. */
    double W[16][16] = {{0}};
    for (int i = 0; i < 16; i++) {
        if (i == 5) continue;
        hs_peer_view v;
        hs_exchange *ex = hs_simnet_exchange(nt.sim, i);
        assert_int_equal(ex->ops->view(ex, 20, &v), 0);
        assert_int_equal(v.n_members, 15);
        double row = v.self_w;
        for (int k = 0; k < v.n_in; k++) {
            assert_true(v.in[k].id != 5);
            W[i][v.in[k].id] = v.in[k].w;
            row += v.in[k].w;
        }
        assert_true(fabs(row - 1.0) < 1e-6);
    }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) assert_true(fabs(W[i][j] - W[j][i]) < 1e-12);
    double d0 = net_stats(&nt, avg), dist = d0;
    int r;
    for (r = 20; r < 2000 && dist > d0 / 1000; r++) {
        net_round(&nt, (uint64_t)r);
        dist = net_stats(&nt, avg);
    }
    printf("# choco after a crash: 1000x closer in %d more rounds\n", r - 20);
    assert_true(dist <= d0 / 1000);
    net_free(&nt);
}

/* Lossy links: a lost delta would leave a replica behind for good, so the receiver asks the
 * sender for its full replica (a flag on its own next message) and the two resynchronise.
 * With 10% of the messages dropped, CHOCO and DCD still reach consensus. */
static void test_lossy_links(void **state) {
    (void)state;
    const char *algos[] = {"choco", "dcd", "dpsgd", "beer"};
    const char *comp[] = {"topk:0.25", "none", "none", "topk:0.25"};
    for (int k = 0; k < 4; k++) {
        hs_algo_cfg cfg;
        hs_algo_cfg_default(&cfg);
        assert_int_equal(hs_algo_kind_parse(algos[k], &cfg.kind), 0);
        cfg.compress = comp[k];
        cfg.gamma_c = 0.4f;
        net nt;
        net_new(&nt, "ring", 8, 32, &cfg);
        hs_simnet_set_loss(nt.sim, 0.1, 3);
        double avg[32];
        double d0 = net_stats(&nt, avg), dist = d0;
        int r;
        for (r = 0; r < 3000 && dist > d0 / 1000; r++) {
            net_round(&nt, (uint64_t)r);
            dist = net_stats(&nt, avg);
        }
        uint64_t resyncs = 0;
        for (int i = 0; i < 8; i++) {
            hs_algo_stats st;
            hs_algo_get_stats(nt.a[i], &st);
            resyncs += st.resyncs;
        }
        printf("# %s with 10%% message loss: 1000x closer in %d rounds, %llu replicas resynchronised\n",
               algos[k], r, (unsigned long long)resyncs);
        assert_true(dist <= d0 / 1000);
        if (k != 2) assert_true(resyncs > 0); /* dpsgd keeps no replicas */
        net_free(&nt);
    }
}

/* Saving an algorithm mid-run and loading it into a fresh object continues identically. */
static void test_save_load(void **state) {
    (void)state;
    const char *algos[] = {"dpsgd", "dcd", "choco", "sgp", "beer"};
    /* The error-feedback residual travels in the save of the one algorithm that takes ef:. */
    const char *comp[] = {"ef:topk:0.3", "randk:0.5", "topk:0.3", "none", "topk:0.3"};
    for (int k = 0; k < 5; k++) {
        hs_algo_cfg cfg;
        hs_algo_cfg_default(&cfg);
        assert_int_equal(hs_algo_kind_parse(algos[k], &cfg.kind), 0);
        cfg.compress = comp[k];
        net a, b;
        const char *spec = k == 3 ? "onepeer-exp" : "ring";
        net_new(&a, spec, 8, 40, &cfg);
        net_new(&b, spec, 8, 40, &cfg);
        for (int r = 0; r < 7; r++) net_round(&a, (uint64_t)r);
        /* A loaded state saves to the same bytes: nothing is lost or reinterpreted. */
        for (int i = 0; i < 8; i++) {
            hs_buf *s1, *s2;
            assert_int_equal(hs_buf_new(&s1, 0), 0);
            assert_int_equal(hs_buf_new(&s2, 0), 0);
            assert_int_equal(hs_algo_save(a.a[i], s1), 0);
            int err = hs_algo_load(b.a[i], s1->data, s1->len);
            if (err) fail_msg("%s load: %s", algos[k], hs_error_message());
            assert_int_equal(hs_algo_save(b.a[i], s2), 0);
            assert_int_equal(s1->len, s2->len);
            assert_memory_equal(s1->data, s2->data, s1->len);
            if (k == 0) { /* D-PSGD (no replicas): a version-2 state, with d zeros as own */
                uint32_t cl = 0;
                memcpy(&cl, s1->data + 20, 4);
                size_t at = 36 + cl, zeros = 40 * sizeof(float);
                hs_buf *v2;
                assert_int_equal(hs_buf_new(&v2, s1->len + zeros), 0);
                memcpy(v2->data, s1->data, at);
                memset(v2->data + at, 0, zeros);
                memcpy(v2->data + at + zeros, s1->data + at, s1->len - at);
                v2->data[4] = 2;
                v2->len = s1->len + zeros;
                assert_int_equal(hs_algo_load(b.a[i], v2->data, v2->len), 0);
                hs_buf_unref(s2);
                assert_int_equal(hs_buf_new(&s2, 0), 0);
                assert_int_equal(hs_algo_save(b.a[i], s2), 0);
                assert_int_equal(s1->len, s2->len);
                assert_memory_equal(s1->data, s2->data, s1->len);
                /* Version 3 has no own vector: a version-3 head over version-2 bytes is refused. */
                v2->data[4] = 3;
                assert_true(hs_algo_load(b.a[i], v2->data, v2->len) < 0);
                hs_buf_unref(v2);
            }
            /* Corruptions are refused and leave the state as it was. */
            assert_true(hs_algo_load(b.a[i], s1->data, s1->len - 1) < 0);
            s1->data[0] ^= 1;
            assert_int_equal(hs_algo_load(b.a[i], s1->data, s1->len), HS_EFORMAT);
            hs_buf_unref(s1);
            hs_buf_unref(s2);
        }
        net_free(&a);
        net_free(&b);
    }
    /* Another algorithm's state is refused by name. */
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    float x[4] = {0};
    hs_algo *p, *q;
    cfg.kind = HS_ALGO_DPSGD;
    assert_int_equal(hs_algo_new(&p, &cfg, 0, 4, x), 0);
    cfg.kind = HS_ALGO_CHOCO;
    assert_int_equal(hs_algo_new(&q, &cfg, 0, 4, x), 0);
    hs_buf *s;
    assert_int_equal(hs_buf_new(&s, 0), 0);
    assert_int_equal(hs_algo_save(p, s), 0);
    assert_int_equal(hs_algo_load(q, s->data, s->len), HS_EMISMATCH);
    assert_non_null(strstr(hs_error_message(), "dpsgd"));
    hs_buf_unref(s);
    hs_algo_free(p);
    hs_algo_free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_consensus_dpsgd),
        cmocka_unit_test(test_dpsgd_pair_in_place),
        cmocka_unit_test(test_consensus_choco),
        cmocka_unit_test(test_consensus_dcd),
        cmocka_unit_test(test_consensus_beer),
        cmocka_unit_test(test_beer_tracks_gradient),
        cmocka_unit_test(test_dcd_average_in_expectation),
        cmocka_unit_test(test_dcd_refuses_biased),
        cmocka_unit_test(test_default_gamma_c),
        cmocka_unit_test(test_compressor_rules),
        cmocka_unit_test(test_sgp_push_sum),
        cmocka_unit_test(test_sgp_straggler_waited_once),
        cmocka_unit_test(test_churn_choco),
        cmocka_unit_test(test_lossy_links),
        cmocka_unit_test(test_save_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
