/* Unit tests of quasi-global momentum (--momentum-kind qg) and its hybrid form: the updates
 * against a hand computation (heavy ball and Nesterov, several local steps, lr 0, an lr
 * without a float inverse), the refusals, a checkpoint of another kind, the local kind left
 * as it was, and seeded simulations on Dirichlet shards that train and repeat. */
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

static hs_backend *cpu(void) {
    hs_backend *be;
    hs_backend_cfg bc = {1, 0};
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &bc), 0);
    return be;
}

static hs_optim *kind_optim(hs_backend *be, const char *kind, size_t n, float lr, float mu,
                            int nesterov) {
    hs_optim_cfg c;
    hs_optim_cfg_default(&c);
    c.lr = lr;
    c.momentum = mu;
    c.nesterov = nesterov;
    c.sched = HS_LR_CONST;
    assert_int_equal(hs_momentum_kind_parse(kind, &c.momentum_kind), 0);
    assert_string_equal(hs_momentum_kind_name(c.momentum_kind), kind);
    hs_optim *o;
    assert_int_equal(hs_optim_new(&o, be, n, &c), 0);
    return o;
}

static void near2(const float *v, double a, double b) {
    if (fabs(v[0] - a) > 1e-6 || fabs(v[1] - b) > 1e-6)
        fail_msg("got (%.9g, %.9g), expected (%.9g, %.9g)", (double)v[0], (double)v[1], a, b);
}

/* lr 0.1, beta 0.5. Round 1 from x = (1, -1), mhat = 0, g = (1, 2): m = g, x_half =
 * (0.9, -1.2); the gossip moves x to (0.95, -1.3), so d = (x_0 - x_1) / 0.1 = (0.5, 3) and
 * mhat = 0.5 d = (0.25, 1.5). Round 2, g = (-1, 0.5): m = 0.5 mhat + g = (-0.875, 1.25) and
 * x = (0.95, -1.3) - 0.1 m = (1.0375, -1.425), mhat untouched by the step; with no gossip
 * d = m and mhat = 0.5 (0.25, 1.5) + 0.5 (-0.875, 1.25) = (-0.3125, 1.375). */
static void test_update_by_hand(void **state) {
    (void)state;
    hs_backend *be = cpu();
    hs_optim *o = kind_optim(be, "qg", 2, 0.1f, 0.5f, 0);
    assert_int_equal(hs_optim_nstate(o), 1);
    float *mhat = hs_optim_state(o, 0);
    float x[2] = {1.0f, -1.0f}, g1[2] = {1.0f, 2.0f}, g2[2] = {-1.0f, 0.5f};
    assert_int_equal(hs_optim_round_begin(o, x), 0);
    assert_int_equal(hs_optim_step(o, x, g1, 0, NULL), 0);
    near2(x, 0.9, -1.2);
    near2(mhat, 0.0, 0.0); /* the step does not write the buffer */
    x[0] = 0.95f;
    x[1] = -1.3f;
    assert_int_equal(hs_optim_round_end(o, x), 0);
    near2(mhat, 0.25, 1.5);
    assert_int_equal(hs_optim_round_begin(o, x), 0);
    assert_int_equal(hs_optim_step(o, x, g2, 1, NULL), 0);
    near2(x, 1.0375, -1.425);
    near2(mhat, 0.25, 1.5);
    assert_int_equal(hs_optim_round_end(o, x), 0);
    near2(mhat, -0.3125, 1.375);
    hs_optim_free(o);

    /* Nesterov (QG-DSGDm-N): the step is g + beta m. From the same mhat = (0.25, 1.5) and
     * g = (-1, 0.5): m = (-0.875, 1.25), direction (-1.4375, 1.125), x = (1.09375, -1.4125). */
    o = kind_optim(be, "qg", 2, 0.1f, 0.5f, 1);
    mhat = hs_optim_state(o, 0);
    mhat[0] = 0.25f;
    mhat[1] = 1.5f;
    x[0] = 0.95f;
    x[1] = -1.3f;
    assert_int_equal(hs_optim_round_begin(o, x), 0);
    assert_int_equal(hs_optim_step(o, x, g2, 0, NULL), 0);
    near2(x, 1.09375, -1.4125);
    near2(mhat, 0.25, 1.5);
    hs_optim_free(o);

    /* Two local steps in a round divide by the summed lr: from mhat = 0, steps with g1 then
     * g2 and no gossip give d = (g1 + g2) / 2 = (0, 1.25), mhat = 0.5 d = (0, 0.625). */
    o = kind_optim(be, "qg", 2, 0.1f, 0.5f, 0);
    mhat = hs_optim_state(o, 0);
    x[0] = 1.0f;
    x[1] = -1.0f;
    assert_int_equal(hs_optim_round_begin(o, x), 0);
    assert_int_equal(hs_optim_step(o, x, g1, 0, NULL), 0);
    assert_int_equal(hs_optim_step(o, x, g2, 1, NULL), 0);
    near2(x, 1.0, -1.25);
    assert_int_equal(hs_optim_round_end(o, x), 0);
    near2(mhat, 0.0, 0.625);
    hs_optim_free(o);

    /* At lr 0 (consensus runs) the round's change is the gossip alone, with no step size to
     * scale it by: the buffer is left as it is. */
    o = kind_optim(be, "qg", 2, 0.0f, 0.5f, 0);
    mhat = hs_optim_state(o, 0);
    mhat[0] = 0.5f;
    mhat[1] = -0.5f;
    assert_int_equal(hs_optim_round_begin(o, x), 0);
    assert_int_equal(hs_optim_step(o, x, g1, 0, NULL), 0);
    x[0] = 7.0f;
    assert_int_equal(hs_optim_round_end(o, x), 0);
    near2(mhat, 0.5, -0.5);
    hs_optim_free(o);
    hs_backend_close(be);
}

/* Hybrid, lr 0.1, beta 0.5 (so the gossip buffer decays at beta (2 - beta) = 0.75). Round 1
 * from x = (1, -1), v = mg = 0, g = (1, 2): v = g, x = (0.9, -1.2), and x after the local steps
 * xm = (0.9, -1.2); the gossip moves x to (0.95, -1.3), so its share is (xm - x) / 0.1 =
 * (-0.5, 1) and mg = 0.5 (-0.5, 1) = (-0.25, 0.5), v untouched. Round 2, g = (-1, 0.5): v =
 * 0.5 (1, 2) + g = (-0.5, 1.5), x = (0.95, -1.3) - 0.1 v - 0.1 * 0.5 mg = (1.0125, -1.475); no
 * gossip, so mg = 0.75 mg = (-0.1875, 0.375). QG's buffer would have taken the local steps
 * too. */
static void test_hybrid_by_hand(void **state) {
    (void)state;
    hs_backend *be = cpu();
    hs_optim *o = kind_optim(be, "hybrid", 2, 0.1f, 0.5f, 0);
    assert_int_equal(hs_optim_nstate(o), 2); /* checkpoints carry both buffers */
    float *v = hs_optim_state(o, 0), *mg = hs_optim_state(o, 1);
    assert_true(hs_optim_velocity(o) == v);
    assert_int_equal(hs_optim_needs_x(o), 1);
    float x[2] = {1.0f, -1.0f}, g1[2] = {1.0f, 2.0f}, g2[2] = {-1.0f, 0.5f};
    assert_int_equal(hs_optim_round_begin(o, x), 0);
    assert_int_equal(hs_optim_step(o, x, g1, 0, NULL), 0);
    near2(x, 0.9, -1.2);
    near2(v, 1.0, 2.0);
    near2(mg, 0.0, 0.0);
    x[0] = 0.95f;
    x[1] = -1.3f;
    assert_int_equal(hs_optim_round_end(o, x), 0);
    near2(mg, -0.25, 0.5);
    near2(v, 1.0, 2.0);
    assert_int_equal(hs_optim_round_begin(o, x), 0);
    assert_int_equal(hs_optim_step(o, x, g2, 1, NULL), 0);
    near2(v, -0.5, 1.5);
    near2(x, 1.0125, -1.475);
    assert_int_equal(hs_optim_round_end(o, x), 0);
    near2(mg, -0.1875, 0.375);
    hs_optim_free(o);
    hs_backend_close(be);
}

/* A round whose summed lr has no float inverse (a subnormal lr, 1e-39 here: 1 / lr_sum rounds
 * to infinity) adds nothing to the buffer, as a round at lr 0. Dividing by it filled the buffer
 * with NaN (0 * inf wherever the round left x alone), and the next step made x NaN; both
 * kinds, qg's mhat and hybrid's mg. */
static void test_lr_without_inverse(void **state) {
    (void)state;
    hs_backend *be = cpu();
    for (int hyb = 0; hyb < 2; hyb++) {
        hs_optim *o = kind_optim(be, hyb ? "hybrid" : "qg", 2, 1e-39f, 0.5f, 0);
        float *buf = hs_optim_state(o, hyb);
        buf[0] = 0.5f;
        buf[1] = -0.5f;
        float x[2] = {1.0f, -1.0f}, g[2] = {0.0f, 0.0f};
        assert_int_equal(hs_optim_round_begin(o, x), 0);
        assert_int_equal(hs_optim_step(o, x, g, 0, NULL), 0);
        x[1] = -1.5f; /* the gossip moved element 1 only */
        assert_int_equal(hs_optim_round_end(o, x), 0);
        if (!isfinite(buf[0]) || !isfinite(buf[1]))
            fail_msg("%s: buffer (%g, %g)", hyb ? "hybrid" : "qg", (double)buf[0],
                     (double)buf[1]);
        assert_int_equal(hs_optim_step(o, x, g, 1, NULL), 0);
        assert_true(isfinite(x[0]) && isfinite(x[1]));
        hs_optim_free(o);
    }
    hs_backend_close(be);
}

/* The local kind is what it always was: the buffer takes the gradients, and the round
 * boundaries are no-ops. */
static void test_local_unchanged(void **state) {
    (void)state;
    hs_backend *be = cpu();
    hs_optim_cfg c;
    hs_optim_cfg_default(&c);
    assert_int_equal(c.momentum_kind, HS_MOMENTUM_LOCAL);
    assert_string_equal(hs_momentum_kind_name(c.momentum_kind), "local");
    c.lr = 0.1f;
    c.momentum = 0.5f;
    c.sched = HS_LR_CONST;
    hs_optim *o;
    assert_int_equal(hs_optim_new(&o, be, 2, &c), 0);
    float x[2] = {1.0f, -1.0f}, g[2] = {1.0f, 2.0f};
    assert_int_equal(hs_optim_round_begin(o, x), 0);
    assert_int_equal(hs_optim_step(o, x, g, 0, NULL), 0);
    x[0] = 5.0f;
    assert_int_equal(hs_optim_round_end(o, x), 0);
    near2(hs_optim_state(o, 0), 1.0, 2.0);
    hs_optim_free(o);
    hs_backend_close(be);
}

static void test_refusals(void **state) {
    (void)state;
    hs_backend *be = cpu();
    hs_momentum_kind k;
    assert_int_equal(hs_momentum_kind_parse("global", &k), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "local, qg or hybrid"));
    hs_optim *o = NULL;
    for (int mk = HS_MOMENTUM_QG; mk <= HS_MOMENTUM_HYBRID; mk++) {
        hs_optim_cfg c;
        hs_optim_cfg_default(&c);
        c.momentum_kind = (hs_momentum_kind)mk;
        c.momentum = 0.0f;
        assert_int_equal(hs_optim_new(&o, be, 4, &c), HS_EINVAL);
        assert_non_null(strstr(hs_error_message(), "--momentum > 0"));
        c.momentum = 0.9f;
        c.kind = HS_OPTIM_ADAMW;
        assert_int_equal(hs_optim_new(&o, be, 4, &c), HS_EINVAL);
        assert_null(o);
    }

    hs_dataset *ds;
    hs_synth_cfg sc = {64, 8, 3, 3.0f, 9, 0};
    assert_int_equal(hs_dataset_synthetic(&ds, &sc), 0);
    hs_trainer_cfg tc;
    memset(&tc, 0, sizeof(tc));
    hs_mlp_cfg mc;
    assert_int_equal(hs_mlp_cfg_parse(&mc, ds->dim, "4", ds->classes), 0);
    hs_model_spec_mlp(&tc.model, &mc);
    hs_optim_cfg_default(&tc.optim);
    tc.optim.momentum_kind = HS_MOMENTUM_QG;
    tc.batch = 8;
    tc.local_steps = 1;
    hs_algo_cfg ac;
    hs_algo_cfg_default(&ac);
    const hs_algo_kind refused[] = {HS_ALGO_SGP, HS_ALGO_DCD, HS_ALGO_SGP, HS_ALGO_DCD};
    for (int i = 0; i < 4; i++) {
        tc.optim.momentum_kind = i < 2 ? HS_MOMENTUM_QG : HS_MOMENTUM_HYBRID;
        ac.kind = refused[i];
        ac.compress = refused[i] == HS_ALGO_DCD ? "qsgd:16" : "none";
        hs_trainer *t = NULL;
        assert_int_equal(hs_trainer_new(&t, be, &tc, ds, &ac, 0), HS_EINVAL);
        assert_non_null(strstr(hs_error_message(), hs_algo_kind_name(refused[i])));
        assert_null(t);
    }
    hs_dataset_free(ds);
    hs_backend_close(be);
}

/* A small synthetic data set and the trainer configuration the checkpoint tests vary. */
static hs_dataset *ckpt_setup(hs_trainer_cfg *tc, hs_algo_cfg *ac) {
    hs_dataset *ds;
    hs_synth_cfg sc = {64, 8, 3, 3.0f, 9, 0};
    assert_int_equal(hs_dataset_synthetic(&ds, &sc), 0);
    memset(tc, 0, sizeof(*tc));
    hs_mlp_cfg mc;
    assert_int_equal(hs_mlp_cfg_parse(&mc, ds->dim, "4", ds->classes), 0);
    hs_model_spec_mlp(&tc->model, &mc);
    hs_optim_cfg_default(&tc->optim);
    tc->batch = 8;
    tc->local_steps = 1;
    hs_algo_cfg_default(ac);
    return ds;
}

/* A checkpoint of another momentum kind is refused with a message that names
 * --momentum-kind: choco's default was qg (one state vector), then hybrid (two), then local
 * (one), so an older run resumed at the defaults lands here, and "--momentum must match" sent
 * its user to a flag that was already right. Also hybrid's two vectors into a run of one, and
 * local and qg, which keep one vector each: only the kind the file records tells them apart. */
static void test_checkpoint_of_another_kind(void **state) {
    (void)state;
    hs_backend *be = cpu();
    hs_trainer_cfg tc;
    hs_algo_cfg ac;
    hs_dataset *ds = ckpt_setup(&tc, &ac);
    const hs_momentum_kind from[] = {HS_MOMENTUM_QG, HS_MOMENTUM_LOCAL, HS_MOMENTUM_HYBRID,
                                     HS_MOMENTUM_HYBRID, HS_MOMENTUM_QG, HS_MOMENTUM_LOCAL},
                           to[] = {HS_MOMENTUM_HYBRID, HS_MOMENTUM_HYBRID, HS_MOMENTUM_QG,
                                   HS_MOMENTUM_LOCAL, HS_MOMENTUM_LOCAL, HS_MOMENTUM_QG};
    for (int i = 0; i < 6; i++) {
        hs_trainer *a, *b;
        tc.optim.momentum_kind = from[i];
        assert_int_equal(hs_trainer_new(&a, be, &tc, ds, &ac, 0), 0);
        tc.optim.momentum_kind = to[i];
        assert_int_equal(hs_trainer_new(&b, be, &tc, ds, &ac, 0), 0);
        hs_buf *ck;
        assert_int_equal(hs_buf_new(&ck, 0), 0);
        assert_int_equal(hs_trainer_save(a, ck), 0);
        assert_int_equal(hs_trainer_load(b, ck->data, ck->len, 1), HS_EMISMATCH);
        const char *m = hs_error_message();
        if (!strstr(m, "--momentum-kind") || !strstr(m, hs_momentum_kind_name(to[i])))
            fail_msg("%s into %s: %s", hs_momentum_kind_name(from[i]),
                     hs_momentum_kind_name(to[i]), m);
        hs_buf_unref(ck);
        hs_trainer_free(a);
        hs_trainer_free(b);
    }
    hs_dataset_free(ds);
    hs_backend_close(be);
}

/* The optimizer word's second byte (the momentum kind plus one) as checkpoints and joiner
 * snapshots carry it: a file from before it was recorded (0 there) is judged by its count of
 * vectors alone, so a local file of then resumes under qg as it always did; a qg snapshot is
 * refused by a local joiner as a checkpoint is by a local run; a byte that names no kind is a
 * format error. Offsets: the checkpoint's head is 24 bytes, the snapshot's 20, then d floats. */
static void test_momentum_kind_byte(void **state) {
    (void)state;
    hs_backend *be = cpu();
    hs_trainer_cfg tc;
    hs_algo_cfg ac;
    hs_dataset *ds = ckpt_setup(&tc, &ac);
    hs_trainer *local, *qg;
    tc.optim.momentum_kind = HS_MOMENTUM_LOCAL;
    assert_int_equal(hs_trainer_new(&local, be, &tc, ds, &ac, 0), 0);
    tc.optim.momentum_kind = HS_MOMENTUM_QG;
    assert_int_equal(hs_trainer_new(&qg, be, &tc, ds, &ac, 0), 0);
    size_t d = hs_trainer_dim(local);
    hs_buf *ck, *sn;
    assert_int_equal(hs_buf_new(&ck, 0), 0);
    assert_int_equal(hs_buf_new(&sn, 0), 0);
    assert_int_equal(hs_trainer_save(local, ck), 0);
    assert_int_equal(hs_trainer_snapshot(qg, sn), 0);
    uint8_t *ck_mk = ck->data + 24 + 4 * d + 1, *sn_mk = sn->data + 20 + 4 * d + 1;
    assert_int_equal(*ck_mk, HS_MOMENTUM_LOCAL + 1);
    assert_int_equal(*sn_mk, HS_MOMENTUM_QG + 1);
    assert_int_equal(hs_trainer_load(qg, ck->data, ck->len, 1), HS_EMISMATCH);
    assert_int_equal(hs_trainer_adopt(local, sn->data, sn->len), HS_EMISMATCH);
    assert_non_null(strstr(hs_error_message(), "model snapshot"));
    *ck_mk = 0;
    *sn_mk = 0;
    assert_int_equal(hs_trainer_load(qg, ck->data, ck->len, 1), 0);
    assert_int_equal(hs_trainer_adopt(local, sn->data, sn->len), 0);
    *ck_mk = HS_MOMENTUM_HYBRID + 2;
    assert_int_equal(hs_trainer_load(qg, ck->data, ck->len, 1), HS_EFORMAT);
    assert_non_null(strstr(hs_error_message(), "names no momentum kind"));
    hs_buf_unref(ck);
    hs_buf_unref(sn);
    hs_trainer_free(local);
    hs_trainer_free(qg);
    hs_dataset_free(ds);
    hs_backend_close(be);
}

/* Mean training loss of the peers' last round. */
static double sim_loss(hs_sim *s) {
    double l = 0;
    for (int i = 0; i < hs_sim_n(s); i++) l += hs_sim_round_stats(s, i)->loss;
    return l / hs_sim_n(s);
}

/* n = 6 on a ring with Dirichlet(0.5) label shards; returns peer 0's x (caller frees) and the
 * mean losses of the first and the last 5 rounds. */
static float *run_sim(const hs_dataset *ds, hs_algo_kind algo, const char *compress,
                      hs_momentum_kind mk, int rounds, double *first, double *last, size_t *d) {
    hs_backend *be = cpu();
    hs_sim_cfg sc;
    memset(&sc, 0, sizeof(sc));
    sc.n = 6;
    sc.topology = "ring";
    sc.seed = 3;
    assert_int_equal(hs_partition_parse("dirichlet:0.5", &sc.partition), 0);
    hs_algo_cfg_default(&sc.algo);
    sc.algo.kind = algo;
    sc.algo.compress = compress;
    sc.algo.seed = 3;
    sc.algo.same_start = 1;
    if (algo == HS_ALGO_CHOCO) sc.algo.gamma_c = 0.2f;
    hs_mlp_cfg mc;
    assert_int_equal(hs_mlp_cfg_parse(&mc, ds->dim, "32", ds->classes), 0);
    hs_model_spec_mlp(&sc.trainer.model, &mc);
    hs_optim_cfg_default(&sc.trainer.optim);
    sc.trainer.optim.momentum_kind = mk;
    sc.trainer.optim.lr = 0.05f;
    sc.trainer.optim.weight_decay = 1e-4f;
    sc.trainer.optim.total_steps = rounds;
    sc.trainer.batch = 16;
    sc.trainer.local_steps = 1;
    sc.trainer.seed = 3;
    hs_sim *s;
    if (hs_sim_new(&s, be, &sc, ds) < 0) fail_msg("sim: %s", hs_error_message());
    *first = *last = 0;
    for (int r = 0; r < rounds; r++) {
        int peer;
        if (hs_sim_step(s, &peer) < 0) fail_msg("round %d: %s", r, hs_error_message());
        if (r < 5) *first += sim_loss(s) / 5;
        if (r >= rounds - 5) *last += sim_loss(s) / 5;
    }
    *d = hs_trainer_dim(hs_sim_trainer(s, 0));
    float *x = malloc(sizeof(float) * *d);
    assert_non_null(x);
    memcpy(x, hs_trainer_x(hs_sim_trainer(s, 0)), sizeof(float) * *d);
    hs_sim_free(s);
    hs_backend_close(be);
    return x;
}

static void check_sim(hs_algo_kind algo, const char *compress) {
    hs_dataset *ds;
    hs_synth_cfg sc = {1200, 16, 6, 4.0f, 11, 0};
    assert_int_equal(hs_dataset_synthetic(&ds, &sc), 0);
    double f1, l1, f2, l2, f3, l3;
    size_t d;
    float *a = run_sim(ds, algo, compress, HS_MOMENTUM_QG, 60, &f1, &l1, &d);
    float *b = run_sim(ds, algo, compress, HS_MOMENTUM_QG, 60, &f2, &l2, &d);
    float *c = run_sim(ds, algo, compress, HS_MOMENTUM_LOCAL, 60, &f3, &l3, &d);
    print_message("# %s qg: loss %.4f -> %.4f; local: %.4f -> %.4f\n", hs_algo_kind_name(algo),
                  f1, l1, f3, l3);
    /* It trains: the loss falls by more than half over 60 rounds. */
    assert_true(isfinite(l1) && l1 < 0.5 * f1);
    /* Seeded runs repeat bit for bit, and qg is not the local kind under another name. */
    assert_memory_equal(a, b, sizeof(float) * d);
    assert_memory_not_equal(a, c, sizeof(float) * d);
    free(a);
    free(b);
    free(c);
    hs_dataset_free(ds);
}

static void test_sim_dpsgd(void **state) {
    (void)state;
    check_sim(HS_ALGO_DPSGD, "none");
}

static void test_sim_choco(void **state) {
    (void)state;
    check_sim(HS_ALGO_CHOCO, "topk:0.1");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_update_by_hand),
        cmocka_unit_test(test_hybrid_by_hand),
        cmocka_unit_test(test_local_unchanged),
        cmocka_unit_test(test_lr_without_inverse),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_checkpoint_of_another_kind),
        cmocka_unit_test(test_momentum_kind_byte),
        cmocka_unit_test(test_sim_dpsgd),
        cmocka_unit_test(test_sim_choco),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
