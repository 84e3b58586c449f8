/* Mini-batches: a fresh seeded permutation per epoch, gathered into contiguous buffers. The
 * permutation of epoch e depends only on (seed, stream, e), so a resumed run sees the same
 * batches as an uninterrupted one. */
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
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
    float *x;
    int32_t *y;
};

static void permute(hs_batcher *b) {
    for (size_t i = 0; i < b->ds->n; i++) b->perm[i] = (uint32_t)i;
    hs_rng r;
    hs_rng_init(&r, b->seed, HS_RNG_SHUFFLE, b->stream, (uint32_t)b->epoch);
    hs_rng_shuffle_u32(&r, b->perm, b->ds->n);
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

int hs_batcher_next(hs_batcher *b, const float **x, const int32_t **y) {
    size_t n = b->ds->n;
    size_t left = n - b->pos;
    if (left == 0 || (b->drop_last && left < (size_t)b->batch)) {
        b->epoch++;
        permute(b);
        left = n;
    }
    int bs = left < (size_t)b->batch ? (int)left : b->batch;
    int dim = b->ds->dim;
    for (int i = 0; i < bs; i++) {
        uint32_t k = b->perm[b->pos + (size_t)i];
        memcpy(b->x + (size_t)i * dim, b->ds->x + (size_t)k * dim, sizeof(float) * (size_t)dim);
        b->y[i] = b->ds->y[k];
    }
    b->pos += (size_t)bs;
    b->last_epoch = b->epoch;
    *x = b->x;
    *y = b->y;
    return bs;
}

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
