/* The round engine's order of phases: open, local, push, pull and close, end, in a circle;
 * where a run stops, what a failure leaves, and an end that closes the job. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>
#include "hearsay/error.h"
#include "train/round.h"

typedef struct fake {
    char log[128];
    int fail_local, end_at;
} fake;

static void note(fake *f, const char *what, uint64_t r) {
    size_t len = strlen(f->log);
    snprintf(f->log + len, sizeof(f->log) - len, "%s%llu ", what, (unsigned long long)r);
}
static int f_open(void *c, uint64_t r) { note(c, "o", r); return 0; }
static int f_local(void *c, uint64_t r, hs_round_stats *st) {
    fake *f = c;
    note(f, "l", r);
    st->loss = (double)r;
    return f->fail_local ? HS_EDIVERGED : 0;
}
static int f_close(void *c, uint64_t r) { note(c, "c", r); return 0; }
static int f_end(void *c, uint64_t r) {
    fake *f = c;
    note(f, "e", r);
    return (int)r == f->end_at;
}

static hs__round_model model(fake *f) {
    hs__round_model m = {f, NULL, NULL, f_open, f_local, f_close, f_end};
    return m;
}

/* Without an algorithm push and pull gossip nothing; the hooks run in the round's order. */
static void test_order(void **state) {
    (void)state;
    fake f = {.end_at = -1};
    hs__round e;
    hs__round_model m = model(&f);
    hs__round_init(&e, &m, NULL, 3);
    assert_int_equal(hs__round_run(&e, HS__PH_PULL), 0);
    assert_string_equal(f.log, "o3 l3 ");
    assert_int_equal(e.next, HS__PH_PULL);
    assert_int_equal(hs__round_run(&e, HS__PH_OPEN), 0);
    assert_string_equal(f.log, "o3 l3 c3 e3 ");
    assert_int_equal(e.r, 4);
    /* From OPEN to OPEN is a whole round. */
    assert_int_equal(hs__round_run(&e, HS__PH_OPEN), 0);
    assert_string_equal(f.log, "o3 l3 c3 e3 o4 l4 c4 e4 ");
    assert_true(e.st.loss == 4.0);
}

static void test_failure_and_end(void **state) {
    (void)state;
    fake f = {.fail_local = 1, .end_at = 7};
    hs__round e;
    hs__round_model m = model(&f);
    hs__round_init(&e, &m, NULL, 7);
    assert_int_equal(hs__round_run(&e, HS__PH_OPEN), HS_EDIVERGED);
    assert_int_equal(e.next, HS__PH_LOCAL);
    assert_int_equal(e.r, 7);
    f.fail_local = 0;
    f.log[0] = 0;
    /* An end that says the job ended stops the run before the next round opens. */
    assert_int_equal(hs__round_run(&e, HS__PH_LOCAL), 1);
    assert_string_equal(f.log, "l7 c7 e7 ");
    assert_int_equal(e.next, HS__PH_OPEN);
    assert_int_equal(e.r, 8);
    hs__round_restart(&e, 2);
    f.log[0] = 0;
    assert_int_equal(hs__round_run(&e, HS__PH_LOCAL), 0);
    assert_string_equal(f.log, "o2 ");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_failure_and_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
