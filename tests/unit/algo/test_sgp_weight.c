/* SGP's push-sum weight stays a float's: a peer that gets no share (its in-neighbours paused or
 * behind, which --staleness 0 never waits for) halves w each round it pushes, and past ~128
 * such rounds 1 / w is not a float and z = x / w not finite (sgp-straggler-net under load: "the
 * parameters are not finite"). It keeps its shares once w is that small, mass and all, and
 * pushes again as soon as a share arrives. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "hearsay/algo.h"
#include "hearsay/error.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"

enum { DW = 1000, ROUNDS = 300 };

static double weight(const hs_algo *a) {
    hs_algo_stats st;
    hs_algo_get_stats(a, &st);
    return st.push_weight;
}

static uint64_t sent(const hs_algo *a) {
    hs_algo_stats st;
    hs_algo_get_stats(a, &st);
    return st.bytes_sent;
}

/* Two peers on onepeer-exp, peer 1 silent for 300 rounds of peer 0's: peer 0's evaluation point
 * stays finite and equal to its x / w of round 0 (push-sum moves no z without shares coming in),
 * and the weight of peer 0 and of its shares in flight is still 1. Then peer 1 pulls and pushes:
 * peer 0, with that share, pushes again. */
static void test_starved_peer_stays_finite(void **state) {
    (void)state;
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_SGP;
    cfg.compress = "none";
    cfg.staleness = 0;
    hs_topo *topo;
    hs_simnet *sim;
    assert_int_equal(hs_topo_new(&topo, "onepeer-exp", 2, 5), 0);
    assert_int_equal(hs_simnet_new(&sim, topo), 0);
    float x[2][DW];
    hs_algo *a[2];
    hs_exchange *ex[2];
    for (int i = 0; i < 2; i++) {
        for (size_t k = 0; k < DW; k++) x[i][k] = (float)(k % 89) * 0.017f - 0.3f * (float)i;
        assert_int_equal(hs_algo_new(&a[i], &cfg, (uint32_t)i, DW, x[i]), 0);
        ex[i] = hs_simnet_exchange(sim, i);
    }
    for (uint64_t r = 0; r < ROUNDS; r++) {
        assert_int_equal(hs_algo_push(a[0], ex[0], r, x[0]), 0);
        assert_int_equal(hs_algo_pull(a[0], ex[0], r, x[0]), 0);
    }
    const float *z = hs_algo_eval_point(a[0], x[0]);
    for (size_t k = 0; k < DW; k++)
        if (!(fabsf(z[k] - ((float)(k % 89) * 0.017f)) <= 1e-5f))
            fail_msg("z[%zu] = %g after %d rounds without a share (w %g)", k, (double)z[k],
                     ROUNDS, weight(a[0]));
    double w = weight(a[0]);
    printf("# peer 0 after %d rounds alone: w %.3g\n", ROUNDS, w);
    assert_true(w > 0 && isfinite(1.0f / (float)w));
    assert_true(fabs(w + hs_simnet_inflight_weight(sim) - 1.0) < 1e-12);
    /* Peer 1 pushes half of its weight to peer 0 and takes everything in flight. */
    assert_int_equal(hs_algo_push(a[1], ex[1], 0, x[1]), 0);
    assert_int_equal(hs_algo_pull(a[1], ex[1], 0, x[1]), 0);
    assert_true(fabs(weight(a[1]) - (1.5 - w)) < 1e-12);
    assert_int_equal(hs_algo_pull(a[0], ex[0], ROUNDS, x[0]), 0);
    uint64_t before = sent(a[0]);
    assert_int_equal(hs_algo_push(a[0], ex[0], ROUNDS + 1, x[0]), 0);
    assert_true(sent(a[0]) > before);
    for (int i = 0; i < 2; i++) hs_algo_free(a[i]);
    hs_simnet_free(sim);
    hs_topo_free(topo);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_starved_peer_stays_finite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
