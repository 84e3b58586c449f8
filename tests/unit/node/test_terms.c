/* Unit tests of the job's terms a connected peer goes by (src/node/terms.c): a resumed or
 * restarted peer counts the job's rounds, from the welcome when one came, else from its
 * checkpoint, never from its own --rounds when the job's differ (its compressors' keys and
 * place in a schedule would be offset from its neighbours'). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/checkpoint.h"
#include "node/node_internal.h"

/* A peer resumed with --rounds 100 and --wait-peers 2, in a job of 40 rounds ending at 44. */
static void setup_peer(hs__node_cfg *cfg, hs_net_welcome *w, hs_checkpoint *ck, int has_first) {
    memset(cfg, 0, sizeof(*cfg));
    memset(w, 0, sizeof(*w));
    memset(ck, 0, sizeof(*ck));
    cfg->rounds = 100;
    cfg->wait_peers = 2;
    ck->round = 20;
    ck->end_round = 44;
    ck->first_round = 4;
    ck->has_first_round = has_first;
}

/* Rejoining the running job: the welcome's count, even from a version-4 checkpoint. */
static void test_rejoin_takes_welcome(void **state) {
    (void)state;
    hs__node_cfg cfg;
    hs_net_welcome w;
    hs_checkpoint ck;
    hs__node_terms jt, wj = {44, 40, 0};
    for (int has_first = 0; has_first < 2; has_first++) {
        setup_peer(&cfg, &w, &ck, has_first);
        assert_int_equal(hs__node_terms_pick(&cfg, &w, &wj, 1, 0, 1, &ck, &jt), 0);
        assert_int_equal(jt.rounds, 40);
    }
}

/* Restarting the whole job alone (no welcome): the checkpoint's count and end. */
static void test_restart_takes_checkpoint(void **state) {
    (void)state;
    hs__node_cfg cfg;
    hs_net_welcome w;
    hs_checkpoint ck;
    hs__node_terms jt, wj = {0, 1, 0};
    setup_peer(&cfg, &w, &ck, 1);
    assert_int_equal(hs__node_terms_pick(&cfg, &w, &wj, 0, 1, 1, &ck, &jt), 0);
    assert_int_equal(jt.end, 44);
    assert_int_equal(jt.rounds, 40);
    assert_int_equal(jt.wait, -2);
    /* Without a wait (no restart): the same count; the end comes from the checkpoint later. */
    assert_int_equal(hs__node_terms_pick(&cfg, &w, &wj, 0, 0, 1, &ck, &jt), 0);
    assert_int_equal(jt.rounds, 40);
    /* A count whose first round wrapped below 0 (end 10, 50 rounds) comes back as written. */
    ck.end_round = 10;
    ck.first_round = (uint64_t)10 - 50;
    assert_int_equal(hs__node_terms_pick(&cfg, &w, &wj, 0, 1, 1, &ck, &jt), 0);
    assert_int_equal(jt.rounds, 50);
    /* A version-4 checkpoint says nothing: its own --rounds, as before. */
    setup_peer(&cfg, &w, &ck, 0);
    assert_int_equal(hs__node_terms_pick(&cfg, &w, &wj, 0, 1, 1, &ck, &jt), 0);
    assert_int_equal(jt.rounds, 100);
}

/* Joining a restart held by its first peer: the welcome's count and wait, its checkpoint's end. */
static void test_restart_joiner_takes_welcome(void **state) {
    (void)state;
    hs__node_cfg cfg;
    hs_net_welcome w;
    hs_checkpoint ck;
    hs__node_terms jt, wj = {44, 40, -2};
    setup_peer(&cfg, &w, &ck, 0);
    assert_int_equal(hs__node_terms_pick(&cfg, &w, &wj, 1, 1, 1, &ck, &jt), 0);
    assert_int_equal(jt.end, 44);
    assert_int_equal(jt.rounds, 40);
    assert_int_equal(jt.wait, -2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejoin_takes_welcome),
        cmocka_unit_test(test_restart_takes_checkpoint),
        cmocka_unit_test(test_restart_joiner_takes_welcome),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
