/* DCD-PSGD (Tang, Gan, Zhang, Zhang and Liu, NeurIPS 2018, Algorithm 1; DESIGN.md section 4):
 *   x_half = sum_j W_ij xhat_j - gamma g_i       (xhat_i = x_i: every replica is exact)
 *   z_i    = x_half - x_i;  x_i += C(z_i);  every holder of a replica of x_i adds C(z_i)
 * The caller's local steps give x - gamma g at the start of end(); the mix uses the replicas
 * as they were at the start of the round (messages of round r-1 applied), the update C(z_i)
 * goes out, and the neighbours' round-r updates are applied to their replicas afterwards.
 * C must be unbiased (hs_algo_new refuses others): the average of the x_i is then kept in
 * expectation, not exactly, and the method is known to break down at high compression. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "compress/device.h"
#include "core/error_internal.h"
#include "tensor/gossip_ops.h"

/* Device mode (a->be): x_r, the mix and a copy of each in-neighbour's replica in the backend's
 * memory, the replicas themselves and a->own (x after the round's update, from the same bytes)
 * on the host. A device replica takes each delta as the host's does; after anything the deltas
 * cannot follow (a->reps_dirty: a full replica, a loss, a load) the synced ones are uploaded
 * again, d floats each. A copy whose neighbour is no longer an in-neighbour (it left, the
 * topology varies, a joiner took its place) is taken over by the next new one, so the table
 * holds as many as there were in-neighbours at once, not every neighbour ever met (with churn
 * or a schedule, d floats of device memory for each). */
typedef struct dcd_state {
    float *dxr, *dacc;
    uint32_t *ids;
    float **drep;
    int n, cap;
} dcd_state;

static void dcd_fini(hs_algo *a) {
    dcd_state *s = a->priv;
    if (!s) return;
    if (a->be) {
        hs_be_free(a->be, s->dxr);
        hs_be_free(a->be, s->dacc);
        for (int i = 0; i < s->n; i++) hs_be_free(a->be, s->drep[i]);
    }
    free(s->ids);
    free(s->drep);
}

static int dcd_to_device(hs_algo *a, hs_backend *be) {
    dcd_state *s = a->priv;
    int err = hs_be_alloc_f(be, a->d, &s->dxr);
    if (err == 0) err = hs_be_alloc_f(be, a->d, &s->dacc);
    if (err < 0) {
        hs_be_free(be, s->dxr);
        s->dxr = NULL;
        return hs__err_prefix(err, "dcd: device state of %zu parameters", a->d);
    }
    a->reps_dirty = 1;
    return 0;
}

/* The device copy of neighbour id's replica, or NULL. */
static float *find_rep(const dcd_state *s, uint32_t id) {
    for (int i = 0; i < s->n; i++)
        if (s->ids[i] == id) return s->drep[i];
    return NULL;
}

/* A device copy for neighbour id, its contents undefined until uploaded: its own, that of a
 * neighbour that is no longer an in-neighbour, or a new one. */
static int dev_rep(hs_algo *a, uint32_t id, float **out) {
    dcd_state *s = a->priv;
    if ((*out = find_rep(s, id))) return 0;
    for (int i = 0; i < s->n; i++) {
        const hs__nbr *n = hs__algo_nbr(a, s->ids[i]);
        if (!n || !n->is_in) {
            s->ids[i] = id;
            *out = s->drep[i];
            return 0;
        }
    }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 4;
        uint32_t *ids = realloc(s->ids, sizeof(*ids) * (size_t)cap);
        if (ids) s->ids = ids;
        float **rep = ids ? realloc(s->drep, sizeof(*rep) * (size_t)cap) : NULL;
        if (!rep) return hs__err(HS_ENOMEM, "dcd: out of memory");
        s->drep = rep;
        s->cap = cap;
    }
    float *p = NULL;
    int err = hs_be_alloc_f(a->be, a->d, &p);
    if (err < 0) return hs__err_prefix(err, "dcd: device replica of peer %u", id);
    s->ids[s->n] = id;
    s->drep[s->n++] = p;
    *out = p;
    return 0;
}

/* hs__apply_replica, and a delta it applied to a replica the device's copy follows goes into
 * that copy too: the host decode checked the bytes, so the device adds the same floats. */
static int apply_dev(hs_algo *a, hs__nbr *n, uint64_t round, const uint8_t *p, size_t len,
                     void *ctx) {
    int synced = n->synced;
    int err = hs__apply_replica(a, n, round, p, len, ctx);
    if (err < 0 || !synced || a->reps_dirty || p[0] != HS_PAYLOAD_DELTA || !n->is_in) return err;
    float *rep = find_rep(a->priv, n->id);
    /* Without a copy (the last upload did not see this neighbour synced) the next push
     * uploads one. */
    if (!rep) {
        a->reps_dirty = 1;
        return 0;
    }
    return hs__compress_decode_add_be(a->comp, a->be, p + 1, len - 1, n->id, hs__algo_key(a, round),
                                      rep, a->d, 1.0f);
}

/* The synced in-neighbours' replicas to the device, after the deltas could not be followed. */
static int upload_reps(hs_algo *a, const hs_peer_view *v) {
    for (int i = 0; i < v->n_in; i++) {
        hs__nbr *n = hs__algo_nbr(a, v->in[i].id);
        if (!n->synced) continue;
        float *rep;
        int err = dev_rep(a, n->id, &rep);
        if (err < 0) return err;
        err = hs_be_upload(a->be, rep, n->rep, sizeof(float) * a->d);
        if (err < 0) return err;
    }
    a->reps_dirty = 0;
    return 0;
}

/* dcd_push's mix and update on the device, in its operations: acc from 0, acc += W_ij (rep_j -
 * x_r) in view order, acc += 1 (x - x_r), x = x_r + C(acc); the host's own takes C(acc) from
 * the same bytes (it held x_r). *sq: sum acc_k^2 before the local update, a statistic. */
static int push_dev(hs_algo *a, const hs_peer_view *v, const uint8_t *present, uint64_t key,
                    float *x, hs_buf *msg, double *sq, double *wsum) {
    dcd_state *s = a->priv;
    hs_backend *be = a->be;
    const hs_gossip_ops *go = be->ops->gossip;
    size_t d = a->d;
    int err = a->reps_dirty ? upload_reps(a, v) : 0;
    if (err == 0) err = be->ops->fill(be, s->dacc, d, 0.0f);
    for (int i = 0; i < v->n_in && err == 0; i++) {
        if (!present[i]) continue;
        /* upload_reps gave every synced in-neighbour its copy; apply_dev keeps it current. */
        const float *rep = find_rep(s, v->in[i].id);
        if (!rep) return hs__err(HS_EINVAL, "dcd: no device replica of peer %u", v->in[i].id);
        err = go->acc_diff(be, s->dacc, rep, s->dxr, d, (float)v->in[i].w);
        *wsum += v->in[i].w;
    }
    if (err < 0 || (err = hs_be_dot(be, s->dacc, s->dacc, d, sq)) < 0 ||
        (err = go->acc_diff(be, s->dacc, x, s->dxr, d, 1.0f)) < 0 ||
        (err = hs__compress_encode_be(a->comp, be, s->dacc, d, a->self, key, msg)) < 0 ||
        (err = hs_be_copy_f(be, x, s->dxr, d)) < 0 ||
        (err = hs__compress_decode_add_be(a->comp, be, msg->data + 1, msg->len - 1, a->self, key,
                                          x, d, 1.0f)) < 0)
        return err;
    return hs_compress_decode_add(a->comp, msg->data + 1, msg->len - 1, a->self, key, a->own, d,
                                  1.0f);
}

static int dcd_check_compressor(const hs_compressor *c) {
    const char *name = hs_compressor_name(c);
    int unbiased = hs_compressor_unbiased(c);
    if (!unbiased)
        return hs__err(HS_EINVAL, "--algo dcd needs an unbiased compressor; %s is biased (use "
                                  "qsgd, randk or none with dcd, or --algo choco, which "
                                  "accepts any contraction)",
                       name);
    return 0;
}

static int dcd_begin(hs_algo *a, hs_exchange *ex, uint64_t r, const float *x) {
    hs_peer_view v;
    /* A new replica's start is host memory: own, which equals x on the device. */
    int err = hs__algo_view(a, ex, r, &v, a->be ? a->own : x);
    if (err < 0) return err;
    /* On the device x_r is copied there; the host's own already holds x_r (the last round's
     * update, or the start hs_algo_reset_x set). */
    if (a->be) return hs_be_copy_f(a->be, ((dcd_state *)a->priv)->dxr, x, a->d);
    memcpy(a->own, x, sizeof(float) * a->d);
    return 0;
}

static int dcd_push(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    size_t d = a->d;
    float *xr = a->own, *acc = a->tmp;
    uint8_t *present;
    if ((err = hs__algo_present(a, v.n_in, &present)) < 0) return err;
    /* Replicas must reflect round r-1 before they are mixed. */
    a->stats.missing = 0;
    for (int i = 0; i < v.n_in; i++) {
        hs__nbr *n = hs__algo_nbr(a, v.in[i].id);
        int got = r == 0 ? 1
                         : hs__algo_catch_up(a, ex, n, r - 1, a->cfg.recv_timeout_ms,
                                             a->be ? apply_dev : hs__apply_replica, NULL);
        if (got < 0) return got;
        present[i] = (uint8_t)(got && n->synced);
        a->stats.missing += !present[i];
    }
    hs_buf *msg;
    double wsum = 0, sq = 0;
    hs__algo_wait_room(a, ex, &v, r, 1 + hs_compress_max_bytes(a->comp, d));
    if (a->be) {
        if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA,
                                   hs_compress_max_bytes(a->comp, d))) < 0)
            return err;
        if ((err = push_dev(a, &v, present, hs__algo_key(a, r), x, msg, &sq, &wsum)) == 0)
            err = hs__algo_send_replica(a, ex, &v, r, msg);
        a->stats.disagreement = wsum > 0 ? sq / (wsum * wsum * (double)d) : 0.0;
        goto out;
    }
    /* z = sum_j W_ij (xhat_j - x_r) + (x - x_r), in ascending order: the mixed model after the
     * local update, minus x_r (differences, so the float weights' rounding cannot move the
     * average; a missing neighbour's weight stays on x_r). */
    memset(acc, 0, sizeof(float) * d);
    for (int i = 0; i < v.n_in; i++) {
        if (!present[i]) continue;
        hs__acc_diff(acc, hs__algo_nbr(a, v.in[i].id)->rep, xr, d, (float)v.in[i].w);
        wsum += v.in[i].w;
    }
    for (size_t k = 0; k < d; k++) {
        sq += (double)acc[k] * acc[k];
        acc[k] = acc[k] + (x[k] - xr[k]);
    }
    a->stats.disagreement = wsum > 0 ? sq / (wsum * wsum * (double)d) : 0.0;
    if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA, hs_compress_max_bytes(a->comp, d))) < 0)
        return err;
    if ((err = hs_compress_encode(a->comp, acc, d, a->self, hs__algo_key(a, r), msg)) < 0)
        goto out;
    /* x_{r+1} = x_r + C(z), decoded from the same bytes the neighbours decode. */
    memcpy(x, xr, sizeof(float) * d);
    if ((err = hs_compress_decode_add(a->comp, msg->data + 1, msg->len - 1, a->self,
                                      hs__algo_key(a, r), x, d, 1.0f)) < 0)
        goto out;
    memcpy(a->own, x, sizeof(float) * d);
    err = hs__algo_send_replica(a, ex, &v, r, msg);
out:
    hs_buf_unref(msg);
    return err < 0 ? err : 0;
}

/* Applies the neighbours' round-r updates to their replicas; late ones are applied at the
 * start of the next round. */
static int dcd_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    (void)x;
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    for (int i = 0; i < v.n_in; i++) {
        hs__nbr *n = hs__algo_nbr(a, v.in[i].id);
        if (n->next_round < r) continue; /* still owes an older round: wait for it next time */
        int got = hs__algo_catch_up(a, ex, n, r, a->cfg.recv_timeout_ms,
                                    a->be ? apply_dev : hs__apply_replica, NULL);
        if (got < 0) return got;
    }
    return 0;
}

const hs__algo_ops hs__algo_dcd = {
    .name = "dcd",
    .synchronous = 1,
    .fixed_neighbours = 1,
    .default_compress = "qsgd:16",
    .default_topology = "ring",
    .needs_replicas = 1,
    .drifts_with_compression = 1,
    /* z lives in push alone: the node keeps the caller's x there between rounds instead of a
     * copy of its own (one vector less a peer: 5.39 -> 4.39 at 270M). */
    .tmp_idle = 1,
    .priv_size = sizeof(dcd_state),
    .check_compressor = dcd_check_compressor,
    .fini = dcd_fini,
    .begin = dcd_begin,
    .push = dcd_push,
    .pull = dcd_pull,
    .to_device = dcd_to_device,
};
