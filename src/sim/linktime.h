/* Virtual link time for the simulator, from the link profiles of tools/wan (wan/profile.h):
 * when the last byte of a message reaches its receiver, through the sender's uplink, the pair's
 * own link, the pair's delay and the receiver's downlink, each a queue that a message occupies
 * for bytes/rate; and what a ring all-reduce of the same links costs (DDP's baseline).
 * Jitter and loss are not modelled (mean delays only). Single-threaded. */
#ifndef HS_SIM_LINKTIME_H
#define HS_SIM_LINKTIME_H

#include <stddef.h>

#include "hearsay/sim.h"
#include "wan/profile.h"

typedef struct hs__linktime hs__linktime;

/* p is borrowed and must outlive the model. */
int hs__linktime_new(hs__linktime **out, const hs__wan_profile *p);
void hs__linktime_free(hs__linktime *lt); /* accepts NULL */

/* The virtual time (seconds) at which a message of `bytes` bytes that i sends to j at time t
 * has fully arrived. Messages queue behind earlier ones on every rate-limited stage they share
 * (call in order of sending time). A stage passes a message as a fluid: it starts when the
 * message's first byte arrives and the stage is free, and ends no sooner than bytes/rate after
 * that nor before the previous stage has ended. With one uplink and one downlink of rate R and
 * delay D that is t + D + 8 bytes / R. */
double hs__linktime_arrival(hs__linktime *lt, int i, int j, size_t bytes, double t);

/* Seconds of a ring all-reduce of `bytes` bytes among all peers (ring in index order) by the
 * alpha-beta model: 2 (n - 1) steps, in each of which every peer sends bytes / n to the next;
 * a step lasts as long as its slowest ring link takes (delay + 8 bytes / n / rate, the rate
 * being the smallest of the sender's uplink, the pair's link and the receiver's downlink).
 * With equal links: 2 (n - 1) (D + 8 bytes / (n R)). 0 for one peer, -1 out of memory. */
double hs__linktime_allreduce(const hs__linktime *lt, size_t bytes);

/* Messages of the simulated network s arrive when lt says instead of after its uniform
 * latency (NULL: back to the latency). lt is borrowed; clocks are then in seconds. */
void hs__simnet_set_links(hs_simnet *s, hs__linktime *lt);

#endif
