/* The metrics record: the exact JSON line (order, escaping, null for non-finite numbers, ints
 * without a fraction), snprintf's contract of hs_metrics_format, the file holding exactly the
 * formatted line, an algorithm's own metrics landing in their fields, and docs/METRICS.md
 * documenting every field of the table with its kind (and nothing the table lacks). */
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

#include "hearsay/algo.h"
#include "hearsay/error.h"
#include "hearsay/metrics.h"

static void test_line(void **state) {
    (void)state;
    hs_metrics_rec m;
    hs_metrics_init(&m);
    assert_true(hs_metrics_get(&m, HS_MF_UNIX_TIME) > 1.6e9); /* stamped now */
    m.set = 0;                                                /* for an exact line */
    hs_metrics_set(&m, HS_MF_LOSS, 0.5);
    hs_metrics_set(&m, HS_MF_PEER, 3);
    hs_metrics_set(&m, HS_MF_BYTES_SENT, 12345678901.0); /* past %.9g's digits */
    hs_metrics_set(&m, HS_MF_TEST_ACC, NAN);
    hs_metrics_set_str(&m, HS_MF_EVENT, "a\"b\\c\n");
    hs_metrics_set(&m, HS_MF_EVENT, 1);   /* a string field takes no number */
    hs_metrics_set_str(&m, HS_MF_LR, "x"); /* nor a number field a string */
    m.extra[0].name = "gizmo";
    m.extra[0].v = 2.5;
    m.n_extra = 1;
    uint64_t pr[2] = {7, 9};
    m.peer_rounds = pr;
    m.n_peer_rounds = 2;
    const char *want = "{\"peer\":3,\"event\":\"a\\\"b\\\\c\\u000a\",\"loss\":0.5,\"test_acc\":null,"
                       "\"bytes_sent\":12345678901,\"gizmo\":2.5,\"rounds_0\":7,\"rounds_1\":9}";
    char buf[512];
    assert_int_equal(hs_metrics_format(&m, buf, sizeof(buf)), strlen(want));
    assert_string_equal(buf, want);
    assert_true(isnan(hs_metrics_get(&m, HS_MF_LR)));
    assert_null(hs_metrics_get_str(&m, HS_MF_REASON));
    /* snprintf's contract: the whole length, and as much as fits, terminated. */
    assert_int_equal(hs_metrics_format(&m, NULL, 0), strlen(want));
    char small[10];
    assert_int_equal(hs_metrics_format(&m, small, sizeof(small)), strlen(want));
    assert_int_equal(strlen(small), sizeof(small) - 1);
    assert_memory_equal(small, want, sizeof(small) - 1);
    /* A timestamp keeps its microseconds. */
    m.set = 0;
    m.n_extra = m.n_peer_rounds = 0;
    hs_metrics_set(&m, HS_MF_UNIX_TIME, 1795476720.25);
    hs_metrics_format(&m, buf, sizeof(buf));
    assert_string_equal(buf, "{\"unix_time\":1795476720.250000}");
}

static void test_file(void **state) {
    (void)state;
    char path[] = "/tmp/hs-test-metrics-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    hs_metrics_file *f;
    assert_int_equal(hs_metrics_open(&f, path, 0), 0);
    hs_metrics_rec m;
    hs_metrics_init(&m);
    hs_metrics_set(&m, HS_MF_ROUND, 1);
    /* Longer than any buffer the file had: it grows. */
    uint64_t *pr = calloc(400, sizeof(*pr));
    assert_non_null(pr);
    m.peer_rounds = pr;
    m.n_peer_rounds = 400;
    assert_int_equal(hs_metrics_write(f, &m), 0);
    m.n_peer_rounds = 0;
    assert_int_equal(hs_metrics_write(f, &m), 0);
    hs_metrics_close(f);
    size_t need = hs_metrics_format(&m, NULL, 0);
    char *want = malloc(need + 1);
    hs_metrics_format(&m, want, need + 1);
    FILE *in = fopen(path, "r");
    assert_non_null(in);
    char line[16384];
    assert_non_null(fgets(line, sizeof(line), in));
    assert_non_null(strstr(line, "\"rounds_399\":0}\n"));
    assert_non_null(fgets(line, sizeof(line), in));
    assert_int_equal(strlen(line), need + 1);
    assert_memory_equal(line, want, need);
    assert_int_equal(line[need], '\n');
    assert_null(fgets(line, sizeof(line), in));
    fclose(in);
    unlink(path);
    free(want);
    free(pr);
    assert_int_equal(hs_metrics_open(&f, "/nonexistent-dir/m.jsonl", 0), HS_EIO);
    assert_null(f);
    hs_metrics_close(NULL);
}

/* SGP's own metrics (hs_algo_metrics) are fields of the table, not extras. */
static void test_algo_fields(void **state) {
    (void)state;
    float x0[4] = {0};
    hs_algo_cfg c;
    memset(&c, 0, sizeof(c));
    c.kind = HS_ALGO_SGP;
    hs_algo *a;
    assert_int_equal(hs_algo_new(&a, &c, 0, 4, x0), 0);
    hs_metrics_rec m;
    hs_metrics_init(&m);
    hs_metrics_from_algo(&m, a);
    assert_int_equal(m.n_extra, 0);
    assert_true(hs_metrics_get(&m, HS_MF_PUSH_WEIGHT) == 1.0);
    assert_true(hs_metrics_get(&m, HS_MF_WAITS) == 0.0);
    assert_true(hs_metrics_get(&m, HS_MF_BYTES_SENT) == 0.0);
    hs_algo_free(a);
    hs_net_stats ns;
    memset(&ns, 0, sizeof(ns));
    ns.bytes_sent = 100;
    ns.ex.bytes_sent = 50;
    ns.n_members = 4;
    hs_metrics_from_net(&m, &ns);
    assert_true(hs_metrics_get(&m, HS_MF_WIRE_BYTES_SENT) == 100.0);
    assert_true(hs_metrics_get(&m, HS_MF_MEMBERS) == 4.0);
    assert_true(hs_metrics_get(&m, HS_MF_BYTES_SENT) == 0.0); /* payload, not frames */
}

/* Every field of the table has its row in docs/METRICS.md with its kind, and every row (but the
 * per-peer pattern rounds_<i>) is a field of the table. */
static void test_documented(void **state) {
    (void)state;
    const char *root = getenv("HS_SOURCE_ROOT");
    assert_non_null(root);
    char path[4096];
    snprintf(path, sizeof(path), "%s/docs/METRICS.md", root);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    int seen[HS_MF_COUNT] = {0};
    static const char *kinds[] = {"int", "number", "string"};
    char line[2048];
    int rows = 0;
    while (fgets(line, sizeof(line), f)) {
        char name[64], kind[16];
        if (sscanf(line, "| `%63[^`]` | %15s |", name, kind) != 2) continue;
        rows++;
        if (!strcmp(name, "rounds_<i>")) continue;
        int fi = hs_metrics_field_find(name);
        if (fi < 0) fail_msg("docs/METRICS.md documents %s, which the record lacks", name);
        if (strcmp(kind, kinds[hs_metrics_field_kind(fi)]))
            fail_msg("%s: docs say %s, the record writes %s", name, kind,
                     kinds[hs_metrics_field_kind(fi)]);
        seen[fi]++;
    }
    fclose(f);
    for (int fi = 0; fi < HS_MF_COUNT; fi++)
        if (seen[fi] != 1)
            fail_msg("%s: %d rows in docs/METRICS.md", hs_metrics_field_name(fi), seen[fi]);
    assert_int_equal(rows, HS_MF_COUNT + 1);
    assert_null(hs_metrics_field_name(HS_MF_COUNT));
    assert_int_equal(hs_metrics_field_find("no_such_field"), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_algo_fields),
        cmocka_unit_test(test_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
