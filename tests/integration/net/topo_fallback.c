/* A minimal implementation of hearsay/topo.h (ring and complete, Metropolis-Hastings weights,
 * restrict) for the network tests, netpeer and the network benchmark, linked only while
 * src/topo has no sources (see src/net/meson.build). Not part of the library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "hearsay/topo.h"

struct hs_topo {
    int n;
    char name[32];
    double *W; /* n * n, W[i * n + j] */
};

static int topo_alloc(hs_topo **out, int n, const char *name) {
    hs_topo *t = calloc(1, sizeof(*t));
    if (!t || !(t->W = calloc((size_t)n * (size_t)n, sizeof(double)))) {
        free(t);
        return hs__err(HS_ENOMEM, "topology: out of memory");
    }
    t->n = n;
    snprintf(t->name, sizeof(t->name), "%s", name);
    *out = t;
    return 0;
}

/* Metropolis-Hastings weights over an adjacency matrix. */
static void mh(hs_topo *t, const unsigned char *adj) {
    int n = t->n;
    int *deg = calloc((size_t)n, sizeof(int));
    if (!deg)
        return;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            deg[i] += adj[i * n + j];
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < n; j++) {
            if (!adj[i * n + j])
                continue;
            double w = 1.0 / (1.0 + (deg[i] > deg[j] ? deg[i] : deg[j]));
            t->W[i * n + j] = w;
            s += w;
        }
        t->W[i * n + i] = 1.0 - s;
    }
    free(deg);
}

int hs_topo_new(hs_topo **out, const char *spec, int n, uint64_t seed) {
    (void)seed;
    int ring = !strcmp(spec, "ring"), complete = !strcmp(spec, "complete");
    if (!ring && !complete)
        return hs__err(HS_ENOTSUP, "topology %s: the test fallback knows ring and complete", spec);
    if (n < 1)
        return hs__err(HS_EINVAL, "topology %s: %d peers", spec, n);
    unsigned char *adj = calloc((size_t)n * (size_t)n, 1);
    if (!adj)
        return hs__err(HS_ENOMEM, "topology: out of memory");
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            if (i == j)
                continue;
            int d = (j - i + n) % n;
            adj[i * n + j] = complete || d == 1 || d == n - 1;
        }
    int err = topo_alloc(out, n, spec);
    if (err == 0)
        mh(*out, adj);
    free(adj);
    return err;
}

void hs_topo_free(hs_topo *t) {
    if (!t)
        return;
    free(t->W);
    free(t);
}

int hs_topo_n(const hs_topo *t) { return t->n; }
int hs_topo_directed(const hs_topo *t) {
    (void)t;
    return 0;
}
int hs_topo_period(const hs_topo *t) {
    (void)t;
    return 1;
}
const char *hs_topo_name(const hs_topo *t) { return t->name; }

int hs_topo_matrix(const hs_topo *t, uint64_t round, double *W) {
    (void)round;
    memcpy(W, t->W, (size_t)t->n * (size_t)t->n * sizeof(double));
    return 0;
}

int hs_topo_view(const hs_topo *t, int rank, uint64_t round, hs_view *out) {
    (void)round;
    int n = t->n;
    if (rank < 0 || rank >= n)
        return hs__err(HS_EINVAL, "topology: rank %d of %d", rank, n);
    memset(out, 0, sizeof(*out));
    out->rank = rank;
    out->n = n;
    out->self_w = t->W[rank * n + rank];
    out->in = calloc((size_t)n, sizeof(hs_edge));
    out->out = calloc((size_t)n, sizeof(hs_edge));
    if (!out->in || !out->out) {
        hs_view_free(out);
        return hs__err(HS_ENOMEM, "topology view: out of memory");
    }
    for (int j = 0; j < n; j++) {
        if (j == rank)
            continue;
        if (t->W[rank * n + j] > 0)
            out->in[out->n_in++] = (hs_edge){j, t->W[rank * n + j]};
        if (t->W[j * n + rank] > 0)
            out->out[out->n_out++] = (hs_edge){j, t->W[j * n + rank]};
    }
    return 0;
}

void hs_view_free(hs_view *v) {
    free(v->in);
    free(v->out);
    v->in = v->out = NULL;
    v->n_in = v->n_out = 0;
}

int hs_topo_restrict(hs_topo **out, const hs_topo *t, const uint8_t *alive) {
    int n = 0, on = t->n;
    for (int i = 0; i < on; i++)
        n += alive[i] != 0;
    if (n == 0)
        return hs__err(HS_EINVAL, "topology restrict: nobody alive");
    unsigned char *adj = calloc((size_t)n * (size_t)n, 1);
    if (!adj)
        return hs__err(HS_ENOMEM, "topology: out of memory");
    for (int i = 0, a = 0; i < on; i++) {
        if (!alive[i])
            continue;
        for (int j = 0, b = 0; j < on; j++) {
            if (!alive[j])
                continue;
            adj[a * n + b] = i != j && t->W[i * on + j] > 0;
            b++;
        }
        a++;
    }
    int err = topo_alloc(out, n, t->name);
    if (err == 0)
        mh(*out, adj);
    free(adj);
    return err;
}
