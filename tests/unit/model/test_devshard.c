/* Unit tests of the device shard (src/model/devshard.c): batches gathered in backend memory
 * must be the host batcher's, example for example, so gradients agree bit for bit. The CPU
 * backend's ops serve as the "device" here, with host_memory cleared so the shard path is taken;
 * tests/cuda/ checks the CUDA gather against the CPU's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "model/devshard.h"

static hs_backend *open_cpu(int host_memory) {
    hs_backend *be;
    hs_backend_cfg cfg = {1, 0};
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &cfg), 0);
    be->host_memory = host_memory;
    return be;
}

/* n random images of c x h x w with labels in [0, classes). */
static hs_dataset *images(size_t n, int c, int h, int w, int classes) {
    hs_dataset *ds = calloc(1, sizeof(*ds));
    assert_non_null(ds);
    ds->n = n;
    ds->channels = c, ds->height = h, ds->width = w;
    ds->dim = c * h * w;
    ds->classes = classes;
    ds->x = malloc(sizeof(float) * n * (size_t)ds->dim);
    ds->y = malloc(n);
    assert_non_null(ds->x), assert_non_null(ds->y);
    hs_rng r;
    hs__rng_init(&r, 7, HS_RNG_INIT, 0, 0);
    for (size_t i = 0; i < n * (size_t)ds->dim; i++) ds->x[i] = (float)hs__rng_normal(&r);
    for (size_t i = 0; i < n; i++) ds->y[i] = (uint8_t)(i * 7 % (size_t)classes);
    strcpy(ds->name, "test-images");
    return ds;
}

/* A model on 3 x 8 x 8 inputs whose first layer is a convolution (it reads the set's
 * channel-major rows itself) or a max pooling (its input goes NHWC). */
static void spec_for(hs_model_spec *s, int conv_first) {
    memset(s, 0, sizeof(*s));
    strcpy(s->name, conv_first ? "test-conv" : "test-pool");
    s->in_c = 3, s->in_h = 8, s->in_w = 8, s->classes = 5;
    int n = 0;
    if (conv_first)
        s->layer[n++] = (hs_layer_spec){HS_LAYER_CONV2D, 4, 3, 1, 1, 1, 0};
    else
        s->layer[n++] = (hs_layer_spec){HS_LAYER_MAXPOOL, 0, 2, 2, 0, 0, 0};
    s->layer[n++] = (hs_layer_spec){HS_LAYER_RELU, 0, 0, 0, 0, 0, 0};
    s->layer[n++] = (hs_layer_spec){HS_LAYER_FLATTEN, 0, 0, 0, 0, 0, 0};
    s->layer[n++] = (hs_layer_spec){HS_LAYER_LINEAR, 5, 0, 0, 0, 1, 0};
    s->n_layers = n;
    assert_int_equal(hs_model_spec_check(s), 0);
}

/* Steps through three epochs (the last batch of each is short) and a seek, comparing the
 * host batcher's gradient with the device shard's at every step. */
static void compare(int conv_first, int augment) {
    const int batch = 16;
    hs_dataset *ds = images(50, 3, 8, 8, 5);
    hs_model_spec spec;
    spec_for(&spec, conv_first);
    hs_backend *host = open_cpu(1), *dev = open_cpu(0);
    hs_model *mh, *md;
    hs_batcher *bh, *bd;
    hs__devshard *sh;
    assert_int_equal(hs_model_new_spec(&mh, host, &spec, batch), 0);
    assert_int_equal(hs_model_new_spec(&md, dev, &spec, batch), 0);
    assert_int_equal(hs_model_init(mh, 3), 0);
    assert_int_equal(hs_model_init(md, 3), 0);
    assert_int_equal(hs_batcher_new(&bh, ds, batch, 11, 2, 0), 0);
    assert_int_equal(hs_batcher_new(&bd, ds, batch, 11, 2, 0), 0);
    assert_int_equal(hs_batcher_set_augment(bh, augment), 0);
    assert_int_equal(hs_batcher_set_augment(bd, augment), 0);
    assert_int_equal(hs__devshard_new(&sh, dev, ds, md, batch), 0);
    assert_non_null(sh);
    size_t d = hs_model_nparams(mh);
    hs_xent_acc *acc;
    assert_int_equal(dev->ops->alloc(dev, sizeof(*acc), (void **)&acc), 0);
    for (int step = 0; step < 14; step++) {
        if (step == 10) {
            /* A resume lands mid-epoch in an epoch the shard has not loaded. */
            assert_int_equal(hs_batcher_seek(bh, 17), 0);
            assert_int_equal(hs_batcher_seek(bd, 17), 0);
        }
        const float *bx;
        const int32_t *by;
        int bs = hs_batcher_next(bh, &bx, &by);
        hs_step_stats a;
        hs_xent_acc b;
        assert_int_equal(hs_model_grad(mh, bx, by, bs, &a), 0);
        assert_int_equal(hs__devshard_grad(sh, bd, md, acc), bs);
        assert_int_equal(dev->ops->xent_read(dev, acc, &b, 1), 0);
        assert_true(a.loss == b.loss);
        assert_int_equal(a.correct, b.correct);
        assert_int_equal(b.calls, 1);
        assert_int_equal(b.rows, bs);
        assert_memory_equal(hs_model_grads(mh), hs_model_grads(md), sizeof(float) * d);
    }
    hs_be_free(dev, acc);
    hs__devshard_free(sh);
    hs_batcher_free(bh);
    hs_batcher_free(bd);
    hs_model_free(mh);
    hs_model_free(md);
    hs_backend_close(host);
    hs_backend_close(dev);
    hs_dataset_free(ds);
}

static void test_same_batches(void **state) {
    (void)state;
    for (int conv_first = 0; conv_first < 2; conv_first++)
        for (int augment = 0; augment < 2; augment++) compare(conv_first, augment);
}

/* The gather of one augmented example against hs_augment_apply itself, in both layouts. */
static void test_gather_layouts(void **state) {
    (void)state;
    hs_dataset *ds = images(3, 3, 5, 6, 2);
    hs_backend *be = open_cpu(1);
    uint32_t idx[2] = {2, 0};
    uint8_t aug[9] = {0, 0, 0, 8, 8, 1, 3, 6, 1};
    float want[2][90], got[90];
    int32_t y[2];
    hs_augment_apply(want[0], ds->x + 2 * 90, 3, 5, 6, 3, 6, 1);
    hs_augment_apply(want[1], ds->x, 3, 5, 6, 0, 0, 0);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        hs_gather_geom g = {3, 5, 6, nhwc, HS_AUGMENT_PAD};
        float x[180];
        assert_int_equal(be->ops->gather(be, ds->x, ds->y, idx, aug, &g, 2, x, y), 0);
        for (int i = 0; i < 2; i++) {
            for (int ch = 0; ch < 3; ch++)
                for (int p = 0; p < 30; p++)
                    got[nhwc ? p * 3 + ch : ch * 30 + p] = want[i][ch * 30 + p];
            assert_memory_equal(x + 90 * i, got, sizeof(got));
            assert_int_equal(y[i], ds->y[idx[i]]);
        }
    }
    hs_backend_close(be);
    hs_dataset_free(ds);
}

/* Nothing to gain where the backend's memory is the host's; a label the model cannot take is
 * refused when the shard is made, naming the example. */
static void test_refusals(void **state) {
    (void)state;
    hs_dataset *ds = images(20, 3, 8, 8, 5);
    hs_model_spec spec;
    spec_for(&spec, 1);
    hs_backend *host = open_cpu(1), *dev = open_cpu(0);
    hs_model *m;
    hs__devshard *s = (hs__devshard *)1;
    assert_int_equal(hs_model_new_spec(&m, host, &spec, 8), 0);
    assert_int_equal(hs__devshard_new(&s, host, ds, m, 8), 0);
    assert_null(s);
    hs_model_free(m);
    assert_int_equal(hs_model_new_spec(&m, dev, &spec, 8), 0);
    ds->y[13] = 5;
    assert_int_equal(hs__devshard_new(&s, dev, ds, m, 8), HS_EINVAL);
    assert_non_null(strstr(hs_error_message(), "example 13"));
    hs_model_free(m);
    hs_backend_close(host);
    hs_backend_close(dev);
    hs_dataset_free(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_batches),
        cmocka_unit_test(test_gather_layouts),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
