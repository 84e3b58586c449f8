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
 * business. Everything here is deterministic in (spec, n, seed). */
#ifndef HEARSAY_TOPO_H
#define HEARSAY_TOPO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_topo hs_topo;

/* Builds a topology from a spec: a generator "KIND[:PARAMS]" (ring, torus:RxC, hypercube,
 * exponential, onepeer-exp, complete, regular:D, two-cluster[:BRIDGES]) for n ranks, or the
 * path of a JSON topology file (docs/TOPOLOGY.md), in which case n must be 0 or equal the
 * file's peer count. seed drives random generators. Errors name the spec, field and value. */
int hs_topo_new(hs_topo **out, const char *spec, int n, uint64_t seed);
void hs_topo_free(hs_topo *t); /* accepts NULL */

int hs_topo_n(const hs_topo *t);
int hs_topo_directed(const hs_topo *t);
int hs_topo_period(const hs_topo *t); /* 1 for a static topology */
const char *hs_topo_name(const hs_topo *t);

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
 * (directed), so that the survivors of a crash can re-weight from degrees alone. */
int hs_topo_restrict(hs_topo **out, const hs_topo *t, const uint8_t *alive);

#ifdef __cplusplus
}
#endif
#endif
