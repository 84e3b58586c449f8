/* hearsay: one peer's training loop, shared by the network runtime and the simulator.
 *
 * A trainer owns the model, the optimizer, the batches of its shard and the algorithm, and
 * runs rounds: hs_algo_begin, `local_steps` optimizer steps with the gradient taken at the
 * algorithm's evaluation point, hs_algo_push, hs_algo_pull. The simulator interleaves the
 * phases of n trainers; a networked peer runs the local steps and a node (hearsay/node.h) the
 * gossip phases around them, in the same order. Both therefore compute the same floats: a
 * seeded synchronous run gives the same parameters either way.
 *
 * The algorithm works on a host copy of x; on a host-memory backend that copy is the model's
 * own parameter vector (no copies at all), on CUDA it is synchronised once per round.
 * Threading: one thread per trainer. */
#ifndef HEARSAY_TRAINER_H
#define HEARSAY_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/data.h"
#include "hearsay/exchange.h"
#include "hearsay/model.h"
#include "hearsay/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The outer optimizer (SlowMo / DiLoCo: src/train/outer.c): after each round's gossip, a
 * Nesterov step of rate lr and momentum `momentum` on the round's pseudo-gradient (the model
 * at the round's open minus the model after the gossip for CHOCO and BEER; before it for the
 * others, whose mixing is then applied once). on = 0: no outer step; lr 1 with
 * momentum 0 computes the same bits as no outer step. A NaN lr or momentum is not given:
 * neither given, 0.5 and 0.5; one given, the other makes them sum to 1 (outer.c says why). */
typedef struct hs_outer_cfg {
    int on;
    float lr;       /* [0, 10] */
    float momentum; /* [0, 1) */
} hs_outer_cfg;

typedef struct hs_trainer_cfg {
    hs_model_spec model; /* the architecture, resolved for the data (hs_model_spec_parse) */
    hs_optim_cfg optim;  /* total_steps counts local steps */
    int batch;
    int local_steps;     /* optimizer steps per communication round (>= 1) */
    uint64_t seed;       /* initialisation (the same on every peer) and batch order */
    uint32_t stream;     /* batch-order stream: the peer's rank or id */
    int augment;         /* crop-and-flip augmentation of the batches (hs_batcher_set_augment) */
    hs_outer_cfg outer;  /* the outer step after each round's gossip (off when zeroed) */
} hs_trainer_cfg;

typedef struct hs_trainer hs_trainer;

/* A trainer on backend be (borrowed) over the examples of shard (borrowed; both must outlive
 * the trainer), for peer `self`, running algorithm acfg (NULL: a peer with no neighbours, as
 * `hearsay train`, which takes only local steps). The model starts from the seeded
 * initialisation, identical on every peer. */
int hs_trainer_new(hs_trainer **out, hs_backend *be, const hs_trainer_cfg *cfg,
                   const hs_dataset *shard, const hs_algo_cfg *acfg, uint32_t self);
void hs_trainer_free(hs_trainer *t); /* accepts NULL */

/* Replaces x (d floats, host memory) before the first round, e.g. from a join snapshot or for
 * consensus experiments. */
int hs_trainer_set_x(hs_trainer *t, const float *x);

typedef struct hs_round_stats {
    double loss;     /* mean training loss over the round's local steps */
    int samples;     /* examples processed in the round */
    float lr;        /* learning rate of the last local step */
    double compute_s; /* seconds spent in the local steps */
} hs_round_stats;

/* Round r's local steps (local_steps of them). A round's phases are run in order by the round
 * engine (src/train/round.h), which takes the trainer's open, local steps and close. */
int hs_trainer_local(hs_trainer *t, uint64_t r, hs_round_stats *st);
/* n optimizer steps on the shard (the one local-step loop: hs_trainer_local runs local_steps of
 * them, `hearsay train` as many as lie between its reports); st's loss is their mean.
 * HS_EDIVERGED on a non-finite loss. */
int hs_trainer_local_n(hs_trainer *t, int n, hs_round_stats *st);
/* Open before hs_algo_begin and close after hs_algo_pull (the outer step, the optimizer's round
 * hooks), with the vector the phases work on: hs_trainer_gossip_x, which is host memory, or
 * on a device backend, for an algorithm that gossips there (CHOCO without an outer step), the
 * parameters in the backend's memory. */
int hs_trainer_round_open(hs_trainer *t);
int hs_trainer_round_close(hs_trainer *t);
float *hs_trainer_gossip_x(hs_trainer *t);

/* Loss and accuracy of the model at the algorithm's evaluation point (x, or x / w for SGP). */
int hs_trainer_evaluate(hs_trainer *t, const hs_dataset *ds, double *loss, double *accuracy);

/* The host copy of x (d floats), current between rounds (brought from the device when the
 * algorithm gossips there); NULL, hs_error_message() set, when that copy failed. */
const float *hs_trainer_x(const hs_trainer *t);
/* The model as evaluated (z = x / w for SGP): d host floats, valid until the next call; NULL
 * as hs_trainer_x. */
const float *hs_trainer_eval_x(hs_trainer *t);
size_t hs_trainer_dim(const hs_trainer *t);
hs_algo *hs_trainer_algo(hs_trainer *t);
hs_model *hs_trainer_model(hs_trainer *t);
/* Local steps done so far. */
long hs_trainer_steps(const hs_trainer *t);
/* Batches per pass over the shard. */
long hs_trainer_steps_per_epoch(const hs_trainer *t);

/* Writes the model as evaluated (hs_trainer_eval_x) to path as d raw little-endian floats, the
 * format `hearsay train --save` writes, so runs can be compared byte for byte. */
int hs_trainer_write_params(hs_trainer *t, const char *path);

/* Checkpoints: x, the optimizer's state (momentum, or AdamW's moments and step count), the
 * step count and the algorithm's state. */
int hs_trainer_save(hs_trainer *t, hs_buf *out);
/* Validates everything before changing anything. With with_algo = 0 the algorithm's part is
 * checked for length only and not restored: a peer that rejoins under a new id resumes its
 * model and optimizer, while its neighbourhood (replicas, push-sum weight) starts afresh. */
int hs_trainer_load(hs_trainer *t, const uint8_t *p, size_t len, int with_algo);

/* What a joiner needs from a member: the step count, the evaluation point (the model itself;
 * x / w for SGP) and the optimizer's state when it has one (momentum, AdamW's moments). */
int hs_trainer_snapshot(hs_trainer *t, hs_buf *out);
/* Starts from a member's snapshot: x, the step count (so the learning-rate schedule and the
 * batch order continue where the job is) and the optimizer's state if the snapshot carries one
 * (it must then be this optimizer's; one without keeps a fresh state). Validates first. */
int hs_trainer_adopt(hs_trainer *t, const uint8_t *p, size_t len);
/* Sets the number of local steps done (learning-rate schedule, batch order). */
int hs_trainer_set_steps(hs_trainer *t, long steps);

#ifdef __cplusplus
}
#endif
#endif
