/* The CUDA backend's device-side loss totals (softmax_xent_acc, xent_read): what a run of
 * calls adds up on the device must be what the host got by reading every call's own result
 * (softmax_xent) and summing, bit for bit, since both add the same doubles in the same order;
 * a bad label and a non-finite loss are kept with the call that had them; reset empties the
 * totals. Then the same through the model: a few training steps whose losses are accumulated
 * on the device against the same steps read one by one.
 *
 * Exit-code protocol as the other CUDA tests (../cuda_open.h): 77 without a CUDA build or a
 * GPU, a failure with HEARSAY_REQUIRE_CUDA=1 and none. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "hearsay/tensor.h"
#include "model/devshard.h"
#include "model/lossacc.h"

#include "../cuda_open.h"

static hs_backend *dev;

static float *upload_f(const float *h, size_t n) {
    float *d;
    assert_int_equal(hs_be_alloc_f(dev, n, &d), 0);
    assert_int_equal(hs_be_upload(dev, d, h, sizeof(float) * n), 0);
    return d;
}

static int32_t *upload_labels(const int32_t *h, int m) {
    int32_t *d;
    assert_int_equal(dev->ops->alloc(dev, sizeof(int32_t) * (size_t)m, (void **)&d), 0);
    assert_int_equal(hs_be_upload(dev, d, h, sizeof(int32_t) * (size_t)m), 0);
    return d;
}

/* One batch of m rows of k seeded logits and labels in [0, k), in device memory twice (the
 * gradient overwrites the logits in place). */
typedef struct batch {
    int m, k;
    float *z1, *z2;
    int32_t *y;
} batch;

static void batch_new(batch *b, int m, int k, uint32_t stream) {
    size_t mk = (size_t)m * k;
    float *hz = malloc(sizeof(float) * mk);
    int32_t *hy = malloc(sizeof(int32_t) * (size_t)m);
    assert_non_null(hz);
    assert_non_null(hy);
    hs_rng r;
    hs__rng_init(&r, 77, HS_RNG_TEST, stream, 0);
    for (size_t i = 0; i < mk; i++) hz[i] = 3.0f * (float)hs__rng_normal(&r);
    for (int i = 0; i < m; i++) hy[i] = (int32_t)(hs__rng_u64(&r) % (uint64_t)k);
    b->m = m;
    b->k = k;
    b->z1 = upload_f(hz, mk);
    b->z2 = upload_f(hz, mk);
    b->y = upload_labels(hy, m);
    free(hz);
    free(hy);
}

static void batch_free(batch *b) {
    hs_be_free(dev, b->z1);
    hs_be_free(dev, b->z2);
    hs_be_free(dev, b->y);
}

static hs_xent_acc *acc_new(void) {
    hs_xent_acc *a;
    assert_int_equal(dev->ops->alloc(dev, sizeof(*a), (void **)&a), 0);
    return a;
}

/* Batches of awkward shapes: the totals equal the host's sum of the per-call results, the
 * gradients written are softmax_xent's, and a read with reset leaves nothing behind. */
static void test_totals_equal_per_call_sum(void **state) {
    (void)state;
    static const int shapes[][2] = {{1, 1}, {7, 10}, {128, 10}, {1000, 3}, {33, 1000}, {64, 10}};
    const int nb = (int)(sizeof(shapes) / sizeof(shapes[0]));
    hs_xent_acc *acc = acc_new(), tot, again;
    double sum = 0;
    long correct = 0, rows = 0;
    for (int i = 0; i < nb; i++) {
        batch b;
        batch_new(&b, shapes[i][0], shapes[i][1], (uint32_t)i);
        float scale = 1.0f / (float)b.m;
        double loss;
        int ok;
        assert_int_equal(dev->ops->softmax_xent(dev, b.z1, b.y, b.m, b.k, b.z1, scale, &loss,
                                                &ok), 0);
        assert_int_equal(dev->ops->softmax_xent_acc(dev, b.z2, b.y, b.m, b.k, b.z2, scale, acc),
                         0);
        sum += loss / b.m; /* what the trainer added per step before the totals existed */
        correct += ok;
        rows += b.m;
        size_t mk = (size_t)b.m * b.k;
        float *g1 = malloc(sizeof(float) * mk), *g2 = malloc(sizeof(float) * mk);
        assert_int_equal(hs_be_download(dev, g1, b.z1, sizeof(float) * mk), 0);
        assert_int_equal(hs_be_download(dev, g2, b.z2, sizeof(float) * mk), 0);
        assert_memory_equal(g1, g2, sizeof(float) * mk);
        free(g1);
        free(g2);
        batch_free(&b);
        /* A read without reset in the middle changes nothing. */
        if (i == 2) {
            assert_int_equal(dev->ops->xent_read(dev, acc, &tot, 0), 0);
            assert_memory_equal(&tot.loss, &sum, sizeof(double));
        }
    }
    assert_int_equal(dev->ops->xent_read(dev, acc, &tot, 1), 0);
    if (memcmp(&tot.loss, &sum, sizeof(double)) != 0)
        print_error("accumulated %.17g, per-call sum %.17g\n", tot.loss, sum);
    assert_memory_equal(&tot.loss, &sum, sizeof(double));
    assert_int_equal(tot.correct, correct);
    assert_int_equal(tot.rows, rows);
    assert_int_equal(tot.calls, nb);
    assert_int_equal(tot.nonfinite_call, 0);
    assert_int_equal(tot.bad_call, 0);
    assert_int_equal(dev->ops->xent_read(dev, acc, &again, 1), 0);
    hs_xent_acc zero;
    memset(&zero, 0, sizeof(zero));
    assert_memory_equal(&again, &zero, sizeof(zero));
    hs_be_free(dev, acc);
}

/* A non-finite logit makes that call's loss non-finite: the totals keep the first such call;
 * a bad label is kept with its call, row, label and class count (the CPU returns it at once,
 * as its softmax_xent does). */
static void test_nonfinite_and_bad_label(void **state) {
    (void)state;
    hs_xent_acc *acc = acc_new(), tot;
    batch b;
    for (int call = 1; call <= 4; call++) {
        batch_new(&b, 5, 4, 100 + (uint32_t)call);
        if (call == 3) {
            float nan = NAN;
            assert_int_equal(hs_be_upload(dev, b.z2 + 6, &nan, sizeof(nan)), 0);
        }
        assert_int_equal(dev->ops->softmax_xent_acc(dev, b.z2, b.y, 5, 4, b.z2, 0.2f, acc), 0);
        batch_free(&b);
    }
    assert_int_equal(dev->ops->xent_read(dev, acc, &tot, 1), 0);
    assert_int_equal(tot.calls, 4);
    assert_int_equal(tot.nonfinite_call, 3);
    assert_true(isnan(tot.nonfinite_loss));
    assert_true(isnan(tot.loss));
    assert_int_equal(tot.bad_call, 0);

    batch_new(&b, 6, 4, 200);
    int32_t y[6] = {0, 1, 2, 7, 3, -1};
    assert_int_equal(hs_be_upload(dev, b.y, y, sizeof(y)), 0);
    int err = dev->ops->softmax_xent_acc(dev, b.z2, b.y, 6, 4, b.z2, 1.0f, acc);
    if (dev->host_memory && err == HS_EINVAL) {
        assert_non_null(strstr(hs_error_message(), "label 7 of row 3"));
    } else {
        assert_int_equal(err, 0);
        assert_int_equal(dev->ops->xent_read(dev, acc, &tot, 1), 0);
        assert_int_equal(tot.bad_call, 1);
        assert_int_equal(tot.bad_row, 3);
        assert_int_equal(tot.bad_label, 7);
        assert_int_equal(tot.bad_classes, 4);
    }
    batch_free(&b);
    hs_be_free(dev, acc);
}

/* Training steps through the model: a run of steps accumulated on the device reads back as the
 * sum of the same steps' losses read one by one (two models from the same initialisation, the
 * same batches), and the parameters the steps leave are the same bits. */
static void test_model_steps(void **state) {
    (void)state;
    enum { DIM = 64, CLASSES = 10, BATCH = 32, STEPS = 12 };
    hs_dataset *ds;
    hs_synth_cfg sc = {BATCH * STEPS, DIM, CLASSES, 4.0f, 11, 0};
    assert_int_equal(hs_dataset_synthetic(&ds, &sc), 0);
    hs_mlp_cfg mc;
    assert_int_equal(hs_mlp_cfg_parse(&mc, DIM, "48", CLASSES), 0);
    hs_model *m1, *m2;
    hs_optim *o1, *o2;
    hs_optim_cfg oc;
    hs_optim_cfg_default(&oc);
    oc.lr = 0.05f;
    oc.sched = HS_LR_CONST;
    assert_int_equal(hs_model_new(&m1, dev, &mc, BATCH), 0);
    assert_int_equal(hs_model_new(&m2, dev, &mc, BATCH), 0);
    assert_int_equal(hs_model_init(m1, 5), 0);
    assert_int_equal(hs_model_init(m2, 5), 0);
    size_t d = hs_model_nparams(m1);
    assert_int_equal(hs_optim_new(&o1, dev, d, &oc), 0);
    assert_int_equal(hs_optim_new(&o2, dev, d, &oc), 0);
    hs__lossacc *la;
    assert_int_equal(hs__lossacc_new(&la, dev), 0);
    double sum = 0;
    int32_t y[BATCH];
    for (int s = 0; s < STEPS; s++) {
        const float *x = ds->x + (size_t)s * BATCH * DIM;
        for (int i = 0; i < BATCH; i++) y[i] = ds->y[(size_t)s * BATCH + (size_t)i];
        hs_step_stats st;
        assert_int_equal(hs_model_grad(m1, x, y, BATCH, &st), 0);
        assert_int_equal(hs_optim_step(o1, hs_model_params(m1), hs_model_grads(m1), s, NULL), 0);
        sum += st.loss;
        assert_int_equal(hs__model_grad_acc(m2, x, y, BATCH, hs__lossacc_buf(la)), 0);
        assert_int_equal(hs_optim_step(o2, hs_model_params(m2), hs_model_grads(m2), s, NULL), 0);
    }
    hs_xent_acc tot;
    assert_int_equal(hs__lossacc_read(la, 0, STEPS, 1, &tot), 0);
    assert_memory_equal(&tot.loss, &sum, sizeof(double));
    assert_int_equal(tot.calls, STEPS);
    assert_int_equal(tot.rows, STEPS * BATCH);
    float *p1 = malloc(sizeof(float) * d), *p2 = malloc(sizeof(float) * d);
    assert_int_equal(hs_be_download(dev, p1, hs_model_params(m1), sizeof(float) * d), 0);
    assert_int_equal(hs_be_download(dev, p2, hs_model_params(m2), sizeof(float) * d), 0);
    assert_memory_equal(p1, p2, sizeof(float) * d);
    free(p1);
    free(p2);
    /* A non-finite step is named by its step, and when read later, by when it was found. The
     * NaN goes into the last bias (the logits), where no ReLU can swallow it. */
    float *params = hs_model_params(m2) + d - 1;
    float nan = NAN;
    for (int s = 0; s < 3; s++) {
        if (s == 1) assert_int_equal(hs_be_upload(dev, params, &nan, sizeof(nan)), 0);
        const float *x = ds->x + (size_t)s * BATCH * DIM;
        for (int i = 0; i < BATCH; i++) y[i] = ds->y[(size_t)s * BATCH + (size_t)i];
        assert_int_equal(hs__model_grad_acc(m2, x, y, BATCH, hs__lossacc_buf(la)), 0);
    }
    assert_int_equal(hs__lossacc_read(la, 40, 43, 1, &tot), HS_EDIVERGED);
    assert_non_null(strstr(hs_error_message(), "the training loss is nan at step 42, found at "
                                                "step 43"));
    hs__lossacc_free(la);
    hs_optim_free(o1), hs_optim_free(o2), hs_model_free(m1), hs_model_free(m2);
    hs_dataset_free(ds);
}

int main(int argc, char **argv) {
    hs_backend_cfg cfg = {1, 0};
    int self_check = argc > 1 && !strcmp(argv[1], "--self-check");
    int rc;
    if (self_check) {
        /* The CPU in place of CUDA: checks this test's logic only. */
        rc = hs_backend_open(&dev, HS_DEVICE_CPU, &cfg) < 0;
    } else {
        rc = cuda_test_open(&dev, &cfg);
    }
    if (rc != 0) return rc;
    printf("# %s%s\n", dev->description, self_check ? " (self-check: CPU in place of CUDA)" : "");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_totals_equal_per_call_sum),
        cmocka_unit_test(test_nonfinite_and_bad_label),
        cmocka_unit_test(test_model_steps),
    };
    int failed = cmocka_run_group_tests_name("cuda-lossacc", tests, NULL, NULL);
    hs_backend_close(dev);
    return failed ? 1 : 0;
}
