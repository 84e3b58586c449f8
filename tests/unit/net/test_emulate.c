/* Unit tests of link emulation: the option string, delay/jitter ordering, pacing and the loss
 * rate (src/net/emulate.c). */
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
#include "hearsay/net.h"
#include "net/emulate.h"

static void test_parse(void **state) {
    (void)state;
    hs_net_emulation e;
    assert_int_equal(hs_net_emulation_parse("delay=50ms,jitter=10ms,rate=10mbit,loss=0.01", &e), 0);
    assert_true(e.delay_ms == 50 && e.jitter_ms == 10 && e.rate_bps == 10e6 && e.loss == 0.01);
    assert_int_equal(hs_net_emulation_parse("loss=2%,delay=1s", &e), 0);
    assert_true(fabs(e.loss - 0.02) < 1e-12 && e.delay_ms == 1000 && e.rate_bps == 0);
    assert_int_equal(hs_net_emulation_parse("delay=250us,rate=1gbit", &e), 0);
    assert_true(fabs(e.delay_ms - 0.25) < 1e-12 && e.rate_bps == 1e9);
    assert_int_equal(hs_net_emulation_parse("", &e), 0);
    assert_true(hs_net_emulation_none(&e));
    assert_int_equal(hs_net_emulation_parse("none", &e), 0);
    assert_true(hs_net_emulation_none(&e));

    assert_int_equal(hs_net_emulation_parse("delay=5parsecs", &e), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "unknown unit"));
    assert_int_equal(hs_net_emulation_parse("latency=5ms", &e), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "unknown key 'latency'"));
    assert_int_equal(hs_net_emulation_parse("loss=1.5", &e), HS_EINVAL);
    assert_int_equal(hs_net_emulation_parse("delay=-3ms", &e), HS_EINVAL);
    assert_int_equal(hs_net_emulation_parse("delay", &e), HS_EINVAL);
    assert_int_equal(hs_net_emulation_parse("delay=5ms,", &e), HS_EINVAL);
    assert_int_equal(hs_net_emulation_parse("rate=10bit", &e), HS_EINVAL);
    assert_int_equal(hs_net_emulation_parse("delay=nan", &e), HS_EINVAL);
}

static void test_format_roundtrip(void **state) {
    (void)state;
    hs_net_emulation e = {12.5, 3, 2.5e6, 0.125}, f;
    char buf[256];
    assert_true(hs_net_emulation_format(&e, buf, sizeof(buf)) > 0);
    assert_int_equal(hs_net_emulation_parse(buf, &f), 0);
    assert_memory_equal(&e, &f, sizeof(e));
    assert_int_equal(hs_net_emulation_format(&e, buf, 8), HS_ERANGE);
}

static void test_release_order(void **state) {
    (void)state;
    hs_net_emulation e = {50, 40, 0, 0};
    hs__link l;
    hs__link_init(&l, &e, 1, 0, 1);
    uint64_t prev = 0, now = 1000000;
    double lo = 1e18, hi = 0;
    for (int i = 0; i < 10000; i++, now += 100) {
        uint64_t t = hs__link_release(&l, now);
        assert_true(t >= prev); /* frames never overtake each other */
        prev = t;
        double d = (double)(t - now) / 1000;
        if (d < lo)
            lo = d;
        if (d > hi)
            hi = d;
    }
    assert_true(lo >= 10 - 1e-9);
    assert_true(hi <= 90 + 1e-9 + 10); /* ordering may hold a frame behind a later draw */
    /* the same seed draws the same delays */
    hs__link a, b;
    hs__link_init(&a, &e, 7, 2, 3);
    hs__link_init(&b, &e, 7, 2, 3);
    for (int i = 0; i < 100; i++)
        assert_true(hs__link_release(&a, 0) == hs__link_release(&b, 0));
}

static void test_pace(void **state) {
    (void)state;
    hs_net_emulation e = {0, 0, 8e6, 0}; /* 1 byte per microsecond */
    hs__link l;
    hs__link_init(&l, &e, 1, 0, 1);
    assert_true(hs__link_pace(&l, 100, 1000) == 100);
    assert_true(l.paced_until_us == 1100);
    assert_true(hs__link_pace(&l, 500, 1000) == 1100); /* queued behind the first */
    assert_true(hs__link_pace(&l, 5000, 10) == 5000);
    hs_net_emulation none = {0, 0, 0, 0};
    hs__link_init(&l, &none, 1, 0, 1);
    assert_true(hs__link_pace(&l, 42, 1u << 30) == 42);
}

static void test_loss_rate(void **state) {
    (void)state;
    hs_net_emulation e = {0, 0, 0, 0.1};
    hs__link l;
    hs__link_init(&l, &e, 3, 1, 2);
    int lost = 0, n = 100000;
    for (int i = 0; i < n; i++)
        lost += hs__link_lose(&l);
    /* binomial sd = sqrt(n p (1-p)) ~ 95: 5 sd */
    assert_true(abs(lost - n / 10) < 500);
    e.loss = 0;
    hs__link_init(&l, &e, 3, 1, 2);
    for (int i = 0; i < 1000; i++)
        assert_false(hs__link_lose(&l));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),         cmocka_unit_test(test_format_roundtrip),
        cmocka_unit_test(test_release_order), cmocka_unit_test(test_pace),
        cmocka_unit_test(test_loss_rate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
