/* Unit tests of src/topo's generators: spectral gaps against closed forms, per-rank views against
 * the global matrix for every generator and n up to 64, weights, the random regular generator.
 * The file reader and writer: test_topo_file.c. */
#include "topo_helpers.h"

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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
