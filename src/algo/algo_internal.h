/* Internals shared by the algorithms: the neighbour table (replicas, per-neighbour round
 * cursors, which edges are new and need a full replica), payload framing, and the ops table
 * each algorithm file fills in. */
#ifndef HS_ALGO_INTERNAL_H
#define HS_ALGO_INTERNAL_H

#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/compress.h"
#include "hearsay/tensor.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "payloads are little-endian IEEE floats: this host is not little-endian"
#endif

/* Byte 0 of every algorithm payload: the type in the low 7 bits. */
enum {
    HS_PAYLOAD_DELTA = 1, /* a compressor message (hearsay/compress.h) */
    HS_PAYLOAD_FULL = 2,  /* a full replica: d little-endian fp32 values */
    HS_PAYLOAD_PUSH = 3,  /* push-sum: fp64 weight shares (one a block), a compressor message */
    /* Replicas of several vectors (ops->pub_vectors > 1): for each vector but the last the u32
     * length of its compressor message, then the messages in vector order. Vector k's message
     * of round r is keyed by hs__part_round(r, k). */
    HS_PAYLOAD_DELTA_PARTS = 4,
    /* Bit 7: the sender lost its replica of the receiver (a message of the receiver's was lost
     * or failed validation) and asks for the receiver's full replica. */
    HS_PAYLOAD_WANT_FULL = 0x80,
};

typedef struct hs__nbr {
    uint32_t id;
    int is_in, is_out;
    float *rep;          /* replica of the neighbour's public vector(s) (a->dpub floats) or NULL */
    int synced;          /* rep holds the neighbour's current value */
    int sent_full;       /* this peer's replica reached the neighbour (out-edges) */
    uint64_t next_round; /* first round of this neighbour's messages not yet consumed */
    int lagging;         /* sgp: missed a staleness wait; not waited for until it catches up */
    float w_in;          /* W[self][id] in the current view (in-neighbours) */
    int want_full;       /* rep was lost: ask the neighbour for its full replica */
    int gone;            /* left or declared dead (the exchange's HS_ECONNRESET): out of the
                            mix until it is heard from again */
} hs__nbr;

/* One algorithm: what the front end (algo.c) and the rest of hearsay ask of it. Adding an
 * algorithm is one file filling this table, one entry in algo.c's table and one hs_algo_kind
 * (docs/HACKING.md, "Adding an algorithm"). Hooks left NULL do nothing. */
typedef struct hs__algo_ops {
    const char *name;        /* --algo NAME */
    int synchronous;         /* completes every round with every neighbour; mixes with symmetric
                                weights, so it needs an undirected topology */
    int fixed_neighbours;    /* keeps replicas of its neighbours: a static topology only */
    int uses_gamma_c;        /* takes the CHOCO consensus step (cfg.gamma_c, automatic when 0) */
    const char *default_compress; /* the CLI's --compress when none is given */
    const char *default_topology; /* the CLI's --topology when none is given */
    int default_staleness;   /* --staleness when none is given (sgp) */
    int needs_replicas;      /* the neighbour table keeps a replica of each in-neighbour */
    int qg_momentum;         /* quasi-global momentum (Lin et al. 2021) applies: the mixing step
                                averages models with a doubly stochastic W, so the round's change
                                of x is a descent direction the buffer may keep */
    int drifts_with_compression; /* replicas drift with the compression error: the guard's
                                    advice on divergence is to compress less */
    int pub_vectors;         /* vectors of d floats in a replica (0 means 1): one per quantity
                                gossiped with compressed differences (beer: model, tracker) */
    size_t priv_size;        /* bytes of zeroed private state at a->priv, freed by the front end
                                (after fini, which frees what the state points to) */
    /* Whether the algorithm can work with compressor c: HS_EINVAL with the reason and the fix
     * (hs_algo_check_compressor). */
    int (*check_compressor)(const hs_compressor *c);
    int (*init)(hs_algo *a, const float *x0);
    void (*fini)(hs_algo *a);
    int (*begin)(hs_algo *a, hs_exchange *ex, uint64_t r, const float *x);
    int (*push)(hs_algo *a, hs_exchange *ex, uint64_t r, float *x);
    int (*pull)(hs_algo *a, hs_exchange *ex, uint64_t r, float *x);
    /* The point the gradient is taken at, when it is not x (hs_algo_eval_point, into the
     * algorithm's own z), and the same on n <= d host values, elementwise, z and x the caller's
     * from value `first` on (hs__algo_eval_range: the owner of x then keeps no vector of z of
     * its own; SGP's weight is its block's); with the inverse on n values, which serves
     * hs_algo_from_eval_point too (all of d). All three or none. With them the trainer keeps x
     * apart from the model's parameters. */
    const float *(*eval_point)(hs_algo *a, const float *x);
    void (*eval_range)(const hs_algo *a, float *z, const float *x, size_t first, size_t n);
    void (*from_eval_range)(const hs_algo *a, float *z, size_t first, size_t n);
    /* Before the first round: the peer starts from x (hs_algo_reset_x), a->own already set. */
    void (*reset_x)(hs_algo *a, const float *x);
    /* The algorithm's own per-round metrics, beyond hs_algo_stats' common ones. */
    void (*metrics)(const hs_algo *a, hs_algo_metric_fn emit, void *ctx);
    /* The push-sum weight a payload of this algorithm carries (0 for none): the simulator's
     * mass accounting of messages in flight, without knowing the payload's layout. */
    double (*payload_weight)(const uint8_t *p, size_t len);
    /* The algorithm's own checkpoint fields, after the common ones (hs_algo_save). load
     * validates everything before changing any state, and is only called before the common
     * fields are installed, so an error leaves the algorithm as it was. */
    int (*save)(const hs_algo *a, hs_buf *out);
    int (*load)(hs_algo *a, const uint8_t **p, const uint8_t *end);
    /* x as it was at the round's begin (d little-endian fp32, possibly unaligned), while the
     * algorithm holds it between begin and pull; NULL otherwise (hs__algo_round_x). */
    const void *(*round_x)(const hs_algo *a);
    /* 1 when a->tmp is scratch of push and pull alone, dead from one round to the next: the
     * owner of x may keep its vector there between rounds (hs__algo_idle_vector). */
    int tmp_idle;
    /* Moves the per-round vector work onto backend be (hs__algo_to_device): allocates the
     * device state; NULL: the algorithm has no device path. */
    int (*to_device)(hs_algo *a, hs_backend *be);
    /* eval_point and from_eval_point on vectors in the device's memory, in device mode (z
     * and x distinct): the same floats. NULL with eval_point NULL. */
    int (*eval_point_be)(hs_algo *a, float *z, const float *x);
    int (*from_eval_point_be)(hs_algo *a, float *x, const float *z);
} hs__algo_ops;

struct hs_algo {
    hs_algo_cfg cfg;
    char compress_spec[96];
    uint32_t self;
    size_t d;
    size_t dpub;  /* floats in a replica and in own: d times ops->pub_vectors */
    const hs__algo_ops *ops;
    hs_compressor *comp;
    hs__nbr *nbrs;
    int n_nbrs, cap_nbrs;
    uint64_t epoch;
    uint64_t round0; /* the job's first round (hs_algo_set_first_round): compressor keys count
                        from it (hs__algo_key) */
    int have_view;
    float *own;   /* dcd: x at round start; choco: xhat_self; dpsgd: x at round start; beer: hhat
                     then ghat (dpub floats; replicas of others start as x0 then zeros) */
    float *tmp;   /* scratch of d floats */
    float *tmp2;  /* scratch of d floats */
    float rscale; /* choco, beer: a difference's factor before compression (hs__algo_scale_diff) */
    hs_buf *pool[4];  /* payload buffers for reuse (the pool holds one reference each) */
    size_t room_bytes; /* the last message hs__algo_wait_room made room for: its size, */
    uint64_t room_round; /* and its round */
    uint8_t *present; /* scratch flags, one per in-neighbour */
    int present_cap;
    void *priv;   /* the algorithm's own state: ops->priv_size bytes */
    /* Set when replicas or mixing weights changed in a way that an accumulator kept up to date
     * by deltas cannot follow (a neighbour came or went, a weight changed, a replica was
     * replaced or lost, a state was loaded); cleared by the algorithm once it has rebuilt. */
    int reps_dirty;
    hs_algo_stats stats;
    /* Device mode (hs__algo_to_device): x of begin/push/pull is in be's memory and the
     * accumulator handed to hs__apply_replica is too; NULL: everything is host memory. */
    hs_backend *be;
};

extern const hs__algo_ops hs__algo_dpsgd, hs__algo_dcd, hs__algo_choco, hs__algo_sgp,
    hs__algo_beer;

/* Before the first round: the algorithm takes x (begin, push, pull) in the memory of backend
 * be and does its per-round vector work there, with the backend's gossip ops
 * (src/tensor/gossip_ops.h) and compress/device.h, so that only messages cross to the host.
 * Returns 1 in device mode, 0 when the host path stays (x stays host memory: be is host
 * memory or has no gossip ops, the algorithm has no device path (every one has one now), or
 * its compressor keeps an ef: residual), or a negative error. The host keeps the replicas and its
 * own replica (a->own), updated from the same bytes, so checkpoints, full replicas and
 * neighbourhood changes work as on the host. Implemented in algo_device.c. */
int hs__algo_to_device(hs_algo *a, hs_backend *be);
/* hs__apply_replica's decode of a delta into neighbour n's host replica (at `at`) and into a
 * device accumulator (at `at`, weighted by W_ij), in device mode. */
int hs__algo_decode_dev(hs_algo *a, hs__nbr *n, uint64_t key, const uint8_t *p, size_t len,
                        size_t at, float *acc);
/* D-PSGD's device round (dpsgd_dev.c), which dpsgd.c hands begin and pull in device mode. */
/* 0 for a D-PSGD message (its first byte says a model), else HS_EPROTO naming n. */
int hs__dpsgd_check_type(const hs__nbr *n, const uint8_t *p, size_t len);
typedef struct hs__dpsgd_dev hs__dpsgd_dev;
int hs__dpsgd_dev_new(hs_algo *a, hs_backend *be, hs__dpsgd_dev **out);
void hs__dpsgd_dev_free(hs_algo *a, hs__dpsgd_dev *s);
int hs__dpsgd_dev_begin(hs_algo *a, hs__dpsgd_dev *s, hs_exchange *ex, uint64_t r,
                        const float *x);
int hs__dpsgd_dev_pull(hs_algo *a, hs__dpsgd_dev *s, hs_exchange *ex, uint64_t r, float *x);
/* In device mode, z (device) = the evaluation point of x (device), and the reverse, x = the
 * point whose evaluation point is z, as hs_algo_eval_point and hs_algo_from_eval_point do on
 * the host (same floats); z = x where the algorithm evaluates at x. */
int hs__algo_eval_point_be(hs_algo *a, float *z, const float *x);
int hs__algo_from_eval_point_be(hs_algo *a, float *x, const float *z);

/* On the host, z[k] = the evaluation point of x[k] for k < n, x[0] being the model's value
 * `first` (hs_algo_eval_point's floats, into the caller's memory: z = x where the algorithm
 * evaluates at x; z may be x), and its inverse on z in place (hs_algo_from_eval_point's): for an
 * owner of x that keeps no z of its own (node/vec.c under SGP), a block or the caller's vector
 * at a time. */
void hs__algo_eval_range(const hs_algo *a, float *z, const float *x, size_t first, size_t n);
void hs__algo_from_eval_range(const hs_algo *a, float *z, size_t first, size_t n);

/* The algorithm of kind k, or NULL. */
const hs__algo_ops *hs__algo_ops_of(hs_algo_kind k);

/* Fetches the view of round r and reconciles the neighbour table with it: neighbours that left
 * are dropped, new ones added (with a replica that is synced only when every peer starts from
 * x0 and this is the first view), so edges created by a membership change resynchronise. */
int hs__algo_view(hs_algo *a, hs_exchange *ex, uint64_t r, hs_peer_view *v, const float *x0);

/* The table entry of neighbour id, or NULL. */
hs__nbr *hs__algo_nbr(hs_algo *a, uint32_t id);

/* Sends payload (one reference taken per send) to `to` and counts it. Returns 1 when the
 * neighbour is gone (the exchange's HS_ECONNRESET): the message was not sent, and the caller
 * decides what becomes of it (synchronous algorithms drop it; SGP keeps the share's mass). */
int hs__algo_send(hs_algo *a, hs_exchange *ex, uint32_t to, uint64_t r, hs_buf *payload);

/* Before a synchronous algorithm builds a round's message of up to `bytes` bytes: waits, up
 * to the receive timeout in all, until every out-neighbour's link has room for it (the
 * exchange's wait_room). The previous round's message may still be on its way over a slow
 * link: built at once, the new one would be a second copy of the model in memory, and send()
 * would refuse it (a round lost to the neighbour). A synchronous round waits for its
 * neighbours anyway; SGP, which must not, does not call this. */
void hs__algo_wait_room(hs_algo *a, hs_exchange *ex, const hs_peer_view *v, uint64_t r,
                        size_t bytes);
/* At the job's end or a stop: the same wait (at most max_ms when that is shorter, >= 0), for
 * the last message to be out. The node then copies the caller's vector, which no round holds
 * any more (node/vec.c), or a checkpoint's state: with that message still queued over a slow
 * link, three vectors would be alive at once. */
void hs__algo_settle(hs_algo *a, hs_exchange *ex, int max_ms);

/* Payloads larger than this are not kept in the pool once sent. */
#define HS__POOL_MAX_BYTES ((size_t)16 << 20)
/* A payload starting with `type`, with room for `reserve` more bytes; the caller owns one
 * reference. Buffers come from a small per-algorithm pool and are reused once every other
 * holder (the exchange's pending sends) has let go, so steady-state rounds allocate nothing. */
int hs__payload_new(hs_algo *a, hs_buf **out, int type, size_t reserve);
/* A FULL payload carrying v (d floats). */
int hs__payload_full(hs_algo *a, hs_buf **out, const float *v, size_t d);
/* Validates a FULL payload and copies its d values to dst (unchanged on error). */
int hs__payload_read_full(const uint8_t *p, size_t len, float *dst, size_t d, uint32_t from);

/* Receives neighbour n's messages of rounds n->next_round .. r in order, handing each to
 * apply(a, n, round, bytes, len, ctx). Returns 1 when round r was applied, 0 when a message did
 * not come in time or the neighbour is gone (n->next_round then names the round still owed),
 * or a negative error. Rounds before r are waited for like round r. A message apply refuses
 * is dropped as a lost one (the replica is asked for in full), bar HS_ECUDA (the device failed
 * to take it), which is returned. */
typedef int (*hs__apply_fn)(hs_algo *a, hs__nbr *n, uint64_t round, const uint8_t *p, size_t len,
                            void *ctx);
int hs__algo_catch_up(hs_algo *a, hs_exchange *ex, hs__nbr *n, uint64_t r, int timeout_ms,
                      hs__apply_fn apply, void *ctx);
/* Neighbour n's message was lost (its replica must be replaced), or n left or was declared
 * dead at round r (out of the mix until heard from again): the bookkeeping of catch_up. */
void hs__algo_nbr_lost(hs_algo *a, hs__nbr *n);
void hs__algo_nbr_gone(hs_algo *a, hs__nbr *n, uint64_t r);

/* stream.c: neighbour n's message of round r as it arrives, in pieces (the exchange's
 * recv_piece, which must be there): each piece goes in order to fn (bytes [off, off + len) of
 * a message of total bytes; the WANT_FULL flag is taken off the first byte, as catch_up
 * does), with catch_up's bookkeeping; older rounds of n are dropped by the exchange.
 * Returns 1 when all of it came and fn took it; 0 when it did not come in timeout_ms (nor all
 * of it), the neighbour is gone, or fn refused a piece (< 0 from fn: the message is dropped,
 * said at warning level); *taken is then how many of its bytes fn took. < 0: an error of the
 * run. n->next_round is r + 1 after it either way. */
typedef int (*hs__piece_fn)(hs_algo *a, const uint8_t *p, size_t len, uint64_t off,
                            uint64_t total, void *ctx);
int hs__algo_recv_pieces(hs_algo *a, hs_exchange *ex, hs__nbr *n, uint64_t r, int timeout_ms,
                         hs__piece_fn fn, void *ctx, uint64_t *taken);
/* stream.c: a piece reader's values gathered into runs of whole values (width bytes each, a
 * divisor of the run's 4 KiB), so that each value is checked before it is used and applied in
 * runs whose bounds do not depend on how the message was cut into pieces. hs__algo_feed_runs
 * copies len bytes in and hands each run to take (n values, the first being value `first`) once
 * it is full or holds value d - 1; a run take refuses stops the feed with its error. */
typedef struct hs__runs {
    uint8_t blk[4096]; /* the values of the run being filled, as they came */
    size_t have;       /* its bytes */
    size_t k;          /* values taken */
    size_t width;      /* bytes of a value */
} hs__runs;
typedef int (*hs__run_fn)(hs_algo *a, const uint8_t *v, size_t n, size_t first, void *ctx);
int hs__algo_feed_runs(hs_algo *a, hs__runs *r, const uint8_t *p, size_t len, hs__run_fn take,
                       void *ctx);

/* Replica algorithms (choco, dcd): send `delta` to out-neighbours that hold this peer's
 * replica (a->own) and the full replica to new ones; bring in-neighbours' replicas up to round
 * r, marking in present[i] (one per v->in[i]) those that are current. */
int hs__algo_send_replica(hs_algo *a, hs_exchange *ex, const hs_peer_view *v, uint64_t r,
                          hs_buf *delta);
int hs__algo_recv_replicas(hs_algo *a, hs_exchange *ex, const hs_peer_view *v, uint64_t r,
                           uint8_t *present, float *acc);
/* replica_stream.c: whether in-neighbour n's message of round r is taken in pieces as it
 * arrives (a large dense delta or full replica on an exchange with recv_piece, host memory,
 * one vector a replica, n's replica current up to r - 1); then hs__algo_recv_pieces' result,
 * the message applied to n's replica and (acc, as hs__apply_replica) the running mix. Not all of
 * it in time loses the replica (a full one is asked for): the rest is not kept for later. */
int hs__algo_replica_streams(const hs_algo *a, const hs_exchange *ex, const hs__nbr *n,
                             uint64_t r);
int hs__algo_recv_replica_pieces(hs_algo *a, hs_exchange *ex, hs__nbr *n, uint64_t r,
                                 float *acc);
/* Applies a FULL, DELTA or DELTA_PARTS payload of neighbour n to its replica (an
 * hs__apply_fn). ctx is NULL or an accumulator (float *, a->dpub values: one vector per part)
 * kept equal to sum_j W_ij rep_j up to a constant: a delta of an in-neighbour is added to it
 * too, weighted by W_ij, while !a->reps_dirty (a FULL payload sets reps_dirty). */
int hs__apply_replica(hs_algo *a, hs__nbr *n, uint64_t round, const uint8_t *p, size_t len,
                      void *ctx);
/* The compressor key of round r: rounds since the job's first, not r itself. A networked job
 * starts at whatever round its members' joins reached (4, 8, 12 on loopback); random
 * compressors keyed by r would draw differently in each launch and unlike the simulator's. */
static inline uint64_t hs__algo_key(const hs_algo *a, uint64_t r) { return r - a->round0; }
/* The compressor key of part k of a round-r DELTA_PARTS message: distinct per part, so random
 * compressors draw independent selections for the vectors of one round. */
static inline uint64_t hs__part_round(uint64_t r, int k) { return r ^ ((uint64_t)k << 56); }

/* A scratch array of n flags owned by a. */
int hs__algo_present(hs_algo *a, int n, uint8_t **out);

/* acc[k] += w * (a[k] - b[k]) for k < d: the same IEEE operations in the same order on every
 * machine. */
void hs__acc_diff(float *acc, const float *a, const float *b, size_t d, float w);

/* The running mix of a replica algorithm (CHOCO, BEER) in full from the replicas: mix (a->dpub
 * floats, one vector per part) = sum_j W_ij (rep_j - own) over the synced in-neighbours of v, in
 * view order; returns sum_j W_ij of those and marks the replicas clean. */
float hs__mix_rebuild(hs_algo *a, const hs_peer_view *v, float *mix);

/* x[k] += g * m[k] for k < d; returns sum_k m[k]^2 (a statistic, summed in float lanes so the
 * loop vectorises). */
double hs__step_sq(float *x, const float *m, float g, size_t d);
/* sum_k x_k^2, summed in double in index order: the divergence guard's scale of a model (the
 * CPU reference of hs_gossip_ops.sumsq); non-finite when an element is. */
double hs__sum_sq(const float *x, size_t d);

/* BEER's tracker and model steps over d floats (beer.c, where they are explained); the
 * reference of the device's beer_track and beer_step (src/tensor/gossip_ops.h). */
void hs__beer_track(float *v, float *s_prev, float *dg, const float *mg, const float *g,
                    float gamma, const float *xr, const float *x, size_t d);
double hs__beer_step_model(float *x, float *dh, const float *xr, const float *mh, const float *v,
                           const float *h, float gamma, size_t d);

/* Multiplies a difference about to be compressed (d floats, in the backend's memory in device
 * mode) by a->rscale, hs__compress_replica_scale of the compressor; nothing when that is 1. */
int hs__algo_scale_diff(hs_algo *a, float *diff);

/* The contraction of c, with hs__compress_replica_scale applied, on the consensus step's probe
 * (step.c): v and out are scratch of c's d floats. */
int hs__algo_probe_delta(const hs_compressor *c, float *v, float *out, double *delta_probe);

/* Little-endian serialisation helpers for save/load. */
int hs__put_u32(hs_buf *b, uint32_t v);
int hs__put_u64(hs_buf *b, uint64_t v);
int hs__put_f64(hs_buf *b, double v);
int hs__put_floats(hs_buf *b, const float *v, size_t n);
int hs__get_u32(const uint8_t **p, const uint8_t *end, uint32_t *v);
int hs__get_u64(const uint8_t **p, const uint8_t *end, uint64_t *v);
int hs__get_f64(const uint8_t **p, const uint8_t *end, double *v);
/* Checks that n floats follow, all finite, and steps over them; *at (may be NULL): where. */
int hs__skip_floats(const uint8_t **p, const uint8_t *end, size_t n, const uint8_t **at);
/* Reads n floats, all finite, into dst (unchanged on error). */
int hs__get_floats(const uint8_t **p, const uint8_t *end, float *dst, size_t n);

/* The vector hs_algo_begin was given, as the algorithm holds it until the round's pull (D-PSGD
 * keeps it to mix against); NULL when it holds none. Lets the owner of x lend its vector for
 * the round instead of keeping a copy of its own (node/vec.c). */
const void *hs__algo_round_x(const hs_algo *a);
/* Whether a's kind holds the round's x that way (ops->round_x). */
int hs__algo_lends_round_x(const hs_algo *a);
/* A vector of d floats that a does not use between rounds (ops->tmp_idle), for the owner of x
 * to keep its vector in between its calls instead of a copy of its own (node/vec.c: CHOCO,
 * DCD, BEER);
 * NULL when there is none. Any push or pull overwrites it. */
float *hs__algo_idle_vector(hs_algo *a);

#endif
