/* hearsay: the in-process simulator.
 *
 * hs_simnet is an exchange (hearsay/exchange.h) for n peers in one process: ids 0..n-1 are the
 * ranks of a topology, messages are queued in memory and delivered in a fixed order, so every
 * run with the same seed is identical. Synchronous algorithms are driven in lockstep phases
 * (every begin, then every local step, then every end), so a receive never waits; asynchronous
 * ones (SGP) run in virtual time, each peer's round taking `slowdown` time units and each
 * message arriving `latency` units after it is sent.
 *
 * hs_sim runs n trainers (hearsay/trainer.h) over one dataset on one backend.
 * Threading: single-threaded. */
#ifndef HEARSAY_SIM_H
#define HEARSAY_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/data.h"
#include "hearsay/exchange.h"
#include "hearsay/topo.h"
#include "hearsay/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_simnet hs_simnet;

/* A network of hs_topo_n(topo) peers; topo is borrowed and must outlive the network. */
int hs_simnet_new(hs_simnet **out, const hs_topo *topo);
void hs_simnet_free(hs_simnet *s); /* frees queued messages too; accepts NULL */

/* The exchange of peer i (owned by s). */
hs_exchange *hs_simnet_exchange(hs_simnet *s, int i);

/* Virtual time: messages peer i sends arrive at clock(i) + latency; drain() by peer i delivers
 * those that arrived by clock(i). */
void hs_simnet_set_clock(hs_simnet *s, int i, double t);
/* Peer i's clock: a receive that waits for a message in flight moves it forward. */
double hs_simnet_clock(const hs_simnet *s, int i);
void hs_simnet_set_latency(hs_simnet *s, double latency);

/* Drops each message sent from now on with probability p (seeded), as a lossy link would;
 * a receive of a dropped round fails with HS_ENOENT once a later round of that sender is
 * queued, as on the network. */
void hs_simnet_set_loss(hs_simnet *s, double p, uint64_t seed);

/* Peer i leaves (crashes): from now on views are the topology restricted to the survivors,
 * re-weighted by Metropolis-Hastings, under a new epoch; receives from i fail with
 * HS_ECONNRESET; messages to i are dropped. Also for a peer that left with hs_simnet_leave:
 * the views then take in every departure so far. */
int hs_simnet_kill(hs_simnet *s, int i);
/* Peer i leaves while the views stay as they are, as in the network runtime between a BYE and
 * the membership view that drops the peer: receives from i fail with HS_ECONNRESET and
 * messages to i are dropped, but the survivors' views still list it (hs_simnet_kill later
 * brings the new membership in). */
int hs_simnet_leave(hs_simnet *s, int i);
int hs_simnet_alive(const hs_simnet *s, int i);

/* The push-sum weight carried by SGP shares still queued (sent, not yet received). */
double hs_simnet_inflight_weight(const hs_simnet *s);
/* Messages queued for all peers. */
size_t hs_simnet_queued(const hs_simnet *s);

typedef struct hs_sim_cfg {
    int n;
    const char *topology;     /* generator spec or file (hearsay/topo.h) */
    hs_algo_cfg algo;
    hs_trainer_cfg trainer;   /* stream is set per peer */
    hs_partition partition;
    uint64_t seed;            /* topology, sharding and compression seed */
    const double *slowdown;   /* n factors (>= 1) or NULL: virtual round time per peer */
    double latency;           /* virtual message latency, in rounds of a normal peer */
    /* n backends (borrowed, each outliving the simulator; NULL entries mean be) or NULL: peer i
     * trains and gossips on peer_be[i], so GPU and CPU peers can share one job. */
    hs_backend *const *peer_be;
} hs_sim_cfg;

typedef struct hs_sim hs_sim;

/* n trainers on be (borrowed; or cfg->peer_be's) over shards of train (borrowed; both outlive
 * the simulator). */
int hs_sim_new(hs_sim **out, hs_backend *be, const hs_sim_cfg *cfg, const hs_dataset *train);
void hs_sim_free(hs_sim *s);

/* Advances the simulation: a synchronous algorithm runs one round of every peer; SGP runs the
 * round of the peer whose virtual clock is earliest (ties by id). *peer is that peer, or -1
 * for a lockstep round. */
int hs_sim_step(hs_sim *s, int *peer);

int hs_sim_n(const hs_sim *s);
hs_trainer *hs_sim_trainer(hs_sim *s, int i);
hs_simnet *hs_sim_net(hs_sim *s);
/* Rounds completed by peer i, and its virtual clock. */
uint64_t hs_sim_rounds(const hs_sim *s, int i);
double hs_sim_clock(const hs_sim *s, int i);
/* Shard size of peer i. */
size_t hs_sim_shard_size(const hs_sim *s, int i);
/* The last round's statistics of peer i. */
const hs_round_stats *hs_sim_round_stats(const hs_sim *s, int i);

/* Exact consensus distance of the evaluation points: (1/n) sum_i ||z_i - zbar||^2 / d, and
 * zbar itself when avg is non-NULL (d floats). */
int hs_sim_consensus(hs_sim *s, double *dist, float *avg);

#ifdef __cplusplus
}
#endif
#endif
