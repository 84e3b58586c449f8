/* The byte layouts of what a peer saves of itself: its checkpoint state and the snapshot a
 * joiner adopts. One writer and one header reader for the trainer (train/trainer.c) and for
 * the node's caller-owned vector (node/vec.c), which differ only in the parts they have. */
#ifndef HS_TRAIN_STATE_H
#define HS_TRAIN_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/buf.h"
#include "train/outer.h"

/* A joiner's snapshot: magic, d (u64), steps (u64), the model as evaluated (d floats), then the
 * optimizer's state when there is one, then the outer section when the job has an outer step.
 * A stateless SGD snapshot without an outer step is what it always was. */
#define HS__SNAPSHOT_MAGIC 0x4E535348u /* "HSSN" */
/* Checkpoint states: magic, version, d (u64), steps (u64), the model as evaluated (d floats),
 * the optimizer's state (trainer only), the outer section (train/outer.h), the algorithm's
 * state length (u64) and bytes. The trainer's (4: the outer section after the optimizer) and
 * the caller vector's (2: the outer section after the model). */
#define HS__TRAINER_STATE_MAGIC 0x52545348u /* "HSTR" */
#define HS__TRAINER_STATE_VERSION 4u
#define HS__VEC_STATE_MAGIC 0x564E5348u /* "HSNV" */
#define HS__VEC_STATE_VERSION 2u

/* What a state is made of. put_optim (NULL: no optimizer section) writes u32 kind (the
 * momentum kind plus one in its second byte, 0 in older files: train/trainer.c), u32 number
 * of vectors, u64 step count, then the vectors of d floats. */
typedef struct hs__state_parts {
    size_t d;
    uint64_t steps;
    const void *model; /* as evaluated: x, or x / w for SGP; d floats in host order, which may
                          be unaligned (the bytes of a message that holds them) */
    int (*put_optim)(void *ctx, hs_buf *out);
    void *optim_ctx;
    const hs__outer *outer; /* NULL: no outer step */
    const hs_algo *algo;    /* NULL: no algorithm (a checkpoint's algorithm section is empty) */
} hs__state_parts;

/* A checkpoint state of the given magic and version. */
int hs__state_put_checkpoint(hs_buf *out, uint32_t magic, uint32_t version,
                             const hs__state_parts *s);
/* A joiner's snapshot. */
int hs__state_put_snapshot(hs_buf *out, const hs__state_parts *s);
/* Reads the head of either (version 0: a snapshot, which has none) and checks its magic,
 * version, d and step count; what names the thing in messages. */
int hs__state_get_head(const uint8_t **p, const uint8_t *end, uint32_t magic, uint32_t version,
                       size_t d, const char *what, uint64_t *steps);

#endif
