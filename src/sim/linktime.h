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

/* IP (20) + TCP (20) + timestamp option (12) bytes: what Linux puts on each packet. */
#define HS__LINKTIME_TCP_HEADERS 52

/* From now on a message costs its bytes on the wire: its payload in packets of at most
 * mtu - headers bytes (the profile's mtu), each adding `headers` bytes; the emulator's rates
 * count IP bytes. 0 (the default) or a value >= mtu: the payload alone. */
void hs__linktime_set_headers(hs__linktime *lt, int headers);
/* What `bytes` of payload are on the wire (bytes itself with no headers set). */
double hs__linktime_wire_bytes(const hs__linktime *lt, double bytes);

/* How TCP shares a congested stage (hs__linktime_set_tcp): the fraction of the stage's rate a
 * message gets when its connection has the stage alone and when it waits behind another
 * connection's message, and when a stage counts as congested: on_overflow, when a message's
 * wait plus its own time there exceeds the profile's queue_ms plus its round trip (the
 * drop-tail queue overflows: reno); else whenever it waits behind another message (bbr). */
typedef struct hs__linktime_tcp {
    const char *name;
    double share_alone, share_shared;
    int on_overflow;
} hs__linktime_tcp;

/* Picks the TCP model by name: "fluid" (the default: every stage passes its full rate, so a
 * message's time is exactly its bytes / rate after its wait), "reno" or "bbr" (measured
 * shares). HS_EINVAL for another name. */
int hs__linktime_set_tcp(hs__linktime *lt, const char *name);
const hs__linktime_tcp *hs__linktime_tcp_model(const hs__linktime *lt);
/* Whether model m counts a message that waits `wait` seconds at a stage and then takes `dur`
 * there as congested, with the drop-tail queue of queue_s and a round trip of rtt seconds.
 * Never for "fluid". */
int hs__linktime_congested(const hs__linktime_tcp *m, double wait, double dur, double queue_s,
                           double rtt);

/* The virtual time (seconds) at which a message of `bytes` bytes that i sends to j at time t
 * has fully arrived. Messages queue behind earlier ones on every rate-limited stage they share
 * (call in order of sending time). A stage passes a message as a fluid: it starts when the
 * message's first byte arrives and the stage is free, and ends no sooner than bytes/rate after
 * that nor before the previous stage has ended. With one uplink and one downlink of rate R and
 * delay D that is t + D + 8 bytes / R (bytes on the wire: see hs__linktime_set_headers). */
double hs__linktime_arrival(hs__linktime *lt, int i, int j, size_t bytes, double t);

/* Seconds of a ring all-reduce of `bytes` bytes among all peers (ring in index order) by the
 * alpha-beta model of gloo's ring: 2 (n - 1) steps, in each of which every peer sends bytes / n
 * to the next; a step lasts as long as its slowest ring link takes (2 delays, for gloo's
 * receiver-ready notice and the data, + 8 bytes / n / rate, the rate being the smallest of the
 * sender's uplink, the pair's link and the receiver's downlink). With equal links:
 * 2 (n - 1) (2 D + 8 bytes / (n R)). 0 for one peer, -1 out of memory. */
double hs__linktime_allreduce(const hs__linktime *lt, size_t bytes);

/* Messages of the simulated network s arrive when lt says instead of after its uniform
 * latency (NULL: back to the latency). lt is borrowed; clocks are then in seconds. */
void hs__simnet_set_links(hs_simnet *s, hs__linktime *lt);

/* The simulator in the links' time (hearsay sim --links): call once, before the first step.
 * Peer i's round then computes for compute[i] x slowdown[i] x local steps x step_s seconds, its
 * messages arrive when the links say, and clocks are in seconds. p is borrowed and must
 * outlive s. HS_EINVAL when p has another number of peers. */
int hs__sim_set_links(hs_sim *s, const hs__wan_profile *p, double step_s);
/* Messages and the all-reduce cost their bytes on the wire (hs__linktime_set_headers); call
 * after hs__sim_set_links. */
void hs__sim_set_link_headers(hs_sim *s, int headers);
/* The TCP model of the links (hs__linktime_set_tcp); call after hs__sim_set_links. */
int hs__sim_set_link_tcp(hs_sim *s, const char *model);
/* Peer i's progress in rounds of a normal peer: its rounds when lockstep; in virtual time its
 * clock without links, with links its rounds times its compute factor (its clock counts its
 * waits too). A job of N rounds ends when every peer's progress reaches N. */
double hs__sim_progress(const hs_sim *s, int i);
/* The virtual time (seconds) the latest live peer has reached; NaN without links. */
double hs__sim_vtime(const hs_sim *s);
/* DDP's time for the same profile: `steps` steps, each the slowest peer's compute, then a ring
 * all-reduce of the model's gradient (float32) by the alpha-beta model, its seconds in
 * *allreduce_s. NaN without links. */
double hs__sim_ddp_time(const hs_sim *s, long steps, double *allreduce_s);

#endif
