/* SGP's staleness wait in the simulator's virtual time (src/algo/sgp.c): a peer waits for an
 * in-neighbour's late share at most two of its own rounds plus what its most punctual other
 * in-neighbour usually costs. Peers on "complete" over a fast link (1 Gbit/s, 1 ms): FAST and
 * PUNCT compute 0.1 s a round, SLOW 2.5x or 5x longer. Without the bound FAST would wait for
 * every late share (as a networked peer does for up to its receive timeout) and run at SLOW's
 * pace in both cases. With SLOW its only in-neighbour (two peers), nothing tells SLOW's
 * lateness from the links', so it is waited for. A peer that keeps pace but pauses once is
 * waited for in full: only a second late share in a row is let go. */
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
enum { FAST = 0, SLOW = 1, PUNCT = 2 };

typedef struct pair {
    hs__wan_profile *p;
    hs_topo *t;
    hs_simnet *net;
    hs__linktime *lt;
    int n;
    hs_algo *a[3];
    float x[3][D];
    double clock[3];
    uint64_t r[3];
} pair;

static void pair_new(pair *s, int n) {
    memset(s, 0, sizeof(*s));
    s->n = n;
    char json[128];
    snprintf(json, sizeof(json), "{\"peers\": %d, \"delay_ms\": 1, \"rate_mbit\": 1000}", n);
    if (hs__wan_profile_parse(&s->p, json, "test.json") < 0) fail_msg("%s", hs_error_message());
    assert_int_equal(hs_topo_new(&s->t, "complete", n, 1), 0);
    assert_int_equal(hs_simnet_new(&s->net, s->t), 0);
    assert_int_equal(hs__linktime_new(&s->lt, s->p), 0);
    hs__simnet_set_links(s->net, s->lt);
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_SGP;
    cfg.staleness = 1;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < D; k++) s->x[i][k] = (float)(i + k);
        if (hs_algo_new(&s->a[i], &cfg, (uint32_t)i, D, s->x[i]) < 0)
            fail_msg("hs_algo_new: %s", hs_error_message());
    }
}

static void pair_free(pair *s) {
    for (int i = 0; i < s->n; i++) hs_algo_free(s->a[i]);
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

/* FAST's 40 rounds. SLOW's shares go out ahead of them, as on a network (every slow round
 * whose compute ends within a second of FAST's clock), so that a wait for one is a wait for a
 * share already on its way; PUNCT runs each round just before FAST. SLOW's round pause_at (if
 * any) takes 3 s longer: a pause of its host. */
static void run_pausing(pair *s, double slow, uint64_t pause_at) {
    while (s->r[FAST] < 40) {
        while (s->clock[SLOW] < s->clock[FAST] + 1.0)
            round_of(s, SLOW, slow + (s->r[SLOW] == pause_at ? 3.0 : 0.0));
        if (s->n > 2) round_of(s, PUNCT, 0.1);
        round_of(s, FAST, 0.1);
    }
    hs_algo_stats st = stats_of(s, FAST);
    printf("# %d peers, slow step %.2f s: FAST's 40 rounds in %.3f s, %llu waits, %llu timed out\n",
           s->n, slow, s->clock[FAST], (unsigned long long)st.waits,
           (unsigned long long)st.wait_timeouts);
}

static void run(pair *s, double slow) { run_pausing(s, slow, UINT64_MAX); }

/* 2.5x slower: each of SLOW's shares is 0.15 s late, within two of FAST's rounds (PUNCT's
 * shares cost nothing): it is waited for every round, and FAST runs at SLOW's pace. */
static void test_waits_within_two_rounds(void **state) {
    (void)state;
    pair s;
    pair_new(&s, 3);
    run(&s, 0.25);
    hs_algo_stats st = stats_of(&s, FAST);
    assert_int_equal(st.wait_timeouts, 0);
    assert_true(st.waits >= 38);
    assert_true(s.clock[FAST] > 39 * 0.25);
    pair_free(&s);
}

/* 5x slower: FAST waits for SLOW's first share in full (PUNCT not measured yet), then finds
 * its next one later than two rounds (0.2 s, PUNCT costing nothing), marks it lagging and never
 * waits for it again: its remaining rounds take 0.1 s each, far from SLOW's 0.5 s. */
static void test_slow_peer_not_waited_for(void **state) {
    (void)state;
    pair s;
    pair_new(&s, 3);
    run(&s, 0.5);
    hs_algo_stats st = stats_of(&s, FAST);
    assert_int_equal(st.wait_timeouts, 1);
    assert_true(s.clock[FAST] < 40 * 0.1 + 1.0);
    assert_true(st.push_weight > 0);
    pair_free(&s);
}

/* Two peers: SLOW is FAST's only in-neighbour, so its lateness may be the links' (a thin WAN
 * delays every share alike): it is waited for, 5x slower or not. */
/* SLOW keeps FAST's pace but pauses once for 3 s: its late share is waited for in full
 * (no timeout, so no mass left in flight for the job's end), and FAST, caught up, never waits
 * long again. With a budget for every share it would be let go and marked lagging. */
static void test_one_pause_waited_for(void **state) {
    (void)state;
    pair s;
    pair_new(&s, 3);
    run_pausing(&s, 0.1, 20);
    hs_algo_stats st = stats_of(&s, FAST);
    assert_int_equal(st.wait_timeouts, 0);
    assert_true(s.clock[FAST] > 40 * 0.1 + 2.0);
    pair_free(&s);
}

static void test_single_in_neighbour_waited_for(void **state) {
    (void)state;
    pair s;
    pair_new(&s, 2);
    run(&s, 0.5);
    hs_algo_stats st = stats_of(&s, FAST);
    assert_int_equal(st.wait_timeouts, 0);
    assert_true(s.clock[FAST] > 39 * 0.5);
    pair_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waits_within_two_rounds),
        cmocka_unit_test(test_slow_peer_not_waited_for),
        cmocka_unit_test(test_one_pause_waited_for),
        cmocka_unit_test(test_single_in_neighbour_waited_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
