/* The mixed jobs of test_cuda_round.c (round_job.c): N peers of one algorithm over hs_simnet,
 * peers 1 and 2 on the device, every peer's x after every round and its saved state compared
 * bit for bit with the all-host job's. */
#ifndef HS_TESTS_CUDA_GOSSIP_ROUND_JOB_H
#define HS_TESTS_CUDA_GOSSIP_ROUND_JOB_H

#include <stddef.h>

#include "hearsay/algo.h"
#include "hearsay/tensor.h"

#define N 5
#define D 1000
#define ROUNDS 8

extern hs_backend *dev;
extern int reference; /* dev is gossip_ref.h's reference device */
extern size_t x_bytes; /* the simulated model's size in bytes (0: none) */
extern int x_downloads; /* downloads of x_bytes since last cleared */
extern int fail_x;      /* downloads of x_bytes fail (a device's failed copy) */

/* One job of N peers; peers with `mixed` and on_device(i) run on dev. x_out (host) receives
 * every peer's x after each round, appended: ROUNDS * N * D floats; save_hash[i] a hash of
 * peer i's hs_algo_save at the end (its replicas and own replica, which the host keeps). */
typedef struct job_opts {
    const char *spec;
    hs_algo_kind kind;
    int same_start;
    double loss;
    int mixed;
    const char *topo; /* hs_topo_new's spec; NULL: a ring */
} job_opts;

/* After round reload_at (0: never), peers 1 and 2 restart from their saved state, as a trainer
 * resuming from a checkpoint does: a new hs_algo (moved to the device in a mixed job), then
 * loaded. In the mixed job, what the device held (BEER's tracker, the mixes, DCD's device
 * replicas, x_r) must come back from the host's state: the same bits as the host's restart. */
extern int reload_at;

/* After round leave_at (0: never) peer leaver leaves (a BYE: the views still list it), and two
 * rounds later the membership drops it (a new epoch, views re-weighted): its neighbours take it
 * out of their mixes, then restart BEER's tracker, re-weight their replicas (DCD's device
 * copies among them), keep SGP's shares to it. */
extern int leave_at, leaver;

/* The device allocations the device peers' algorithms made during the rounds of the last mixed
 * job and still hold at its end (DCD's device replicas). */
extern int round_allocs;

/* In round fail_pull_at (0: never) of a mixed job the device's decode primitives fail
 * (HS_ECUDA) while the device peers pull; fail_pull_rc[i] is device peer i's hs_algo_pull
 * result, and the job stops after that round. */
extern int fail_pull_at, fail_pull_rc[N];

/* One run of job o (mixed or all on the host): x_out receives every peer's x after each round,
 * ROUNDS * N * D floats, save_hash[i] a hash of peer i's hs_algo_save at the end. */
void run_job(const job_opts *o, float *x_out, uint64_t *save_hash);

/* Runs job o twice, all on the host and with peers 1 and 2 on dev, and fails unless every
 * peer's x after every round and its saved state are the same bits, and every message crossed
 * through the backend's staging memory. */
void check(const job_opts *o);

/* Wraps be's ops and gossip ops in round_job.c's counting ones and makes be dev; the reverse. */
void round_job_instrument(hs_backend *be);
void round_job_uninstrument(hs_backend *be);

#endif
