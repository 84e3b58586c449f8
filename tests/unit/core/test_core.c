/* Unit tests of src/core: error messages, Philox known answers, distributions, buffers. */
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

#include "core/error_internal.h"
#include "core/log.h"
#include "core/philox.h"
#include "core/rng.h"
#include "hearsay/buf.h"
#include "hearsay/error.h"

static void test_error_messages(void **state) {
    (void)state;
    assert_string_equal(hs_strerror(HS_EPROTO), "protocol error");
    assert_string_equal(hs_err_name(HS_EINVAL), "HS_EINVAL");
    assert_string_equal(hs_strerror(-99999), "unknown error");
    assert_int_equal(hs__err(HS_EFORMAT, "file %s: bad %d", "x.json", 3), HS_EFORMAT);
    assert_string_equal(hs_error_message(), "file x.json: bad 3");
    assert_int_equal(hs__err_prefix(HS_EFORMAT, "outer"), HS_EFORMAT);
    assert_string_equal(hs_error_message(), "outer: file x.json: bad 3");
    /* A different code must not inherit the stale message. */
    hs__err_prefix(HS_EIO, "read");
    assert_string_equal(hs_error_message(), "read: input/output error");
    hs__err_code(HS_ENOMEM);
    assert_string_equal(hs_error_message(), "out of memory");
}

/* Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors). */
static void test_philox_kat(void **state) {
    (void)state;
    struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < sizeof(kat) / sizeof(kat[0]); i++) {
        uint32_t out[4];
        hs_philox4x32_10(kat[i].ctr, kat[i].key, out);
        for (int j = 0; j < 4; j++) assert_int_equal(out[j], kat[i].out[j]);
    }
}

static void test_rng_streams(void **state) {
    (void)state;
    hs_rng a, b;
    hs__rng_init(&a, 42, HS_RNG_TEST, 1, 2);
    hs__rng_init(&b, 42, HS_RNG_TEST, 1, 2);
    for (int i = 0; i < 100; i++) assert_int_equal(hs__rng_u32(&a), hs__rng_u32(&b));
    /* Random access agrees with the sequential reader. */
    hs__rng_init(&a, 42, HS_RNG_TEST, 1, 2);
    for (uint64_t i = 0; i < 37; i++) assert_int_equal(hs__rng_u32(&a), hs_rng_at(42, HS_RNG_TEST, 1, 2, i));
    /* A different peer gives a different stream. */
    hs__rng_init(&a, 42, HS_RNG_TEST, 1, 2);
    hs__rng_init(&b, 42, HS_RNG_TEST, 2, 2);
    int same = 0;
    for (int i = 0; i < 64; i++) same += hs__rng_u32(&a) == hs__rng_u32(&b);
    assert_true(same < 2);
}

static void test_rng_distributions(void **state) {
    (void)state;
    hs_rng r;
    hs__rng_init(&r, 7, HS_RNG_TEST, 0, 0);
    const int n = 200000;
    double s = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        double x = hs__rng_normal(&r);
        s += x;
        s2 += x * x;
    }
    /* Mean within 5 standard errors (1/sqrt(n)); variance within 5 of its standard error. */
    assert_true(fabs(s / n) < 5.0 / sqrt(n));
    assert_true(fabs(s2 / n - 1.0) < 5.0 * sqrt(2.0 / n));
    for (int k = 0; k < 3; k++) {
        double shape = k == 0 ? 0.3 : k == 1 ? 1.0 : 4.5;
        double g = 0, g2 = 0;
        for (int i = 0; i < n; i++) {
            double x = hs__rng_gamma(&r, shape);
            assert_true(x >= 0);
            g += x;
            g2 += x * x;
        }
        double mean = g / n, var = g2 / n - mean * mean;
        /* Gamma(a, 1): mean a, variance a. */
        assert_true(fabs(mean - shape) < 5.0 * sqrt(shape / n));
        assert_true(fabs(var - shape) < 0.05 * shape + 0.01);
    }
    unsigned hist[10] = {0};
    for (int i = 0; i < n; i++) hist[hs__rng_uniform(&r, 10)]++;
    for (int i = 0; i < 10; i++) assert_true(fabs(hist[i] - n / 10.0) < 5 * sqrt(n * 0.09));
    float u = hs_rng_u01(0xffffffffu);
    assert_true(u < 1.0f);
    assert_true(hs_rng_u01(0) == 0.0f);
    assert_true(hs_rng_below(0xffffffffu, 7) == 6);
}

static void test_shuffle_is_permutation(void **state) {
    (void)state;
    uint32_t idx[1000];
    for (int i = 0; i < 1000; i++) idx[i] = (uint32_t)i;
    hs_rng r;
    hs__rng_init(&r, 3, HS_RNG_TEST, 0, 0);
    hs__rng_shuffle_u32(&r, idx, 1000);
    int seen[1000] = {0}, moved = 0;
    for (int i = 0; i < 1000; i++) {
        assert_true(idx[i] < 1000);
        seen[idx[i]]++;
        moved += idx[i] != (uint32_t)i;
    }
    for (int i = 0; i < 1000; i++) assert_int_equal(seen[i], 1);
    assert_true(moved > 900);
}

static void test_buf(void **state) {
    (void)state;
    hs_buf *b;
    assert_int_equal(hs_buf_new(&b, 0), 0);
    for (int i = 0; i < 1000; i++) assert_int_equal(hs_buf_append(b, &i, sizeof(i)), 0);
    assert_int_equal(b->len, 1000 * sizeof(int));
    int v;
    memcpy(&v, b->data + 999 * sizeof(int), sizeof(int));
    assert_int_equal(v, 999);
    hs_buf_ref(b);
    assert_int_equal(b->refs, 2);
    hs_buf_unref(b);
    hs_buf_unref(b);
    hs_buf_unref(NULL);
}

/* A peer names itself (the log tag) while its loop thread is already logging: every line
 * carries one whole tag, never a mix of two (and ThreadSanitizer sees no race). */
static void *retag(void *arg) {
    (void)arg;
    for (int i = 0; i < 2000; i++) hs__log_set_tag(i % 2 ? "peer 1" : "peer 22");
    return NULL;
}

static void test_log_tag_threads(void **state) {
    (void)state;
    char path[] = "/tmp/hs-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    hs__log_set_tag("peer 22");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, retag, NULL), 0);
    for (int i = 0; i < 2000; i++) hs__log(HS_LOG_ERROR, "line %d", i);
    pthread_join(th, NULL);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);
    hs__log_set_tag(NULL);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    int n = 0;
    while (fgets(line, sizeof(line), f)) {
        const char *t = strchr(line, ' '); /* after the timestamp */
        assert_non_null(t);
        if (strncmp(t, " peer 1 error: ", 15) && strncmp(t, " peer 22 error: ", 16))
            fail_msg("torn tag: %s", line);
        n++;
    }
    fclose(f);
    unlink(path);
    assert_int_equal(n, 2000);
}

/* The peer of a line: the calling thread's (a node stepping on it) or else the process's; the
 * stderr tag follows it, and a callback (hearsay/log.h) receives it in the record instead. */
typedef struct got_line {
    int level, rank;
    uint32_t peer;
    char msg[64];
} got_line;
static got_line got[8];
static int n_got;
static pthread_mutex_t got_lock = PTHREAD_MUTEX_INITIALIZER;

static void keep_record(const hs_log_record *r, void *user) {
    if (user != &n_got) return; /* the count below then says so (no assert off the main thread) */
    pthread_mutex_lock(&got_lock);
    if (n_got < 8) {
        got[n_got] = (got_line){(int)r->level, r->rank, r->peer, ""};
        snprintf(got[n_got].msg, sizeof(got[n_got].msg), "%s", r->message);
        n_got++;
    }
    pthread_mutex_unlock(&got_lock);
}

static void *as_node_7(void *arg) {
    hs__log_set_thread_peer(3, 7);
    hs__log(HS_LOG_WARN, "from %s", (const char *)arg);
    return NULL;
}

static void *as_nobody(void *arg) {
    hs__log(HS_LOG_WARN, "from %s", (const char *)arg);
    return NULL;
}

static void test_log_peer_and_callback(void **state) {
    (void)state;
    hs__log_set_peer(2, 5); /* the process's peer, and this thread's */
    char path[] = "/tmp/hs-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    int saved = dup(STDERR_FILENO);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    hs__log_set_tag("peer 5");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, as_node_7, "node 7"), 0);
    pthread_join(th, NULL);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256] = "";
    assert_non_null(fgets(line, sizeof(line), f));
    fclose(f);
    unlink(path);
    assert_non_null(strstr(line, " peer 7 warn: from node 7"));
    hs_log_set_callback(keep_record, &n_got);
    hs__log(HS_LOG_ERROR, "from main");
    assert_int_equal(pthread_create(&th, NULL, as_node_7, "node 7"), 0);
    pthread_join(th, NULL);
    assert_int_equal(pthread_create(&th, NULL, as_nobody, "nobody"), 0);
    pthread_join(th, NULL);
    hs_log_set_callback(NULL, NULL);
    hs__log_set_tag(NULL);
    assert_int_equal(n_got, 3);
    assert_int_equal(got[0].level, HS_LOG_ERROR);
    assert_int_equal(got[0].rank, 2);
    assert_int_equal(got[0].peer, 5);
    assert_string_equal(got[0].msg, "from main");
    assert_int_equal(got[1].level, HS_LOG_WARN);
    assert_int_equal(got[1].rank, 3);
    assert_int_equal(got[1].peer, 7);
    assert_string_equal(got[1].msg, "from node 7");
    assert_int_equal(got[2].rank, 2); /* no node on that thread: the process's */
    assert_int_equal(got[2].peer, 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_philox_kat),
        cmocka_unit_test(test_rng_streams),
        cmocka_unit_test(test_rng_distributions),
        cmocka_unit_test(test_shuffle_is_permutation),
        cmocka_unit_test(test_buf),
        cmocka_unit_test(test_log_tag_threads),
        cmocka_unit_test(test_log_peer_and_callback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
