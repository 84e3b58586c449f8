/* Unit tests of a node's progress line (node.c, node_end): one node alone on 127.0.0.1 (port
 * 0), its lines caught through hs_log_set_callback. A caller that reports an accuracy but no
 * loss (hs_node_report with NaN, as tests/integration/big's bigpeer reports nothing) gets a
 * line without a loss, not "loss nan"; one that reports a loss sees it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/log.h"
#include "hearsay/node.h"

enum { D = 64 };

typedef struct caught {
    int lines, with_loss;
    char any_loss[256];
} caught;

static void catch_line(const hs_log_record *rec, void *user) {
    caught *c = user;
    if (strncmp(rec->message, "round ", 6) != 0 || !strchr(rec->message, '/')) return;
    c->lines++;
    const char *l = strstr(rec->message, "loss");
    if (l) {
        c->with_loss++;
        snprintf(c->any_loss, sizeof(c->any_loss), "%s", rec->message);
    }
}

/* A lone node of 3 rounds whose caller reports (loss, accuracy) every round. */
static void run_lone(double loss, caught *c) {
    hs_node_options *o;
    hs_node *n = NULL;
    float x[D] = {0};
    assert_int_equal(hs_node_options_new(&o), 0);
    const char *kv[][2] = {{"insecure", "1"}, {"listen", "127.0.0.1:0"}, {"rounds", "3"}};
    for (size_t i = 0; i < sizeof(kv) / sizeof(kv[0]); i++)
        assert_int_equal(hs_node_options_set(o, kv[i][0], kv[i][1]), 0);
    assert_int_equal(hs_node_new(&n, o, D), 0);
    hs_node_options_free(o);
    memset(c, 0, sizeof(*c));
    hs_log_set_level(HS_LOG_INFO);
    hs_log_set_callback(catch_line, c);
    assert_int_equal(hs_node_start(n, x, D), 0);
    int rc;
    do {
        hs_node_report(n, loss, 0.5);
        rc = hs_node_step(n, x, D);
    } while (rc == 0);
    assert_int_equal(rc, 1);
    hs_node_free(n);
    hs_log_set_callback(NULL, NULL);
}

static void test_no_loss_no_nan(void **state) {
    (void)state;
    caught c;
    run_lone(NAN, &c);
    assert_int_equal(c.lines, 3);
    if (c.with_loss) fail_msg("a loss shown that nobody reported: %s", c.any_loss);
}

static void test_reported_loss_shown(void **state) {
    (void)state;
    caught c;
    run_lone(0.25, &c);
    assert_int_equal(c.lines, 3);
    assert_int_equal(c.with_loss, 3);
    assert_non_null(strstr(c.any_loss, "loss 0.2500"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_loss_no_nan),
        cmocka_unit_test(test_reported_loss_shown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
