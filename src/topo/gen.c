/* Topology generators: ring, 2-D torus, hypercube, static exponential, one-peer exponential
 * (time-varying, directed), complete, random d-regular and two clusters joined by a few
 * bridges. Undirected graphs get Metropolis-Hastings weights, which are the uniform 1/(d+1)
 * on the regular ones; the directed one gets uniform shares. Deterministic in (spec, n, seed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/rng.h"
#include "topo/topo_internal.h"

/* The random regular generator keeps an n x n adjacency bitset. */
#define REGULAR_MAX_PEERS 16384
/* Connectivity re-draws of a random 2-regular graph before giving up. */
#define REGULAR_MAX_REDRAWS 2000

#define KINDS                                                                                      \
    "ring, torus:RxC, hypercube, exponential, onepeer-exp, complete, regular:D, "                  \
    "two-cluster[:BRIDGES], or a path ending in .json"

typedef struct arcvec {
    hs__arc *a;
    size_t m, cap;
    int oom;
} arcvec;

static void push(arcvec *v, int i, int j) {
    if (v->oom) return;
    if (v->m == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 256;
        hs__arc *a = realloc(v->a, cap * sizeof(*a));
        if (!a) {
            v->oom = 1;
            return;
        }
        v->a = a;
        v->cap = cap;
    }
    v->a[v->m++] = (hs__arc){i, j, 0};
}

/* An undirected edge: both arcs. Self loops (small n wrapping around) are dropped. */
static void edge(arcvec *v, int i, int j) {
    if (i == j) return;
    push(v, i, j);
    push(v, j, i);
}

static int is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

static int log2_ceil(int n) {
    int k = 0;
    while ((1L << k) < n) k++;
    return k;
}

/* A decimal integer in [lo, hi] spanning s[0..len); -1 when it is not one. */
static int parse_num(const char *s, size_t len, int lo, int hi, int *out) {
    if (len == 0 || len > 9) return -1;
    long v = 0;
    for (size_t k = 0; k < len; k++) {
        if (s[k] < '0' || s[k] > '9') return -1;
        v = v * 10 + (s[k] - '0');
    }
    if (v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

/* Union-find root with path halving. */
static int uf_find(int *p, int x) {
    while (p[x] != x) {
        p[x] = p[p[x]];
        x = p[x];
    }
    return x;
}

static int edges_connected(int n, const int *eu, const int *ev, size_t m, int *parent) {
    for (int i = 0; i < n; i++) parent[i] = i;
    int comps = n;
    for (size_t k = 0; k < m; k++) {
        int a = uf_find(parent, eu[k]), b = uf_find(parent, ev[k]);
        if (a != b) {
            parent[a] = b;
            comps--;
        }
    }
    return comps == 1;
}

static int bit_get(const uint64_t *bs, int n, int u, int v) {
    size_t k = (size_t)u * (size_t)n + (size_t)v;
    return (int)(bs[k >> 6] >> (k & 63) & 1);
}

static void bit_set(uint64_t *bs, int n, int u, int v, int on) {
    size_t k = (size_t)u * (size_t)n + (size_t)v;
    if (on) bs[k >> 6] |= (uint64_t)1 << (k & 63);
    else bs[k >> 6] &= ~((uint64_t)1 << (k & 63));
}

/* A random D-regular graph by double-edge swaps (the switch Markov chain; Rao, Jana and
 * Bandyopadhyay, Sankhya 1996): start from a circulant
 * D-regular graph, apply ~10 m random swaps ab, cd -> ad, cb that keep the graph simple, and
 * keep swapping until it is connected. Dense D (2D >= n - 1) is built as the complement of a
 * sparse one, which is then connected automatically (two non-adjacent vertices of a graph with
 * 2D >= n - 1 share a neighbour). Unlike stub matching this never dead-ends. */
static int gen_regular(arcvec *out, int n, int D, uint64_t seed, const char *spec) {
    if (D < 0 || D >= n)
        return hs__err(HS_EINVAL, "topology '%s': degree %d must be in [0, %d) for %d peers", spec,
                       D, n, n);
    if (((long)n * D) % 2)
        return hs__err(HS_EINVAL, "topology '%s': no %d-regular graph on %d peers (n * D is odd)",
                       spec, D, n);
    if (n > 1 && (D == 0 || (D == 1 && n > 2)))
        return hs__err(HS_EINVAL,
                       "topology '%s': a %d-regular graph on %d peers is never connected", spec, D,
                       n);
    if (n > REGULAR_MAX_PEERS)
        return hs__err(HS_EINVAL, "topology '%s': %d peers (random regular graphs: at most %d)",
                       spec, n, REGULAR_MAX_PEERS);
    int complement = n > 2 && 2 * D >= n - 1;
    int d = complement ? n - 1 - D : D;
    size_t m = (size_t)n * (size_t)d / 2;
    size_t words = ((size_t)n * (size_t)n + 63) / 64;
    uint64_t *bs = calloc(words, sizeof(uint64_t));
    int *eu = malloc((m ? m : 1) * sizeof(int)), *ev = malloc((m ? m : 1) * sizeof(int));
    int *parent = malloc((size_t)n * sizeof(int));
    int err = 0;
    if (!bs || !eu || !ev || !parent) {
        err = hs__err(HS_ENOMEM, "topology '%s': out of memory", spec);
        goto done;
    }
    size_t k = 0;
    for (int i = 0; i < n; i++)
        for (int s = 1; s <= d / 2; s++) {
            eu[k] = i;
            ev[k++] = (i + s) % n;
        }
    if (d % 2)
        for (int i = 0; i < n / 2; i++) {
            eu[k] = i;
            ev[k++] = i + n / 2;
        }
    for (size_t e = 0; e < m; e++) {
        bit_set(bs, n, eu[e], ev[e], 1);
        bit_set(bs, n, ev[e], eu[e], 1);
    }
    hs_rng r;
    hs__rng_init(&r, seed, HS_RNG_TOPO, 0, 0);
    size_t attempts = 10 * m;
    for (int redraw = 0;; redraw++) {
        for (size_t s = 0; m >= 2 && s < attempts; s++) {
            size_t e1 = hs__rng_uniform(&r, (uint32_t)m), e2 = hs__rng_uniform(&r, (uint32_t)m);
            int a = eu[e1], b = ev[e1], c = eu[e2], dd = ev[e2];
            if (hs__rng_u32(&r) & 1) {
                int tmp = c;
                c = dd;
                dd = tmp;
            }
            /* ab, cd -> ad, cb: rejected when it would make a loop or a double edge (which also
             * covers e1 == e2 and edges sharing a vertex). */
            if (a == dd || c == b || bit_get(bs, n, a, dd) || bit_get(bs, n, c, b)) continue;
            bit_set(bs, n, a, b, 0);
            bit_set(bs, n, b, a, 0);
            bit_set(bs, n, c, dd, 0);
            bit_set(bs, n, dd, c, 0);
            bit_set(bs, n, a, dd, 1);
            bit_set(bs, n, dd, a, 1);
            bit_set(bs, n, c, b, 1);
            bit_set(bs, n, b, c, 1);
            eu[e1] = a;
            ev[e1] = dd;
            eu[e2] = c;
            ev[e2] = b;
        }
        if (complement || edges_connected(n, eu, ev, m, parent)) break;
        if (redraw == REGULAR_MAX_REDRAWS) {
            err = hs__err(HS_EINVAL,
                          "topology '%s': no connected %d-regular graph on %d peers after %d "
                          "draws (use a larger degree)",
                          spec, D, n, REGULAR_MAX_REDRAWS);
            goto done;
        }
        attempts = m;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (bit_get(bs, n, i, j) != complement) edge(out, i, j);
done:
    free(bs);
    free(eu);
    free(ev);
    free(parent);
    return err;
}

int hs_topo_generate(hs_topo **out, const char *spec, int n, uint64_t seed) {
    *out = NULL;
    if (!spec) return hs__err(HS_EINVAL, "topology: no spec");
    const char *colon = strchr(spec, ':');
    size_t klen = colon ? (size_t)(colon - spec) : strlen(spec);
    const char *par = colon ? colon + 1 : NULL;
    size_t plen = par ? strlen(par) : 0;
    char kind[32];
    if (klen >= sizeof(kind))
        return hs__err(HS_EINVAL, "topology '%.64s': unknown kind (expected %s)", spec, KINDS);
    memcpy(kind, spec, klen);
    kind[klen] = '\0';
    int takes = !strcmp(kind, "torus") || !strcmp(kind, "regular") || !strcmp(kind, "two-cluster");
    int known = takes || !strcmp(kind, "ring") || !strcmp(kind, "hypercube") ||
                !strcmp(kind, "exponential") || !strcmp(kind, "onepeer-exp") ||
                !strcmp(kind, "complete");
    if (!known)
        return hs__err(HS_EINVAL, "topology '%.64s': unknown kind '%s' (expected %s)", spec, kind,
                       KINDS);
    if (par && !takes)
        return hs__err(HS_EINVAL, "topology '%.64s': %s takes no parameters", spec, kind);

    int rows = 0, cols = 0, degree = -1, bridges = 2;
    if (!strcmp(kind, "torus")) {
        if (par) {
            const char *x = memchr(par, 'x', plen);
            if (!x || parse_num(par, (size_t)(x - par), 1, HS_TOPO_MAX_PEERS, &rows) < 0 ||
                parse_num(x + 1, plen - (size_t)(x + 1 - par), 1, HS_TOPO_MAX_PEERS, &cols) < 0)
                return hs__err(HS_EINVAL,
                               "topology '%.64s': expected torus:RxC with R and C in 1..%d", spec,
                               HS_TOPO_MAX_PEERS);
            if ((long)rows * cols > HS_TOPO_MAX_PEERS)
                return hs__err(HS_EINVAL, "topology '%.64s': %ld peers (at most %d)", spec,
                               (long)rows * cols, HS_TOPO_MAX_PEERS);
            if (n == 0) n = rows * cols;
            if (n != rows * cols)
                return hs__err(HS_EINVAL, "topology '%.64s': %dx%d is %d peers, not %d", spec,
                               rows, cols, rows * cols, n);
        } else if (n > 0) {
            /* The most square factorisation. */
            for (rows = 1; (long)(rows + 1) * (rows + 1) <= n; rows++) {}
            while (n % rows) rows--;
            cols = n / rows;
        }
    } else if (!strcmp(kind, "regular")) {
        if (!par || parse_num(par, plen, 0, HS_TOPO_MAX_PEERS, &degree) < 0)
            return hs__err(HS_EINVAL, "topology '%.64s': expected regular:D with a degree D >= 0",
                           spec);
    } else if (!strcmp(kind, "two-cluster") && par) {
        if (parse_num(par, plen, 1, HS_TOPO_MAX_PEERS, &bridges) < 0)
            return hs__err(HS_EINVAL,
                           "topology '%.64s': expected two-cluster:BRIDGES with BRIDGES >= 1",
                           spec);
    }
    if (n <= 0)
        return hs__err(HS_EINVAL, "topology '%.64s': needs a number of peers (got %d)", spec, n);
    if (n > HS_TOPO_MAX_PEERS)
        return hs__err(HS_EINVAL, "topology '%.64s': %d peers (at most %d)", spec, n,
                       HS_TOPO_MAX_PEERS);

    /* The size of W's off-diagonal part before building it. */
    double arcs_needed = 0;
    if (!strcmp(kind, "complete") || !strcmp(kind, "two-cluster"))
        arcs_needed = (double)n * (n - 1);
    else if (!strcmp(kind, "regular"))
        arcs_needed = (double)n * degree;
    else if (!strcmp(kind, "exponential"))
        arcs_needed = 2.0 * n * log2_ceil(n);
    if (!strcmp(kind, "two-cluster")) arcs_needed /= 2;
    if (arcs_needed > HS_TOPO_MAX_ARCS)
        return hs__err(HS_EINVAL, "topology '%.64s': %d peers need %.0f matrix entries (at most %d)",
                       spec, n, arcs_needed, HS_TOPO_MAX_ARCS);

    char name[HS_TOPO_MAX_STR + 1];
    arcvec v = {0};
    int err = 0, directed = 0, period = 1;
    hs_topo *t = NULL;
    hs__arc *rounds_arcs = NULL;
    if (!strcmp(kind, "ring")) {
        snprintf(name, sizeof(name), "ring-%d", n);
        for (int i = 0; i < n; i++) edge(&v, i, (i + 1) % n);
    } else if (!strcmp(kind, "torus")) {
        snprintf(name, sizeof(name), "torus-%dx%d", rows, cols);
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                edge(&v, r * cols + c, ((r + 1) % rows) * cols + c);
                edge(&v, r * cols + c, r * cols + (c + 1) % cols);
            }
    } else if (!strcmp(kind, "hypercube")) {
        if (!is_pow2(n))
            return hs__err(HS_EINVAL, "topology '%.64s': %d peers is not a power of 2", spec, n);
        snprintf(name, sizeof(name), "hypercube-%d", n);
        for (int i = 0; i < n; i++)
            for (int b = 1; b < n; b <<= 1)
                if (i < (i ^ b)) edge(&v, i, i ^ b);
    } else if (!strcmp(kind, "exponential")) {
        snprintf(name, sizeof(name), "exponential-%d", n);
        for (int i = 0; i < n; i++)
            for (long s = 1; s < n; s <<= 1) edge(&v, i, (int)((i + s) % n));
    } else if (!strcmp(kind, "complete")) {
        snprintf(name, sizeof(name), "complete-%d", n);
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++) edge(&v, i, j);
    } else if (!strcmp(kind, "regular")) {
        snprintf(name, sizeof(name), "regular-%d-d%d", n, degree);
        if ((err = gen_regular(&v, n, degree, seed, spec)) < 0) goto done;
    } else if (!strcmp(kind, "two-cluster")) {
        int a = n / 2, b = n - a;
        if (n < 2)
            return hs__err(HS_EINVAL, "topology '%.64s': needs at least 2 peers (got %d)", spec, n);
        if (bridges > a)
            return hs__err(HS_EINVAL,
                           "topology '%.64s': %d bridges between clusters of %d and %d peers (at "
                           "most %d)",
                           spec, bridges, a, b, a);
        if (bridges == 2) snprintf(name, sizeof(name), "two-cluster-%d", n);
        else snprintf(name, sizeof(name), "two-cluster-%d-b%d", n, bridges);
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if ((i < a) == (j < a)) edge(&v, i, j);
        /* Bridge endpoints spread evenly over each cluster, so no peer carries two of them. */
        for (int k = 0; k < bridges; k++)
            edge(&v, (int)((long)k * a / bridges), a + (int)((long)k * b / bridges));
    } else { /* onepeer-exp */
        /* Round t: i sends half its mass to i + 2^(t mod P), P = ceil(log2 n) (Assran et al.,
         * "Stochastic Gradient Push", ICML 2019). For n a power of 2 the product over one period
         * is exactly the average; for other n it still mixes (the union holds the ring). */
        directed = 1;
        period = n > 1 ? log2_ceil(n) : 1;
        snprintf(name, sizeof(name), "onepeer-exp-%d", n);
    }
    if (v.oom) {
        err = hs__err(HS_ENOMEM, "topology '%.64s': out of memory", spec);
        goto done;
    }
    if (!(t = hs__topo_alloc(n, directed, period, name))) {
        err = hs__err(HS_ENOMEM, "topology '%.64s': out of memory", spec);
        goto done;
    }
    t->default_weights = 1;
    if (directed) {
        if (!(rounds_arcs = malloc((size_t)n * sizeof(*rounds_arcs)))) {
            err = hs__err(HS_ENOMEM, "topology '%.64s': out of memory", spec);
            goto done;
        }
        for (int r = 0; r < period; r++) {
            size_t m = 0;
            for (int i = 0; n > 1 && i < n; i++)
                rounds_arcs[m++] = (hs__arc){(int)((i + (1L << r)) % n), i, 0};
            if ((err = hs__topo_default_weights(n, 1, rounds_arcs, m)) < 0) goto done;
            if ((err = hs__topo_set_round(t, r, rounds_arcs, m, NULL)) < 0) goto done;
        }
    } else {
        v.m = hs__arcs_unique(v.a, v.m);
        if ((err = hs__topo_default_weights(n, 0, v.a, v.m)) < 0) goto done;
        if ((err = hs__topo_set_round(t, 0, v.a, v.m, NULL)) < 0) goto done;
    }
    *out = t;
    t = NULL;
done:
    free(v.a);
    free(rounds_arcs);
    hs_topo_free(t);
    return err;
}
