/* The node's internals shared by its files and by the peer (src/peer.c): the resolved
 * configuration, the model interface through which a node drives whoever owns the vector (the
 * caller's flat vector in node.c's public entries, the built-in trainer in peer.c), and the
 * phases of hs_node_start split so the peer can build its trainer once it knows its id.
 * Threading as in hearsay/node.h. */
#ifndef HS_NODE_NODE_INTERNAL_H
#define HS_NODE_NODE_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/buf.h"
#include "hearsay/checkpoint.h"
#include "hearsay/guard.h"
#include "hearsay/net.h"
#include "hearsay/node.h"
#include "hearsay/trainer.h"

/* Defaults of options `hearsay run` shares with the node (the CLI's table says the same). */
#define HS__NODE_CHECKPOINT_EVERY 100
#define HS__NODE_JOIN_TIMEOUT_MS 30000
#define HS__NODE_RESUME_REQUIRE 2
#define HS__NODE_STR_(x) #x
#define HS__NODE_STR(x) HS__NODE_STR_(x)
/* A snapshot of this many bytes or more is withdrawn as soon as no WELCOME holds it (a smaller
 * one stays for the snapshot timeout, for joiners on their way): a standing copy of a large
 * model would cost a vector of memory every round (issue 21). Joiners wait for the next. */
#define HS__NODE_SNAP_KEEP_MAX ((size_t)64 << 20)
/* A stop waits at most this long (or --recv-timeout, when shorter) for the last round's message
 * to leave before it copies the model (node.c, node_open). */
#define HS__NODE_STOP_SETTLE_MS 5000
/* A job without a round count runs until its peers leave: its end lies this far ahead. */
#define HS__NODE_NO_END ((int64_t)1 << 50)

/* Everything the node needs, resolved. Strings are borrowed from whoever filled it (the
 * node's own copy of its options, or the peer's configuration). */
typedef struct hs__node_cfg {
    hs_net_config net;
    hs_algo_cfg algo;
    int world;               /* number of shards (>= 1) */
    int rank;                /* this peer's shard; < 0: from a checkpoint, or id mod world */
    const char *rendezvous;  /* hearsay/peer.h */
    long rounds;             /* rounds the job runs from its first (<= 0: no end) */
    int wait_peers, wait_new_only, wait_timeout_ms;
    const char *metrics;     /* JSON-lines file ({id}: the peer id), or NULL */
    int quiet;
    const char *checkpoint_dir;
    long checkpoint_every;
    int resume; /* 0; 1: from the newest checkpoint of the job's timeline, or fresh when there
                   is none; HS__NODE_RESUME_REQUIRE: a checkpoint or an error */
    hs_guard_cfg guard;
    hs_outer_cfg outer;      /* the caller-vector model's outer step (the trainer has its own) */
} hs__node_cfg;

/* The owner of the vector a node gossips: its algorithm (whose state lives with the vector) and
 * the operations a node needs between rounds. All return 0 or a negative HS_E*. */
typedef struct hs__node_model {
    void *ctx;
    hs_algo *(*algo)(void *ctx);
    float *(*x)(void *ctx);            /* the algorithm's x (host memory, d floats) */
    /* The mean square of the model as evaluated (x, or x / w), which the divergence guard
     * reads every round: where the model is in device memory, computed there. */
    int (*eval_ms)(void *ctx, double *ms);
    long (*steps)(void *ctx);          /* local steps done (0: still at the job's start) */
    /* The round's local steps, run by the node's round engine between the round's begin and
     * push (the trainer's, in peer.c); NULL: the caller takes them between hs_node_step calls.
     * HS_EDIVERGED (a non-finite loss) ends the run as a divergence. */
    int (*local)(void *ctx, uint64_t r);
    /* What a joiner adopts, and adopting it (hs_trainer_snapshot's format). */
    int (*snapshot)(void *ctx, hs_buf *out);
    int (*adopt)(void *ctx, const uint8_t *p, size_t len);
    /* Checkpoint state (hs_trainer_save's format) and resuming from it. */
    int (*save)(void *ctx, hs_buf *out);
    int (*load)(void *ctx, const uint8_t *p, size_t len, int with_algo);
    /* Around a round's gossip: before hs_algo_begin and after hs_algo_pull (the optimizer's
     * round hooks; the trainer evaluates in round_end). NULL: nothing to do. */
    int (*round_begin)(void *ctx, uint64_t r);
    int (*round_end)(void *ctx, uint64_t r);
    /* Removed from the job and let in again under a new id: a fresh algorithm (and optimizer)
     * for that id, before the welcome snapshot is adopted. */
    int (*renew)(void *ctx, uint32_t self);
} hs__node_model;

/* A node from a resolved configuration (copied; its strings must outlive the node) for a model
 * of d floats with architecture signature sig (copied). */
int hs__node_new_cfg(hs_node **out, const hs__node_cfg *cfg, size_t d, const char *sig);

/* hs_node_start in two halves. connect: resume's checkpoint, listen, join or rendezvous, the
 * job's terms from the welcome; after it hs__node_self, _rank and _job_rounds are known. run:
 * the model (borrowed until hs_node_free) resumes or adopts the welcome, waits for the members
 * and begins the first round. */
int hs__node_connect(hs_node *n);
int hs__node_begin(hs_node *n, const hs__node_model *m);
/* One round's gossip on the model's own x (hs_node_step without the caller's vector). */
int hs__node_step(hs_node *n);

uint32_t hs__node_self(const hs_node *n);
int hs__node_rank(const hs_node *n);
/* The rounds the job runs (the first peer's count, from the welcome), for the trainer's
 * learning-rate schedule. */
long hs__node_job_rounds(const hs_node *n);
uint64_t hs__node_first_round(const hs_node *n);
int hs__node_stopped(const hs_node *n);
/* A divergence found outside the node (a non-finite training loss): the node leaves saying
 * why. Returns HS_EDIVERGED. */
int hs__node_fail(hs_node *n, const char *what);
/* Diverged: round, reason and advice (NULL when not diverged). */
const char *hs__node_diverged(const hs_node *n, double *round, const char **advice);
/* Training details of the round for the metrics record: learning rate and epoch (NaN: none),
 * and a test evaluation (NaN: none this round). */
void hs__node_report_train(hs_node *n, double lr, double epoch);
void hs__node_report_test(hs_node *n, double loss, double accuracy);
void hs__node_bytes(const hs_node *n, uint64_t *sent, uint64_t *recv);

/* "{id}" in a path replaced by the peer's id (every peer may be given the same command line). */
int hs__node_expand_id(const char *in, uint32_t id, char *out, size_t cap);
size_t hs__node_dim(const hs_node *n);
const hs__node_cfg *hs__node_config(const hs_node *n);
/* The node's runtime (NULL before it connects). */
hs_net *hs__node_net(const hs_node *n);
/* The caller's-vector model of the public entries (vec.c), owned by the node once set: the node
 * frees it with free_fn, so node.c needs nothing of vec.c. */
void *hs__node_vec(const hs_node *n);
void hs__node_set_vec(hs_node *n, void *v, void (*free_fn)(void *));

/* ckwrite.c: writes m's state to a checkpoint in dir, described by base (its members: the ones
 * net knows now, when there is a net). */
int hs__node_ck_write(const hs__node_model *m, hs_net *net, const hs_checkpoint_info *base,
                      const char *dir);

/* resume.c: the job's timeline at the head of a welcome snapshot (HS__NODE_TIMELINE_BYTES),
 * and the checkpoint a resumed peer continues from. */
#define HS__NODE_TIMELINE_BYTES (12 + 16 * HS_TIMELINE_ANCESTORS)
size_t hs__node_timeline_put(const hs_timeline *t, uint8_t *out);
int hs__node_timeline_get(const uint8_t *p, hs_timeline *t);
/* A resumed peer of shard `rank` with its newest checkpoint *ck joins a job of timeline t at
 * `round`: keeps *ck, or replaces it with the newest checkpoint of t's history at most one
 * checkpoint interval behind `round` (any, when the welcome carries no model: job_model 0),
 * saying so, and returns 1; or clears it and returns 0 (the peer takes the job's model, said
 * with the reason). Either way removes the shard's files that the job will never load. */
int hs__node_resume_pick(const hs__node_cfg *cfg, int rank, const char *sig,
                         const hs_timeline *t, uint64_t round, int job_model, hs_checkpoint *ck);
/* --resume's newest checkpoint of this shard into *ck: 1; none (said in the log, unless
 * --resume=require, which makes it an error): 0. */
int hs__node_resume_load(const hs__node_cfg *cfg, const char *sig, hs_checkpoint *ck);
/* A checkpoint's state is as large as the model: a joiner would hold it beside the WELCOME's
 * snapshot. shed frees the file's bytes (the rest of *ck stays); state reads them again, the
 * same file (rank, round and timeline), validated completely: 0, or HS_ENOENT / the read's
 * error when it is gone or changed. */
void hs__node_ck_shed(hs_checkpoint *ck);
int hs__node_ck_state(const hs__node_cfg *cfg, const char *sig, hs_checkpoint *ck);
/* A resumed peer not yet in a job (err: how its own start or rendezvous ended) rejoins through
 * the checkpoint's members (nc->bootstrap then names the one that let it in, copied to addr);
 * when none answers and it is the job's first peer, it starts the job alone (*alone = 1),
 * holding for `hold` members when hold > 1 (a restart: hs__node_restart_agree). */
int hs__node_resume_rejoin(const hs_checkpoint *ck, hs_net_config *nc, int join_ms, int first,
                           int hold, int err, hs_net **net, hs_net_welcome *w, char *addr,
                           size_t cap, int *alone);
/* The job's timeline into *tl: the welcome's (welcome_tl, NULL when none), with the checkpoint
 * picked for it (hs__node_resume_pick); or a new job's, branched from the checkpoint's. In a
 * restart (restart != 0) a checkpoint of the timeline's history is kept as it is and the
 * timeline is provisional until hs__node_restart_agree: returns 1 then, else 0. */
int hs__node_resume_timeline(const hs__node_cfg *cfg, int rank, const char *sig,
                             const uint8_t *welcome_tl, uint64_t join_round, int job_model,
                             int restart, int *have_ck, hs_checkpoint *ck, hs_timeline *tl);
/* A restarted job's members are in and agree on its first round (the sequencer's choice: the
 * newest checkpoint round among them, hs_net_config.resume_round): the provisional timeline *tl
 * branches at that round under an id every member computes alike. A shard with no checkpoint
 * (have_ck 0) or one more than a checkpoint interval behind takes the newest checkpoint of
 * another shard within an interval of the round from its directory (one the shards share)
 * into *ck and returns 1 (the caller loads it); else 0. Says what this shard goes on from,
 * loudly when it is still behind, and removes the shard's files the job will never load. */
int hs__node_restart_agree(const hs__node_cfg *cfg, int rank, const char *sig, hs_timeline *tl,
                           uint64_t round, hs_checkpoint *ck, int have_ck, int members);

/* What a joiner must know to end with the job, at the head of every snapshot: the end round (0
 * while the job waits for its members and has not decided it), and the rule the first peers
 * follow until then: how many members they wait for and how many rounds they train from the
 * round at which those are in. A restarted job waiting for its members says -N members: its
 * end is known, its first round and timeline are agreed once they are in (resume.c). */
typedef struct hs__node_terms {
    uint64_t end;
    int64_t rounds, wait;
} hs__node_terms;
_Static_assert(sizeof(hs__node_terms) == 24, "job terms are 24 bytes on the wire");
/* The terms, then the job's timeline (hs__node_timeline_put). */
#define HS__NODE_TERMS_BYTES (24 + HS__NODE_TIMELINE_BYTES)
/* terms.c: reads the job's terms at the head of a welcome snapshot, validated. */
int hs__node_terms_read(const hs_net_welcome *w, hs__node_terms *jt);
/* The terms a peer goes by once connected (*jt), until it learns the job's: its own (--rounds,
 * --wait-peers), a joiner's from the welcome w, a restart's from its checkpoint ck (have_ck)
 * and the welcome's terms wj (read by the caller; has_wj 0: none came). */
int hs__node_terms_pick(const hs__node_cfg *cfg, const hs_net_welcome *w,
                        const hs__node_terms *wj, int has_wj, int restart, int have_ck,
                        const hs_checkpoint *ck, hs__node_terms *jt);

/* Whether a peer's replicas of its neighbours may start at its own vector (same_start: the
 * configured wish): only for a peer that begins with a fresh job, before anyone trained: the
 * job's end not known yet (job_end 0), or this peer's first round (start_round) no later than
 * the job's (job_end - rounds: a joiner let in as the wait ended). Not for a resumed peer
 * (have_ck), one in a restart (which may load another shard's checkpoint later), one joining a
 * running job (with or without the job's model), or one whose model has taken steps. */
int hs__node_same_start(int same_start, int have_ck, int restart, uint64_t job_end,
                        int64_t rounds, uint64_t start_round, long steps);

/* join.c: reaching the job. stop points at the node's stop flag. */
int hs__node_refusal_final(int err);
void hs__node_own_address(const hs_net_config *nc, hs_net *net, char *out, size_t cap);
int hs__node_write_rendezvous(const char *path, const char *run_id, const char *addr);
int hs__node_join_rendezvous(const char *path, const char *run_id, hs_net_config *nc,
                             int timeout_ms, char *addr, size_t cap, hs_net **net,
                             hs_net_welcome *w, atomic_int *stop);
/* Rank order through the rendezvous (join.c): rank r waits (at most timeout_ms) until rank r-1
 * is a member of this job, then, once a member itself, marks it for rank r+1. */
int hs__node_rendezvous_turn(const char *path, const char *run_id, int rank, int timeout_ms,
                             atomic_int *stop);
void hs__node_rendezvous_mark(const char *path, const char *run_id, int rank, const char *addr);
int hs__node_wait_members(hs_net *net, int n, int timeout_ms, atomic_int *stop);
/* *r raised to the first round of the newest member list: where a wait for the job's first
 * members ends, the same for every peer that waited. */
int hs__node_start_round(hs_net *net, uint64_t *r);
int hs__node_await_job(hs_net *net, int bound_ms, atomic_int *stop);
int hs__node_rejoin(hs_net **netp, const hs_net_config *nc, hs_net_welcome *w, int bound_ms,
                    atomic_int *stop);
double hs__node_now(void);
/* The log's tag of this thread's lines: "peer ID". */
void hs__node_set_tag(uint32_t self);
/* Waits (at most timeout_ms, or until *stop) until net answered every join request and no more
 * than `holders` references to b are left, as a WELCOME that sends it drops its own once
 * written (a joiner admitted by the wait takes it first): 1, or 0 when they stayed. */
int hs__node_await_unheld(hs_net *net, hs_buf *b, int holders, int timeout_ms,
                          atomic_int *stop);

/* options.c: the options resolved into cfg (strings borrowed from o) for a model of d floats:
 * defaults filled, combinations checked, CHOCO's automatic step computed. */
int hs__node_options_resolve(const hs_node_options *o, size_t d, hs__node_cfg *cfg);
hs_node_options *hs__node_options_dup(const hs_node_options *o);
/* The i-th option's name and its default in the table (NULL: unset, the algorithm's or the
 * runtime's own); NULL past the last. For tests that hold the node to `hearsay run`. */
const char *hs__node_option(size_t i, const char **def);
/* The configuration of no options set (no security mode, nothing checked): the defaults
 * `hearsay run` starts from, so the command and the node agree. */
void hs__node_cfg_defaults(hs__node_cfg *cfg);
/* CHOCO's and BEER's consensus step for a job of n peers on topology spec (seeded) with
 * compressor spec at d: sets acfg->gap; why (may be NULL) says how it was chosen. 0 when the
 * algorithm takes no step. */
float hs__node_auto_gamma_c(hs_algo_cfg *acfg, const char *topology, int n, size_t d,
                            uint64_t seed, char *why, size_t why_len);

#endif
