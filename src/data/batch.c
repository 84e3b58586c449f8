/* Mini-batches: a fresh seeded permutation per epoch, gathered into contiguous buffers, with
 * optional crop-and-flip augmentation. The permutation of epoch e and the augmentation of an
 * example in it depend only on (seed, stream, e, example), so a resumed run sees the same
 * batches as an uninterrupted one. */
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/philox.h"
#include "core/rng.h"
#include "hearsay/data.h"

struct hs_batcher {
    const hs_dataset *ds;
    int batch;
    uint64_t seed;
    uint32_t stream;
    int drop_last;
    uint32_t *perm;
    long epoch;     /* epoch of perm */
    size_t pos;     /* next position in perm */
    long steps;     /* batches per epoch */
    long last_epoch;
    int augment;
    float *x;
    int32_t *y;
};

static void permute(hs_batcher *b) {
    for (size_t i = 0; i < b->ds->n; i++) b->perm[i] = (uint32_t)i;
    hs_rng r;
    hs__rng_init(&r, b->seed, HS_RNG_SHUFFLE, b->stream, (uint32_t)b->epoch);
    hs__rng_shuffle_u32(&r, b->perm, b->ds->n);
    b->pos = 0;
}

int hs_batcher_new(hs_batcher **out, const hs_dataset *ds, int batch, uint64_t seed,
                   uint32_t stream, int drop_last) {
    if (batch <= 0) return hs__err(HS_EINVAL, "--batch %d: must be >= 1", batch);
    if (ds->n == 0) return hs__err(HS_EINVAL, "dataset %s is empty", ds->name);
    if (drop_last && ds->n < (size_t)batch)
        return hs__err(HS_EINVAL, "dataset %s has %zu examples, fewer than one batch of %d",
                       ds->name, ds->n, batch);
    hs_batcher *b = calloc(1, sizeof(*b));
    if (!b) return hs__err(HS_ENOMEM, "batcher: out of memory");
    b->ds = ds;
    b->batch = batch;
    b->seed = seed;
    b->stream = stream;
    b->drop_last = drop_last;
    b->steps = drop_last ? (long)(ds->n / (size_t)batch)
                         : (long)((ds->n + (size_t)batch - 1) / (size_t)batch);
    b->perm = malloc(sizeof(uint32_t) * ds->n);
    b->x = malloc(sizeof(float) * (size_t)batch * (size_t)ds->dim);
    b->y = malloc(sizeof(int32_t) * (size_t)batch);
    if (!b->perm || !b->x || !b->y) {
        hs_batcher_free(b);
        return hs__err(HS_ENOMEM, "batcher: out of memory");
    }
    permute(b);
    *out = b;
    return 0;
}

void hs_batcher_free(hs_batcher *b) {
    if (!b) return;
    free(b->perm);
    free(b->x);
    free(b->y);
    free(b);
}

int hs_batcher_next_idx(hs_batcher *b, const uint32_t **idx) {
    size_t n = b->ds->n;
    size_t left = n - b->pos;
    if (left == 0 || (b->drop_last && left < (size_t)b->batch)) {
        b->epoch++;
        permute(b);
        left = n;
    }
    int bs = left < (size_t)b->batch ? (int)left : b->batch;
    *idx = b->perm + b->pos;
    b->pos += (size_t)bs;
    b->last_epoch = b->epoch;
    return bs;
}

int hs_batcher_next(hs_batcher *b, const float **x, const int32_t **y) {
    const uint32_t *idx;
    int bs = hs_batcher_next_idx(b, &idx);
    int dim = b->ds->dim;
    for (int i = 0; i < bs; i++) {
        uint32_t k = idx[i];
        float *dst = b->x + (size_t)i * dim;
        const float *src = b->ds->x + (size_t)k * dim;
        if (b->augment) {
            int dy, dx, flip;
            hs_augment_draw(b->seed, b->stream, b->epoch, k, &dy, &dx, &flip);
            hs_augment_apply(dst, src, b->ds->channels, b->ds->height, b->ds->width, dy, dx, flip);
        } else {
            memcpy(dst, src, sizeof(float) * (size_t)dim);
        }
        b->y[i] = b->ds->y[k];
    }
    *x = b->x;
    *y = b->y;
    return bs;
}

int hs_batcher_augment_table(const hs_batcher *b, long epoch, uint8_t *aug) {
    if (!b->augment) return 0;
    for (size_t k = 0; k < b->ds->n; k++) {
        int dy, dx, flip;
        hs_augment_draw(b->seed, b->stream, epoch, k, &dy, &dx, &flip);
        aug[3 * k] = (uint8_t)dy;
        aug[3 * k + 1] = (uint8_t)dx;
        aug[3 * k + 2] = (uint8_t)flip;
    }
    return 1;
}

const uint32_t *hs_batcher_perm(const hs_batcher *b) { return b->perm; }
long hs_batcher_epoch(const hs_batcher *b) { return b->last_epoch; }
long hs_batcher_steps_per_epoch(const hs_batcher *b) { return b->steps; }

int hs_batcher_seek(hs_batcher *b, long step) {
    if (step < 0) return hs__err(HS_EINVAL, "batcher: step %ld is negative", step);
    b->epoch = step / b->steps;
    permute(b);
    b->pos = (size_t)(step % b->steps) * (size_t)b->batch;
    b->last_epoch = b->epoch;
    return 0;
}

int hs_batcher_set_augment(hs_batcher *b, int on) {
    const hs_dataset *ds = b->ds;
    if (on && (ds->height < 2 || ds->width < 2))
        return hs__err(HS_EINVAL,
                       "--augment: dataset %s has no spatial structure (%d x %d x %d examples); "
                       "crops and flips need images",
                       ds->name, ds->channels, ds->height, ds->width);
    b->augment = on != 0;
    return 0;
}

void hs_augment_draw(uint64_t seed, uint32_t stream, long epoch, size_t example, int *dy,
                     int *dx, int *flip) {
    /* One Philox block per example: the stream's round is the epoch, its block the example. */
    uint32_t r[4];
    hs_rng_block(seed, HS_RNG_AUGMENT, stream, (uint32_t)epoch, (uint32_t)example, r);
    *dy = (int)hs_rng_below(r[0], 2 * HS_AUGMENT_PAD + 1);
    *dx = (int)hs_rng_below(r[1], 2 * HS_AUGMENT_PAD + 1);
    *flip = (int)(r[2] >> 31);
}

void hs_augment_apply(float *dst, const float *src, int c, int h, int w, int dy, int dx,
                      int flip) {
    for (int ch = 0; ch < c; ch++)
        for (int i = 0; i < h; i++) {
            int si = i + dy - HS_AUGMENT_PAD;
            float *drow = dst + ((size_t)ch * h + i) * w;
            if (si < 0 || si >= h) {
                memset(drow, 0, sizeof(float) * (size_t)w);
                continue;
            }
            const float *srow = src + ((size_t)ch * h + si) * w;
            for (int j = 0; j < w; j++) {
                int sj = (flip ? w - 1 - j : j) + dx - HS_AUGMENT_PAD;
                drow[j] = sj >= 0 && sj < w ? srow[sj] : 0.0f;
            }
        }
}
