/* Topology files (JSON, read with cJSON; format in docs/TOPOLOGY.md) and hs_topo_new, which
 * picks between a file and a generator. Every value is checked before use and every error
 * names the field and the value; nothing here trusts the file. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error_internal.h"
#include "topo/topo_internal.h"

typedef struct ctx {
    const char *name; /* error prefix */
    int n, directed;
    int weights;          /* -1: not known yet, 0: no edge has a weight, 1: all have one */
    char weights_at[128]; /* the field that decided it */
} ctx;

static int bad(const ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const ctx *c, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return hs__err(HS_EINVAL, "%s: %s", c->name, msg);
}

/* A short rendering of a JSON value for messages: its type and, for scalars, the value. */
static const char *describe(const cJSON *v, char *buf, size_t len) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsTrue(v)) return "true";
    if (cJSON_IsFalse(v)) return "false";
    if (cJSON_IsNumber(v)) {
        snprintf(buf, len, "number %g", v->valuedouble);
        return buf;
    }
    if (cJSON_IsString(v)) {
        char s[41];
        size_t k = 0;
        for (const char *p = v->valuestring; *p && k < sizeof(s) - 1; p++)
            s[k++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
        s[k] = '\0';
        snprintf(buf, len, "string \"%s\"%s", s, strlen(v->valuestring) > k ? "..." : "");
        return buf;
    }
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

/* A JSON key for messages: non-printable bytes as '?', at most 40 characters. */
static const char *show_key(const char *s, char *buf, size_t len) {
    size_t k = 0;
    for (; s[k] && k < 40 && k + 4 < len; k++)
        buf[k] = (s[k] >= 0x20 && s[k] < 0x7f) ? s[k] : '?';
    snprintf(buf + k, len - k, "%s", s[k] ? "..." : "");
    return buf;
}

/* An integer-valued number in [lo, hi]. */
static int get_int(const ctx *c, const cJSON *v, const char *field, const char *what, int lo,
                   int hi, int *out) {
    char d[96];
    if (!cJSON_IsNumber(v))
        return bad(c, "%s: expected %s, got %s", field, what, describe(v, d, sizeof(d)));
    double x = v->valuedouble;
    if (!isfinite(x) || x != floor(x)) return bad(c, "%s: %g is not an integer", field, x);
    if (x < lo || x > hi) return bad(c, "%s: %g is not in %d..%d", field, x, lo, hi);
    *out = (int)x;
    return 0;
}

static int get_rank(const ctx *c, const cJSON *v, const char *field, int *out) {
    char d[96];
    if (!cJSON_IsNumber(v))
        return bad(c, "%s: expected a peer rank, got %s", field, describe(v, d, sizeof(d)));
    double x = v->valuedouble;
    if (!isfinite(x) || x != floor(x)) return bad(c, "%s: peer %g is not an integer", field, x);
    if (x < 0 || x >= c->n)
        return bad(c, "%s: peer %g is out of range (%d peers: 0..%d)", field, x, c->n, c->n - 1);
    *out = (int)x;
    return 0;
}

/* The two ranks of an edge entry x[0], x[1] of field f ("edges[3]"), each named in errors. */
static int get_ends(const ctx *c, const cJSON *const *x, const char *f, int *i, int *j) {
    char fi[112];
    int err;
    snprintf(fi, sizeof(fi), "%s[0]", f);
    if ((err = get_rank(c, x[0], fi, i)) < 0) return err;
    snprintf(fi, sizeof(fi), "%s[1]", f);
    return get_rank(c, x[1], fi, j);
}

/* A weight in (0, 1] (edges) or [0, 1] (self weights). */
static int get_weight(const ctx *c, const cJSON *v, const char *field, int zero_ok, double *out) {
    char d[96];
    if (!cJSON_IsNumber(v))
        return bad(c, "%s: expected a weight, got %s", field, describe(v, d, sizeof(d)));
    double w = v->valuedouble;
    if (!isfinite(w)) return bad(c, "%s: weight %g is not finite", field, w);
    if (w < 0) return bad(c, "%s: weight %g is negative", field, w);
    if (w == 0 && !zero_ok)
        return bad(c, "%s: weight 0 is zero (leave the edge out instead)", field);
    if (w > 1) return bad(c, "%s: weight %g is greater than 1", field, w);
    *out = w;
    return 0;
}

static int get_string(const ctx *c, const cJSON *v, const char *field, int allow_space,
                      int allow_empty, const char **out) {
    char d[96], why[128];
    if (!cJSON_IsString(v) || !v->valuestring)
        return bad(c, "%s: expected a string, got %s", field, describe(v, d, sizeof(d)));
    const char *s = v->valuestring;
    if (!*s && !allow_empty) return bad(c, "%s: empty string", field);
    if (!hs__topo_str_ok(s, strlen(s), allow_space, why, sizeof(why)))
        return bad(c, "%s: %s", field, why);
    *out = s;
    return 0;
}

typedef struct keyed {
    long key;
    int idx;
} keyed;

static int keyed_cmp(const void *x, const void *y) {
    const keyed *a = x, *b = y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* The arcs of one edge list: [from, to] or [from, to, weight]. Undirected edges give both
 * arcs. field is "edges" or "schedule[r].edges". *total counts arcs over all rounds. */
static int parse_edges(ctx *c, const cJSON *arr, const char *field, hs__arc **out, size_t *m,
                       size_t *total) {
    char d[96], f[96];
    *out = NULL;
    *m = 0;
    if (!cJSON_IsArray(arr))
        return bad(c, "%s: expected an array of edges, got %s", field, describe(arr, d, sizeof(d)));
    size_t ne = 0;
    for (const cJSON *e = arr->child; e; e = e->next) ne++;
    size_t per = c->directed ? 1 : 2;
    if (ne * per > HS_TOPO_MAX_ARCS || *total + ne * per > HS_TOPO_MAX_ARCS)
        return bad(c, "%s: %zu edges (at most %d matrix entries in all)", field, ne,
                   HS_TOPO_MAX_ARCS);
    *total += ne * per;
    hs__arc *a = malloc((ne ? ne : 1) * per * sizeof(*a));
    keyed *keys = malloc((ne ? ne : 1) * sizeof(*keys));
    int *from = malloc((ne ? ne : 1) * sizeof(int)), *to = malloc((ne ? ne : 1) * sizeof(int));
    int err = 0;
    if (!a || !keys || !from || !to) {
        err = hs__err(HS_ENOMEM, "%s: %s: out of memory", c->name, field);
        goto done;
    }
    size_t k = 0;
    for (const cJSON *e = arr->child; e; e = e->next, k++) {
        snprintf(f, sizeof(f), "%s[%zu]", field, k);
        int len = 0;
        const cJSON *x[3] = {NULL, NULL, NULL};
        if (cJSON_IsArray(e))
            for (const cJSON *y = e->child; y; y = y->next) {
                if (len < 3) x[len] = y;
                len++;
            }
        if (!cJSON_IsArray(e) || len < 2 || len > 3) {
            err = bad(c, "%s: expected [from, to] or [from, to, weight], got %s", f,
                      cJSON_IsArray(e) ? (len < 2 ? "a shorter array" : "a longer array")
                                       : describe(e, d, sizeof(d)));
            goto done;
        }
        int i, j;
        if ((err = get_ends(c, x, f, &i, &j)) < 0) goto done;
        if (i == j) {
            err = bad(c, "%s: self edge %d-%d (a peer's own weight is self_weight)", f, i, j);
            goto done;
        }
        int has_w = len == 3;
        if (c->weights < 0) {
            c->weights = has_w;
            snprintf(c->weights_at, sizeof(c->weights_at), "%s", f);
        } else if (c->weights != has_w) {
            err = bad(c, "%s: has %s weight but %s has %s (give every edge a weight, or none)",
                      f, has_w ? "a" : "no", c->weights_at, c->weights ? "one" : "none");
            goto done;
        }
        double w = 0;
        if (has_w && (err = get_weight(c, x[2], f, 0, &w)) < 0) goto done;
        /* Edge from -> to: to mixes from's value, W[to][from] = w (the same entry as W[from][to]
         * when undirected). */
        from[k] = i;
        to[k] = j;
        a[*m] = (hs__arc){j, i, w};
        (*m)++;
        if (!c->directed) a[(*m)++] = (hs__arc){i, j, w};
        int lo = c->directed || i < j ? i : j, hi = c->directed || i < j ? j : i;
        keys[k] = (keyed){(long)lo * c->n + hi, (int)k};
    }
    qsort(keys, ne, sizeof(*keys), keyed_cmp);
    for (size_t q = 1; q < ne; q++)
        if (keys[q].key == keys[q - 1].key) {
            int p = keys[q].idx;
            err = bad(c, "%s[%d]: edge %d%s%d duplicates %s[%d]", field, p, from[p],
                      c->directed ? "->" : "-", to[p], field, keys[q - 1].idx);
            goto done;
        }
done:
    free(keys);
    free(from);
    free(to);
    if (err < 0) {
        free(a);
        *m = 0;
        return err;
    }
    *out = a;
    return 0;
}

/* "auto" (or absent): NULL; a number: the same for every peer; an array: one per peer. */
static int parse_self(const ctx *c, const cJSON *v, const char *field, double **out) {
    char d[96], f[128];
    *out = NULL;
    if (!v || (cJSON_IsString(v) && v->valuestring && !strcmp(v->valuestring, "auto"))) return 0;
    if (!cJSON_IsNumber(v) && !cJSON_IsArray(v))
        return bad(c, "%s: expected \"auto\", a weight or an array of %d weights, got %s", field,
                   c->n, describe(v, d, sizeof(d)));
    if (c->weights == 0)
        return bad(c, "%s: explicit self weights need explicit edge weights (without them the "
                   "weights are Metropolis-Hastings and %s must be \"auto\")", field, field);
    double *s = malloc((size_t)c->n * sizeof(double));
    int err = 0;
    if (!s) return hs__err(HS_ENOMEM, "%s: out of memory", c->name);
    if (cJSON_IsNumber(v)) {
        if ((err = get_weight(c, v, field, 1, &s[0])) < 0) goto fail;
        for (int i = 1; i < c->n; i++) s[i] = s[0];
    } else if (cJSON_IsArray(v)) {
        int k = 0;
        for (const cJSON *y = v->child; y; y = y->next) k++;
        if (k != c->n) {
            err = bad(c, "%s: %d entries for %d peers", field, k, c->n);
            goto fail;
        }
        k = 0;
        for (const cJSON *y = v->child; y; y = y->next, k++) {
            snprintf(f, sizeof(f), "%s[%d]", field, k);
            if ((err = get_weight(c, y, f, 1, &s[k])) < 0) goto fail;
        }
    } else {
        err = bad(c, "%s: expected \"auto\", a weight or an array of %d weights, got %s", field,
                  c->n, describe(v, d, sizeof(d)));
        goto fail;
    }
    *out = s;
    return 0;
fail:
    free(s);
    return err;
}

static int str_cmp_idx(const void *x, const void *y, void *arg) {
    char **s = arg;
    int a = *(const int *)x, b = *(const int *)y;
    int c = strcmp(s[a], s[b]);
    return c ? c : (a > b) - (a < b);
}

static int parse_addresses(const ctx *c, const cJSON *v, hs_topo *t) {
    char d[96], f[64];
    int k = 0, err = 0;
    int *order = NULL;
    if (!cJSON_IsArray(v))
        return bad(c, "addresses: expected an array of %d strings, got %s", c->n,
                   describe(v, d, sizeof(d)));
    for (const cJSON *y = v->child; y; y = y->next) k++;
    if (k != c->n) return bad(c, "addresses: %d entries for %d peers", k, c->n);
    if (!(t->addr = calloc((size_t)c->n, sizeof(char *))) ||
        !(order = malloc((size_t)c->n * sizeof(int))))
        goto oom;
    k = 0;
    for (const cJSON *y = v->child; y; y = y->next, k++) {
        const char *s = NULL;
        snprintf(f, sizeof(f), "addresses[%d]", k);
        if ((err = get_string(c, y, f, 0, 0, &s)) < 0) goto done;
        if (!(t->addr[k] = strdup(s))) goto oom;
        order[k] = k;
    }
    qsort_r(order, (size_t)c->n, sizeof(int), str_cmp_idx, t->addr);
    for (int q = 1; q < c->n; q++)
        if (!strcmp(t->addr[order[q]], t->addr[order[q - 1]])) {
            err = bad(c, "addresses[%d]: \"%s\" duplicates addresses[%d]", order[q],
                      t->addr[order[q]], order[q - 1]);
            goto done;
        }
    goto done;
oom:
    err = hs__err(HS_ENOMEM, "%s: out of memory", c->name);
done:
    free(order);
    return err;
}

static int parse_emulate(const ctx *c, const cJSON *v, hs_topo *t) {
    char d[96], f[96];
    int err = 0;
    const char *s = NULL;
    char *dflt = NULL, **peer = NULL;
    hs__emu_link *links = NULL;
    keyed *keys = NULL;
    size_t nl = 0;
    const cJSON *vd = NULL, *vp = NULL, *ve = NULL;
    if (!cJSON_IsObject(v))
        return bad(c, "emulate: expected an object, got %s", describe(v, d, sizeof(d)));
    for (const cJSON *y = v->child; y; y = y->next) {
        const cJSON **slot = !strcmp(y->string, "default") ? &vd
                             : !strcmp(y->string, "peers") ? &vp
                             : !strcmp(y->string, "edges") ? &ve
                                                            : NULL;
        if (!slot)
            return bad(c, "emulate: unknown key \"%s\" (expected default, peers, edges)",
                       show_key(y->string, d, sizeof(d)));
        if (*slot) return bad(c, "emulate: duplicate key \"%s\"", y->string);
        *slot = y;
    }
    if (vd) {
        if ((err = get_string(c, vd, "emulate.default", 1, 1, &s)) < 0) goto done;
        if (!(dflt = strdup(s))) goto oom;
    }
    if (vp) {
        if (!cJSON_IsObject(vp)) {
            err = bad(c, "emulate.peers: expected an object {\"RANK\": \"SPEC\"}, got %s",
                      describe(vp, d, sizeof(d)));
            goto done;
        }
        if (!(peer = calloc((size_t)c->n, sizeof(char *)))) goto oom;
        for (const cJSON *y = vp->child; y; y = y->next) {
            const char *key = y->string;
            long r = 0;
            size_t kl = strlen(key);
            int ok = kl > 0 && kl <= 6 && !(kl > 1 && key[0] == '0');
            for (size_t q = 0; ok && q < kl; q++) {
                ok = key[q] >= '0' && key[q] <= '9';
                r = r * 10 + (key[q] - '0');
            }
            if (!ok || r >= c->n) {
                err = bad(c, "emulate.peers: key \"%s\" is not a peer rank (0..%d)",
                          show_key(key, d, sizeof(d)), c->n - 1);
                goto done;
            }
            snprintf(f, sizeof(f), "emulate.peers.%ld", r);
            if (peer[r]) {
                err = bad(c, "%s: peer %ld appears twice", f, r);
                goto done;
            }
            if ((err = get_string(c, y, f, 1, 1, &s)) < 0) goto done;
            if (!(peer[r] = strdup(s))) goto oom;
        }
    }
    if (ve) {
        if (!cJSON_IsArray(ve)) {
            err = bad(c, "emulate.edges: expected an array of [from, to, spec], got %s",
                      describe(ve, d, sizeof(d)));
            goto done;
        }
        size_t ne = 0;
        for (const cJSON *y = ve->child; y; y = y->next) ne++;
        if (!(links = calloc((ne ? ne : 1) * 2, sizeof(*links))) ||
            !(keys = malloc((ne ? ne : 1) * sizeof(*keys))))
            goto oom;
        size_t k = 0;
        for (const cJSON *e = ve->child; e; e = e->next, k++) {
            snprintf(f, sizeof(f), "emulate.edges[%zu]", k);
            const cJSON *x[3] = {NULL, NULL, NULL};
            int len = 0;
            if (cJSON_IsArray(e))
                for (const cJSON *y = e->child; y; y = y->next) {
                    if (len < 3) x[len] = y;
                    len++;
                }
            if (!cJSON_IsArray(e) || len != 3) {
                err = bad(c, "%s: expected [from, to, spec], got %s", f,
                          cJSON_IsArray(e) ? "an array of another length"
                                           : describe(e, d, sizeof(d)));
                goto done;
            }
            int i, j;
            char fi[112];
            if ((err = get_ends(c, x, f, &i, &j)) < 0) goto done;
            snprintf(fi, sizeof(fi), "%s[2]", f);
            if ((err = get_string(c, x[2], fi, 1, 1, &s)) < 0) goto done;
            const char *arrow = c->directed ? "->" : "-";
            if (i == j || !hs__topo_has_arc(t, j, i)) {
                err = bad(c, "%s: %d%s%d is not a link of the topology", f, i, arrow, j);
                goto done;
            }
            int lo = c->directed || i < j ? i : j, hi = c->directed || i < j ? j : i;
            keys[k] = (keyed){(long)lo * c->n + hi, (int)k};
            links[nl].from = i;
            links[nl].to = j;
            if (!(links[nl++].spec = strdup(s))) goto oom;
            if (!c->directed) {
                links[nl].from = j;
                links[nl].to = i;
                if (!(links[nl++].spec = strdup(s))) goto oom;
            }
        }
        qsort(keys, ne, sizeof(*keys), keyed_cmp);
        for (size_t q = 1; q < ne; q++)
            if (keys[q].key == keys[q - 1].key) {
                err = bad(c, "emulate.edges[%d]: link %ld%s%ld duplicates emulate.edges[%d]",
                          keys[q].idx, keys[q].key / c->n, c->directed ? "->" : "-",
                          keys[q].key % c->n, keys[q - 1].idx);
                goto done;
            }
    }
    hs__topo_set_emulation(t, dflt, peer, links, nl);
    free(keys);
    return 0;
oom:
    err = hs__err(HS_ENOMEM, "%s: out of memory", c->name);
done:
    free(dflt);
    if (peer)
        for (int i = 0; i < c->n; i++) free(peer[i]);
    free(peer);
    for (size_t q = 0; q < nl; q++) free(links[q].spec);
    free(links);
    free(keys);
    return err;
}

/* The topology's default name from the name given: no directory, no ".json". */
static void default_name(const char *name, char *out, size_t len) {
    const char *b = strrchr(name, '/');
    b = b ? b + 1 : name;
    size_t k = strlen(b);
    if (k > 5 && !strcmp(b + k - 5, ".json")) k -= 5;
    if (k >= len) k = len - 1;
    for (size_t q = 0; q < k; q++) out[q] = (b[q] >= 0x20 && b[q] < 0x7f) ? b[q] : '_';
    out[k] = '\0';
}

static void line_col(const char *buf, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *p = buf; p < at; p++) {
        if (*p == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

enum { K_NAME, K_DESC, K_PEERS, K_DIRECTED, K_EDGES, K_SELF, K_SCHEDULE, K_ADDR, K_EMU, K_N };
static const char *const top_keys[K_N] = {"name",        "description", "peers",
                                          "directed",    "edges",       "self_weight",
                                          "schedule",    "addresses",   "emulate"};

static int build(ctx *c, const cJSON *root, const char *name_hint, hs_topo **out) {
    char d[96], f[96];
    const cJSON *k[K_N] = {0};
    hs_topo *t = NULL;
    double *self = NULL;
    int err = 0;
    if (!cJSON_IsObject(root))
        return bad(c, "top level: expected an object, got %s", describe(root, d, sizeof(d)));
    for (const cJSON *y = root->child; y; y = y->next) {
        int q = 0;
        while (q < K_N && strcmp(y->string, top_keys[q])) q++;
        if (q == K_N)
            return bad(c, "unknown key \"%s\" (expected name, description, peers, directed, "
                       "edges, self_weight, schedule, addresses, emulate)",
                       show_key(y->string, d, sizeof(d)));
        if (k[q]) return bad(c, "duplicate key \"%s\"", top_keys[q]);
        k[q] = y;
    }
    char tname[HS_TOPO_MAX_STR + 1];
    if (k[K_NAME]) {
        const char *s;
        if ((err = get_string(c, k[K_NAME], "name", 1, 0, &s)) < 0) return err;
        snprintf(tname, sizeof(tname), "%s", s);
    } else {
        default_name(name_hint, tname, sizeof(tname));
    }
    if (k[K_DESC] && !cJSON_IsString(k[K_DESC]))
        return bad(c, "description: expected a string, got %s", describe(k[K_DESC], d, sizeof(d)));
    if (!k[K_PEERS]) return bad(c, "missing key \"peers\" (the number of peers)");
    if ((err = get_int(c, k[K_PEERS], "peers", "the number of peers", 1, HS_TOPO_MAX_PEERS,
                       &c->n)) < 0)
        return err;
    if (k[K_DIRECTED]) {
        if (!cJSON_IsBool(k[K_DIRECTED]))
            return bad(c, "directed: expected true or false, got %s",
                       describe(k[K_DIRECTED], d, sizeof(d)));
        c->directed = cJSON_IsTrue(k[K_DIRECTED]);
    }
    if (k[K_EDGES] && k[K_SCHEDULE])
        return bad(c, "both \"edges\" and \"schedule\" given (a static topology has edges, a "
                   "time-varying one a schedule)");
    if (!k[K_EDGES] && !k[K_SCHEDULE]) return bad(c, "missing key \"edges\" (or \"schedule\")");
    if (k[K_SCHEDULE] && k[K_SELF])
        return bad(c, "self_weight: give it inside each schedule entry");
    int period = 1;
    if (k[K_SCHEDULE]) {
        const cJSON *s = k[K_SCHEDULE];
        if (!cJSON_IsArray(s))
            return bad(c, "schedule: expected an array of rounds, got %s",
                       describe(s, d, sizeof(d)));
        period = 0;
        for (const cJSON *y = s->child; y; y = y->next) period++;
        if (period < 1 || period > HS_TOPO_MAX_PERIOD)
            return bad(c, "schedule: %d rounds (expected 1..%d)", period, HS_TOPO_MAX_PERIOD);
    }
    if ((long)period * c->n > HS_TOPO_MAX_CELLS)
        return bad(c, "schedule: %d rounds of %d peers is too large (rounds * peers at most %d)",
                   period, c->n, HS_TOPO_MAX_CELLS);
    if (!(t = hs__topo_alloc(c->n, c->directed, period, tname)))
        return hs__err(HS_ENOMEM, "%s: out of memory", c->name);

    /* Edges of every round first: whether weights are given is known only after all of them
     * (an explicit self weight needs explicit edge weights). */
    hs__arc **ra = calloc((size_t)period, sizeof(*ra));
    size_t *rm = calloc((size_t)period, sizeof(*rm));
    const cJSON **rself = calloc((size_t)period, sizeof(*rself));
    size_t total = 0;
    if (!ra || !rm || !rself) {
        err = hs__err(HS_ENOMEM, "%s: out of memory", c->name);
        goto done;
    }
    if (!k[K_SCHEDULE]) {
        if ((err = parse_edges(c, k[K_EDGES], "edges", &ra[0], &rm[0], &total)) < 0) goto done;
        rself[0] = k[K_SELF];
    } else {
        int r = 0;
        for (const cJSON *e = k[K_SCHEDULE]->child; e; e = e->next, r++) {
            snprintf(f, sizeof(f), "schedule[%d]", r);
            if (!cJSON_IsObject(e)) {
                err = bad(c, "%s: expected an object {\"edges\": [...]}, got %s", f,
                          describe(e, d, sizeof(d)));
                goto done;
            }
            const cJSON *ve = NULL;
            for (const cJSON *y = e->child; y; y = y->next) {
                const cJSON **slot = !strcmp(y->string, "edges")         ? &ve
                                     : !strcmp(y->string, "self_weight") ? &rself[r]
                                                                         : NULL;
                if (!slot) {
                    err = bad(c, "%s: unknown key \"%s\" (expected edges, self_weight)", f,
                              show_key(y->string, d, sizeof(d)));
                    goto done;
                }
                if (*slot) {
                    err = bad(c, "%s: duplicate key \"%s\"", f, y->string);
                    goto done;
                }
                *slot = y;
            }
            if (!ve) {
                err = bad(c, "%s: missing key \"edges\"", f);
                goto done;
            }
            snprintf(f, sizeof(f), "schedule[%d].edges", r);
            if ((err = parse_edges(c, ve, f, &ra[r], &rm[r], &total)) < 0) goto done;
        }
    }
    if (c->weights < 0) c->weights = 0; /* no edges at all */
    t->default_weights = !c->weights;
    for (int r = 0; r < period; r++) {
        if (k[K_SCHEDULE]) snprintf(f, sizeof(f), "schedule[%d].self_weight", r);
        else snprintf(f, sizeof(f), "self_weight");
        if ((err = parse_self(c, rself[r], f, &self)) < 0) goto done;
        if (self) t->default_weights = 0;
        if (!c->weights && (err = hs__topo_default_weights(c->n, c->directed, ra[r], rm[r])) < 0)
            goto done;
        if ((err = hs__topo_set_round(t, r, ra[r], rm[r], self)) < 0) goto done;
        free(self);
        self = NULL;
    }
    if (k[K_ADDR] && (err = parse_addresses(c, k[K_ADDR], t)) < 0) goto done;
    if (k[K_EMU] && (err = parse_emulate(c, k[K_EMU], t)) < 0) goto done;
    *out = t;
    t = NULL;
done:
    if (ra)
        for (int r = 0; r < period; r++) free(ra[r]);
    free(ra);
    free(rm);
    free(rself);
    free(self);
    hs_topo_free(t);
    return err;
}

int hs_topo_from_json(hs_topo **out, const char *buf, size_t len, const char *name,
                      unsigned flags) {
    ctx c = {.name = name ? name : "topology", .weights = -1};
    hs_topo *t = NULL;
    *out = NULL;
    if (len > HS_TOPO_MAX_FILE)
        return hs__err(HS_ERANGE, "%s: %zu bytes (a topology file is at most %d)", c.name, len,
                       HS_TOPO_MAX_FILE);
    /* cJSON gets a terminated copy, so no parser path can read past the input. */
    char *text = malloc(len + 1);
    if (!text) return hs__err(HS_ENOMEM, "%s: out of memory", c.name);
    memcpy(text, buf, len);
    text[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 0);
    int err = 0, line, col;
    if (!root) {
        if (!end || end < text || end > text + len) end = text + len;
        line_col(text, end, &line, &col);
        err = hs__err(HS_EFORMAT, "%s: not valid JSON (error at line %d, column %d)", c.name,
                      line, col);
        goto done;
    }
    for (const char *p = end ? end : text + len; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            line_col(text, p, &line, &col);
            err = hs__err(HS_EFORMAT, "%s: not valid JSON (trailing characters at line %d, "
                          "column %d)", c.name, line, col);
            goto done;
        }
    if ((err = build(&c, root, c.name, &t)) < 0) goto done;
    if (!(flags & HS_TOPO_LENIENT)) {
        hs_topo_report rep;
        if ((err = hs_topo_check(t, HS_TOPO_CHECK_NOGAP, &rep)) < 0) goto done;
        if (!rep.valid) {
            err = hs__err(HS_EINVAL, "%s: %s", c.name, rep.reason);
            goto done;
        }
    }
    *out = t;
    t = NULL;
done:
    cJSON_Delete(root);
    free(text);
    hs_topo_free(t);
    return err;
}

int hs_topo_load(hs_topo **out, const char *path, unsigned flags) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return hs__err(e == ENOENT ? HS_ENOENT : HS_EIO, "%s: cannot open: %s", path,
                       strerror(e));
    }
    struct stat sb;
    char *buf = NULL;
    int err = 0;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        err = hs__err(HS_EIO, "%s: not a regular file", path);
        goto done;
    }
    if (sb.st_size > HS_TOPO_MAX_FILE) {
        err = hs__err(HS_ERANGE, "%s: %lld bytes (a topology file is at most %d)", path,
                      (long long)sb.st_size, HS_TOPO_MAX_FILE);
        goto done;
    }
    size_t len = (size_t)sb.st_size;
    if (!(buf = malloc(len ? len : 1))) {
        err = hs__err(HS_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    if (fread(buf, 1, len, f) != len) {
        err = hs__err(HS_EIO, "%s: read failed", path);
        goto done;
    }
    err = hs_topo_from_json(out, buf, len, path, flags);
done:
    free(buf);
    fclose(f);
    return err;
}

int hs_topo_new(hs_topo **out, const char *spec, int n, uint64_t seed) {
    hs_topo *t = NULL;
    int err;
    *out = NULL;
    if (!spec) return hs__err(HS_EINVAL, "topology: no spec");
    if (hs_topo_spec_is_file(spec)) {
        if ((err = hs_topo_load(&t, spec, 0)) < 0) return err;
        if (n != 0 && n != t->n) {
            err = hs__err(HS_EINVAL, "%s: the file has %d peers, not %d", spec, t->n, n);
            hs_topo_free(t);
            return err;
        }
        *out = t;
        return 0;
    }
    if ((err = hs_topo_generate(&t, spec, n, seed)) < 0) return err;
    hs_topo_report rep;
    if ((err = hs_topo_check(t, HS_TOPO_CHECK_NOGAP, &rep)) < 0 || !rep.valid) {
        if (err == 0) err = hs__err(HS_EINVAL, "topology '%s' on %d peers: %s", spec, t->n,
                                    rep.reason);
        hs_topo_free(t);
        return err;
    }
    *out = t;
    return 0;
}
