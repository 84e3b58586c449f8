/* The outer optimizer (src/train/outer.c): the step by hand, a non-finite momentum stopped,
 * --outer-lr 1 --outer-momentum 0 equal to no outer step bit for bit in the simulator for each
 * algorithm, a consensus-only run keeping the network average, the gossip's correction kept
 * out of the momentum where the algorithm mixes exactly, and the outer momentum carried by
 * checkpoints (resume gives the same bits) and by joiners' snapshots; the defaults. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/algo.h"
#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "hearsay/sim.h"
#include "hearsay/tensor.h"
#include "hearsay/trainer.h"
#include "train/outer.h"

static hs_backend *cpu(void) {
    hs_backend *be;
    hs_backend_cfg bc = {1, 0};
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &bc), 0);
    return be;
}

/* Two outer steps by hand against the equations in outer.c, in double. */
static void test_step_by_hand(void **state) {
    (void)state;
    enum { D = 4 };
    float x[D] = {1, -2, 0.5f, 3};
    hs_algo_cfg ac;
    hs_algo_cfg_default(&ac);
    ac.kind = HS_ALGO_DPSGD;
    ac.compress = "none";
    hs_algo *a;
    assert_int_equal(hs_algo_new(&a, &ac, 0, D, x), 0);
    hs_outer_cfg oc = {1, 0.5f, 0.75f};
    hs__outer *o;
    assert_int_equal(hs__outer_new(&o, &oc, D), 0);
    double u[D] = {0}, ref[D];
    for (int k = 0; k < D; k++) ref[k] = x[k];
    for (int round = 0; round < 2; round++) {
        hs__outer_open(o, a, x);
        for (int k = 0; k < D; k++) x[k] = x[k] * 0.5f + 0.25f; /* the round's local steps */
        assert_int_equal(hs__outer_step(o, a, x), 0);
        for (int k = 0; k < D; k++) {
            double g = ref[k] - ((double)(float)ref[k] * 0.5 + 0.25);
            u[k] = 0.75 * u[k] + g;
            ref[k] = ref[k] - 0.5 * (g + 0.75 * u[k]);
            assert_true(fabs(x[k] - ref[k]) < 1e-5 * (1 + fabs(ref[k])));
        }
    }
    /* A model the gossip made non-finite makes the momentum so: the run stops, saying why. */
    hs__outer_open(o, a, x);
    x[2] = INFINITY;
    assert_int_equal(hs__outer_step(o, a, x), HS_EDIVERGED);
    assert_non_null(strstr(hs_error_message(), "outer momentum is not finite (parameter 2"));
    hs__outer_free(o);
    /* Off: nothing is made, and the calls do nothing. */
    hs_outer_cfg off = {0, 1, 0};
    assert_int_equal(hs__outer_new(&o, &off, D), 0);
    assert_null(o);
    assert_int_equal(hs__outer_step(NULL, a, x), 0);
    hs_outer_cfg bad = {1, 0.5f, 1.0f};
    assert_int_equal(hs__outer_new(&o, &bad, D), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "--outer-momentum 1"));
    hs_algo_free(a);
}

/* The defaults (outer.c says why): neither value given, rate 0.5 and momentum 0.5; one given,
 * the other makes them sum to 1. Rounds that each move the model by the same amount then move
 * it by 1 - 0.5^(k+2) times that amount in round k = 0, 1, ...: smoothed, approaching it, never
 * above it
 * (the old 1 / 0 moves it by the amount at once; DiLoCo's 0.7 / 0.9 by up to 7 times it). */
static void test_defaults(void **state) {
    (void)state;
    enum { D = 3 };
    float x[D] = {0.5f, -1, 2}, before[D];
    hs_algo_cfg ac;
    hs_algo_cfg_default(&ac);
    ac.kind = HS_ALGO_CHOCO;
    ac.compress = "none";
    hs_algo *a;
    assert_int_equal(hs_algo_new(&a, &ac, 0, D, x), 0);
    hs_outer_cfg oc;
    hs__outer_cfg_default(&oc);
    assert_int_equal(oc.on, 0); /* off until one of the options is given */
    float lr, m;
    hs__outer_resolve(&oc, &lr, &m);
    assert_true(lr == 0.5f && m == 0.5f);
    const struct {
        float lr, m, want_lr, want_m;
    } one[] = {{0.7f, NAN, 0.7f, 0.3f}, {NAN, 0.9f, 0.1f, 0.9f}, {1, NAN, 1, 0},
               {1.5f, NAN, 1.5f, 0}, {NAN, 0, 1, 0}, {0.3f, 0.2f, 0.3f, 0.2f}};
    for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++) {
        hs_outer_cfg c = {1, one[i].lr, one[i].m};
        hs__outer_resolve(&c, &lr, &m);
        assert_true(fabsf(lr - one[i].want_lr) < 1e-6f && fabsf(m - one[i].want_m) < 1e-6f);
    }
    oc.on = 1;
    hs__outer *o;
    assert_int_equal(hs__outer_new(&o, &oc, D), 0);
    assert_non_null(o);
    for (int round = 0; round < 6; round++) {
        hs__outer_open(o, a, x);
        memcpy(before, x, sizeof(before));
        for (int k = 0; k < D; k++) x[k] -= 0.25f; /* the round's local steps and gossip */
        assert_int_equal(hs__outer_step(o, a, x), 0);
        double want = 0.25 * (1.0 - ldexp(1.0, -(round + 2)));
        for (int k = 0; k < D; k++) assert_true(fabs((before[k] - x[k]) - want) < 1e-5);
    }
    hs__outer_free(o);
    hs_outer_cfg bad = {1, NAN, 1.5f}; /* a given value out of range is still refused */
    assert_int_equal(hs__outer_new(&o, &bad, D), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "--outer-momentum 1.5"));
    hs_algo_free(a);
}

/* The momentum's pseudo-gradient by hand: for D-PSGD (an exact mix) it ends at the model
 * before the gossip (hs__outer_local_done), and the gossip's correction c is applied once:
 * x = a - c - alpha (g + beta u); for CHOCO (a damped mix) it ends after the gossip, and c is
 * in the momentum: x = a - alpha (g + c + beta u). */
static void test_rule_by_hand(void **state) {
    (void)state;
    enum { D = 3 };
    const hs_algo_kind kinds[] = {HS_ALGO_DPSGD, HS_ALGO_CHOCO};
    for (int which = 0; which < 2; which++) {
        float x[D] = {1, -2, 0.5f};
        hs_algo_cfg ac;
        hs_algo_cfg_default(&ac);
        ac.kind = kinds[which];
        ac.compress = which ? "topk:1" : "none";
        ac.gamma_c = 0.5f;
        hs_algo *a;
        assert_int_equal(hs_algo_new(&a, &ac, 0, D, x), 0);
        hs_outer_cfg oc = {1, 0.5f, 0.75f};
        hs__outer *o;
        assert_int_equal(hs__outer_new(&o, &oc, D), 0);
        double u[D] = {0}, ref[D];
        for (int k = 0; k < D; k++) ref[k] = x[k];
        for (int round = 0; round < 3; round++) {
            hs__outer_open(o, a, x);
            for (int k = 0; k < D; k++) x[k] = x[k] * 0.5f + 0.25f; /* the local steps */
            assert_int_equal(hs__outer_local_done(o, a, x), 0);
            for (int k = 0; k < D; k++) x[k] += 0.125f * (float)(k - 1); /* the gossip's c */
            assert_int_equal(hs__outer_step(o, a, x), 0);
            for (int k = 0; k < D; k++) {
                double an = ref[k], g = an - ((double)(float)an * 0.5 + 0.25),
                       c = -0.125 * (k - 1);
                if (which) { /* damped: c is part of the pseudo-gradient */
                    g += c;
                    c = 0;
                }
                u[k] = 0.75 * u[k] + g;
                ref[k] = an - c - 0.5 * (g + 0.75 * u[k]);
                if (!(fabs(x[k] - ref[k]) < 1e-5 * (1 + fabs(ref[k]))))
                    fail_msg("%s round %d [%d]: %g, by hand %g", hs_algo_kind_name(kinds[which]),
                             round, k, (double)x[k], ref[k]);
            }
        }
        hs__outer_free(o);
        hs_algo_free(a);
    }
}

static hs_dataset *synth(void) {
    hs_dataset *ds;
    hs_synth_cfg sc = {800, 12, 4, 4.0f, 7, 0};
    assert_int_equal(hs_dataset_synthetic(&ds, &sc), 0);
    return ds;
}

static hs_sim *sim(hs_backend *be, const hs_dataset *ds, hs_algo_kind algo, const char *compress,
                   hs_outer_cfg outer, float lr, int n) {
    hs_sim_cfg sc;
    memset(&sc, 0, sizeof(sc));
    sc.n = n;
    sc.topology = hs_algo_kind_default_topology(algo);
    sc.seed = 3;
    assert_int_equal(hs_partition_parse("iid", &sc.partition), 0);
    hs_algo_cfg_default(&sc.algo);
    sc.algo.kind = algo;
    sc.algo.compress = compress;
    sc.algo.seed = 3;
    sc.algo.same_start = lr > 0;
    if (hs_algo_kind_uses_gamma_c(algo)) sc.algo.gamma_c = 0.2f;
    hs_mlp_cfg mc;
    assert_int_equal(hs_mlp_cfg_parse(&mc, ds->dim, "16", ds->classes), 0);
    hs_model_spec_mlp(&sc.trainer.model, &mc);
    hs_optim_cfg_default(&sc.trainer.optim);
    sc.trainer.optim.lr = lr;
    sc.trainer.optim.weight_decay = lr > 0 ? 1e-4f : 0.0f;
    sc.trainer.optim.total_steps = 60;
    sc.trainer.batch = 16;
    sc.trainer.local_steps = 3;
    sc.trainer.seed = 3;
    sc.trainer.outer = outer;
    hs_sim *s;
    if (hs_sim_new(&s, be, &sc, ds) < 0) fail_msg("sim: %s", hs_error_message());
    return s;
}

static void steps(hs_sim *s, int rounds) {
    for (int r = 0; r < rounds; r++)
        if (hs_sim_step(s, NULL) < 0) fail_msg("round %d: %s", r, hs_error_message());
}

/* --outer-lr 1 --outer-momentum 0 is the algorithm without an outer step, bit for bit. */
static void identity(hs_algo_kind algo, const char *compress) {
    hs_backend *be = cpu();
    hs_dataset *ds = synth();
    hs_outer_cfg off = {0, 1, 0}, unit = {1, 1, 0}, on = {1, 0.7f, 0.9f};
    hs_sim *a = sim(be, ds, algo, compress, off, 0.05f, 4),
           *b = sim(be, ds, algo, compress, unit, 0.05f, 4),
           *c = sim(be, ds, algo, compress, on, 0.05f, 4);
    int rounds = hs_algo_kind_synchronous(algo) ? 8 : 32; /* SGP: one peer's round a step */
    steps(a, rounds);
    steps(b, rounds);
    steps(c, rounds);
    size_t d = hs_trainer_dim(hs_sim_trainer(a, 0));
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(hs_trainer_x(hs_sim_trainer(a, i)), hs_trainer_x(hs_sim_trainer(b, i)),
                            sizeof(float) * d);
        /* and the outer step does act when it is not the identity */
        assert_memory_not_equal(hs_trainer_x(hs_sim_trainer(a, i)),
                                hs_trainer_x(hs_sim_trainer(c, i)), sizeof(float) * d);
    }
    hs_sim_free(a);
    hs_sim_free(b);
    hs_sim_free(c);
    hs_dataset_free(ds);
    hs_backend_close(be);
}

static void test_identity_dpsgd(void **state) {
    (void)state;
    identity(HS_ALGO_DPSGD, "none");
}
static void test_identity_choco(void **state) {
    (void)state;
    identity(HS_ALGO_CHOCO, "topk:0.1");
}
static void test_identity_beer(void **state) {
    (void)state;
    identity(HS_ALGO_BEER, "topk:0.1");
}
static void test_identity_sgp(void **state) {
    (void)state;
    identity(HS_ALGO_SGP, "none");
}

/* Consensus only (inner lr 0, peers start apart): with outer momentum the peers still agree,
 * and the network average stays where it was. */
static void consensus(hs_algo_kind algo, const char *compress) {
    hs_backend *be = cpu();
    hs_dataset *ds = synth();
    hs_outer_cfg on = {1, 0.7f, 0.9f};
    enum { N = 6 };
    hs_sim *s = sim(be, ds, algo, compress, on, 0.0f, N);
    size_t d = hs_trainer_dim(hs_sim_trainer(s, 0));
    float *x = malloc(sizeof(float) * d), *avg0 = malloc(sizeof(float) * d),
          *avg1 = malloc(sizeof(float) * d);
    assert_true(x && avg0 && avg1);
    uint32_t st = 12345;
    for (int i = 0; i < N; i++) {
        for (size_t k = 0; k < d; k++) {
            st = st * 1664525u + 1013904223u;
            x[k] = (float)((double)(st >> 8) / (1 << 24) - 0.5);
        }
        assert_int_equal(hs_trainer_set_x(hs_sim_trainer(s, i), x), 0);
    }
    double c0, c1;
    assert_int_equal(hs_sim_consensus(s, &c0, avg0), 0);
    steps(s, 60);
    assert_int_equal(hs_sim_consensus(s, &c1, avg1), 0);
    double worst = 0;
    for (size_t k = 0; k < d; k++) worst = fmax(worst, fabs((double)avg1[k] - avg0[k]));
    print_message("# %s: consensus %.3g -> %.3g, average moved by at most %.3g\n",
                  hs_algo_kind_name(algo), c0, c1, worst);
    assert_true(c1 < 1e-3 * c0);
    assert_true(worst < 1e-5);
    free(x);
    free(avg0);
    free(avg1);
    hs_sim_free(s);
    hs_dataset_free(ds);
    hs_backend_close(be);
}

static void test_consensus_dpsgd(void **state) {
    (void)state;
    consensus(HS_ALGO_DPSGD, "none");
}
static void test_consensus_choco(void **state) {
    (void)state;
    consensus(HS_ALGO_CHOCO, "topk:0.5");
}

/* Consensus only, peers apart: where the algorithm mixes exactly (D-PSGD, SGP) nothing moves
 * the momentum (the local steps change nothing), so the outer step leaves the gossip's mix
 * as it is, bit for bit against no outer step; CHOCO's correction is in the momentum, which
 * accelerates its damped mix. */
static void exact_mix(hs_algo_kind algo, const char *compress, int same) {
    hs_backend *be = cpu();
    hs_dataset *ds = synth();
    hs_outer_cfg off = {0, 1, 0}, on = {1, 0.7f, 0.9f};
    enum { N = 4 };
    hs_sim *a = sim(be, ds, algo, compress, off, 0.0f, N), *b = sim(be, ds, algo, compress, on, 0.0f, N);
    size_t d = hs_trainer_dim(hs_sim_trainer(a, 0));
    float *x = malloc(sizeof(float) * d);
    assert_non_null(x);
    for (int i = 0; i < N; i++) {
        for (size_t k = 0; k < d; k++) x[k] = (float)((i * 7 + (int)k) % 11) - 5.0f;
        assert_int_equal(hs_trainer_set_x(hs_sim_trainer(a, i), x), 0);
        assert_int_equal(hs_trainer_set_x(hs_sim_trainer(b, i), x), 0);
    }
    int rounds = hs_algo_kind_synchronous(algo) ? 10 : 40;
    steps(a, rounds);
    steps(b, rounds);
    for (int i = 0; i < N; i++) {
        int eq = memcmp(hs_trainer_x(hs_sim_trainer(a, i)), hs_trainer_x(hs_sim_trainer(b, i)),
                        sizeof(float) * d) == 0;
        if (eq != same)
            fail_msg("%s peer %d: the outer step %s the consensus-only mix", hs_algo_kind_name(algo),
                     i, same ? "changed" : "did not change");
    }
    free(x);
    hs_sim_free(a);
    hs_sim_free(b);
    hs_dataset_free(ds);
    hs_backend_close(be);
}

static void test_exact_mix(void **state) {
    (void)state;
    exact_mix(HS_ALGO_DPSGD, "none", 1);
    exact_mix(HS_ALGO_SGP, "none", 1);
    exact_mix(HS_ALGO_CHOCO, "topk:0.5", 0);
}

/* Checkpoints and joiners' snapshots carry the outer momentum: a trainer that loads or adopts
 * another's state writes the same state again; a run with another outer setting, or a
 * momentum that is not finite, is refused. */
static void test_resume_and_join(void **state) {
    (void)state;
    hs_backend *be = cpu();
    hs_dataset *ds = synth();
    hs_outer_cfg on = {1, 0.7f, 0.9f}, off = {0, 1, 0};
    enum { N = 4 };
    hs_sim *a = sim(be, ds, HS_ALGO_DPSGD, "none", on, 0.05f, N),
           *b = sim(be, ds, HS_ALGO_DPSGD, "none", on, 0.05f, N);
    steps(a, 4);
    hs_buf *buf[N], *snap, *snap2;
    assert_int_equal(hs_buf_new(&snap, 0), 0);
    assert_int_equal(hs_buf_new(&snap2, 0), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(hs_buf_new(&buf[i], 0), 0);
        assert_int_equal(hs_trainer_save(hs_sim_trainer(a, i), buf[i]), 0);
        if (hs_trainer_load(hs_sim_trainer(b, i), buf[i]->data, buf[i]->len, 1) < 0)
            fail_msg("load: %s", hs_error_message());
    }
    /* ... and saves what it loaded: the same bytes, outer momentum included. */
    for (int i = 0; i < N; i++) {
        snap->len = 0;
        assert_int_equal(hs_trainer_save(hs_sim_trainer(b, i), snap), 0);
        assert_int_equal(snap->len, buf[i]->len);
        assert_memory_equal(snap->data, buf[i]->data, snap->len);
    }
    snap->len = 0;
    /* A joiner adopts peer 0's snapshot; its own snapshot then says the same. */
    hs_sim *j = sim(be, ds, HS_ALGO_DPSGD, "none", on, 0.05f, N),
           *k = sim(be, ds, HS_ALGO_DPSGD, "none", off, 0.05f, N);
    assert_int_equal(hs_trainer_snapshot(hs_sim_trainer(a, 0), snap), 0);
    if (hs_trainer_adopt(hs_sim_trainer(j, 0), snap->data, snap->len) < 0)
        fail_msg("adopt: %s", hs_error_message());
    assert_int_equal(hs_trainer_snapshot(hs_sim_trainer(j, 0), snap2), 0);
    assert_int_equal(snap->len, snap2->len);
    assert_memory_equal(snap->data, snap2->data, snap->len);
    /* A peer without an outer step refuses it, and the reverse. */
    assert_int_equal(hs_trainer_adopt(hs_sim_trainer(k, 0), snap->data, snap->len), HS_EMISMATCH);
    assert_non_null(strstr(hs_error_message(), "outer"));
    snap2->len = 0;
    assert_int_equal(hs_trainer_snapshot(hs_sim_trainer(k, 1), snap2), 0);
    assert_int_equal(hs_trainer_adopt(hs_sim_trainer(j, 1), snap2->data, snap2->len),
                     HS_EMISMATCH);
    assert_int_equal(hs_trainer_load(hs_sim_trainer(k, 2), buf[2]->data, buf[2]->len, 1),
                     HS_EMISMATCH);
    /* A momentum that is not finite is refused before anything changes. */
    size_t d = hs_trainer_dim(hs_sim_trainer(a, 0));
    float inf = INFINITY;
    memcpy(snap->data + snap->len - sizeof(float) * d, &inf, sizeof(inf));
    assert_int_equal(hs_trainer_adopt(hs_sim_trainer(j, 2), snap->data, snap->len), HS_EFORMAT);
    assert_non_null(strstr(hs_error_message(), "outer momentum 0 is not finite"));
    for (int i = 0; i < N; i++) hs_buf_unref(buf[i]);
    hs_buf_unref(snap);
    hs_buf_unref(snap2);
    hs_sim_free(a);
    hs_sim_free(b);
    hs_sim_free(j);
    hs_sim_free(k);
    hs_dataset_free(ds);
    hs_backend_close(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_by_hand),     cmocka_unit_test(test_identity_dpsgd),
        cmocka_unit_test(test_identity_choco),   cmocka_unit_test(test_identity_beer),
        cmocka_unit_test(test_identity_sgp),     cmocka_unit_test(test_consensus_dpsgd),
        cmocka_unit_test(test_consensus_choco),  cmocka_unit_test(test_resume_and_join),
        cmocka_unit_test(test_rule_by_hand),     cmocka_unit_test(test_exact_mix),
        cmocka_unit_test(test_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
