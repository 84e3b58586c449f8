/* hearsay: the convergence guard, one for the simulator, networked peers and the launcher.
 *
 * A run is fed to the guard as observations (round, consensus distance, training loss, test
 * accuracy when it was measured, the parameters' mean square). The guard decides whether the
 * run is still trustworthy: a non-finite value stops it at once; sustained geometric growth of
 * the consensus distance (not a single jump), a training loss that climbs far above its best,
 * or a collapse of the test accuracy make it diverged. The verdict comes with a reason and an
 * advice naming the knob that fits the algorithm and compressor (gamma_c for CHOCO and BEER, the
 * compression for DCD and compressed D-PSGD, the learning rate for all).
 *
 * The guard decides; the caller acts (stop with exit status 3, or warn once and go on).
 * Threading: one guard per thread; no I/O. */
#ifndef HEARSAY_GUARD_H
#define HEARSAY_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/algo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hs_guard_policy {
    HS_GUARD_STOP = 0, /* a diverged run stops (the default) */
    HS_GUARD_WARN = 1, /* a diverged run is reported once and goes on; non-finite still stops */
} hs_guard_policy;

/* "stop", "warn"; parse sets HS_EINVAL with a message naming s. */
const char *hs_guard_policy_name(hs_guard_policy p);
int hs_guard_policy_parse(const char *s, hs_guard_policy *out);

typedef struct hs_guard_cfg {
    hs_guard_policy policy;
    hs_algo_kind algo;
    const char *compress; /* the compressor spec, for the advice; NULL = "none" */
    float gamma_c;        /* CHOCO's consensus step, for the advice */
    float lr;             /* the peak learning rate, for the advice (0: not known) */
    long window;          /* rounds per growth window (0: 15); a quarter epoch suits */
    long warmup;          /* rounds ignored for growth while the peers first drift apart from
                             their common start (0: 4 windows, at least 60 rounds) */
} hs_guard_cfg;

typedef struct hs_guard_obs {
    double round;     /* progress in rounds (may be fractional in virtual time) */
    /* Negative: not known. NaN or infinity: the run is broken (a stop). */
    double consensus; /* consensus distance per parameter (exact, or a peer's estimate) */
    double param_ms;  /* mean square of the parameters, to make consensus relative; 0: consensus
                         is taken as it is */
    double loss;      /* training loss of the round */
    double test_acc;  /* test accuracy when measured at this round; NAN when it was not */
} hs_guard_obs;

typedef enum hs_guard_verdict {
    HS_GUARD_OK = 0,
    HS_GUARD_DIVERGING = 1, /* diverged under policy warn: reported once, the run goes on */
    HS_GUARD_DIVERGED = 2,  /* the run must stop */
} hs_guard_verdict;

typedef struct hs_guard hs_guard;

int hs_guard_new(hs_guard **out, const hs_guard_cfg *cfg);
void hs_guard_free(hs_guard *g); /* accepts NULL */

/* Feeds one observation. Returns HS_GUARD_DIVERGED when the run must stop (non-finite values
 * always; divergence under policy stop), HS_GUARD_DIVERGING the first time divergence is
 * seen under policy warn, else HS_GUARD_OK. Once stopped, every later call returns
 * HS_GUARD_DIVERGED. */
hs_guard_verdict hs_guard_observe(hs_guard *g, const hs_guard_obs *o);

/* Starts the growth rule over at `round` (the round index the next observation, round + 1,
 * completes): the consensus distance measured from then on is not comparable with the one
 * before, because the peer starts late (a job whose first round is not 0, a resumed or rejoined
 * peer whose replicas are rebuilt) or its neighbourhood changed (other neighbours or weights).
 * Earlier windows are forgotten and growth is judged again only after a fresh warm-up, counted
 * from the start of the window `round` falls in; the loss, accuracy and non-finite rules go on
 * as before. */
void hs_guard_restart(hs_guard *g, double round);

/* Follows the neighbourhood a networked peer's own consensus estimate is measured against:
 * `epoch`, the membership in force at `round`, and `gone`, how many neighbours were found gone
 * so far (hs_algo_stats.gone: each left the mix at once, before the view that drops it). The
 * first call, and every call where either differs from the call before, restarts the growth
 * rule at `round` (hs_guard_restart). Returns 1 when it restarted. */
int hs_guard_follow(hs_guard *g, double round, uint64_t epoch, uint64_t gone);

/* Stops the run for a failure found elsewhere (the trainer's HS_EDIVERGED: a non-finite loss
 * or parameter), so it is reported like the guard's own verdicts. Returns HS_GUARD_DIVERGED. */
hs_guard_verdict hs_guard_fail(hs_guard *g, double round, const char *what);

/* Why the run diverged ("" while it has not), and what to change: both name values, e.g.
 * "the consensus distance grew 9.1x over 90 rounds (6 windows in a row)" and "lower --gamma-c
 * (now 0.4; try 0.2) or --lr (now 0.05)". Valid until the guard is freed. */
const char *hs_guard_reason(const hs_guard *g);
const char *hs_guard_advice(const hs_guard *g);
/* The round of the verdict (NAN while there is none). */
double hs_guard_round(const hs_guard *g);

/* The advice for a configuration, without a guard (the trainer's and the CLI's messages). */
void hs_guard_advice_for(const hs_guard_cfg *cfg, char *out, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
