/* Link profiles of the WAN emulator (format in docs/WAN.md), read with cJSON. Every value is
 * checked before use, unknown keys are refused (a misspelt "dealy_ms" must not silently mean
 * no delay), and every error names the field and the value. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "wan/profile.h"

#define MAX_TEXT (1 << 20)

typedef struct ctx {
    const char *name; /* error prefix */
    int n;
} ctx;

static int bad(const ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const ctx *c, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return hs__err(HS_EINVAL, "%s: %s", c->name, msg);
}

static const char *kind(const cJSON *v) {
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

/* Refuses any key of object o not in the NULL-terminated list. */
static int only_keys(const ctx *c, const cJSON *o, const char *where, const char *const *keys) {
    for (const cJSON *k = o->child; k; k = k->next) {
        int ok = 0;
        for (const char *const *p = keys; *p && !ok; p++) ok = k->string && !strcmp(k->string, *p);
        if (!ok) {
            char s[41];
            size_t i = 0;
            for (; k->string && k->string[i] && i < sizeof(s) - 1; i++)
                s[i] = (k->string[i] >= 0x20 && k->string[i] < 0x7f) ? k->string[i] : '?';
            s[i] = '\0';
            return bad(c, "%s%s\"%s\": unknown field", where, *where ? "." : "", s);
        }
    }
    return 0;
}

/* A finite number in [lo, hi] (hi < 0: no upper bound). */
static int get_num(const ctx *c, const cJSON *v, const char *field, double lo, double hi,
                   double *out) {
    if (!cJSON_IsNumber(v)) return bad(c, "%s: expected a number, got %s", field, kind(v));
    double x = v->valuedouble;
    if (!isfinite(x) || x < lo || (hi >= 0 && x > hi)) {
        if (hi >= 0) return bad(c, "%s: %g is not in [%g, %g]", field, x, lo, hi);
        return bad(c, "%s: %g is below %g", field, x, lo);
    }
    *out = x;
    return 0;
}

static int get_int(const ctx *c, const cJSON *v, const char *field, int lo, int hi, int *out) {
    double x;
    int err = get_num(c, v, field, lo, hi, &x);
    if (err < 0) return err;
    if (x != floor(x)) return bad(c, "%s: %g is not an integer", field, x);
    *out = (int)x;
    return 0;
}

static int get_peer(const ctx *c, const cJSON *v, const char *field, int *out) {
    if (!cJSON_IsNumber(v)) return bad(c, "%s: expected a peer index, got %s", field, kind(v));
    double x = v->valuedouble;
    if (!isfinite(x) || x != floor(x) || x < 0 || x >= c->n)
        return bad(c, "%s: peer %g is not in 0..%d", field, x, c->n - 1);
    *out = (int)x;
    return 0;
}

/* The link fields an object may set; has_* says which it did. */
typedef struct link_fields {
    double delay, jitter, loss, rate;
    int has_delay, has_jitter, has_loss, has_rate;
} link_fields;

static int get_link(const ctx *c, const cJSON *o, const char *where, link_fields *lf) {
    char f[160];
    int err;
    const cJSON *v;
    memset(lf, 0, sizeof(*lf));
#define FIELD(key, lo, hi, dst, has, scale)                                                        \
    if ((v = cJSON_GetObjectItemCaseSensitive(o, key))) {                                          \
        snprintf(f, sizeof(f), "%s%s%s", where, *where ? "." : "", key);                           \
        if ((err = get_num(c, v, f, lo, hi, &lf->dst)) < 0) return err;                            \
        lf->dst *= scale;                                                                          \
        lf->has = 1;                                                                               \
    }
    FIELD("delay_ms", 0, 60000, delay, has_delay, 1e-3)
    FIELD("jitter_ms", 0, 60000, jitter, has_jitter, 1e-3)
    FIELD("loss", 0, 0.99, loss, has_loss, 1)
    FIELD("rate_mbit", 0, 1e6, rate, has_rate, 1e6)
#undef FIELD
    return 0;
}

static void apply(hs__wan_pair *p, const link_fields *lf) {
    if (lf->has_delay) p->delay_s = lf->delay;
    if (lf->has_jitter) p->jitter_s = lf->jitter;
    if (lf->has_loss) p->loss = lf->loss;
}

static int add_bucket(hs__wan_profile *p, double bps) {
    double *b = realloc(p->bucket_bps, (size_t)(p->nbuckets + 1) * sizeof(*b));
    if (!b) return hs__err(HS_ENOMEM, "profile: out of memory");
    p->bucket_bps = b;
    b[p->nbuckets] = bps;
    return p->nbuckets++;
}

static int parse_clusters(const ctx *c, hs__wan_profile *p, const cJSON *cl, const cJSON *btw) {
    static const char *const ckeys[] = {"peers",     "delay_ms", "jitter_ms", "loss",
                                        "rate_mbit", "name",     NULL};
    static const char *const bkeys[] = {"delay_ms", "jitter_ms", "loss", "rate_mbit", NULL};
    int n = p->n, err = 0, nc;
    char f[96];
    if (!cJSON_IsArray(cl)) return bad(c, "clusters: expected an array, got %s", kind(cl));
    nc = cJSON_GetArraySize(cl);
    if (nc < 1 || nc > n) return bad(c, "clusters: %d clusters for %d peers", nc, n);
    int *of = malloc((size_t)n * sizeof(*of));
    link_fields *in = calloc((size_t)nc, sizeof(*in)), between = {0};
    int *shared = malloc((size_t)nc * (size_t)nc * sizeof(*shared));
    if (!of || !in || !shared) {
        err = hs__err(HS_ENOMEM, "profile: out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) of[i] = -1;
    for (int k = 0; k < nc * nc; k++) shared[k] = -1;
    for (int k = 0; k < nc; k++) {
        const cJSON *o = cJSON_GetArrayItem(cl, k), *ps;
        snprintf(f, sizeof(f), "clusters[%d]", k);
        if (!cJSON_IsObject(o)) {
            err = bad(c, "%s: expected an object, got %s", f, kind(o));
            goto out;
        }
        if ((err = only_keys(c, o, f, ckeys)) < 0 || (err = get_link(c, o, f, &in[k])) < 0)
            goto out;
        ps = cJSON_GetObjectItemCaseSensitive(o, "peers");
        if (!cJSON_IsArray(ps) || cJSON_GetArraySize(ps) < 1) {
            err = bad(c, "%s.peers: expected a non-empty array of peer indices", f);
            goto out;
        }
        for (int m = 0; m < cJSON_GetArraySize(ps); m++) {
            char g[128];
            int i;
            snprintf(g, sizeof(g), "%s.peers[%d]", f, m);
            if ((err = get_peer(c, cJSON_GetArrayItem(ps, m), g, &i)) < 0) goto out;
            if (of[i] >= 0) {
                err = bad(c, "%s: peer %d is already in clusters[%d]", g, i, of[i]);
                goto out;
            }
            of[i] = k;
        }
    }
    if (btw) {
        if (!cJSON_IsObject(btw)) {
            err = bad(c, "between: expected an object, got %s", kind(btw));
            goto out;
        }
        if ((err = only_keys(c, btw, "between", bkeys)) < 0 ||
            (err = get_link(c, btw, "between", &between)) < 0)
            goto out;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int a = of[i], b = of[j];
            hs__wan_pair *pp = &p->pair[i * n + j];
            if (i == j || a < 0 || b < 0) continue;
            const link_fields *lf = a == b ? &in[a] : &between;
            apply(pp, lf);
            if (!lf->has_rate || lf->rate == 0) continue;
            /* Inside a cluster each pair has its own link; between two clusters every pair
             * shares one pipe per direction, as sites joined by one WAN line do. */
            if (a == b) {
                pp->bucket = add_bucket(p, lf->rate);
            } else {
                if (shared[a * nc + b] < 0) shared[a * nc + b] = add_bucket(p, lf->rate);
                pp->bucket = shared[a * nc + b];
            }
            if (pp->bucket < 0) {
                err = pp->bucket;
                goto out;
            }
        }
out:
    free(of);
    free(in);
    free(shared);
    return err;
}

static int parse_peers(const ctx *c, hs__wan_profile *p, const cJSON *arr) {
    static const char *const keys[] = {"id", "up_mbit", "down_mbit", "rate_mbit", "compute", NULL};
    char f[96], g[128];
    int err, i;
    if (!cJSON_IsArray(arr)) return bad(c, "peer: expected an array, got %s", kind(arr));
    for (int k = 0; k < cJSON_GetArraySize(arr); k++) {
        const cJSON *o = cJSON_GetArrayItem(arr, k), *v;
        double x;
        snprintf(f, sizeof(f), "peer[%d]", k);
        if (!cJSON_IsObject(o)) return bad(c, "%s: expected an object, got %s", f, kind(o));
        if ((err = only_keys(c, o, f, keys)) < 0) return err;
        snprintf(g, sizeof(g), "%s.id", f);
        if ((err = get_peer(c, cJSON_GetObjectItemCaseSensitive(o, "id"), g, &i)) < 0) return err;
        static const char *const rk[] = {"rate_mbit", "up_mbit", "down_mbit"};
        for (int r = 0; r < 3; r++)
            if ((v = cJSON_GetObjectItemCaseSensitive(o, rk[r]))) {
                snprintf(g, sizeof(g), "%s.%s", f, rk[r]);
                if ((err = get_num(c, v, g, 0, 1e6, &x)) < 0) return err;
                if (r != 2) p->up_bps[i] = x * 1e6;
                if (r != 1) p->down_bps[i] = x * 1e6;
            }
        if ((v = cJSON_GetObjectItemCaseSensitive(o, "compute"))) {
            snprintf(g, sizeof(g), "%s.compute", f);
            if ((err = get_num(c, v, g, 1, 1000, &p->compute[i])) < 0) return err;
        }
    }
    return 0;
}

static int parse_links(const ctx *c, hs__wan_profile *p, const cJSON *arr) {
    static const char *const keys[] = {"from",      "to",   "both",      "delay_ms",
                                       "jitter_ms", "loss", "rate_mbit", NULL};
    char f[96], g[128];
    int err, i, j;
    if (!cJSON_IsArray(arr)) return bad(c, "links: expected an array, got %s", kind(arr));
    for (int k = 0; k < cJSON_GetArraySize(arr); k++) {
        const cJSON *o = cJSON_GetArrayItem(arr, k), *both;
        link_fields lf;
        snprintf(f, sizeof(f), "links[%d]", k);
        if (!cJSON_IsObject(o)) return bad(c, "%s: expected an object, got %s", f, kind(o));
        if ((err = only_keys(c, o, f, keys)) < 0 || (err = get_link(c, o, f, &lf)) < 0) return err;
        snprintf(g, sizeof(g), "%s.from", f);
        if ((err = get_peer(c, cJSON_GetObjectItemCaseSensitive(o, "from"), g, &i)) < 0) return err;
        snprintf(g, sizeof(g), "%s.to", f);
        if ((err = get_peer(c, cJSON_GetObjectItemCaseSensitive(o, "to"), g, &j)) < 0) return err;
        if (i == j) return bad(c, "%s: from and to are both peer %d", f, i);
        both = cJSON_GetObjectItemCaseSensitive(o, "both");
        if (both && !cJSON_IsBool(both))
            return bad(c, "%s.both: expected true or false, got %s", f, kind(both));
        for (int d = 0; d < (cJSON_IsTrue(both) ? 2 : 1); d++) {
            hs__wan_pair *pp = d ? &p->pair[j * p->n + i] : &p->pair[i * p->n + j];
            apply(pp, &lf);
            if (lf.has_rate) pp->bucket = lf.rate > 0 ? add_bucket(p, lf.rate) : -1;
            if (pp->bucket < -1) return pp->bucket;
        }
    }
    return 0;
}

int hs__wan_profile_parse(hs__wan_profile **out, const char *text, const char *name) {
    static const char *const keys[] = {"name",     "comment",   "peers",    "delay_ms", "jitter_ms",
                                       "loss",     "rate_mbit", "queue_ms", "mtu",      "seed",
                                       "clusters", "between",   "peer",     "links",    NULL};
    ctx c = {name, 0};
    hs__wan_profile *p = NULL;
    link_fields top;
    const cJSON *v;
    double x;
    int err;
    *out = NULL;
    cJSON *root = cJSON_Parse(text);
    if (!root) return hs__err(HS_EINVAL, "%s: not valid JSON", name);
    if (!cJSON_IsObject(root)) {
        err = bad(&c, "expected an object at the top, got %s", kind(root));
        goto fail;
    }
    if ((err = only_keys(&c, root, "", keys)) < 0) goto fail;
    if ((err = get_int(&c, cJSON_GetObjectItemCaseSensitive(root, "peers"), "peers", 1,
                       HS_WAN_MAX_PEERS, &c.n)) < 0)
        goto fail;
    int n = c.n;
    err = HS_ENOMEM;
    if (!(p = calloc(1, sizeof(*p)))) goto fail;
    p->n = n;
    p->up_bps = calloc((size_t)n, sizeof(double));
    p->down_bps = calloc((size_t)n, sizeof(double));
    p->compute = calloc((size_t)n, sizeof(double));
    p->pair = calloc((size_t)n * (size_t)n, sizeof(*p->pair));
    if (!p->up_bps || !p->down_bps || !p->compute || !p->pair) {
        err = hs__err(HS_ENOMEM, "profile: out of memory");
        goto fail;
    }
    snprintf(p->name, sizeof(p->name), "%s", name);
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "name"))) {
        if (!cJSON_IsString(v) || !v->valuestring) {
            err = bad(&c, "name: expected a string, got %s", kind(v));
            goto fail;
        }
        snprintf(p->name, sizeof(p->name), "%s", v->valuestring);
    }
    if ((err = get_link(&c, root, "", &top)) < 0) goto fail;
    p->mtu = 1500;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "mtu")) &&
        (err = get_int(&c, v, "mtu", 576, 65000, &p->mtu)) < 0)
        goto fail;
    p->queue_s = 0.25;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "queue_ms"))) {
        if ((err = get_num(&c, v, "queue_ms", 1, 60000, &x)) < 0) goto fail;
        p->queue_s = x * 1e-3;
    }
    p->seed = 1;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "seed"))) {
        if ((err = get_num(&c, v, "seed", 0, 9007199254740991.0, &x)) < 0) goto fail;
        p->seed = (uint64_t)x;
    }
    for (int i = 0; i < n; i++) {
        p->up_bps[i] = p->down_bps[i] = top.rate;
        p->compute[i] = 1;
        for (int j = 0; j < n; j++) {
            hs__wan_pair *pp = &p->pair[i * n + j];
            pp->bucket = -1;
            if (i != j) apply(pp, &top);
        }
    }
    const cJSON *cl = cJSON_GetObjectItemCaseSensitive(root, "clusters");
    const cJSON *btw = cJSON_GetObjectItemCaseSensitive(root, "between");
    if (btw && !cl) {
        err = bad(&c, "between: needs \"clusters\" to say what it is between");
        goto fail;
    }
    if (cl && (err = parse_clusters(&c, p, cl, btw)) < 0) goto fail;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "peer")) && (err = parse_peers(&c, p, v)) < 0)
        goto fail;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "links")) && (err = parse_links(&c, p, v)) < 0)
        goto fail;
    cJSON_Delete(root);
    *out = p;
    return 0;
fail:
    cJSON_Delete(root);
    hs__wan_profile_free(p);
    return err;
}

int hs__wan_profile_load(hs__wan_profile **out, const char *path) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return hs__err(errno == ENOENT ? HS_ENOENT : HS_EIO, "profile %s: %s", path,
                       strerror(errno));
    char *text = malloc(MAX_TEXT + 1);
    if (!text) {
        fclose(f);
        return hs__err(HS_ENOMEM, "profile %s: out of memory", path);
    }
    size_t len = fread(text, 1, MAX_TEXT + 1, f);
    int rerr = ferror(f);
    fclose(f);
    int err;
    if (rerr)
        err = hs__err(HS_EIO, "profile %s: read error", path);
    else if (len > MAX_TEXT)
        err = hs__err(HS_EINVAL, "profile %s: larger than %d bytes", path, MAX_TEXT);
    else {
        text[len] = '\0';
        err = hs__wan_profile_parse(out, text, path);
    }
    free(text);
    return err;
}

void hs__wan_profile_free(hs__wan_profile *p) {
    if (!p) return;
    free(p->up_bps);
    free(p->down_bps);
    free(p->compute);
    free(p->pair);
    free(p->bucket_bps);
    free(p);
}
