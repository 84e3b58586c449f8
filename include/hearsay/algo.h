/* hearsay: decentralized optimization algorithms.
 *
 * One interface, five algorithms (src/algo/, one file each):
 *   dpsgd  D-PSGD (Lian et al. 2017): x_i <- sum_j W_ij x_j - gamma g_i; full vectors (or a
 *          lossy cast) on the wire. The baseline.
 *   dcd    DCD-PSGD (Tang et al. 2018): z_i = sum_j W_ij x_j - gamma g_i - x_i; send C(z_i);
 *          every holder of a replica of x_i adds the same decoded C(z_i). Unbiased C only.
 *   choco  CHOCO-SGD (Koloskova et al. 2019): x_half = x_i - gamma g_i;
 *          q_i = Q(x_half - xhat_i); all holders add q_i to xhat_i;
 *          x_i = x_half + gamma_c sum_j W_ij (xhat_j - xhat_i). Any contraction, biased
 *          ones included (hs_algo_check_compressor).
 *   sgp    Stochastic Gradient Push (Assran et al. 2019): push-sum over a directed,
 *          possibly time-varying graph; numerator x_i and weight w_i, gradients at
 *          z_i = x_i / w_i; never waits for slow peers; mass is conserved.
 *   beer   BEER (Zhao et al. 2022): gradient tracking, CHOCO-style compressed gossip of the
 *          model and of a tracker of the average local step; converges to the global optimum
 *          however different the peers' data are. Any contraction; gamma_c is its gamma.
 *
 * A round r of peer i is: hs_algo_begin (sends what can travel before the gradient), then
 * one or more local optimizer steps on x with the gradient taken at hs_algo_eval_point, then
 * hs_algo_push (sends what depends on the local update) and hs_algo_pull (receives, mixes,
 * leaves the next x). The exchange (hearsay/exchange.h) carries the messages; the algorithm
 * never sees a socket, so the network runtime and the in-process simulator run the same code:
 * a networked peer runs the phases back to back, the simulator runs each phase for every peer
 * before the next, so a receive never waits for a send that has not happened.
 *
 * Vectors are host memory of d floats. Threading: one thread per algorithm object. */
#ifndef HEARSAY_ALGO_H
#define HEARSAY_ALGO_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/exchange.h"
#include "hearsay/topo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hs_algo_kind {
    HS_ALGO_DPSGD = 0,
    HS_ALGO_DCD = 1,
    HS_ALGO_CHOCO = 2,
    HS_ALGO_SGP = 3,
    HS_ALGO_BEER = 4,
} hs_algo_kind;

/* "dpsgd", "dcd", "choco", "sgp", "beer". */
const char *hs_algo_kind_name(hs_algo_kind k);
/* HS_EINVAL with a message naming s and the choices. */
int hs_algo_kind_parse(const char *s, hs_algo_kind *out);
/* 1 for algorithms that complete every round with every neighbour (all but sgp). */
int hs_algo_kind_synchronous(hs_algo_kind k);
/* 1 for algorithms that take the consensus step gamma_c (choco, beer). */
int hs_algo_kind_uses_gamma_c(hs_algo_kind k);
/* 1 for algorithms whose gradient is taken elsewhere than x (hs_algo_eval_point; sgp). */
int hs_algo_kind_split_eval(hs_algo_kind k);
/* 1 for algorithms under which quasi-global momentum applies (their mixing step keeps the
 * average: dpsgd, choco). */
int hs_algo_kind_qg_momentum(hs_algo_kind k);
/* 1 for algorithms whose replicas drift with the compression error (dcd): the cure for a
 * divergence is compressing less. */
int hs_algo_kind_drifts_with_compression(hs_algo_kind k);
/* The names of the algorithms for which has(k) is true (want 1) or false (want 0), as
 * "a, b and c" in out (cap bytes, truncated); returns how many. For messages that must not
 * name algorithms by hand. */
int hs_algo_kind_names(int (*has)(hs_algo_kind), int want, char *out, size_t cap);
/* 1 for every algorithm (with hs_algo_kind_names: all of them). */
int hs_algo_kind_any(hs_algo_kind k);
/* The compressor and topology the CLI uses for algorithm k when none is given. */
const char *hs_algo_kind_default_compress(hs_algo_kind k);
const char *hs_algo_kind_default_topology(hs_algo_kind k);
/* The staleness algorithm k uses when none is given (1 for sgp, 0 for the others); the node API
 * and the CLI share it. */
int hs_algo_kind_default_staleness(hs_algo_kind k);

typedef struct hs_algo_cfg {
    hs_algo_kind kind;
    const char *compress; /* compressor spec (hearsay/compress.h); NULL = "none" */
    float gamma_c;        /* CHOCO consensus step size in (0, 1]; 0 (the default): automatic,
                             hs_algo_auto_gamma_c of the compressor */
    double gap;           /* spectral gap 1 - |lambda_2| of the mixing matrix when known (hs_sim
                             from its topology, a peer from its topology spec at the job's size),
                             else 0; shown with the automatic gamma_c, which does not use it */
    int max_degree;       /* most neighbours of any peer when the topology is known (set with
                             the gap), else 0: a ring's (<= 2) scales the automatic gamma_c
                             (hs_algo_scale_gamma_c) */
    int staleness;        /* SGP: wait for messages older than this many rounds from peers
                             that keep up (0: never wait); stragglers are never waited for */
    int recv_timeout_ms;  /* how long a synchronous round waits for a neighbour */
    uint64_t seed;        /* run seed (random compressors) */
    int same_start;       /* 1: every peer starts from the same x0 (same initialisation seed),
                             so replicas of neighbours start equal to x0 without a transfer;
                             0: the first round sends full replicas (consensus experiments with
                             different starting vectors). New edges always send full replicas. */
} hs_algo_cfg;

void hs_algo_cfg_default(hs_algo_cfg *cfg);

/* The automatic CHOCO and BEER consensus step for a compressor of worst-case contraction delta
 * (hs_compressor_delta, in (0, 1]) that keeps 1 - ||C(v) - v||^2 / ||v||^2 = delta_probe of a
 * bell-shaped probe vector v: gamma_c = delta_e / (2 - delta_e) with delta_e =
 * sqrt(delta max(delta, delta_probe)), in (0, 1], increasing in both. It does not use the
 * spectral gap: the measured stable steps do not grow with it (docs/RESULTS.md, "CHOCO consensus
 * step"; src/algo/step.c says why). The one topology input, the degree, is applied on top by
 * hs_algo_scale_gamma_c. */
float hs_algo_default_gamma_c(double delta, double delta_probe);

/* The automatic step gamma_c (hs_algo_default_gamma_c) on a topology whose busiest peer has
 * max_degree neighbours (0: not known): for at most 2 (a ring) 1.5 gamma_c, at most 0.15 and
 * never below gamma_c (the ring limits of top-k and random-k, whose steps are small, are
 * 2.6-3.1x the rule; those of sign and QSGD, above 0.15, only 1.3-2.1x); gamma_c otherwise (the
 * densest graphs set the rule). Every peer of a job given the same topology and size computes
 * the same float. */
float hs_algo_scale_gamma_c(float gamma_c, int max_degree);

/* The automatic step of compressor c (at its own d): probes c with a fixed seeded vector and
 * applies hs_algo_default_gamma_c. The same float on every machine for the same compressor spec,
 * d and seed. delta_probe (may be NULL) receives the probe's contraction. HS_ENOMEM. */
int hs_algo_auto_gamma_c(const hs_compressor *c, float *gamma_c, double *delta_probe);

/* Whether algorithm k can work with compressor c: HS_EINVAL with the reason and the fix for a
 * combination that cannot (CHOCO with a compressor that is not a contraction, ef: around CHOCO
 * or SGP, D-PSGD with a compressor that drops information without error feedback, DCD with a
 * biased compressor). Used by hs_algo_new and by the CLI before any data is loaded. */
int hs_algo_check_compressor(hs_algo_kind k, const hs_compressor *c);

/* Sets cfg->gap to the spectral gap of t's mixing matrix (of one period for a schedule), for
 * the automatic gamma_c; leaves it 0 (unknown) above 1024 peers (the dense eigensolver is
 * O(n^3)) or when t is not a valid mixing matrix. HS_ENOMEM, HS_EIO. */
int hs_algo_cfg_set_topology(hs_algo_cfg *cfg, const hs_topo *t);

/* Sets cfg->max_degree, by which the automatic gamma_c is scaled, to a degree every peer of a
 * job knows alike, whatever it knows of the job's size, so that both ends of an edge take one
 * step: a ring's 2 at any size, a topology file's own (as hs_algo_cfg_set_topology left it),
 * 0 (unscaled) for the other generators, whose degree grows with the size (src/algo/step.c). */
void hs_algo_cfg_set_step_degree(hs_algo_cfg *cfg, const char *topology);

/* Whether algorithm k can run on a topology that is directed or not and repeats with `period`
 * rounds (1: static): the synchronous ones mix with symmetric weights, and CHOCO and DCD keep
 * replicas of fixed neighbours. HS_EINVAL with a message naming the topology `name` and what to
 * use instead. */
int hs_algo_check_topology(hs_algo_kind k, int directed, int period, const char *name);

typedef struct hs_algo hs_algo;

/* An algorithm for peer `self` (its id, which keys random compression) on vectors of d floats,
 * starting from x0 (borrowed; every peer should start from the same x0). Validates the
 * combination with hs_algo_check_compressor and resolves an automatic gamma_c (logged).
 * HS_EINVAL, HS_ENOMEM. */
int hs_algo_new(hs_algo **out, const hs_algo_cfg *cfg, uint32_t self, size_t d, const float *x0);
void hs_algo_free(hs_algo *a); /* accepts NULL */

hs_algo_kind hs_algo_kind_of(const hs_algo *a);
/* CHOCO: the consensus step in use (the configured one, or the automatic one); 0 otherwise. */
float hs_algo_gamma_c(const hs_algo *a);
const char *hs_algo_compressor_name(const hs_algo *a);

/* The point at which the gradient of round r is taken: x itself, or z = x / w for SGP (then
 * returned in a buffer owned by a, valid until the next call). */
const float *hs_algo_eval_point(hs_algo *a, const float *x);

/* Before the first round: the peer starts from x instead of the x0 it was created with (a
 * joiner adopting a member's model, a resumed peer); its own replica starts there too. No
 * effect once a round has run. */
void hs_algo_reset_x(hs_algo *a, const float *x);

/* Before the first round: whether every peer starts from this same x0 (see hs_algo_cfg). */
void hs_algo_set_same_start(hs_algo *a, int same_start);

/* The job's first round (0 unless set; the same for every peer of a job): random compressors
 * draw by the round counted from it, so a seeded job repeats its draws however many rounds
 * its peers' joins took, and after a resume. */
void hs_algo_set_first_round(hs_algo *a, uint64_t r);

/* The inverse of hs_algo_eval_point: turns an evaluation point z (in place, d floats) into the
 * algorithm's x (x = w z for SGP; nothing for the others). */
void hs_algo_from_eval_point(hs_algo *a, float *z);

/* Start of round r: x is the current model (before this round's local steps). */
int hs_algo_begin(hs_algo *a, hs_exchange *ex, uint64_t r, const float *x);

/* After the local steps of round r: x holds their result; sends what depends on it (and, for
 * DCD-PSGD, already applies this peer's own compressed update to x). */
int hs_algo_push(hs_algo *a, hs_exchange *ex, uint64_t r, float *x);

/* Completes round r: receives the neighbours' messages and leaves the next model in x. A
 * neighbour whose message does not come in time, or that is gone (HS_ECONNRESET), is handled so
 * that the mixing row stays stochastic: D-PSGD and DCD-PSGD move its weight to the peer's own
 * value for this round; CHOCO-SGD and BEER keep a late one in the gossip step with its replica
 * of the round before (the late message is applied, in order, when it comes), and take a gone
 * one out of it at once, its weight going to the peer's own value (hs_algo_stats.gone), not at
 * the next membership change: nobody holds its frozen replica any more. A message that is
 * lost for good or fails validation makes a replica algorithm ask that neighbour for its full
 * replica. Other errors are returned. */
int hs_algo_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x);

/* hs_algo_push then hs_algo_pull. */
int hs_algo_end(hs_algo *a, hs_exchange *ex, uint64_t r, float *x);

/* What the last round did. */
typedef struct hs_algo_stats {
    uint64_t bytes_sent, bytes_recv; /* encoded payload bytes, cumulative */
    int missing;                     /* neighbours whose message of the last round did not come */
    double push_weight;              /* SGP: w_i, its blocks' smallest; 1 for the others */
    double disagreement;             /* a local estimate of the consensus distance, per parameter:
                                        ||avg_j v_j - v_i||^2 / d, the squared distance from this
                                        peer's model to the W-weighted average of the neighbours'
                                        values it holds (replicas for dcd/choco, received models
                                        for dpsgd); for sgp the mean ||z_j - z_i||^2 / d over the
                                        shares received */
    uint64_t resyncs;                /* replicas lost (a message lost or malformed) and asked for
                                        again in full, cumulative */
    uint64_t gone;                   /* neighbours found gone (left with BYE or declared dead)
                                        while the view in force still listed them, cumulative:
                                        each left the mix at once, so the neighbourhood that
                                        `disagreement` measures against changed (0 under sgp,
                                        which mixes only the shares that arrive) */
    int staleness_max;               /* SGP: oldest message added in the last round (rounds) */
    double staleness_mean;
    uint64_t waits;                  /* SGP: receives that blocked for a neighbour's share not yet
                                        arrived (the --staleness wait), cumulative; with
                                        staleness 0 SGP never waits and this stays 0 */
    uint64_t wait_timeouts;          /* SGP: of these, the ones that ran to the receive timeout
                                        and marked the neighbour lagging, cumulative: a straggler
                                        costs each of its out-neighbours one such wait, not one
                                        per share it sends */
} hs_algo_stats;

void hs_algo_get_stats(const hs_algo *a, hs_algo_stats *out);

/* The algorithm's own metrics of the last round, beyond the common ones above (sgp:
 * push_weight, staleness_max, staleness_mean), each handed to emit with its name; is_int: the
 * value is a count. None for the others. */
typedef void (*hs_algo_metric_fn)(void *ctx, const char *name, double v, int is_int);
void hs_algo_metrics(const hs_algo *a, hs_algo_metric_fn emit, void *ctx);

/* The push-sum weight a payload in flight carries (sgp's shares: its first block's, which in the
 * simulator, where shares are never cut, is every block's), 0 for any other payload: lets a
 * simulator count the mass of queued messages without knowing their layout. */
double hs_algo_payload_weight(const hs_buf *payload);

/* Checkpoints and join snapshots: everything the algorithm needs to continue (replicas,
 * push-sum weight, error-feedback residual, round) except x itself, appended to out. */
int hs_algo_save(const hs_algo *a, hs_buf *out);
/* Restores a save of the same algorithm, compressor and d; validates before changing state:
 * HS_EFORMAT / HS_EMISMATCH with a message. */
int hs_algo_load(hs_algo *a, const uint8_t *p, size_t len);

#ifdef __cplusplus
}
#endif
#endif
