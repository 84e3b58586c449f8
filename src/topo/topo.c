/* Topologies: the sparse two-way (rows and columns) storage of each round's mixing matrix,
 * default weights, dense matrices, per-rank views, restriction to survivors, addresses and
 * link emulation lookups. A built topology is read-only, so queries are thread-safe. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "topo/topo_internal.h"

hs_topo *hs__topo_alloc(int n, int directed, int period, const char *name) {
    hs_topo *t = calloc(1, sizeof(*t));
    if (!t) return NULL;
    t->n = n;
    t->directed = directed ? 1 : 0;
    t->period = period;
    snprintf(t->name, sizeof(t->name), "%s", name ? name : "");
    if (!(t->g = calloc((size_t)period, sizeof(*t->g)))) {
        free(t);
        return NULL;
    }
    return t;
}

static void graph_free(hs__tgraph *g) {
    free(g->rp);
    free(g->ri);
    free(g->rw);
    free(g->cp);
    free(g->ci);
    free(g->cw);
    free(g->self);
}

void hs_topo_free(hs_topo *t) {
    if (!t) return;
    for (int r = 0; t->g && r < t->period; r++) graph_free(&t->g[r]);
    free(t->g);
    if (t->addr)
        for (int i = 0; i < t->n; i++) free(t->addr[i]);
    free(t->addr);
    free(t->emu_default);
    if (t->emu_peer)
        for (int i = 0; i < t->n; i++) free(t->emu_peer[i]);
    free(t->emu_peer);
    for (size_t k = 0; k < t->n_emu; k++) free(t->emu[k].spec);
    free(t->emu);
    free(t);
}

int hs_topo_n(const hs_topo *t) { return t->n; }
int hs_topo_directed(const hs_topo *t) { return t->directed; }
int hs_topo_period(const hs_topo *t) { return t->period; }
const char *hs_topo_name(const hs_topo *t) { return t->name; }

int hs_topo_spec_is_file(const char *spec) {
    size_t k = strlen(spec);
    return k >= 5 && !strcmp(spec + k - 5, ".json");
}

int hs_topo_set_name(hs_topo *t, const char *name) {
    char why[128];
    size_t len = name ? strlen(name) : 0;
    if (!len) return hs__err(HS_EINVAL, "topology name: empty");
    if (!hs__topo_str_ok(name, len, 1, why, sizeof(why)))
        return hs__err(HS_EINVAL, "topology name: %s", why);
    memcpy(t->name, name, len + 1);
    return 0;
}

int hs__topo_set_round(hs_topo *t, int r, const hs__arc *a, size_t m, const double *self) {
    int n = t->n, err = 0;
    hs__tgraph *g = &t->g[r];
    size_t m1 = m ? m : 1, n1 = (size_t)n + 1;
    size_t *pos = malloc(n1 * sizeof(size_t));
    int *ti = malloc(m1 * sizeof(int)), *tj = malloc(m1 * sizeof(int));
    double *tw = malloc(m1 * sizeof(double));
    /* On failure the round's arrays stay with t, which hs_topo_free releases. */
    g->nnz = m;
    g->rp = calloc(n1, sizeof(size_t));
    g->cp = calloc(n1, sizeof(size_t));
    g->ri = malloc(m1 * sizeof(int));
    g->rw = malloc(m1 * sizeof(double));
    g->ci = malloc(m1 * sizeof(int));
    g->cw = malloc(m1 * sizeof(double));
    g->self = malloc((size_t)n * sizeof(double));
    if (!g->rp || !g->cp || !g->ri || !g->rw || !g->ci || !g->cw || !g->self || !pos || !ti ||
        !tj || !tw) {
        err = hs__err(HS_ENOMEM, "topology %s: out of memory for %zu entries", t->name, m);
        goto done;
    }
    for (size_t k = 0; k < m; k++) {
        g->rp[a[k].i + 1]++;
        g->cp[a[k].j + 1]++;
    }
    for (int i = 0; i < n; i++) {
        g->rp[i + 1] += g->rp[i];
        g->cp[i + 1] += g->cp[i];
    }
    /* Bucket by column in input order, then by row in column order (rows come out sorted by
     * column), then by column again in row order (columns sorted by row): three linear passes
     * instead of a comparison sort. */
    memcpy(pos, g->cp, n1 * sizeof(size_t));
    for (size_t k = 0; k < m; k++) {
        size_t p = pos[a[k].j]++;
        ti[p] = a[k].i;
        tj[p] = a[k].j;
        tw[p] = a[k].w;
    }
    memcpy(pos, g->rp, n1 * sizeof(size_t));
    for (size_t p = 0; p < m; p++) {
        size_t q = pos[ti[p]]++;
        g->ri[q] = tj[p];
        g->rw[q] = tw[p];
    }
    memcpy(pos, g->cp, n1 * sizeof(size_t));
    for (int i = 0; i < n; i++)
        for (size_t q = g->rp[i]; q < g->rp[i + 1]; q++) {
            size_t c = pos[g->ri[q]]++;
            g->ci[c] = i;
            g->cw[c] = g->rw[q];
        }
    for (int i = 0; i < n; i++) {
        if (self) {
            g->self[i] = self[i];
            continue;
        }
        double s = 0;
        if (t->directed)
            for (size_t q = g->cp[i]; q < g->cp[i + 1]; q++) s += g->cw[q];
        else
            for (size_t q = g->rp[i]; q < g->rp[i + 1]; q++) s += g->rw[q];
        g->self[i] = 1.0 - s;
    }
done:
    free(pos);
    free(ti);
    free(tj);
    free(tw);
    return err;
}

int hs__topo_default_weights(int n, int directed, hs__arc *a, size_t m) {
    int *deg = calloc((size_t)n, sizeof(int));
    if (!deg) return hs__err(HS_ENOMEM, "topology: out of memory");
    /* Undirected arcs come in both directions, so counting receivers counts neighbours. */
    for (size_t k = 0; k < m; k++) deg[directed ? a[k].j : a[k].i]++;
    for (size_t k = 0; k < m; k++) {
        int d = directed ? deg[a[k].j] : (deg[a[k].i] > deg[a[k].j] ? deg[a[k].i] : deg[a[k].j]);
        a[k].w = 1.0 / (1.0 + d);
    }
    free(deg);
    return 0;
}

static int arc_cmp(const void *x, const void *y) {
    const hs__arc *a = x, *b = y;
    if (a->i != b->i) return a->i < b->i ? -1 : 1;
    return (a->j > b->j) - (a->j < b->j);
}

size_t hs__arcs_unique(hs__arc *a, size_t m) {
    if (!m) return 0;
    qsort(a, m, sizeof(*a), arc_cmp);
    size_t k = 1;
    for (size_t p = 1; p < m; p++)
        if (a[p].i != a[k - 1].i || a[p].j != a[k - 1].j) a[k++] = a[p];
    return k;
}

static int round_of(const hs_topo *t, uint64_t round) { return (int)(round % (uint64_t)t->period); }

int hs_topo_matrix(const hs_topo *t, uint64_t round, double *W) {
    const hs__tgraph *g = &t->g[round_of(t, round)];
    size_t n = (size_t)t->n;
    memset(W, 0, n * n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        W[i * n + i] = g->self[i];
        for (size_t q = g->rp[i]; q < g->rp[i + 1]; q++) W[i * n + (size_t)g->ri[q]] = g->rw[q];
    }
    return 0;
}

int hs_topo_view(const hs_topo *t, int rank, uint64_t round, hs_view *v) {
    memset(v, 0, sizeof(*v));
    if (rank < 0 || rank >= t->n)
        return hs__err(HS_EINVAL, "topology %s: rank %d is not in [0, %d)", t->name, rank, t->n);
    const hs__tgraph *g = &t->g[round_of(t, round)];
    size_t ni = g->rp[rank + 1] - g->rp[rank], no = g->cp[rank + 1] - g->cp[rank];
    v->rank = rank;
    v->n = t->n;
    v->self_w = g->self[rank];
    v->in = malloc((ni ? ni : 1) * sizeof(hs_edge));
    v->out = malloc((no ? no : 1) * sizeof(hs_edge));
    if (!v->in || !v->out) {
        hs_view_free(v);
        return hs__err(HS_ENOMEM, "topology %s: out of memory", t->name);
    }
    for (size_t k = 0; k < ni; k++) {
        v->in[k].peer = g->ri[g->rp[rank] + k];
        v->in[k].w = g->rw[g->rp[rank] + k];
    }
    for (size_t k = 0; k < no; k++) {
        v->out[k].peer = g->ci[g->cp[rank] + k];
        v->out[k].w = g->cw[g->cp[rank] + k];
    }
    v->n_in = (int)ni;
    v->n_out = (int)no;
    return 0;
}

void hs_view_free(hs_view *v) {
    if (!v) return;
    free(v->in);
    free(v->out);
    v->in = v->out = NULL;
    v->n_in = v->n_out = 0;
}

int hs__topo_has_arc(const hs_topo *t, int i, int j) {
    for (int r = 0; r < t->period; r++) {
        const hs__tgraph *g = &t->g[r];
        size_t lo = g->rp[i], hi = g->rp[i + 1];
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (g->ri[mid] < j) lo = mid + 1;
            else hi = mid;
        }
        if (lo < g->rp[i + 1] && g->ri[lo] == j && g->rw[lo] > 0) return 1;
    }
    return 0;
}

const char *hs_topo_address(const hs_topo *t, int rank) {
    if (!t->addr || rank < 0 || rank >= t->n) return NULL;
    return t->addr[rank];
}

static int link_cmp(const void *x, const void *y) {
    const hs__emu_link *a = x, *b = y;
    if (a->from != b->from) return a->from < b->from ? -1 : 1;
    return (a->to > b->to) - (a->to < b->to);
}

const char *hs_topo_link_emulation(const hs_topo *t, int from, int to) {
    if (from < 0 || from >= t->n || to < 0 || to >= t->n) return NULL;
    const char *s = t->emu_default;
    if (t->emu_peer && t->emu_peer[from]) s = t->emu_peer[from];
    hs__emu_link key = {from, to, NULL};
    const hs__emu_link *l = t->n_emu ? bsearch(&key, t->emu, t->n_emu, sizeof(key), link_cmp) : NULL;
    if (l) s = l->spec;
    return s && *s ? s : NULL;
}

int hs_topo_has_emulation(const hs_topo *t) {
    return t->emu_default || t->emu_peer || t->n_emu;
}

int hs__topo_set_emulation(hs_topo *t, char *dflt, char **peer, hs__emu_link *links, size_t m) {
    if (m) qsort(links, m, sizeof(*links), link_cmp);
    t->emu_default = dflt;
    t->emu_peer = peer;
    t->emu = links;
    t->n_emu = m;
    return 0;
}

static char *dup_or_null(const char *s, int *oom) {
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *oom = 1;
    return d;
}

int hs_topo_restrict(hs_topo **out, const hs_topo *t, const uint8_t *alive) {
    *out = NULL;
    int n = t->n, m = 0;
    int *map = malloc((size_t)n * sizeof(int));
    hs__arc *arcs = NULL;
    hs_topo *u = NULL;
    int err = HS_ENOMEM, oom = 0;
    if (!map) goto fail;
    for (int i = 0; i < n; i++) map[i] = alive[i] ? m++ : -1;
    if (m == 0) {
        err = hs__err(HS_EINVAL, "topology %s: no rank is alive", t->name);
        goto fail;
    }
    size_t maxnnz = 1;
    for (int r = 0; r < t->period; r++)
        if (t->g[r].nnz > maxnnz) maxnnz = t->g[r].nnz;
    if (!(arcs = malloc(maxnnz * sizeof(*arcs)))) goto fail;
    if (!(u = hs__topo_alloc(m, t->directed, t->period, t->name))) goto fail;
    u->default_weights = 1;
    for (int r = 0; r < t->period; r++) {
        const hs__tgraph *g = &t->g[r];
        size_t k = 0;
        for (int i = 0; i < n; i++) {
            if (map[i] < 0) continue;
            for (size_t q = g->rp[i]; q < g->rp[i + 1]; q++)
                if (map[g->ri[q]] >= 0 && g->rw[q] > 0)
                    arcs[k++] = (hs__arc){map[i], map[g->ri[q]], 0};
        }
        if ((err = hs__topo_default_weights(m, t->directed, arcs, k)) < 0) goto fail;
        if ((err = hs__topo_set_round(u, r, arcs, k, NULL)) < 0) goto fail;
    }
    err = HS_ENOMEM;
    if (t->addr) {
        if (!(u->addr = calloc((size_t)m, sizeof(char *)))) goto fail;
        for (int i = 0; i < n; i++)
            if (map[i] >= 0) u->addr[map[i]] = dup_or_null(t->addr[i], &oom);
    }
    u->emu_default = dup_or_null(t->emu_default, &oom);
    if (t->emu_peer) {
        if (!(u->emu_peer = calloc((size_t)m, sizeof(char *)))) goto fail;
        for (int i = 0; i < n; i++)
            if (map[i] >= 0) u->emu_peer[map[i]] = dup_or_null(t->emu_peer[i], &oom);
    }
    if (t->n_emu) {
        if (!(u->emu = calloc(t->n_emu, sizeof(*u->emu)))) goto fail;
        for (size_t k = 0; k < t->n_emu; k++) {
            const hs__emu_link *l = &t->emu[k];
            if (map[l->from] < 0 || map[l->to] < 0) continue;
            /* Renumbering is monotone, so the table stays sorted. */
            u->emu[u->n_emu].from = map[l->from];
            u->emu[u->n_emu].to = map[l->to];
            u->emu[u->n_emu++].spec = dup_or_null(l->spec, &oom);
        }
    }
    if (oom) goto fail;
    free(map);
    free(arcs);
    *out = u;
    return 0;
fail:
    if (err == HS_ENOMEM) hs__err(HS_ENOMEM, "topology %s: out of memory", t->name);
    free(map);
    free(arcs);
    hs_topo_free(u);
    return err;
}

/* ------------------------------------------------------------------ small helpers */

void hs__sb_printf(hs__sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && (size_t)k < room) {
            b->len += (size_t)k;
            return;
        }
        size_t cap = b->cap ? b->cap : 4096;
        while (cap - b->len <= (size_t)k) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

void hs__sb_json_str(hs__sbuf *b, const char *s) {
    hs__sb_printf(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') hs__sb_printf(b, "\\%c", c);
        else if (c < 0x20 || c > 0x7e) hs__sb_printf(b, "\\u%04x", c);
        else hs__sb_printf(b, "%c", c);
    }
    hs__sb_printf(b, "\"");
}

int hs__topo_str_ok(const char *s, size_t len, int allow_space, char *why, size_t whylen) {
    if (len > HS_TOPO_MAX_STR) {
        snprintf(why, whylen, "%zu characters (at most %d)", len, HS_TOPO_MAX_STR);
        return 0;
    }
    for (size_t k = 0; k < len; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c < 0x20 || c > 0x7e || (!allow_space && c == ' ')) {
            snprintf(why, whylen, "character 0x%02x at offset %zu is not %s", c, k,
                     allow_space ? "printable ASCII" : "printable ASCII without spaces");
            return 0;
        }
    }
    return 1;
}
