/* The outer optimizer over any gossip algorithm (outer.c): the anchor and the Nesterov momentum
 * of SlowMo / DiLoCo / NoLoCo, stepped once per communication round after the gossip. Used by
 * the trainer (sim, run, launch) and by the node's caller-vector model (the node API, Python).
 * One thread per object; every function accepts NULL (no outer step: does nothing). */
#ifndef HS_TRAIN_OUTER_H
#define HS_TRAIN_OUTER_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/buf.h"
#include "hearsay/trainer.h"

typedef struct hs__outer hs__outer;

/* The rate and momentum of an outer step whose hs_outer_cfg leaves them NaN (not given):
 * neither given, these; one given (`hearsay run --outer-momentum F` alone, the node's
 * "outer-lr" alone, Python's outer_lr alone), the other makes rate + momentum = 1, so that
 * rate / (1 - momentum), the step's gain on a pseudo-gradient that repeats, is 1 (the rate at
 * least 0). outer.c says why. */
#define HS__OUTER_LR_DEFAULT 0.5f
#define HS__OUTER_MOMENTUM_DEFAULT 0.5f
/* c off, neither value given: either option given turns it on. */
void hs__outer_cfg_default(hs_outer_cfg *c);
/* The rate and momentum c asks for, a value not given filled in as above. */
void hs__outer_resolve(const hs_outer_cfg *c, float *lr, float *momentum);

/* Checks lr and momentum, naming the flag that is wrong (HS_EINVAL). */
int hs__outer_check(const hs_outer_cfg *c);
/* *out = NULL when c is off; else anchor and momentum for d floats, momentum zero. */
int hs__outer_new(hs__outer **out, const hs_outer_cfg *c, size_t d);
void hs__outer_free(hs__outer *o);

/* At the round's open (before the local steps): the anchor becomes the model as evaluated,
 * hs_algo_eval_point(a, x). */
void hs__outer_open(hs__outer *o, hs_algo *a, const float *x);
/* After the local steps, before the gossip, with the model as evaluated (z for SGP: the
 * parameters the steps changed, not x / w of x = w z, which would round them): where the
 * algorithm mixes exactly, the momentum's pseudo-gradient ends here (outer.c). A second call
 * in the same round replaces the first. HS_ENOMEM. */
int hs__outer_local_done(hs__outer *o, hs_algo *a, const float *z);
/* After the gossip (hs_algo_pull): the outer step on x, through the evaluation point.
 * HS_EDIVERGED with a message when the momentum is no longer finite. */
int hs__outer_step(hs__outer *o, hs_algo *a, float *x);

/* The outer section of checkpoints and snapshots: u32 magic "HSOU", u32 version, u32 on; when
 * on: f64 lr, f64 momentum, u64 d, the momentum (d floats). The anchor is not written: at
 * every round boundary it is the model itself, which the state carries already. */
#define HS__OUTER_MAGIC 0x554F5348u
int hs__outer_save(const hs__outer *o, hs_buf *out);
/* Reads a section written by hs__outer_save and checks it against o (NULL: this run has no
 * outer step), changing nothing; at *p == end, an absent section (accepted when o is NULL); *mom points at the momentum's bytes (NULL when off), for
 * hs__outer_install once everything else of the state is valid too. */
int hs__outer_parse(const hs__outer *o, const uint8_t **p, const uint8_t *end, const char *what,
                    const uint8_t **mom);
void hs__outer_install(hs__outer *o, const uint8_t *mom);
/* Whether the bytes at p start an outer section (a snapshot's optional tail). */
int hs__outer_at(const uint8_t *p, const uint8_t *end);

#endif
