/* hearsay: one networked peer, start to finish.
 *
 * hs_peer_run is a node (hearsay/node.h) whose model is a trainer (hearsay/trainer.h) on the
 * calling thread: the node starts or joins the job, adopts the model a joiner is welcomed with,
 * runs each round's gossip until the end (or a stop request), logs per-round metrics,
 * publishes snapshots for joiners, writes checkpoints, and leaves gracefully; the trainer runs
 * the local steps between.
 * Threading: hs_peer_run blocks the calling thread; hs_peer_request_stop may be called from a
 * signal handler. */
#ifndef HEARSAY_PEER_H
#define HEARSAY_PEER_H

#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/data.h"
#include "hearsay/guard.h"
#include "hearsay/net.h"
#include "hearsay/tensor.h"
#include "hearsay/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_peer_cfg {
    hs_net_config net;
    hs_algo_cfg algo;
    hs_trainer_cfg trainer; /* stream is set from the peer's shard */
    hs_partition partition;
    int world;              /* number of shards */
    int rank;               /* this peer's shard; < 0: (id mod world) */
    /* A file on a shared file system through which the peers of a job find each other: rank 0
     * (or a peer with neither rank nor bootstrap) writes "RUN_ID HOST:PORT" there once it
     * listens; the others wait for it and join through that address. An address there that
     * does not let a peer in (a stale file of an earlier job) is read again and retried until
     * the join deadline. NULL: not used. */
    const char *rendezvous;
    /* Rounds the job trains, counted from its first round (0, or the round at which the
     * awaited members are all in, when it waits). The peer that starts a job decides; its
     * count and end round travel to joiners in the welcome snapshot, so every peer ends at the
     * same round whatever its own count says. */
    long rounds;
    long eval_every;        /* rounds between test evaluations (0: never, but at the end) */
    /* Start training only once this many members are there (<= 1: at once). With
     * wait_new_only the wait applies only before the job's first round (a new job, or a
     * joiner of a job still waiting); a peer joining a running job or resuming goes on at
     * once. A stop request ends the wait: hs_peer_run returns HS_EINTR. */
    int wait_peers;
    int wait_new_only;
    int wait_timeout_ms;
    double slowdown;        /* >= 1: this peer computes F times slower (a straggler) */
    const char *metrics;    /* JSON-lines file, or NULL */
    int quiet;
    /* Checkpoints (NULL dir: none): every `checkpoint_every` rounds, and on SIGTERM. */
    const char *checkpoint_dir;
    long checkpoint_every;
    int resume;             /* start from the newest valid checkpoint in checkpoint_dir */
    const char *save;       /* write the final model here (raw floats), or NULL */
    /* The convergence guard: fed every round with this peer's consensus estimate, loss and
     * test accuracy. A peer that stops leaves with a BYE that says why; a peer told so by a
     * neighbour stops as well under policy stop, so the whole job ends. */
    hs_guard_cfg guard;
} hs_peer_cfg;

/* What a run ended with. */
typedef struct hs_peer_result {
    uint32_t id;
    uint64_t first_round, last_round; /* rounds run: [first, last) */
    double test_acc, test_loss;
    double wall_s;
    uint64_t bytes_sent, bytes_recv; /* algorithm payload (docs/METRICS.md: bytes_sent) */
    int stopped; /* ended by a stop request rather than at the last round */
    int late; /* let in at or past the job's end: no round run, the job's final vector */
    int diverged; /* stopped by the convergence guard (here, or a neighbour's) */
    double diverged_round;
    char reason[400], advice[256];
} hs_peer_result;

/* Runs one peer over train/test (borrowed). Returns 0 when the job ended (or a stop request
 * was honoured) cleanly, else a negative error with hs_error_message() set. */
int hs_peer_run(const hs_peer_cfg *cfg, hs_backend *be, const hs_dataset *train,
                const hs_dataset *test, hs_peer_result *res);

/* Asks a running hs_peer_run to finish its current round and leave. Async-signal-safe.
 * `checkpoint` asks for a checkpoint first (SIGTERM before a preemption). */
void hs_peer_request_stop(int checkpoint);

#ifdef __cplusplus
}
#endif
#endif
