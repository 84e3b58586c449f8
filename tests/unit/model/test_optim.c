/* Unit tests of the optimizers' state: AdamW against a hand-computed step and a double-precision
 * reference, its validation, and the trainer's checkpoints and join snapshots carrying the
 * optimizer's state (bit-identical continuation; stateless SGD snapshots keep their old layout). */
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
#include "hearsay/tensor.h"
#include "hearsay/trainer.h"

static hs_backend *cpu(void) {
    hs_backend *be;
    hs_backend_cfg bc = {1, 0};
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &bc), 0);
    return be;
}

static void test_adamw_step(void **state) {
    (void)state;
    hs_backend *be = cpu();
    hs_optim_cfg c;
    hs_optim_cfg_default(&c);
    assert_int_equal(hs_optim_kind_parse("adamw", &c.kind), 0);
    assert_true(c.beta1 == 0.9f && c.beta2 == 0.999f && c.eps == 1e-8f);
    c.lr = 0.1f;
    c.weight_decay = 0.01f;
    c.sched = HS_LR_CONST;
    hs_optim *o;
    assert_int_equal(hs_optim_new(&o, be, 4, &c), 0);
    assert_int_equal(hs_optim_nstate(o), 2);
    assert_null(hs_optim_velocity(o));
    /* By hand, step 1 with x = 1, g = 0.5: m = 0.05, v = 0.00025; bias-corrected 0.5 and 0.25,
     * so the Adam direction is 0.5 / (0.5 + 1e-8) ~ 1; decay x *= 1 - 0.1 * 0.01:
     * x = 0.999 - 0.1 = 0.899. A zero gradient moves x by the decay alone. */
    float x[4] = {1.0f, 1.0f, -2.0f, 3.0f}, g[4] = {0.5f, 0.0f, -1.0f, 1e-3f};
    float lr;
    assert_int_equal(hs_optim_step(o, x, g, 0, &lr), 0);
    assert_true(lr == 0.1f);
    assert_true(fabsf(x[0] - 0.899f) < 1e-6f);
    assert_true(fabsf(x[1] - 0.999f) < 1e-6f);
    assert_true(fabsf(x[2] - (-2.0f * 0.999f + 0.1f)) < 1e-6f);
    assert_true(hs_optim_count(o) == 1);
    float *m = hs_optim_state(o, 0), *v = hs_optim_state(o, 1);
    /* (1 - beta) in float: 1 - 0.999f is 0.00099998713, hence the tolerance on v. */
    assert_true(fabsf(m[0] - 0.05f) < 1e-7f && fabsf(v[0] - 0.00025f) < 0.00025f * 1e-4f);
    /* Ten more steps against a double-precision reference of PyTorch's AdamW. */
    double xr[4] = {x[0], x[1], x[2], x[3]}, mr[4], vr[4];
    for (int i = 0; i < 4; i++) {
        mr[i] = m[i];
        vr[i] = v[i];
    }
    for (int t = 2; t <= 11; t++) {
        for (int i = 0; i < 4; i++) g[i] = (float)(0.3 * sin(t * 1.7 + i) + 0.05 * i);
        assert_int_equal(hs_optim_step(o, x, g, t - 1, NULL), 0);
        for (int i = 0; i < 4; i++) {
            double gi = g[i];
            xr[i] *= 1.0 - 0.1 * 0.01;
            mr[i] = 0.9 * mr[i] + 0.1 * gi;
            vr[i] = 0.999 * vr[i] + 0.001 * gi * gi;
            double mh = mr[i] / (1.0 - pow(0.9, t)), vh = vr[i] / (1.0 - pow(0.999, t));
            xr[i] -= 0.1 * mh / (sqrt(vh) + 1e-8);
        }
    }
    for (int i = 0; i < 4; i++) assert_true(fabs(x[i] - xr[i]) < 1e-5 * (1.0 + fabs(xr[i])));
    assert_true(hs_optim_count(o) == 11);
    hs_optim_free(o);
    /* Nesterov is SGD's; bad hyper-parameters are refused. */
    c.nesterov = 1;
    assert_int_equal(hs_optim_new(&o, be, 4, &c), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "--nesterov"));
    c.nesterov = 0;
    c.beta2 = 1.0f;
    assert_int_equal(hs_optim_new(&o, be, 4, &c), HS_EINVAL);
    c.beta2 = 0.999f;
    c.eps = 0.0f;
    assert_int_equal(hs_optim_new(&o, be, 4, &c), HS_EINVAL);
    hs_optim_kind k;
    assert_int_equal(hs_optim_kind_parse("adam", &k), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "sgd or adamw"));
    /* SGD: a velocity with momentum, nothing without. */
    hs_optim_cfg_default(&c);
    assert_int_equal(hs_optim_new(&o, be, 4, &c), 0);
    assert_int_equal(hs_optim_nstate(o), 1);
    assert_ptr_equal(hs_optim_state(o, 0), hs_optim_velocity(o));
    hs_optim_free(o);
    c.momentum = 0;
    assert_int_equal(hs_optim_new(&o, be, 4, &c), 0);
    assert_int_equal(hs_optim_nstate(o), 0);
    hs_optim_free(o);
    hs_backend_close(be);
}

/* A trainer of a small MLP on a synthetic set with the given optimizer, running D-PSGD alone
 * (only its local steps are used). */
static hs_trainer *trainer(hs_backend *be, const hs_dataset *ds, hs_optim_kind kind, float mu) {
    hs_trainer_cfg tc;
    memset(&tc, 0, sizeof(tc));
    hs_mlp_cfg mc;
    assert_int_equal(hs_mlp_cfg_parse(&mc, ds->dim, "16", ds->classes), 0);
    hs_model_spec_mlp(&tc.model, &mc);
    hs_optim_cfg_default(&tc.optim);
    tc.optim.kind = kind;
    tc.optim.momentum = mu;
    tc.optim.lr = kind == HS_OPTIM_ADAMW ? 1e-3f : 0.05f;
    tc.optim.weight_decay = 1e-2f;
    tc.optim.total_steps = 40;
    tc.batch = 16;
    tc.local_steps = 3;
    tc.seed = 5;
    tc.stream = 2;
    hs_algo_cfg ac;
    hs_algo_cfg_default(&ac);
    ac.kind = HS_ALGO_DPSGD;
    ac.compress = "none";
    ac.seed = 5;
    ac.same_start = 1;
    hs_trainer *t;
    if (hs_trainer_new(&t, be, &tc, ds, &ac, 0) < 0) fail_msg("trainer: %s", hs_error_message());
    return t;
}

static void local(hs_trainer *t, int rounds) {
    for (int r = 0; r < rounds; r++) assert_int_equal(hs_trainer_local(t, (uint64_t)r, NULL), 0);
}

static void check_continuation(hs_optim_kind kind, float mu) {
    hs_backend *be = cpu();
    hs_dataset *ds;
    hs_synth_cfg sc = {200, 12, 3, 3.0f, 9, 0};
    assert_int_equal(hs_dataset_synthetic(&ds, &sc), 0);
    hs_trainer *a = trainer(be, ds, kind, mu);
    size_t d = hs_trainer_dim(a);
    local(a, 4);
    hs_buf *ck, *sn;
    assert_int_equal(hs_buf_new(&ck, 0), 0);
    assert_int_equal(hs_buf_new(&sn, 0), 0);
    assert_int_equal(hs_trainer_save(a, ck), 0);
    assert_int_equal(hs_trainer_snapshot(a, sn), 0);
    int nstate = kind == HS_OPTIM_ADAMW ? 2 : mu != 0.0f;
    /* magic, d, steps, x, and the optimizer's block only when it has state. */
    size_t base = 4 + 8 + 8 + 4 * d;
    assert_int_equal(sn->len, nstate ? base + 16 + 4 * d * (size_t)nstate : base);
    local(a, 5);
    /* A checkpoint and a snapshot each continue bit for bit. */
    hs_trainer *b = trainer(be, ds, kind, mu), *c = trainer(be, ds, kind, mu);
    assert_int_equal(hs_trainer_load(b, ck->data, ck->len, 1), 0);
    assert_int_equal(hs_trainer_adopt(c, sn->data, sn->len), 0);
    assert_int_equal(hs_trainer_steps(c), 12);
    local(b, 5);
    local(c, 5);
    assert_memory_equal(hs_trainer_x(a), hs_trainer_x(b), sizeof(float) * d);
    assert_memory_equal(hs_trainer_x(a), hs_trainer_x(c), sizeof(float) * d);
    if (nstate) {
        /* Without the state (x and step only, what a snapshot used to carry) it differs. */
        hs_trainer *e = trainer(be, ds, kind, mu);
        assert_int_equal(hs_trainer_adopt(e, sn->data, base), 0);
        local(e, 5);
        assert_memory_not_equal(hs_trainer_x(a), hs_trainer_x(e), sizeof(float) * d);
        hs_trainer_free(e);
        /* A state for another optimizer is refused, naming both. */
        hs_trainer *f = trainer(be, ds, kind == HS_OPTIM_ADAMW ? HS_OPTIM_SGD : HS_OPTIM_ADAMW,
                                0.9f);
        assert_int_equal(hs_trainer_adopt(f, sn->data, sn->len), HS_EMISMATCH);
        assert_non_null(strstr(hs_error_message(), "adamw"));
        assert_int_equal(hs_trainer_load(f, ck->data, ck->len, 1), HS_EMISMATCH);
        /* The file's momentum kind is named only where it means something: SGD's buffer. */
        if (kind == HS_OPTIM_ADAMW && strstr(hs_error_message(), "vectors (--momentum-kind"))
            fail_msg("an AdamW file named by a momentum kind: %s", hs_error_message());
        hs_trainer_free(f);
        /* Truncated or trailing bytes are refused. */
        assert_true(hs_trainer_adopt(c, sn->data, sn->len - 4) < 0);
        assert_true(hs_trainer_load(c, ck->data, ck->len - 4, 1) < 0);
        if (kind == HS_OPTIM_ADAMW) {
            /* A negative second moment is refused: v's first float follows m. */
            float neg = -1.0f;
            memcpy(sn->data + base + 16 + 4 * d, &neg, 4);
            assert_int_equal(hs_trainer_adopt(c, sn->data, sn->len), HS_EFORMAT);
            assert_non_null(strstr(hs_error_message(), "second moment"));
        }
    }
    hs_buf_unref(ck);
    hs_buf_unref(sn);
    hs_trainer_free(a);
    hs_trainer_free(b);
    hs_trainer_free(c);
    hs_dataset_free(ds);
    hs_backend_close(be);
}

static void test_state_adamw(void **state) {
    (void)state;
    check_continuation(HS_OPTIM_ADAMW, 0.9f);
}

static void test_state_momentum(void **state) {
    (void)state;
    check_continuation(HS_OPTIM_SGD, 0.9f);
}

static void test_state_plain_sgd(void **state) {
    (void)state;
    check_continuation(HS_OPTIM_SGD, 0.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_step),
        cmocka_unit_test(test_state_adamw),
        cmocka_unit_test(test_state_momentum),
        cmocka_unit_test(test_state_plain_sgd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
