/* hearsay: a gossip node for a caller-owned model.
 *
 * A node is one networked peer without a trainer: the caller owns the model as one flat vector
 * of d floats and its own optimizer; after each local update it calls hs_node_step, which does
 * one gossip round of the configured algorithm on that vector in place. The algorithms' update
 * rules are those of `hearsay run`: a round's first phase is issued at the end of the previous
 * hs_node_step (or of hs_node_start) with the vector as it was then, so it travels while the
 * caller computes (D-PSGD: that vector goes to the neighbours, and the step adds their weighted
 * differences to the caller's updated vector, adapt then combine; CHOCO: the caller's vector is
 * x_half, the step compresses, sends, mixes; SGP: the caller's vector is z = x / w, the node
 * keeps the numerator x and weight w, applies the caller's update to z as it is,
 * x += w (z_new - z_prev), and returns the new z). The network runtime (TLS, bootstrap, churn, quorum, resend), metrics, the
 * convergence guard and checkpoints work as for `hearsay run`, which is itself a user of this
 * API with the built-in trainer (src/peer.c).
 *
 * Checkpoints (checkpoint-dir) hold the node's state: the vector (z for SGP) and the
 * algorithm's state (replicas, push-sum weight); resume writes the vector into x at start. The
 * caller's optimizer state (momentum, moments) is the caller's business: save it alongside.
 *
 * Threading: all calls on one node from one thread at a time, except hs_node_request_stop,
 * which any thread or a signal handler may call. Different nodes are independent (several may
 * run in one process, each on its own thread). */
#ifndef HEARSAY_NODE_H
#define HEARSAY_NODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_node_options hs_node_options;
typedef struct hs_node hs_node;

/* Options by name, with the names and defaults of `hearsay run`'s flags without the leading
 * dashes ("algo", "compress", "gamma-c", "topology", "listen", "advertise", "bootstrap",
 * "secret-file", "cert", "key", "ca", "insecure", "world", "rank", "wait-peers", "rounds",
 * "checkpoint-dir", "checkpoint-every", "resume", "metrics", "on-divergence", "seed",
 * "recv-timeout", "quiet", ...). A flag without a value (insecure, resume, quiet) takes "1"
 * or "0" ("resume" also "require": as --resume=require, an error without a checkpoint, where
 * "1" starts the peer fresh). hs_node_options_set validates the value and returns HS_EINVAL naming the option
 * and what it accepts; an unknown name is HS_EINVAL too. "quiet" 1 is --quiet: the node logs
 * no info lines (warnings and errors stay), unless the HEARSAY_LOG environment variable sets a
 * level. The log level is the process's: once a node of a process is made quiet
 * (hs_node_new), every node and thread of that process logs at warn and above, and a later
 * node with quiet 0 does not bring the info lines back. Besides those of `hearsay run`:
 * "rounds" defaults to 0, no end (the caller leaves when it is done); "same-start" 0 says the
 * peers start from different vectors (the first round sends full replicas; default 1, every
 * peer passes the same vector to hs_node_start). "outer-lr" and "outer-momentum" (either
 * given turns it on) make the node take the outer Nesterov step on the vector after each
 * round's gossip, before hs_node_step gives it back (SlowMo / DiLoCo over gossip: the round's
 * pseudo-gradient is the vector at the round's start, as hs_node_step last returned it, minus
 * the vector after the gossip). The model is "vector:D" to the job: peers with another d are
 * refused. */
int hs_node_options_new(hs_node_options **out);
int hs_node_options_set(hs_node_options *o, const char *name, const char *value);
void hs_node_options_free(hs_node_options *o); /* accepts NULL */

/* Typed forms of hs_node_options_set for numbers and switches: the value is written as text
 * ("%lld", "%.17g", "1"/"0") and checked by the same parser, so an option accepts the same
 * values either way (set_int "world" 4 is set "world" "4"; set_bool "insecure" 1). */
int hs_node_options_set_int(hs_node_options *o, const char *name, long long value);
int hs_node_options_set_double(hs_node_options *o, const char *name, double value);
int hs_node_options_set_bool(hs_node_options *o, const char *name, int value);

/* The i-th option's name (NULL past the last) and, in *default_value when non-NULL, the
 * text of its default (NULL: unset unless given, the algorithm's or the runtime's choice).
 * The table hs_node_options_set reads: bindings check their own signatures against it. */
const char *hs_node_option_name(size_t i, const char **default_value);

/* A node for vectors of d floats. Checks the options together (paths, algorithm and
 * compressor, topology) and opens nothing yet. The options are copied. */
int hs_node_new(hs_node **out, const hs_node_options *o, size_t d);

/* Starts a job or joins one (listen, bootstrap or rendezvous, wait for `wait-peers`
 * members). x (d floats) is this peer's starting vector; every peer of a new job should pass
 * the same one. When the peer joins a job that has run rounds, or resumes from a checkpoint,
 * the job's vector is written into x: the caller must then continue from x. Blocks; a stop
 * request ends it with HS_EINTR. Returns 1 when the job had ended before this peer's first
 * round (a late joiner): x is the job's final vector, and there is no round to step. */
int hs_node_start(hs_node *n, float *x, size_t d);

/* One gossip round on x (d floats, the caller's vector after its local update), in place.
 * Under D-PSGD, CHOCO, DCD and BEER the node keeps no copy of the vector: x itself is the
 * algorithm's vector for the duration of the call (and of hs_node_start), so nothing else may read
 * or write it until the call returns (another thread of the caller's, a device copy in flight);
 * between calls the caller may change it freely, or pass another buffer next time. The node then
 * holds the vector the last call returned only as the round's message it sent (D-PSGD) or in the
 * algorithm's scratch (CHOCO, DCD, BEER), which is also what hs_node_checkpoint saves. Under SGP
 * the node keeps its own copy of x.
 * Returns 0 when the job goes on, 1 when this was the job's last round (`rounds`), or a
 * negative error: HS_EDIVERGED (the guard stopped the run), HS_ECANCELED (removed from the
 * job and could not rejoin), HS_ECONNRESET (stopped long enough to be removed, this peer woke to
 * find the job gone: see hs_net_in_job), HS_EINTR (a stop request was honoured after this
 * round), others from the runtime. On an error x holds the last consistent vector. A peer that
 * the job removed (cut off too long) joins again as a new member: the round is void and x
 * becomes the job's vector, as at a join (1 when it is let in again after the job's end). */
int hs_node_step(hs_node *n, float *x, size_t d);

/* The next round this node will run (rounds done since the job's round 0). */
uint64_t hs_node_round(const hs_node *n);

/* This peer's id in the job (the metrics' "peer", the log's "peer N") and its rank, the
 * shard it stands for (the option "rank", or the checkpoint's when resuming, or id mod world).
 * Valid after hs_node_start returned 0; before it, HS_NODE_NO_ID and -1. A peer removed from
 * the job and let in again (hs_node_step) gets a new id: read it again after a step. */
#define HS_NODE_NO_ID UINT32_MAX
uint32_t hs_node_id(const hs_node *n);
int hs_node_rank(const hs_node *n);

/* Optional: the caller's training loss and test accuracy for this round, reported to the
 * metrics record and the convergence guard (NaN: not measured this round). */
void hs_node_report(hs_node *n, double loss, double accuracy);

/* The last round's metrics record, one JSON object (the same fields and meanings as a line
 * of --metrics; docs/METRICS.md), NUL-terminated into buf. Returns the length written (without
 * the NUL), HS_ERANGE when it does not fit in cap (nothing written), HS_EINVAL before the first
 * round. */
int hs_node_metrics_json(const hs_node *n, char *buf, size_t cap);

/* Leaves the job gracefully (BYE), closes the runtime; idempotent. hs_node_free leaves too. */
int hs_node_leave(hs_node *n);
void hs_node_free(hs_node *n); /* accepts NULL */

/* Writes a checkpoint of the node now, between two hs_node_step calls, into dir (created when
 * missing; hearsay/checkpoint.h's file ckpt-RANK-ROUND.hsck, ROUND the next round to run): what
 * a checkpoint-dir checkpoint holds (the vector, the local step count, the algorithm's state,
 * the job's end round, the members). A node made with the options checkpoint-dir DIR and
 * resume 1 continues from it: the vector is written into x at hs_node_start and the job runs
 * to the saved end from that round (when the restarted peers wait for each other, the member
 * list that admits them is in force from it: hs_net_config.hold_members); as for every resume,
 * neighbours send each other full replicas at the first round. Returns 0, HS_EINVAL before
 * hs_node_start, HS_EIO. */
int hs_node_checkpoint(hs_node *n, const char *dir);

/* Asks the node to stop after the current round (hs_node_step then returns HS_EINTR, after a
 * checkpoint when `checkpoint` is 1 and a checkpoint directory is set). Async-signal-safe. */
void hs_node_request_stop(hs_node *n, int checkpoint);

#ifdef __cplusplus
}
#endif
#endif
