/* hearsay: topologies and mixing matrices.
 *
 * A topology is a graph over ranks 0..n-1 with mixing weights, possibly time-varying (a
 * schedule of graphs with period P, graph r mod P used at round r). Convention: W[i][j] is
 * the weight with which receiver i mixes the value of j, so one gossip step is
 * x_i <- sum_j W[i][j] x_j. Undirected topologies are symmetric and doubly stochastic; directed
 * ones (push-sum) are column stochastic: column j says how sender j splits its mass among
 * itself and its out-neighbours.
 *
 * Ranks are positions in the sorted member list; mapping ranks to peer ids is the runtime's
 * business. Everything here is deterministic in (spec, n, seed). A topology is immutable once
 * built, so any number of threads may query one concurrently. File format, generators and the
 * validation rules: docs/TOPOLOGY.md. */
#ifndef HEARSAY_TOPO_H
#define HEARSAY_TOPO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_topo hs_topo;

/* Limits. Files and specs beyond them are refused with a message naming the value. */
#define HS_TOPO_MAX_PEERS 65536
#define HS_TOPO_MAX_PERIOD 4096         /* rounds of a schedule */
#define HS_TOPO_MAX_ARCS (1 << 23)      /* off-diagonal entries of W, summed over the schedule */
#define HS_TOPO_MAX_CELLS (1 << 22)     /* period * peers */
#define HS_TOPO_MAX_FILE (64 << 20)     /* bytes of a topology file */
#define HS_TOPO_MAX_STR 255             /* characters of a name, address or emulation spec */
#define HS_TOPO_SUM_TOL 1e-6            /* |row or column sum - 1| accepted as stochastic */
#define HS_TOPO_GAP_MAX_N 4096          /* largest n whose spectral gap is computed (dense) */

/* Builds a topology from a spec: a generator "KIND[:PARAMS]" (ring, torus:RxC, hypercube,
 * exponential, onepeer-exp, complete, regular:D, two-cluster[:BRIDGES]) for n ranks, or the
 * path of a JSON topology file (docs/TOPOLOGY.md), in which case n must be 0 or equal the
 * file's peer count. seed drives random generators. The result passed hs_topo_check's cheap
 * checks (everything but the spectral gap); an invalid matrix is refused with HS_EINVAL and the
 * reason. Errors name the spec, field and value. */
int hs_topo_new(hs_topo **out, const char *spec, int n, uint64_t seed);
void hs_topo_free(hs_topo *t); /* accepts NULL */

/* Generators only (no file, no cJSON: usable from hs_core alone). Same spec, n and seed rules
 * as hs_topo_new; n may be 0 when the spec fixes it (torus:RxC). */
int hs_topo_generate(hs_topo **out, const char *spec, int n, uint64_t seed);

/* Flags of the readers. */
#define HS_TOPO_LENIENT 1u /* keep a well-formed file whose matrix fails hs_topo_check (check/show) */

/* Reads a topology from the JSON text buf[0..len) (need not be NUL-terminated). `name` prefixes
 * error messages and, without a "name" key, names the topology (a trailing ".json" and any
 * directory are dropped). Returns HS_EFORMAT when the text is not JSON, HS_EINVAL when it is
 * JSON but not a valid topology (message "NAME: FIELD: reason"), HS_ENOMEM. */
int hs_topo_from_json(hs_topo **out, const char *buf, size_t len, const char *name,
                      unsigned flags);

/* hs_topo_from_json on the contents of a file. HS_ENOENT / HS_EIO when it cannot be read. */
int hs_topo_load(hs_topo **out, const char *path, unsigned flags);

int hs_topo_n(const hs_topo *t);
int hs_topo_directed(const hs_topo *t);
int hs_topo_period(const hs_topo *t); /* 1 for a static topology */
const char *hs_topo_name(const hs_topo *t);
/* Whether hs_topo_new reads spec as a topology file (a path ending in .json), not a generator. */
int hs_topo_spec_is_file(const char *spec);
/* Renames t (copied): 1..HS_TOPO_MAX_STR printable ASCII characters, else HS_EINVAL. Not
 * thread-safe: only before t is shared. */
int hs_topo_set_name(hs_topo *t, const char *name);

/* The dense mixing matrix in use at round `round`: W[i * n + j], n*n doubles, caller-owned. */
int hs_topo_matrix(const hs_topo *t, uint64_t round, double *W);

/* One rank's view of the matrix at a round: whom it receives from (with W[rank][j]) and whom it
 * sends to (with W[j][rank], the share of its mass a push-sum sender gives j). For undirected
 * topologies in and out hold the same ranks. The union of all ranks' views is the matrix. */
typedef struct hs_edge {
    int peer; /* rank */
    double w;
} hs_edge;

typedef struct hs_view {
    int rank, n;
    double self_w; /* W[rank][rank] */
    int n_in, n_out;
    hs_edge *in;  /* ascending by peer; owned */
    hs_edge *out; /* ascending by peer; owned */
} hs_view;

int hs_topo_view(const hs_topo *t, int rank, uint64_t round, hs_view *out);
void hs_view_free(hs_view *v); /* frees the arrays; accepts a zeroed view */

/* The same graph restricted to the ranks with alive[r] != 0 (renumbered in order), weighted by
 * Metropolis-Hastings w_ij = 1 / (1 + max(deg_i, deg_j)) (undirected) or uniform shares
 * (directed), so that the survivors of a crash can re-weight from degrees alone. Addresses and
 * link emulation of the survivors are kept. The result may be disconnected: hs_topo_check says.
 * HS_EINVAL when no rank is alive. */
int hs_topo_restrict(hs_topo **out, const hs_topo *t, const uint8_t *alive);

/* The "addresses" entry of a topology file for one rank ("host:port"), or NULL when the file
 * has none (or rank is out of range). Borrowed: valid while t lives. */
const char *hs_topo_address(const hs_topo *t, int rank);

/* The link emulation spec of the directed link from -> to, opaque here (the network module
 * parses it, e.g. "delay=50ms,jitter=10ms,rate=10mbit,loss=0.01"): from the file's "emulate"
 * object, an "edges" entry first (for undirected topologies it covers both directions), then
 * the sender's "peers" entry, then "default". NULL when none applies or the spec is "" (the
 * way to exempt one link from a default). Borrowed: valid while t lives. */
const char *hs_topo_link_emulation(const hs_topo *t, int from, int to);
/* 1 when the topology carries any link emulation. */
int hs_topo_has_emulation(const hs_topo *t);

/* ------------------------------------------------------------------ validation */

/* What hearsay topo check reports. Degrees and edges are those of the union graph over one
 * period (positive off-diagonal weights). */
typedef struct hs_topo_report {
    int n, directed, period;
    long edges;           /* undirected: pairs {i, j}; directed: arcs j -> i */
    int in_min, in_max;   /* how many peers a rank receives from */
    int out_min, out_max; /* how many peers a rank sends to (= in_* when undirected) */
    int symmetric;        /* every round's W equals its transpose within 1e-12 */
    int nonnegative;      /* no negative entry (a self weight forced below 0 included) */
    double row_err;       /* max over rounds and rows of |row sum - 1| */
    double col_err;       /* same for columns */
    int row_stochastic;   /* row_err <= HS_TOPO_SUM_TOL */
    int col_stochastic;   /* col_err <= HS_TOPO_SUM_TOL */
    int connected;        /* connected (undirected) or strongly connected (directed) */
    int aperiodic;        /* static W: the chain is aperiodic (no bipartite zero-self-weight
                             graph); schedules: 1, the product's gap decides */
    int gap_computed;     /* 0 when skipped (flag, n > HS_TOPO_GAP_MAX_N, or W not stochastic) */
    double lambda2;       /* second largest eigenvalue modulus of W, or of the product
                             W[P-1] ... W[0] of one period for a schedule */
    double gap;           /* 1 - lambda2; for a schedule, per period (see docs/TOPOLOGY.md) */
    const char *method;   /* "dsyev" (symmetric) or "dgeev"; "" when not computed */
    int valid;
    char reason[256]; /* the first thing wrong, "" when valid */
} hs_topo_report;

#define HS_TOPO_CHECK_NOGAP 1u /* skip the eigenvalues (O(n^3)); everything else is O(P * nnz) */

/* Fills r. A topology is valid when every rank has a neighbour (n > 1), W is non-negative,
 * doubly stochastic (undirected: also symmetric) or column stochastic (directed) in every round
 * within HS_TOPO_SUM_TOL, the union graph is (strongly) connected, a static W is aperiodic and,
 * when computed, the gap exceeds 1e-10. Returns 0 whether or not valid; HS_ENOMEM, or HS_EIO
 * when LAPACK fails. */
int hs_topo_check(const hs_topo *t, unsigned flags, hs_topo_report *r);

/* ------------------------------------------------------------------ output */

#define HS_TOPO_JSON_WEIGHTS 1u /* write every weight even when they are the defaults */

/* The topology as a JSON file that hs_topo_from_json reads back to the same matrices (weights
 * written with 17 significant digits; left out, meaning Metropolis-Hastings or uniform shares,
 * when that is what they are and the flag is not given). *out is NUL-terminated, owned by the
 * caller (free()). */
int hs_topo_to_json(const hs_topo *t, unsigned flags, char **out);

/* Graphviz DOT of the union graph: edges labelled with their weight (static) or with the rounds
 * they are used in (schedules), nodes with their self weight. *out owned by the caller. */
int hs_topo_to_dot(const hs_topo *t, char **out);

/* hs_topo_to_json written to the file path (created or truncated). HS_EIO naming the path on
 * failure. */
int hs_topo_write(const hs_topo *t, const char *path, unsigned flags);

#ifdef __cplusplus
}
#endif
#endif
