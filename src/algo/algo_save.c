/* Checkpoints and join snapshots of an algorithm (hs_algo_save / hs_algo_load): the common
 * fields (neighbour table, replicas, own public vector) and the little-endian helpers the
 * algorithms' own save/load hooks use. One thread per algorithm object. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "core/error_internal.h"

#define SAVE_MAGIC 0x4C415348u /* "HSAL" */
/* 2: the push-sum weight moved from the common fields to SGP's own. 3: an algorithm without
 * replicas saves no own vector (it is scratch; version 2 wrote it as d zeros, which a
 * checkpoint of a large model had to hold in memory while it was written). 4: SGP saves one
 * push-sum weight a block of its values (one, as before, for a model of one block; SGP reads
 * the single weight of 2 and 3 as every block's). All three are read. */
#define SAVE_VERSION 4u

int hs__put_u32(hs_buf *b, uint32_t v) { return hs_buf_append(b, &v, 4); }
int hs__put_u64(hs_buf *b, uint64_t v) { return hs_buf_append(b, &v, 8); }
int hs__put_f64(hs_buf *b, double v) { return hs_buf_append(b, &v, 8); }
int hs__put_floats(hs_buf *b, const float *v, size_t n) {
    return hs_buf_append(b, v, sizeof(float) * n);
}

static int need(const uint8_t *p, const uint8_t *end, size_t n) {
    if ((size_t)(end - p) < n)
        return hs__err(HS_EFORMAT, "algorithm state: truncated (%zu bytes left, %zu needed)",
                       (size_t)(end - p), n);
    return 0;
}

int hs__get_u32(const uint8_t **p, const uint8_t *end, uint32_t *v) {
    int err = need(*p, end, 4);
    if (err < 0) return err;
    memcpy(v, *p, 4);
    *p += 4;
    return 0;
}

int hs__get_u64(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    int err = need(*p, end, 8);
    if (err < 0) return err;
    memcpy(v, *p, 8);
    *p += 8;
    return 0;
}

int hs__get_f64(const uint8_t **p, const uint8_t *end, double *v) {
    int err = need(*p, end, 8);
    if (err < 0) return err;
    memcpy(v, *p, 8);
    *p += 8;
    if (!isfinite(*v)) return hs__err(HS_EFORMAT, "algorithm state: a number is not finite");
    return 0;
}

int hs__skip_floats(const uint8_t **p, const uint8_t *end, size_t n, const uint8_t **at) {
    int err = need(*p, end, sizeof(float) * n);
    if (err < 0) return err;
    for (size_t i = 0; i < n; i++) {
        float f;
        memcpy(&f, *p + 4 * i, 4);
        if (!isfinite(f)) return hs__err(HS_EFORMAT, "algorithm state: value %zu is not finite", i);
    }
    if (at) *at = *p;
    *p += sizeof(float) * n;
    return 0;
}

int hs__get_floats(const uint8_t **p, const uint8_t *end, float *dst, size_t n) {
    const uint8_t *at;
    int err = hs__skip_floats(p, end, n, &at);
    if (err == 0) memcpy(dst, at, sizeof(float) * n);
    return err;
}

/* own where it is state (replicas); nothing where it is scratch (algo.c). */
static int put_own(const hs_algo *a, hs_buf *out) {
    return a->ops->needs_replicas ? hs__put_floats(out, a->own, a->dpub) : 0;
}

/* Layout: magic, version, kind, d (u64), compressor name (u32 length + bytes), epoch (u64),
 * have_view, own vector (d floats; only with replicas since version 3), neighbour count, then per neighbour: id, flags
 * (is_in | is_out << 1 | synced << 2 | sent_full << 3), next_round (u64), replica (d floats)
 * when it has one; then the algorithm's own fields (ops->save). */
int hs_algo_save(const hs_algo *a, hs_buf *out) {
    int err = 0;
    const char *cn = hs_compressor_name(a->comp);
    uint32_t cl = (uint32_t)strlen(cn);
    if ((err = hs__put_u32(out, SAVE_MAGIC)) < 0 || (err = hs__put_u32(out, SAVE_VERSION)) < 0 ||
        (err = hs__put_u32(out, (uint32_t)a->cfg.kind)) < 0 ||
        (err = hs__put_u64(out, a->d)) < 0 || (err = hs__put_u32(out, cl)) < 0 ||
        (err = hs_buf_append(out, cn, cl)) < 0 || (err = hs__put_u64(out, a->epoch)) < 0 ||
        (err = hs__put_u32(out, (uint32_t)a->have_view)) < 0 ||
        (err = put_own(a, out)) < 0 || (err = hs__put_u32(out, (uint32_t)a->n_nbrs)) < 0)
        return err;
    for (int i = 0; i < a->n_nbrs; i++) {
        const hs__nbr *n = &a->nbrs[i];
        uint32_t flags = (uint32_t)(n->is_in | n->is_out << 1 | n->synced << 2 | n->sent_full << 3 |
                                    (n->rep != NULL) << 4);
        if ((err = hs__put_u32(out, n->id)) < 0 || (err = hs__put_u32(out, flags)) < 0 ||
            (err = hs__put_u64(out, n->next_round)) < 0)
            return err;
        if (n->rep && (err = hs__put_floats(out, n->rep, a->dpub)) < 0) return err;
    }
    return a->ops->save ? a->ops->save(a, out) : 0;
}

int hs_algo_load(hs_algo *a, const uint8_t *p, size_t len) {
    const uint8_t *end = p + len;
    uint32_t magic, version, kind, cl, have_view, nn;
    uint64_t d, epoch;
    int err;
    if ((err = hs__get_u32(&p, end, &magic)) < 0) return err;
    if (magic != SAVE_MAGIC) return hs__err(HS_EFORMAT, "algorithm state: bad magic 0x%08x", magic);
    if ((err = hs__get_u32(&p, end, &version)) < 0) return err;
    if (version < 2 || version > SAVE_VERSION)
        return hs__err(HS_EFORMAT, "algorithm state: version %u (this build reads 2 to %u)",
                       version, SAVE_VERSION);
    if ((err = hs__get_u32(&p, end, &kind)) < 0 || (err = hs__get_u64(&p, end, &d)) < 0 ||
        (err = hs__get_u32(&p, end, &cl)) < 0)
        return err;
    if (kind != (uint32_t)a->cfg.kind)
        return hs__err(HS_EMISMATCH, "algorithm state is for %s, this run uses %s",
                       hs_algo_kind_name((hs_algo_kind)kind), hs_algo_kind_name(a->cfg.kind));
    if (d != a->d)
        return hs__err(HS_EMISMATCH, "algorithm state has %llu parameters, the model %zu",
                       (unsigned long long)d, a->d);
    const char *cn = hs_compressor_name(a->comp);
    if ((err = need(p, end, cl)) < 0) return err;
    if (cl != strlen(cn) || memcmp(p, cn, cl) != 0)
        return hs__err(HS_EMISMATCH, "algorithm state uses compressor %.*s, this run %s",
                       (int)(cl > 64 ? 64 : cl), (const char *)p, cn);
    p += cl;
    if ((err = hs__get_u64(&p, end, &epoch)) < 0 || (err = hs__get_u32(&p, end, &have_view)) < 0)
        return err;
    /* Parse everything into new storage first, so a bad tail leaves the algorithm untouched.
     * Without replicas own is scratch (algo.c): checked, not kept. */
    float *own = NULL;
    hs__nbr *nbrs = NULL;
    uint32_t got = 0;
    if (a->ops->needs_replicas && !(own = malloc(sizeof(float) * a->dpub)))
        return hs__err(HS_ENOMEM, "algorithm state: out of memory");
    if ((err = own                ? hs__get_floats(&p, end, own, a->dpub)
               : version == 2 ? hs__skip_floats(&p, end, a->dpub, NULL)
                              : 0) < 0 ||
        (err = hs__get_u32(&p, end, &nn)) < 0)
        goto fail;
    if (nn > 1u << 16) {
        err = hs__err(HS_EFORMAT, "algorithm state: %u neighbours", nn);
        goto fail;
    }
    if (nn && !(nbrs = calloc(nn, sizeof(*nbrs)))) {
        err = hs__err(HS_ENOMEM, "algorithm state: out of memory");
        goto fail;
    }
    for (got = 0; got < nn; got++) {
        hs__nbr *n = &nbrs[got];
        uint32_t flags;
        if ((err = hs__get_u32(&p, end, &n->id)) < 0 || (err = hs__get_u32(&p, end, &flags)) < 0 ||
            (err = hs__get_u64(&p, end, &n->next_round)) < 0)
            goto fail;
        n->is_in = flags & 1;
        n->is_out = (flags >> 1) & 1;
        n->synced = (flags >> 2) & 1;
        n->sent_full = (flags >> 3) & 1;
        for (uint32_t j = 0; j < got; j++)
            if (nbrs[j].id == n->id) {
                err = hs__err(HS_EFORMAT, "algorithm state: neighbour %u listed twice", n->id);
                goto fail;
            }
        if (flags > 31 || (!n->is_in && !n->is_out) ||
            (a->ops->needs_replicas && n->is_in && !(flags & 16)) ||
            ((flags & 16) && !(a->ops->needs_replicas && n->is_in))) {
            err = hs__err(HS_EFORMAT, "algorithm state: neighbour %u has flags 0x%x", n->id, flags);
            goto fail;
        }
        if (flags & 16) {
            if (!(n->rep = malloc(sizeof(float) * a->dpub))) {
                err = hs__err(HS_ENOMEM, "algorithm state: out of memory");
                goto fail;
            }
            if ((err = hs__get_floats(&p, end, n->rep, a->dpub)) < 0) goto fail;
        }
    }
    if (a->ops->load && (err = a->ops->load(a, &p, end)) < 0) goto fail;
    if (p != end) {
        err = hs__err(HS_EFORMAT, "algorithm state: %zu trailing bytes", (size_t)(end - p));
        goto fail;
    }
    for (int i = 0; i < a->n_nbrs; i++) free(a->nbrs[i].rep);
    free(a->nbrs);
    a->nbrs = nbrs;
    a->n_nbrs = a->cap_nbrs = (int)nn;
    if (own) {
        free(a->own);
        a->own = own;
    }
    a->epoch = epoch;
    a->have_view = (int)have_view;
    a->reps_dirty = 1;
    return 0;
fail:
    for (uint32_t i = 0; i < nn && nbrs; i++) free(nbrs[i].rep);
    free(nbrs);
    free(own);
    return err;
}
