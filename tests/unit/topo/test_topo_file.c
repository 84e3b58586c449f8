/* Unit tests of src/topo's files: the reader's errors, schedules and weights, the shipped
 * topology files, JSON round trips, link emulation, addresses and restriction, reports, DOT and
 * the writer. */
#include "topo_helpers.h"

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
