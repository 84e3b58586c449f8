/* The round engine: the one place that says in which order a communication round's phases
 * run, for every program that runs rounds (the simulator, one engine per peer; a networked
 * node, for `hearsay run`, `launch`, the node API and Python; `hearsay train`, an engine with
 * no neighbours). The owner of the vector supplies the phases' work through hs__round_model;
 * the engine runs them in order and keeps the round count. One thread per engine. */
#ifndef HS_TRAIN_ROUND_H
#define HS_TRAIN_ROUND_H

#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/exchange.h"
#include "hearsay/trainer.h"

/* A round's phases, in the order they run. */
typedef enum hs__phase {
    HS__PH_OPEN,  /* the owner's open (outer step's anchor, optimizer's round hook), then
                     hs_algo_begin: messages that travel while the peer computes */
    HS__PH_LOCAL, /* the inner optimizer's steps: the owner's, or the caller's between calls */
    HS__PH_PUSH,  /* hs_algo_push */
    HS__PH_PULL,  /* hs_algo_pull */
    HS__PH_CLOSE, /* the owner's close: the outer step, the optimizer's round hook */
    HS__PH_END,   /* the round's bookkeeping: guard, metrics record, checkpoint timing */
    HS__PH_COUNT
} hs__phase;

/* The phases' work; every hook may be NULL (nothing to do), algo may return NULL (no
 * neighbours: no gossip). Hooks return 0 or a negative HS_E*; end returns 1 when the job has
 * ended with this round. */
typedef struct hs__round_model {
    void *ctx;
    hs_algo *(*algo)(void *ctx);
    float *(*x)(void *ctx); /* the vector the algorithm gossips */
    int (*open)(void *ctx, uint64_t r);
    int (*local)(void *ctx, uint64_t r, hs_round_stats *st);
    int (*close)(void *ctx, uint64_t r);
    int (*end)(void *ctx, uint64_t r);
} hs__round_model;

typedef struct hs__round {
    hs__round_model m;
    hs_exchange *ex;   /* NULL without an algorithm */
    uint64_t r;        /* the round in progress */
    hs__phase next;    /* the phase that runs next (after a failure: the one that failed) */
    hs_round_stats st; /* the last local phase's */
} hs__round;

/* The trainer (hearsay/trainer.h) as the owner of the vector: its round open and close, its
 * local_steps optimizer steps (end: none). */
hs__round_model hs__trainer_round_model(hs_trainer *t);
/* The mean square of the trainer's model as evaluated (x, or SGP's x / w): the scale a node's
 * divergence guard reads every round. Where the device holds x and changed it since its last
 * copy, summed there (hs_gossip_ops.sumsq), so that the round brings no d floats to the host;
 * else from the host copy. 0, or a negative HS_E* (HS_ECUDA: the device failed). */
int hs__trainer_eval_ms(hs_trainer *t, double *ms);

/* An engine about to open round r. */
void hs__round_init(hs__round *e, const hs__round_model *m, hs_exchange *ex, uint64_t r);
/* Runs phases from e->next, at least one, until the next to run is `until` (phases run in a
 * circle: after END, r advances and OPEN follows). Returns 0; 1 when END says the job ended
 * (the engine then waits at the next round's OPEN); or the failing phase's error, with
 * e->next still at that phase. */
int hs__round_run(hs__round *e, hs__phase until);
/* Starts over at round r's open (after a failure the owner recovered from). */
void hs__round_restart(hs__round *e, uint64_t r);

#endif
