/* Internal: a training shard kept in backend memory, batches drawn there (devshard.c), and the
 * model's entry for a batch that is already in backend memory. */
#ifndef HS_MODEL_DEVSHARD_H
#define HS_MODEL_DEVSHARD_H

#include "hearsay/data.h"
#include "hearsay/model.h"
#include "hearsay/tensor.h"

typedef struct hs__devshard hs__devshard;

/* Uploads ds (its examples and labels) once to be's memory for batches of up to max_batch
 * for model m. Sets *out to NULL and returns 0 when there is nothing to gain or it cannot be
 * done: a backend whose memory is the host's, one without gather, or a shard that does not fit
 * (logged): the caller then uses the host batcher as before. ds and be are borrowed. */
int hs__devshard_new(hs__devshard **out, hs_backend *be, const hs_dataset *ds,
                     const hs_model *m, int max_batch);
void hs__devshard_free(hs__devshard *s); /* accepts NULL */

/* Draws b's next batch on the device (the examples of hs_batcher_next, in its order, with its
 * augmentation; b must batch the set this shard holds) and runs hs__model_grad_dev on it, the
 * loss going into acc. With s NULL (no shard on the device) the batch is drawn on the host
 * and staged by hs__model_grad_acc: a training loop takes its steps through this one call.
 * Returns the batch size, or a negative HS_E*. */
int hs__devshard_grad(hs__devshard *s, hs_batcher *b, hs_model *m, hs_xent_acc *acc);

/* hs_model_grad with the loss added to acc (backend memory, softmax_xent_acc) instead of
 * returned: the host does not wait for the step. */
int hs__model_grad_acc(hs_model *m, const float *x, const int32_t *y, int bs, hs_xent_acc *acc);
/* The same on a batch in backend memory: x is bs examples as the model's first layer reads
 * them (NHWC when hs__model_input_nhwc, else channel-major), y bs labels, all in [0, classes)
 * (the caller checked them). */
int hs__model_grad_dev(hs_model *m, const float *x, const int32_t *y, int bs,
                       hs_xent_acc *acc);
int hs__model_input_nhwc(const hs_model *m);

#endif
