/* The training shard in backend memory: uploaded once, then every batch is gathered there by
 * index (and cropped and flipped when augmenting), so a GPU step needs no host copy of the
 * data. The indices are the host batcher's: each epoch's permutation (and augmentation table)
 * goes to the device once, and a batch is its slice, so the examples, their order and their
 * augmentation are those of hs_batcher_next. Single-threaded, like the model. */
#include <stdio.h>
#include <stdlib.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "model/devshard.h"

struct hs__devshard {
    hs_backend *be;
    const hs_dataset *ds;
    hs_gather_geom g;
    float *x;       /* the examples, n rows of dim floats as the set holds them */
    uint8_t *y;     /* their labels */
    uint32_t *perm; /* the epoch's permutation, uploaded when the epoch changes */
    uint8_t *aug;   /* the epoch's crop and flip per example (3 n bytes), NULL without */
    uint8_t *aug_host;
    long epoch;     /* of perm and aug; -1 before the first batch */
    float *bx;      /* the batch */
    int32_t *by;
};

void hs__devshard_free(hs__devshard *s) {
    if (!s) return;
    hs_backend *be = s->be;
    hs_be_free(be, s->x);
    hs_be_free(be, s->y);
    hs_be_free(be, s->perm);
    hs_be_free(be, s->aug);
    hs_be_free(be, s->bx);
    hs_be_free(be, s->by);
    free(s->aug_host);
    free(s);
}

int hs__devshard_new(hs__devshard **out, hs_backend *be, const hs_dataset *ds,
                     const hs_model *m, int max_batch) {
    *out = NULL;
    if (be->host_memory || !be->ops->gather) return 0;
    const hs_model_spec *sp = hs_model_get_spec(m);
    if (ds->dim != sp->in_c * sp->in_h * sp->in_w || ds->n == 0 || max_batch < 1)
        return hs__err(HS_EINVAL, "device shard: %zu examples of %d features for a model of %d "
                                  "x %d x %d inputs, batch %d",
                       ds->n, ds->dim, sp->in_c, sp->in_h, sp->in_w, max_batch);
    /* Labels are checked here once, instead of on every batch (hs_model_grad's check). */
    for (size_t k = 0; k < ds->n; k++)
        if (ds->y[k] >= sp->classes)
            return hs__err(HS_EINVAL, "dataset %s: label %u of example %zu is not in [0, %d)",
                           ds->name, ds->y[k], k, sp->classes);
    hs__devshard *s = calloc(1, sizeof(*s));
    if (!s) return hs__err(HS_ENOMEM, "device shard: out of memory");
    s->be = be;
    s->ds = ds;
    s->epoch = -1;
    /* The model's spec shape, not the set's: a set without spatial structure is 1 x 1 x dim. */
    s->g = (hs_gather_geom){sp->in_c, sp->in_h, sp->in_w, hs__model_input_nhwc(m),
                            HS_AUGMENT_PAD};
    size_t n = ds->n, dim = (size_t)ds->dim, mb = (size_t)max_batch;
    int err;
    if ((err = hs_be_alloc_f(be, n * dim, &s->x)) < 0 ||
        (err = be->ops->alloc(be, n, (void **)&s->y)) < 0 ||
        (err = be->ops->alloc(be, sizeof(uint32_t) * n, (void **)&s->perm)) < 0 ||
        (err = hs_be_alloc_f(be, mb * dim, &s->bx)) < 0 ||
        (err = be->ops->alloc(be, sizeof(int32_t) * mb, (void **)&s->by)) < 0) {
        /* Too big for the device next to the model: the host path still works. */
        HS_LOGW("device shard: %s (%zu examples of %zu floats); batches go through the host",
                hs_error_message(), n, dim);
        hs__devshard_free(s);
        return 0;
    }
    if ((err = hs_be_upload(be, s->x, ds->x, sizeof(float) * n * dim)) < 0 ||
        (err = hs_be_upload(be, s->y, ds->y, n)) < 0) {
        hs__devshard_free(s);
        return err;
    }
    *out = s;
    return 0;
}

/* The permutation and augmentation of epoch e on the device. */
static int load_epoch(hs__devshard *s, hs_batcher *b, const uint32_t *perm, long e) {
    hs_backend *be = s->be;
    size_t n = s->ds->n;
    int err = hs_be_upload(be, s->perm, perm, sizeof(uint32_t) * n);
    if (err < 0) return err;
    if (!s->aug_host && !(s->aug_host = malloc(3 * n)))
        return hs__err(HS_ENOMEM, "device shard: out of memory");
    if (hs_batcher_augment_table(b, e, s->aug_host)) {
        if (!s->aug && (err = be->ops->alloc(be, 3 * n, (void **)&s->aug)) < 0) return err;
        if ((err = hs_be_upload(be, s->aug, s->aug_host, 3 * n)) < 0) return err;
    } else {
        hs_be_free(be, s->aug);
        s->aug = NULL;
    }
    s->epoch = e;
    return 0;
}

int hs__devshard_grad(hs__devshard *s, hs_batcher *b, hs_model *m, hs_xent_acc *acc) {
    int bs, err;
    if (!s) {
        const float *bx;
        const int32_t *by;
        bs = hs_batcher_next(b, &bx, &by);
        err = hs__model_grad_acc(m, bx, by, bs, acc);
        return err < 0 ? err : bs;
    }
    const uint32_t *idx;
    bs = hs_batcher_next_idx(b, &idx);
    long e = hs_batcher_epoch(b);
    /* A batch is a slice of its epoch's permutation, which starts a whole number of batches
     * before it. */
    size_t pos = (size_t)(idx - hs_batcher_perm(b));
    if (e != s->epoch && (err = load_epoch(s, b, idx - pos, e)) < 0) return err;
    if ((err = s->be->ops->gather(s->be, s->x, s->y, s->perm + pos, s->aug, &s->g, bs, s->bx,
                                  s->by)) < 0 ||
        (err = hs__model_grad_dev(m, s->bx, s->by, bs, acc)) < 0)
        return err;
    return bs;
}
