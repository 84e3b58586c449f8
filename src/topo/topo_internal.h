/* Internals of src/topo: the sparse representation shared by the generators, the file reader,
 * validation and the writers. */
#ifndef HS_TOPO_INTERNAL_H
#define HS_TOPO_INTERNAL_H

#include <stddef.h>

#include "hearsay/topo.h"

/* One off-diagonal entry W[i][j] = w (receiver i, sender j). */
typedef struct hs__arc {
    int i, j;
    double w;
} hs__arc;

/* One round's W, stored twice so that both halves of a view are slices: by rows (CSR: what i
 * receives) and by columns (CSC: what j sends), each sorted by the other index. */
typedef struct hs__tgraph {
    size_t nnz;     /* off-diagonal entries */
    size_t *rp;     /* n + 1 row pointers */
    int *ri;        /* column of each row entry */
    double *rw;     /* its weight */
    size_t *cp;     /* n + 1 column pointers */
    int *ci;        /* row of each column entry */
    double *cw;     /* its weight */
    double *self;   /* n diagonal entries */
} hs__tgraph;

typedef struct hs__emu_link {
    int from, to;
    char *spec;
} hs__emu_link;

struct hs_topo {
    int n, directed, period;
    /* Weights are what the defaults give (Metropolis-Hastings, uniform shares): the writer
     * may leave them out. */
    int default_weights;
    char name[HS_TOPO_MAX_STR + 1];
    hs__tgraph *g; /* period graphs */
    char **addr;   /* n strings, or NULL */
    char *emu_default;
    char **emu_peer;      /* n entries (NULL = none), or NULL */
    hs__emu_link *emu;    /* sorted by (from, to); both directions of undirected entries */
    size_t n_emu;
};

/* An empty topology with `period` unset rounds; NULL when out of memory. */
hs_topo *hs__topo_alloc(int n, int directed, int period, const char *name);

/* Fills round r from off-diagonal arcs (0 <= i, j < n, i != j, no duplicate (i, j); the caller
 * checked) and self weights (NULL: "auto", 1 minus the row sum when undirected or the column
 * sum when directed). For undirected topologies arcs must hold both (i, j) and (j, i). */
int hs__topo_set_round(hs_topo *t, int r, const hs__arc *arcs, size_t m, const double *self);

/* Default weights of arcs[0..m) in place: Metropolis-Hastings from the degrees (undirected)
 * or uniform shares 1 / (1 + out-degree of the sender j) (directed). */
int hs__topo_default_weights(int n, int directed, hs__arc *arcs, size_t m);

/* Sorts arcs by (i, j) and drops repeated (i, j) pairs (the generators' convenience); returns
 * the new count. */
size_t hs__arcs_unique(hs__arc *arcs, size_t m);

/* Adds the link emulation table to t (takes ownership of the strings on success). */
int hs__topo_set_emulation(hs_topo *t, char *dflt, char **peer, hs__emu_link *links, size_t m);

/* 1 when peer j sends to i (W[i][j] > 0) in some round of the period. */
int hs__topo_has_arc(const hs_topo *t, int i, int j);

/* A growable string for the writers. */
typedef struct hs__sbuf {
    char *p;
    size_t len, cap;
    int oom;
} hs__sbuf;
void hs__sb_printf(hs__sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string literal (only printable ASCII reaches here, but quote and backslash are
 * escaped and anything else becomes \u00XX). */
void hs__sb_json_str(hs__sbuf *b, const char *s);

/* 1 when s is at most HS_TOPO_MAX_STR printable ASCII characters; otherwise 0 and a reason. */
int hs__topo_str_ok(const char *s, size_t len, int allow_space, char *why, size_t whylen);

#endif
