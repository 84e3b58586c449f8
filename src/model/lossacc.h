/* Internal: a training loop's loss totals in backend memory (hs_xent_acc): every step adds to
 * them without waiting, and the loop reads them where it needs a value (a progress line, an
 * evaluation, a round's end). A host-memory backend is read after every step, which costs
 * nothing and keeps the exact step of a divergence; a device is read only at those points, so
 * the host queues step t + 1 while step t runs, and a non-finite loss is found at the next read
 * (and still named by its step). */
#ifndef HS_MODEL_LOSSACC_H
#define HS_MODEL_LOSSACC_H

#include "hearsay/tensor.h"

typedef struct hs__lossacc hs__lossacc;
int hs__lossacc_new(hs__lossacc **out, hs_backend *be);
void hs__lossacc_free(hs__lossacc *a); /* accepts NULL */
/* The buffer the steps add to (hs__model_grad_acc, hs__devshard_grad). */
hs_xent_acc *hs__lossacc_buf(hs__lossacc *a);
/* Whether to read after every step (the backend's memory is the host's). */
int hs__lossacc_eager(const hs__lossacc *a);
/* Reads the totals since the last reset into *out (and, with reset, starts a new interval);
 * base is the number of steps done before the interval's first, now the number done now.
 * HS_EDIVERGED "the training loss is nan at step N" (", found at step M" when read later) for
 * a non-finite loss, HS_EINVAL for a bad label, as softmax_xent says it. */
int hs__lossacc_read(hs__lossacc *a, long base, long now, int reset, hs_xent_acc *out);
/* Zeroes the totals, unread (after an error that abandons the interval). */
void hs__lossacc_clear(hs__lossacc *a);

#endif
