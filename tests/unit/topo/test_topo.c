/* Unit tests of src/topo: spectral gaps against closed forms, per-rank views against the global
 * matrix for every generator and n up to 64, weights, the random regular generator, the file
 * reader's errors, JSON round trips, link emulation, addresses and restriction. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/error.h"
#include "hearsay/topo.h"

/* cmocka 1.1.5 has no floating-point assertion: |a - b| <= eps, printing both on failure. */
#define assert_near(a, b, eps)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (eps)))                                                             \
            fail_msg("%s = %.17g, expected %.17g within %g", #a, a_, b_, (double)(eps));           \
    } while (0)

static hs_topo *gen(const char *spec, int n) {
    hs_topo *t = NULL;
    int err = hs_topo_new(&t, spec, n, 1);
    if (err < 0) fail_msg("%s on %d peers: %s", spec, n, hs_error_message());
    return t;
}

static hs_topo *from_str(const char *json, unsigned flags) {
    hs_topo *t = NULL;
    int err = hs_topo_from_json(&t, json, strlen(json), "test.json", flags);
    if (err < 0) fail_msg("%s: %s", json, hs_error_message());
    return t;
}

/* The reader refuses json with `code` and a message containing `text`. */
static void refuses(const char *json, int code, const char *text) {
    hs_topo *t = NULL;
    int err = hs_topo_from_json(&t, json, strlen(json), "test.json", 0);
    if (err != code || !strstr(hs_error_message(), text))
        fail_msg("%s: expected %s with '%s', got %s '%s'", json, hs_err_name(code), text,
                 hs_err_name(err), hs_error_message());
    assert_null(t);
}

static hs_topo_report check(const hs_topo *t, unsigned flags) {
    hs_topo_report r;
    assert_int_equal(hs_topo_check(t, flags, &r), 0);
    return r;
}

static double *dense(const hs_topo *t, uint64_t round) {
    size_t n = (size_t)hs_topo_n(t);
    double *W = malloc(n * n * sizeof(double));
    assert_non_null(W);
    assert_int_equal(hs_topo_matrix(t, round, W), 0);
    return W;
}

/* ------------------------------------------------------------------ spectral gaps */

static void test_gap_ring(void **state) {
    (void)state;
    const int ns[] = {5, 8, 16, 33, 64, 100};
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        int n = ns[k];
        hs_topo *t = gen("ring", n);
        hs_topo_report r = check(t, 0);
        double want = 1.0 / 3 + 2.0 / 3 * cos(2 * M_PI / n);
        assert_true(r.valid);
        assert_true(r.gap_computed);
        assert_string_equal(r.method, "dsyev");
        assert_near(r.lambda2, want, 1e-5);
        assert_near(r.gap, 1 - want, 1e-5);
        hs_topo_free(t);

        /* The same ring written with explicit weights 1/3 in a file. */
        char buf[8192];
        size_t len = (size_t)snprintf(buf, sizeof(buf), "{\"peers\": %d, \"edges\": [", n);
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s[%d, %d, 0.3333333333333333]",
                                    i ? ", " : "", i, (i + 1) % n);
        snprintf(buf + len, sizeof(buf) - len, "], \"self_weight\": \"auto\"}");
        t = from_str(buf, 0);
        r = check(t, 0);
        assert_true(r.valid);
        assert_near(r.lambda2, want, 1e-5);
        hs_topo_free(t);
    }
}

static void test_gap_complete(void **state) {
    (void)state;
    const int ns[] = {2, 3, 8, 17, 64};
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        hs_topo *t = gen("complete", ns[k]);
        hs_topo_report r = check(t, 0);
        assert_true(r.valid);
        assert_near(r.gap, 1.0, 1e-5);
        assert_int_equal(r.edges, (long)ns[k] * (ns[k] - 1) / 2);
        assert_int_equal(r.in_min, ns[k] - 1);
        hs_topo_free(t);
    }
}

static void test_gap_hypercube(void **state) {
    (void)state;
    for (int k = 1; k <= 7; k++) {
        hs_topo *t = gen("hypercube", 1 << k);
        hs_topo_report r = check(t, 0);
        assert_true(r.valid);
        assert_near(r.lambda2, (double)(k - 1) / (k + 1), 1e-5);
        assert_int_equal(r.in_min, k);
        assert_int_equal(r.in_max, k);
        hs_topo_free(t);
    }
}

/* Torus R x C (R, C >= 3): eigenvalues (1 + 2 cos(2 pi a / R) + 2 cos(2 pi b / C)) / 5. */
static void test_gap_torus(void **state) {
    (void)state;
    const int dims[][2] = {{3, 5}, {4, 4}, {4, 6}, {5, 7}};
    for (size_t k = 0; k < sizeof(dims) / sizeof(dims[0]); k++) {
        int R = dims[k][0], C = dims[k][1];
        char spec[32];
        snprintf(spec, sizeof(spec), "torus:%dx%d", R, C);
        hs_topo *t = gen(spec, 0);
        assert_int_equal(hs_topo_n(t), R * C);
        double want = 0;
        for (int a = 0; a < R; a++)
            for (int b = 0; b < C; b++)
                if (a || b) {
                    double l = fabs(1 + 2 * cos(2 * M_PI * a / R) + 2 * cos(2 * M_PI * b / C)) / 5;
                    if (l > want) want = l;
                }
        hs_topo_report r = check(t, 0);
        assert_true(r.valid);
        assert_near(r.lambda2, want, 1e-5);
        hs_topo_free(t);
    }
}

/* A directed ring with shares 1/2: W = (I + P) / 2, eigenvalues (1 + e^(2 pi i k / n)) / 2 of
 * modulus |cos(pi k / n)|, so lambda_2 = cos(pi / n); exercises dgeev. */
static void test_gap_directed_ring(void **state) {
    (void)state;
    const int ns[] = {6, 9, 20};
    for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
        int n = ns[k];
        char buf[2048];
        size_t len = (size_t)snprintf(buf, sizeof(buf),
                                      "{\"peers\": %d, \"directed\": true, \"edges\": [", n);
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s[%d, %d]", i ? ", " : "", i,
                                    (i + 1) % n);
        snprintf(buf + len, sizeof(buf) - len, "]}");
        hs_topo *t = from_str(buf, 0);
        hs_topo_report r = check(t, 0);
        assert_true(r.valid);
        assert_false(r.symmetric);
        assert_string_equal(r.method, "dgeev");
        assert_near(r.lambda2, cos(M_PI / n), 1e-5);
        hs_topo_free(t);
    }
}

/* One-peer exponential: for n a power of 2 the product of one period's matrices is exactly the
 * average J / n (gap 1); for other n it still mixes. */
static void test_onepeer_product(void **state) {
    (void)state;
    for (int n = 2; n <= 64; n *= 2) {
        hs_topo *t = gen("onepeer-exp", n);
        int P = hs_topo_period(t);
        assert_int_equal(1 << P, n);
        assert_true(hs_topo_directed(t));
        double *A = calloc((size_t)n * n, sizeof(double)), *B = malloc((size_t)n * n * 8);
        for (int i = 0; i < n; i++) A[i * n + i] = 1;
        for (int r = 0; r < P; r++) {
            double *W = dense(t, (uint64_t)r);
            for (int i = 0; i < n; i++)
                for (int j = 0; j < n; j++) {
                    double s = 0;
                    for (int q = 0; q < n; q++) s += W[i * n + q] * A[q * n + j];
                    B[i * n + j] = s;
                }
            memcpy(A, B, (size_t)n * n * 8);
            /* Round r: i keeps 1/2 and sends 1/2 to i + 2^r. */
            for (int i = 0; i < n; i++) {
                assert_near(W[i * n + i], 0.5, 0);
                assert_near(W[((i + (1 << r)) % n) * n + i], 0.5, 0);
            }
            free(W);
        }
        for (int q = 0; q < n * n; q++) assert_near(A[q], 1.0 / n, 1e-12);
        hs_topo_report r = check(t, 0);
        assert_true(r.valid);
        assert_near(r.gap, 1.0, 1e-9);
        /* The round index wraps with the period. */
        double *W0 = dense(t, 0), *WP = dense(t, (uint64_t)P * 1000);
        assert_memory_equal(W0, WP, (size_t)n * n * sizeof(double));
        free(W0);
        free(WP);
        free(A);
        free(B);
        hs_topo_free(t);
    }
    const int odd[] = {3, 5, 12, 24};
    for (size_t k = 0; k < sizeof(odd) / sizeof(odd[0]); k++) {
        hs_topo *t = gen("onepeer-exp", odd[k]);
        int P = 0;
        while ((1 << P) < odd[k]) P++;
        assert_int_equal(hs_topo_period(t), P);
        hs_topo_report r = check(t, 0);
        assert_true(r.valid);
        assert_true(r.gap > 0.05 && r.gap < 1 - 1e-6);
        hs_topo_free(t);
    }
}

/* A bipartite graph without self weights is periodic (eigenvalue -1); a triangle is not. */
static void test_periodic(void **state) {
    (void)state;
    hs_topo *t = from_str("{\"peers\": 4, \"edges\": [[0, 1, 0.5], [1, 2, 0.5], [2, 3, 0.5], "
                          "[3, 0, 0.5]], \"self_weight\": 0}",
                          HS_TOPO_LENIENT);
    hs_topo_report r = check(t, 0);
    assert_false(r.valid);
    assert_false(r.aperiodic);
    assert_true(r.connected);
    assert_near(r.gap, 0, 1e-9);
    assert_non_null(strstr(r.reason, "periodic with period 2"));
    hs_topo_free(t);
    t = from_str("{\"peers\": 3, \"edges\": [[0, 1, 0.5], [1, 2, 0.5], [2, 0, 0.5]], "
                 "\"self_weight\": 0}",
                 0);
    r = check(t, 0);
    assert_true(r.valid);
    assert_true(r.aperiodic);
    assert_near(r.gap, 0.5, 1e-9);
    hs_topo_free(t);
}

/* ------------------------------------------------------------------ views */

/* The union of all ranks' views at a round is W, and i lists j as an in-neighbour with w iff j
 * lists i as an out-neighbour with the same w. */
static void views_match(const hs_topo *t, uint64_t round) {
    int n = hs_topo_n(t);
    double *W = dense(t, round);
    double *U = calloc((size_t)n * n, sizeof(double));
    double *O = calloc((size_t)n * n, sizeof(double));
    hs_view *v = calloc((size_t)n, sizeof(hs_view));
    assert_true(U && O && v);
    for (int i = 0; i < n; i++) {
        assert_int_equal(hs_topo_view(t, i, round, &v[i]), 0);
        assert_int_equal(v[i].rank, i);
        assert_int_equal(v[i].n, n);
        U[i * n + i] = v[i].self_w;
        O[i * n + i] = v[i].self_w;
        for (int k = 0; k < v[i].n_in; k++) {
            const hs_edge *e = &v[i].in[k];
            assert_true(e->peer >= 0 && e->peer < n && e->peer != i);
            if (k) assert_true(e->peer > v[i].in[k - 1].peer);
            assert_true(e->w > 0);
            U[i * n + e->peer] = e->w;
        }
        for (int k = 0; k < v[i].n_out; k++) {
            const hs_edge *e = &v[i].out[k];
            assert_true(e->peer >= 0 && e->peer < n && e->peer != i);
            if (k) assert_true(e->peer > v[i].out[k - 1].peer);
            O[e->peer * n + i] = e->w;
        }
        if (!hs_topo_directed(t)) {
            assert_int_equal(v[i].n_in, v[i].n_out);
            for (int k = 0; k < v[i].n_in; k++) assert_int_equal(v[i].in[k].peer, v[i].out[k].peer);
        }
    }
    /* Both unions are W entry for entry (the same doubles, not approximately). */
    assert_memory_equal(U, W, (size_t)n * n * sizeof(double));
    assert_memory_equal(O, W, (size_t)n * n * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int k = 0; k < v[i].n_in; k++) {
            int j = v[i].in[k].peer, found = 0;
            for (int q = 0; q < v[j].n_out; q++)
                if (v[j].out[q].peer == i) {
                    found = 1;
                    assert_true(v[j].out[q].w == v[i].in[k].w);
                }
            assert_true(found);
        }
    for (int i = 0; i < n; i++) hs_view_free(&v[i]);
    free(v);
    free(W);
    free(U);
    free(O);
}

static void test_views_every_generator(void **state) {
    (void)state;
    const char *specs[] = {"ring", "torus", "hypercube", "exponential", "onepeer-exp",
                           "complete", "regular:2", "regular:3", "regular:4", "regular:7",
                           "two-cluster", "two-cluster:3"};
    int built = 0;
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++)
        for (int n = 1; n <= 64; n++) {
            hs_topo *t = NULL;
            if (hs_topo_new(&t, specs[s], n, (uint64_t)n) < 0) {
                /* Only the combinations a generator rules out may fail. */
                int pow2 = (n & (n - 1)) == 0;
                int ok_fail = (!strcmp(specs[s], "hypercube") && !pow2) ||
                              (!strncmp(specs[s], "regular:", 8)) ||
                              (!strncmp(specs[s], "two-cluster", 11));
                if (!ok_fail) fail_msg("%s on %d peers: %s", specs[s], n, hs_error_message());
                continue;
            }
            built++;
            assert_int_equal(hs_topo_n(t), n);
            for (int r = 0; r < hs_topo_period(t); r++) views_match(t, (uint64_t)r);
            hs_topo_report rep = check(t, HS_TOPO_CHECK_NOGAP);
            if (!rep.valid) fail_msg("%s on %d peers: %s", specs[s], n, rep.reason);
            hs_topo_free(t);
        }
    /* The generators admit most sizes: a sanity bound on the loop above. */
    assert_true(built > 600);
}

static void test_view_errors(void **state) {
    (void)state;
    hs_topo *t = gen("ring", 4);
    hs_view v;
    assert_int_equal(hs_topo_view(t, 4, 0, &v), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "rank 4 is not in [0, 4)"));
    assert_int_equal(hs_topo_view(t, -1, 0, &v), HS_EINVAL);
    assert_null(v.in);
    hs_view_free(&v);
    hs_view_free(NULL);
    hs_topo_free(t);
    hs_topo_free(NULL);
}

/* ------------------------------------------------------------------ weights and generators */

static void test_metropolis_weights(void **state) {
    (void)state;
    hs_topo *t = gen("two-cluster", 10);
    int n = 10;
    double *W = dense(t, 0);
    int deg[10] = {0};
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) deg[i] += i != j && W[i * n + j] > 0;
    /* Clusters {0..4} and {5..9}, complete inside; bridges 0-5 and 2-7. */
    assert_int_equal(deg[0], 5);
    assert_int_equal(deg[2], 5);
    assert_int_equal(deg[1], 4);
    assert_true(W[0 * n + 5] > 0 && W[2 * n + 7] > 0 && W[1 * n + 6] == 0);
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < n; j++) {
            if (i == j || W[i * n + j] == 0) continue;
            double want = 1.0 / (1 + (deg[i] > deg[j] ? deg[i] : deg[j]));
            assert_near(W[i * n + j], want, 1e-15);
            assert_near(W[j * n + i], want, 0);
            s += W[i * n + j];
        }
        assert_near(W[i * n + i], 1 - s, 1e-15);
    }
    free(W);
    hs_topo_free(t);

    /* Regular graphs: Metropolis-Hastings is the uniform 1/(d+1). */
    const struct {
        const char *spec;
        int n;
        double w;
    } reg[] = {{"ring", 8, 1.0 / 3}, {"complete", 6, 1.0 / 6}, {"hypercube", 16, 1.0 / 5},
               {"torus:4x4", 16, 1.0 / 5}, {"exponential", 16, 1.0 / 8}};
    for (size_t k = 0; k < sizeof(reg) / sizeof(reg[0]); k++) {
        t = gen(reg[k].spec, reg[k].n);
        hs_view v;
        assert_int_equal(hs_topo_view(t, 3, 0, &v), 0);
        assert_near(v.self_w, reg[k].w, 1e-15);
        for (int q = 0; q < v.n_in; q++) assert_near(v.in[q].w, reg[k].w, 1e-15);
        hs_view_free(&v);
        hs_topo_free(t);
    }
}

static void test_generator_shapes(void **state) {
    (void)state;
    /* Exponential on 16: i +/- 1, 2, 4, 8 (8 counted once). */
    hs_topo *t = gen("exponential", 16);
    hs_view v;
    assert_int_equal(hs_topo_view(t, 0, 0, &v), 0);
    int want[] = {1, 2, 4, 8, 12, 14, 15};
    assert_int_equal(v.n_in, 7);
    for (int k = 0; k < 7; k++) assert_int_equal(v.in[k].peer, want[k]);
    hs_view_free(&v);
    assert_string_equal(hs_topo_name(t), "exponential-16");
    hs_topo_free(t);
    /* Torus 4x4: rank 5 = (1, 1) has 1, 4, 6, 9. */
    t = gen("torus", 16);
    assert_string_equal(hs_topo_name(t), "torus-4x4");
    assert_int_equal(hs_topo_view(t, 5, 0, &v), 0);
    int tw[] = {1, 4, 6, 9};
    assert_int_equal(v.n_in, 4);
    for (int k = 0; k < 4; k++) assert_int_equal(v.in[k].peer, tw[k]);
    hs_view_free(&v);
    hs_topo_free(t);
    t = gen("torus", 12);
    assert_string_equal(hs_topo_name(t), "torus-3x4");
    hs_topo_free(t);
    /* Ring of 2 and of 1. */
    t = gen("ring", 2);
    hs_topo_report r = check(t, 0);
    assert_true(r.valid);
    assert_int_equal(r.edges, 1);
    hs_topo_free(t);
    t = gen("ring", 1);
    r = check(t, 0);
    assert_true(r.valid);
    assert_int_equal(r.edges, 0);
    assert_near(r.gap, 1, 0);
    hs_topo_free(t);
    /* Two clusters with 3 bridges on 16. */
    t = gen("two-cluster:3", 16);
    assert_string_equal(hs_topo_name(t), "two-cluster-16-b3");
    r = check(t, 0);
    assert_int_equal(r.edges, 2 * 28 + 3);
    hs_topo_free(t);
}

static void test_regular(void **state) {
    (void)state;
    const int cases[][2] = {{16, 4}, {20, 3}, {64, 2}, {20, 15}, {11, 10}, {12, 6}, {1024, 8}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int n = cases[k][0], D = cases[k][1];
        char spec[32];
        snprintf(spec, sizeof(spec), "regular:%d", D);
        hs_topo *a = NULL, *b = NULL, *c = NULL;
        assert_int_equal(hs_topo_new(&a, spec, n, 42), 0);
        assert_int_equal(hs_topo_new(&b, spec, n, 42), 0);
        assert_int_equal(hs_topo_new(&c, spec, n, 43), 0);
        hs_topo_report r = check(a, n > 64 ? HS_TOPO_CHECK_NOGAP : 0);
        assert_true(r.valid);
        assert_true(r.connected);
        assert_int_equal(r.in_min, D);
        assert_int_equal(r.in_max, D);
        assert_int_equal(r.edges, (long)n * D / 2);
        double *A = dense(a, 0), *B = dense(b, 0), *C = dense(c, 0);
        assert_memory_equal(A, B, (size_t)n * n * sizeof(double));
        if (D < n - 1 && !(n == 4 && D == 2))
            assert_true(memcmp(A, C, (size_t)n * n * sizeof(double)) != 0);
        free(A);
        free(B);
        free(C);
        hs_topo_free(a);
        hs_topo_free(b);
        hs_topo_free(c);
    }
}

static void gen_fails(const char *spec, int n, const char *text) {
    hs_topo *t = NULL;
    int err = hs_topo_new(&t, spec, n, 1);
    if (err != HS_EINVAL || !strstr(hs_error_message(), text))
        fail_msg("%s on %d: expected HS_EINVAL with '%s', got %s '%s'", spec, n, text,
                 hs_err_name(err), hs_error_message());
    assert_null(t);
}

static void test_spec_errors(void **state) {
    (void)state;
    gen_fails("star", 8, "unknown kind 'star'");
    gen_fails("ring:3", 8, "ring takes no parameters");
    gen_fails("ring", 0, "needs a number of peers (got 0)");
    gen_fails("ring", HS_TOPO_MAX_PEERS + 1, "65537 peers (at most 65536)");
    gen_fails("hypercube", 12, "12 peers is not a power of 2");
    gen_fails("torus:4y4", 16, "expected torus:RxC");
    gen_fails("torus:4x", 16, "expected torus:RxC");
    gen_fails("torus:4x4", 12, "4x4 is 16 peers, not 12");
    gen_fails("regular", 8, "expected regular:D");
    gen_fails("regular:x", 8, "expected regular:D");
    gen_fails("regular:3", 9, "n * D is odd");
    gen_fails("regular:8", 8, "degree 8 must be in [0, 8)");
    gen_fails("regular:1", 6, "never connected");
    gen_fails("regular:0", 3, "never connected");
    gen_fails("two-cluster", 1, "needs at least 2 peers");
    gen_fails("two-cluster:5", 8, "5 bridges between clusters of 4 and 4");
    gen_fails("two-cluster:0", 8, "expected two-cluster:BRIDGES");
    gen_fails("complete", 4000, "need 15996000 matrix entries");
    hs_topo *t = NULL;
    assert_int_equal(hs_topo_new(&t, "nope.json", 0, 1), HS_ENOENT);
    assert_non_null(strstr(hs_error_message(), "nope.json: cannot open"));
    assert_null(t);
}

/* ------------------------------------------------------------------ the file reader */

static void test_reader_errors(void **state) {
    (void)state;
    refuses("{\"peers\": 3, \"edges\": [[0, 1], [1, 2]", HS_EFORMAT, "not valid JSON");
    refuses("{\"peers\": 2, \"edges\": [[0, 1]]} {}", HS_EFORMAT, "trailing characters");
    refuses("", HS_EFORMAT, "not valid JSON");
    refuses("7", HS_EINVAL, "top level: expected an object, got number 7");
    refuses("{\"peers\": 3, \"edges\": [[0, 1], [1, 2, -0.2]]}", HS_EINVAL,
            "test.json: edges[1]: has a weight but edges[0] has none");
    refuses("{\"peers\": 3, \"edges\": [[0, 1, 0.3], [1, 2, -0.2]]}", HS_EINVAL,
            "test.json: edges[1]: weight -0.2 is negative");
    refuses("{\"peers\": 3, \"edges\": [[0, 1, 0.3], [1, 2, 1e999]]}", HS_EINVAL,
            "edges[1]: weight inf is not finite");
    refuses("{\"peers\": 3, \"edges\": [[0, 3]]}", HS_EINVAL, "edges[0][1]: peer 3 is out of range");
    refuses("{\"peers\": 3, \"edges\": [[1, 1]]}", HS_EINVAL, "edges[0]: self edge 1-1");
    refuses("{\"peers\": 3, \"edges\": [[0, 1], [1, 2], [2, 1]]}", HS_EINVAL,
            "edges[2]: edge 2-1 duplicates edges[1]");
    refuses("{\"peers\": 3, \"edges\": [[0, 1]]}", HS_EINVAL, "peer 2 has no neighbours");
    refuses("{\"peers\": 4, \"edges\": [[0, 1], [2, 3]]}", HS_EINVAL, "not connected");
    refuses("{\"peers\": 3, \"edges\": [[0, 1, 0.5], [1, 2, 0.5]], \"self_weight\": [0.5, 0.2, "
            "0.5]}",
            HS_EINVAL, "row 1 sums to 1.2");
    refuses("{\"peers\": 1e10, \"edges\": []}", HS_EINVAL, "peers: 1e+10 is not in 1..65536");
    refuses("{\"peers\": 2, \"directed\": true, \"schedule\": [{\"edges\": [[0, 1]]}, 5]}",
            HS_EINVAL, "schedule[1]: expected an object");
    refuses("{\"peers\": 2, \"directed\": true, \"schedule\": [{\"self_weight\": 1}]}", HS_EINVAL,
            "schedule[0]: missing key \"edges\"");
    refuses("{\"peers\": 2, \"edges\": [[0, 1]], \"description\": 3}", HS_EINVAL,
            "description: expected a string");
    refuses("{\"peers\": 2, \"edges\": [[0, 1]], \"name\": \"a\\u0001b\"}", HS_EINVAL,
            "name: character 0x01 at offset 1 is not printable ASCII");
    /* Not NUL-terminated: the reader stops at len. */
    const char good[] = "{\"peers\": 2, \"edges\": [[0, 1]]}XXXX";
    hs_topo *t = NULL;
    assert_int_equal(hs_topo_from_json(&t, good, sizeof(good) - 5, "mem", 0), 0);
    assert_string_equal(hs_topo_name(t), "mem");
    hs_topo_free(t);
    /* A lenient read keeps an invalid matrix for check to report. */
    t = from_str("{\"peers\": 4, \"edges\": [[0, 1], [2, 3]]}", HS_TOPO_LENIENT);
    hs_topo_report r = check(t, 0);
    assert_false(r.valid);
    assert_false(r.connected);
    assert_false(r.gap_computed == 0); /* stochastic, so the gap is computed: 0 */
    assert_near(r.gap, 0, 1e-9);
    hs_topo_free(t);
}

static void test_reader_schedule_and_weights(void **state) {
    (void)state;
    hs_topo *t = from_str(
        "{\"name\": \"sched\", \"peers\": 3, \"directed\": true, \"schedule\": ["
        "{\"edges\": [[0, 1, 0.25], [1, 2, 0.5], [2, 0, 1]], \"self_weight\": [0.75, 0.5, 0]},"
        "{\"edges\": [[0, 2, 0.5], [2, 1, 0.5], [1, 0, 0.5]]}]}",
        0);
    assert_int_equal(hs_topo_period(t), 2);
    assert_string_equal(hs_topo_name(t), "sched");
    double *W = dense(t, 0);
    assert_near(W[1 * 3 + 0], 0.25, 0);
    assert_near(W[0 * 3 + 0], 0.75, 0);
    assert_near(W[0 * 3 + 2], 1, 0);
    assert_near(W[2 * 3 + 2], 0, 0);
    free(W);
    W = dense(t, 3);
    assert_near(W[2 * 3 + 0], 0.5, 0);
    assert_near(W[0 * 3 + 0], 0.5, 0); /* auto: 1 - column sum */
    free(W);
    hs_topo_report r = check(t, 0);
    assert_true(r.valid);
    assert_int_equal(r.edges, 6);
    assert_string_equal(r.method, "dgeev");
    hs_topo_free(t);
}

static const char *source_root(void) {
    const char *s = getenv("HS_SOURCE_ROOT");
    return s ? s : ".";
}

static void test_shipped_files(void **state) {
    (void)state;
    const char *names[] = {"ring-8", "ring-16", "torus-4x4", "hypercube-16", "exponential-16",
                           "complete-8", "regular-16-d4", "two-cluster-16", "two-cluster-16-wan",
                           "onepeer-exp-16"};
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        char path[1024];
        snprintf(path, sizeof(path), "%s/topo/%s.json", source_root(), names[k]);
        hs_topo *t = NULL;
        if (hs_topo_new(&t, path, 0, 0) < 0) fail_msg("%s", hs_error_message());
        assert_string_equal(hs_topo_name(t), names[k]);
        hs_topo_report r = check(t, 0);
        assert_true(r.valid);
        assert_true(r.gap > 0);
        assert_int_equal(hs_topo_has_emulation(t), strstr(names[k], "wan") != NULL);
        hs_topo_free(t);
    }
    /* ring-8.json is the generator's ring on 8 peers, entry for entry. */
    char path[1024];
    snprintf(path, sizeof(path), "%s/topo/ring-8.json", source_root());
    hs_topo *f = NULL, *g = gen("ring", 8);
    assert_int_equal(hs_topo_new(&f, path, 8, 0), 0);
    double *A = dense(f, 0), *B = dense(g, 0);
    assert_memory_equal(A, B, 64 * sizeof(double));
    free(A);
    free(B);
    hs_topo_free(f);
    hs_topo_free(g);
    /* A file with another peer count than the run's is refused. */
    f = NULL;
    assert_int_equal(hs_topo_new(&f, path, 9, 0), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "the file has 8 peers, not 9"));
}

/* ------------------------------------------------------------------ round trips */

static void same_topo(const hs_topo *a, const hs_topo *b) {
    int n = hs_topo_n(a);
    assert_int_equal(hs_topo_n(b), n);
    assert_int_equal(hs_topo_directed(a), hs_topo_directed(b));
    assert_int_equal(hs_topo_period(a), hs_topo_period(b));
    assert_string_equal(hs_topo_name(a), hs_topo_name(b));
    for (int r = 0; r < hs_topo_period(a); r++) {
        double *A = dense(a, (uint64_t)r), *B = dense(b, (uint64_t)r);
        assert_memory_equal(A, B, (size_t)n * n * sizeof(double));
        free(A);
        free(B);
    }
    for (int i = 0; i < n; i++) {
        const char *x = hs_topo_address(a, i), *y = hs_topo_address(b, i);
        assert_true((x == NULL) == (y == NULL));
        if (x) assert_string_equal(x, y);
        for (int j = 0; j < n; j++) {
            x = hs_topo_link_emulation(a, i, j);
            y = hs_topo_link_emulation(b, i, j);
            assert_true((x == NULL) == (y == NULL));
            if (x) assert_string_equal(x, y);
        }
    }
}

static void round_trip(const hs_topo *t) {
    for (int flags = 0; flags < 2; flags++) {
        char *s = NULL;
        hs_topo *u = NULL;
        assert_int_equal(hs_topo_to_json(t, flags ? HS_TOPO_JSON_WEIGHTS : 0, &s), 0);
        if (hs_topo_from_json(&u, s, strlen(s), "rt", HS_TOPO_LENIENT) < 0)
            fail_msg("%s\n%s", hs_error_message(), s);
        same_topo(t, u);
        free(s);
        hs_topo_free(u);
    }
}

static void test_round_trip(void **state) {
    (void)state;
    const char *specs[] = {"ring", "torus", "exponential", "onepeer-exp", "complete",
                           "regular:3", "two-cluster", "hypercube"};
    const int ns[] = {1, 2, 6, 16, 30};
    for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++)
        for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
            hs_topo *t = NULL;
            if (hs_topo_new(&t, specs[s], ns[k], 5) < 0) continue;
            round_trip(t);
            hs_topo_free(t);
        }
    /* Explicit, irregular weights, addresses and every kind of emulation entry. */
    hs_topo *t = from_str(
        "{\"name\": \"x y\", \"peers\": 4, \"edges\": [[0, 1, 0.1], [1, 2, 0.2], [2, 3, 0.3], "
        "[3, 0, 0.4], [0, 2, 0.05]], \"self_weight\": \"auto\","
        "\"addresses\": [\"10.0.0.1:7070\", \"10.0.0.2:7070\", \"[::1]:7070\", \"h\\\"q:1\"],"
        "\"emulate\": {\"default\": \"delay=1ms\", \"peers\": {\"2\": \"delay=5ms\", \"3\": \"\"},"
        "\"edges\": [[0, 1, \"delay=50ms,rate=10mbit\"], [3, 2, \"\"]]}}",
        0);
    round_trip(t);
    hs_topo_free(t);
    t = from_str("{\"peers\": 3, \"edges\": [[0, 1, 0.5], [1, 2, 0.5], [2, 0, 0.25]], "
                 "\"self_weight\": [0.25, 0, 0.25]}",
                 HS_TOPO_LENIENT);
    round_trip(t);
    hs_topo_free(t);
}

/* ------------------------------------------------------------------ addresses, emulation */

static void test_emulation(void **state) {
    (void)state;
    const char *j =
        "{\"peers\": 4, \"edges\": [[0, 1], [1, 2], [2, 3], [3, 0]],"
        "\"addresses\": [\"a:1\", \"b:1\", \"c:1\", \"d:1\"],"
        "\"emulate\": {\"default\": \"delay=1ms\", \"peers\": {\"2\": \"delay=5ms\", \"3\": \"\"},"
        "\"edges\": [[0, 1, \"delay=50ms\"], [2, 3, \"\"]]}}";
    hs_topo *t = from_str(j, 0);
    assert_true(hs_topo_has_emulation(t));
    assert_string_equal(hs_topo_address(t, 2), "c:1");
    assert_null(hs_topo_address(t, 4));
    assert_null(hs_topo_address(t, -1));
    /* An edge entry covers both directions of an undirected edge. */
    assert_string_equal(hs_topo_link_emulation(t, 0, 1), "delay=50ms");
    assert_string_equal(hs_topo_link_emulation(t, 1, 0), "delay=50ms");
    /* Then the sender's peer entry, then the default. */
    assert_string_equal(hs_topo_link_emulation(t, 2, 1), "delay=5ms");
    assert_string_equal(hs_topo_link_emulation(t, 1, 2), "delay=1ms");
    assert_string_equal(hs_topo_link_emulation(t, 0, 3), "delay=1ms");
    /* "" exempts: from the peer entry of 3 and from the edge 2-3 over 2's peer entry. */
    assert_null(hs_topo_link_emulation(t, 3, 0));
    assert_null(hs_topo_link_emulation(t, 2, 3));
    assert_null(hs_topo_link_emulation(t, 0, 9));
    hs_topo_free(t);

    t = from_str("{\"peers\": 3, \"directed\": true, \"edges\": [[0, 1], [1, 2], [2, 0]],"
                 "\"emulate\": {\"edges\": [[0, 1, \"loss=0.01\"]]}}",
                 0);
    assert_string_equal(hs_topo_link_emulation(t, 0, 1), "loss=0.01");
    assert_null(hs_topo_link_emulation(t, 1, 0));
    hs_topo_free(t);
    /* A directed entry must follow an arc's direction. */
    refuses("{\"peers\": 3, \"directed\": true, \"edges\": [[0, 1], [1, 2], [2, 0]],"
            "\"emulate\": {\"edges\": [[1, 0, \"loss=0.01\"]]}}",
            HS_EINVAL, "emulate.edges[0]: 1->0 is not a link of the topology");
    t = gen("ring", 4);
    assert_false(hs_topo_has_emulation(t));
    assert_null(hs_topo_link_emulation(t, 0, 1));
    assert_null(hs_topo_address(t, 0));
    hs_topo_free(t);
}

/* ------------------------------------------------------------------ restriction */

static void test_restrict(void **state) {
    (void)state;
    hs_topo *t = from_str("{\"peers\": 8, \"edges\": [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], "
                          "[5, 6], [6, 7], [7, 0]], \"addresses\": [\"h:0\", \"h:1\", \"h:2\", "
                          "\"h:3\", \"h:4\", \"h:5\", \"h:6\", \"h:7\"],"
                          "\"emulate\": {\"peers\": {\"5\": \"delay=5ms\"}, \"edges\": [[4, 5, "
                          "\"delay=9ms\"]]}}",
                          0);
    uint8_t alive[8] = {1, 1, 1, 0, 1, 1, 1, 1};
    hs_topo *u = NULL;
    assert_int_equal(hs_topo_restrict(&u, t, alive), 0);
    /* A path 4-5-6-7-0-1-2 renumbered 3..6, 0..2: Metropolis-Hastings gives 1/3 on every edge
     * and 2/3 of self weight at the two ends. */
    assert_int_equal(hs_topo_n(u), 7);
    hs_topo_report r = check(u, 0);
    assert_true(r.valid);
    assert_int_equal(r.edges, 6);
    assert_int_equal(r.in_min, 1);
    double *W = dense(u, 0);
    assert_near(W[2 * 7 + 2], 2.0 / 3, 1e-15);
    assert_near(W[3 * 7 + 3], 2.0 / 3, 1e-15);
    assert_near(W[2 * 7 + 1], 1.0 / 3, 1e-15);
    assert_near(W[2 * 7 + 3], 0, 0);
    free(W);
    assert_string_equal(hs_topo_address(u, 3), "h:4");
    assert_string_equal(hs_topo_link_emulation(u, 3, 4), "delay=9ms");
    assert_string_equal(hs_topo_link_emulation(u, 4, 5), "delay=5ms");
    for (int i = 0; i < 7; i++) views_match(u, 0);
    hs_topo_free(u);
    /* Two opposite crashes cut the ring in two. */
    uint8_t two[8] = {1, 1, 1, 0, 1, 1, 1, 0};
    assert_int_equal(hs_topo_restrict(&u, t, two), 0);
    r = check(u, 0);
    assert_false(r.connected);
    assert_non_null(strstr(r.reason, "not connected: 2 components"));
    hs_topo_free(u);
    uint8_t none[8] = {0};
    assert_int_equal(hs_topo_restrict(&u, t, none), HS_EINVAL);
    assert_null(u);
    hs_topo_free(t);

    /* Directed schedule: uniform shares, column stochastic every round. */
    t = gen("onepeer-exp", 16);
    uint8_t most[16];
    for (int i = 0; i < 16; i++) most[i] = i != 5;
    assert_int_equal(hs_topo_restrict(&u, t, most), 0);
    assert_int_equal(hs_topo_period(u), 4);
    r = check(u, HS_TOPO_CHECK_NOGAP);
    assert_true(r.col_stochastic);
    assert_true(r.nonnegative);
    for (int k = 0; k < 4; k++) views_match(u, (uint64_t)k);
    hs_topo_free(u);
    hs_topo_free(t);
}

/* ------------------------------------------------------------------ reports and DOT */

static void test_report_fields(void **state) {
    (void)state;
    hs_topo *t = gen("onepeer-exp", 16);
    hs_topo_report r = check(t, HS_TOPO_CHECK_NOGAP);
    assert_true(r.valid);
    assert_int_equal(r.period, 4);
    assert_true(r.directed);
    assert_int_equal(r.edges, 64);
    assert_int_equal(r.in_min, 4);
    assert_int_equal(r.out_max, 4);
    assert_false(r.gap_computed);
    assert_true(isnan(r.gap));
    assert_string_equal(r.method, "");
    assert_string_equal(r.reason, "");
    hs_topo_free(t);
    t = from_str("{\"peers\": 4, \"directed\": true, \"edges\": [[0, 1, 0.5], [1, 2, 0.5], "
                 "[2, 3, 0.5], [3, 0, 0.5]], \"self_weight\": [0.5, 0.5, 0.5, 0.6]}",
                 HS_TOPO_LENIENT);
    r = check(t, 0);
    assert_false(r.valid);
    assert_false(r.col_stochastic);
    assert_false(r.gap_computed);
    assert_near(r.col_err, 0.1, 1e-12);
    assert_non_null(strstr(r.reason, "column 3 sums to 1.1"));
    hs_topo_free(t);
}

static void test_dot(void **state) {
    (void)state;
    hs_topo *t = gen("ring", 3);
    char *s = NULL;
    assert_int_equal(hs_topo_to_dot(t, &s), 0);
    assert_non_null(strstr(s, "graph \"ring-3\" {"));
    assert_non_null(strstr(s, "0 -- 1 [label=\"0.3333\"];"));
    assert_non_null(strstr(s, "0 -- 2 "));
    assert_null(strstr(s, "2 -- 0"));
    free(s);
    hs_topo_free(t);
    t = gen("onepeer-exp", 4);
    assert_int_equal(hs_topo_to_dot(t, &s), 0);
    assert_non_null(strstr(s, "digraph \"onepeer-exp-4\" {"));
    assert_non_null(strstr(s, "0 -> 1 [label=\"t=0\"];"));
    assert_non_null(strstr(s, "0 -> 2 [label=\"t=1\"];"));
    free(s);
    hs_topo_free(t);
}

static void test_write_file(void **state) {
    (void)state;
    char path[] = "/tmp/hs_topo_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    hs_topo *t = gen("regular:3", 10), *u = NULL;
    assert_int_equal(hs_topo_write(t, path, 0), 0);
    assert_int_equal(hs_topo_load(&u, path, 0), 0);
    same_topo(t, u);
    hs_topo_free(u);
    assert_int_equal(hs_topo_write(t, "/nonexistent/dir/x.json", 0), HS_EIO);
    assert_non_null(strstr(hs_error_message(), "/nonexistent/dir/x.json: cannot create"));
    assert_int_equal(hs_topo_load(&u, "/nonexistent/x.json", 0), HS_ENOENT);
    assert_int_equal(hs_topo_load(&u, "/tmp", 0), HS_EIO);
    assert_int_equal(hs_topo_set_name(t, ""), HS_EINVAL);
    assert_int_equal(hs_topo_set_name(t, "fine name"), 0);
    assert_string_equal(hs_topo_name(t), "fine name");
    hs_topo_free(t);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gap_ring),
        cmocka_unit_test(test_gap_complete),
        cmocka_unit_test(test_gap_hypercube),
        cmocka_unit_test(test_gap_torus),
        cmocka_unit_test(test_gap_directed_ring),
        cmocka_unit_test(test_onepeer_product),
        cmocka_unit_test(test_periodic),
        cmocka_unit_test(test_views_every_generator),
        cmocka_unit_test(test_view_errors),
        cmocka_unit_test(test_metropolis_weights),
        cmocka_unit_test(test_generator_shapes),
        cmocka_unit_test(test_regular),
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_reader_errors),
        cmocka_unit_test(test_reader_schedule_and_weights),
        cmocka_unit_test(test_shipped_files),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_emulation),
        cmocka_unit_test(test_restrict),
        cmocka_unit_test(test_report_fields),
        cmocka_unit_test(test_dot),
        cmocka_unit_test(test_write_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
