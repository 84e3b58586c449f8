/* SGP's staleness wait in the simulator's virtual time (src/algo/sgp.c): a peer waits for an
 * in-neighbour's late share at most two of its own rounds. Two peers over a fast link
 * (1 Gbit/s, 1 ms), the fast one computing 0.1 s a round, the other 2.5x or 5x slower. Without
 * the bound the fast peer would wait for every late share (as a networked peer does for up to
 * its receive timeout) and run at the slow peer's pace in both cases. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/algo.h"
#include "hearsay/error.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"
#include "sim/linktime.h"
#include "wan/profile.h"

#define D 8
enum { FAST = 0, SLOW = 1 };

typedef struct pair {
    hs__wan_profile *p;
    hs_topo *t;
    hs_simnet *net;
    hs__linktime *lt;
    hs_algo *a[2];
    float x[2][D];
    double clock[2];
    uint64_t r[2];
} pair;

static void pair_new(pair *s) {
    memset(s, 0, sizeof(*s));
    const char *json = "{\"peers\": 2, \"delay_ms\": 1, \"rate_mbit\": 1000}";
    if (hs__wan_profile_parse(&s->p, json, "test.json") < 0) fail_msg("%s", hs_error_message());
    assert_int_equal(hs_topo_new(&s->t, "onepeer-exp", 2, 1), 0);
    assert_int_equal(hs_simnet_new(&s->net, s->t), 0);
    assert_int_equal(hs__linktime_new(&s->lt, s->p), 0);
    hs__simnet_set_links(s->net, s->lt);
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_SGP;
    cfg.staleness = 1;
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < D; k++) s->x[i][k] = (float)(i + k);
        if (hs_algo_new(&s->a[i], &cfg, (uint32_t)i, D, s->x[i]) < 0)
            fail_msg("hs_algo_new: %s", hs_error_message());
    }
}

static void pair_free(pair *s) {
    for (int i = 0; i < 2; i++) hs_algo_free(s->a[i]);
    hs__linktime_free(s->lt);
    hs_simnet_free(s->net);
    hs_topo_free(s->t);
    hs__wan_profile_free(s->p);
}

/* Peer i computes for step seconds, then runs its round: the push goes out at the end of its
 * compute, the pull may move its clock (a wait). */
static void round_of(pair *s, int i, double step) {
    hs_exchange *ex = hs_simnet_exchange(s->net, i);
    hs_simnet_set_clock(s->net, i, s->clock[i] + step);
    int err = hs_algo_begin(s->a[i], ex, s->r[i], s->x[i]);
    if (!err) err = hs_algo_end(s->a[i], ex, s->r[i], s->x[i]);
    if (err) fail_msg("peer %d round %llu: %s", i, (unsigned long long)s->r[i], hs_error_message());
    s->clock[i] = hs_simnet_clock(s->net, i);
    s->r[i]++;
}

static hs_algo_stats stats_of(const pair *s, int i) {
    hs_algo_stats st;
    hs_algo_get_stats(s->a[i], &st);
    return st;
}

/* The fast peer's 40 rounds; the slow peer's shares go out ahead of them, as on a network
 * (here: every slow round whose compute ends within a second of the fast peer's clock), so
 * that a wait for one is a wait for a share already on its way. */
static void run(pair *s, double fast, double slow) {
    while (s->r[FAST] < 40) {
        while (s->clock[SLOW] < s->clock[FAST] + 1.0) round_of(s, SLOW, slow);
        round_of(s, FAST, fast);
    }
    hs_algo_stats st = stats_of(s, FAST);
    printf("# slow step %.2f s: fast peer's 40 rounds in %.3f s, %llu waits, %llu timed out\n",
           slow, s->clock[FAST], (unsigned long long)st.waits,
           (unsigned long long)st.wait_timeouts);
}

/* 2.5x slower: each share is 0.15 s late, within two of the fast peer's rounds (0.2 s): it is
 * waited for every round, and the fast peer runs at the slow one's pace. */
static void test_waits_within_two_rounds(void **state) {
    (void)state;
    pair s;
    pair_new(&s);
    run(&s, 0.1, 0.25);
    hs_algo_stats st = stats_of(&s, FAST);
    assert_int_equal(st.wait_timeouts, 0);
    assert_true(st.waits >= 38);
    assert_true(s.clock[FAST] > 39 * 0.25);
    pair_free(&s);
}

/* 5x slower: the fast peer's round 1 starts at 0.2 s and the slow share of round 0 comes at
 * 0.5 s + 1 ms: it waits two of its rounds (to 0.4 s), marks the slow peer lagging and never
 * waits for it again: 40 rounds of 0.1 s and that one wait. */
static void test_slow_peer_not_waited_for(void **state) {
    (void)state;
    pair s;
    pair_new(&s);
    run(&s, 0.1, 0.5);
    hs_algo_stats st = stats_of(&s, FAST);
    assert_int_equal(st.wait_timeouts, 1);
    assert_int_equal(st.waits, 1);
    if (fabs(s.clock[FAST] - (40 * 0.1 + 2 * 0.1)) > 1e-6)
        fail_msg("fast peer's 40 rounds took %.17g s, expected 4.2", s.clock[FAST]);
    assert_true(st.push_weight > 0);
    pair_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waits_within_two_rounds),
        cmocka_unit_test(test_slow_peer_not_waited_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
