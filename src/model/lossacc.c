/* A training loop's loss totals in backend memory (lossacc.h): where they live, and how a read
 * turns a bad label or a non-finite loss into the error that names its step. */
#include <stdio.h>
#include <stdlib.h>

#include "core/error_internal.h"
#include "model/lossacc.h"

struct hs__lossacc {
    hs_backend *be;
    hs_xent_acc *buf; /* backend memory */
};

int hs__lossacc_new(hs__lossacc **out, hs_backend *be) {
    *out = NULL;
    hs__lossacc *a = calloc(1, sizeof(*a));
    if (!a) return hs__err(HS_ENOMEM, "training loss: out of memory");
    a->be = be;
    int err = be->ops->alloc(be, sizeof(hs_xent_acc), (void **)&a->buf);
    if (err < 0) {
        free(a);
        return err;
    }
    *out = a;
    return 0;
}

void hs__lossacc_free(hs__lossacc *a) {
    if (!a) return;
    hs_be_free(a->be, a->buf);
    free(a);
}

hs_xent_acc *hs__lossacc_buf(hs__lossacc *a) { return a->buf; }

int hs__lossacc_eager(const hs__lossacc *a) { return a->be->host_memory; }

int hs__lossacc_read(hs__lossacc *a, long base, long now, int reset, hs_xent_acc *out) {
    int err = a->be->ops->xent_read(a->be, a->buf, out, reset);
    if (err < 0) return err;
    /* A read later than the step it names says when it looked, so a log is not misread as
     * the step that stopped. */
    char seen[48] = "";
    if (out->bad_call) {
        long at = base + (long)out->bad_call;
        if (at != now) snprintf(seen, sizeof(seen), " (step %ld, found at step %ld)", at, now);
        return hs__err(HS_EINVAL, "softmax_xent: label %d of row %d not in [0, %d)%s",
                       (int)out->bad_label, (int)out->bad_row, (int)out->bad_classes, seen);
    }
    if (out->nonfinite_call) {
        long at = base + (long)out->nonfinite_call;
        if (at != now) snprintf(seen, sizeof(seen), ", found at step %ld", now);
        return hs__err(HS_EDIVERGED, "the training loss is %g at step %ld%s",
                       out->nonfinite_loss, at, seen);
    }
    return 0;
}

void hs__lossacc_clear(hs__lossacc *a) {
    hs_xent_acc dummy;
    (void)a->be->ops->xent_read(a->be, a->buf, &dummy, 1);
}
