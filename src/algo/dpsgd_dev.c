/* D-PSGD's round in a backend's memory (hs__algo_to_device; dpsgd.c is the reference): x_r, a
 * neighbour's decoded model and the mix live on the device, and only messages cross. Each of
 * dpsgd.c's paths computes, per element, x + 1 (w (C(x_j) - x_r)) (one neighbour: in place or
 * from the message's own values) or x + 1 (sum_j w_j (C(x_j) - x_r)) from 0 (several), and so
 * do these, with the same operations: C(x_j) is decoded into -0.0's for the first (-0.0 + v is
 * v, and -0.0 - x_r is -x_r, the in-place path's start) and into +0.0's for the second (its
 * buffer starts at 0). */
#include <stdlib.h>

#include "algo/algo_internal.h"
#include "compress/device.h"
#include "core/error_internal.h"
#include "tensor/gossip_ops.h"

struct hs__dpsgd_dev {
    float *xr, *xj, *acc;
};

void hs__dpsgd_dev_free(hs_algo *a, hs__dpsgd_dev *s) {
    if (!s) return;
    hs_be_free(a->be, s->xr);
    hs_be_free(a->be, s->xj);
    hs_be_free(a->be, s->acc);
    free(s);
}

int hs__dpsgd_dev_new(hs_algo *a, hs_backend *be, hs__dpsgd_dev **out) {
    hs__dpsgd_dev *s = calloc(1, sizeof(*s));
    if (!s) return hs__err(HS_ENOMEM, "dpsgd: out of memory");
    int err = hs_be_alloc_f(be, a->d, &s->xr);
    if (err == 0) err = hs_be_alloc_f(be, a->d, &s->xj);
    if (err == 0) err = hs_be_alloc_f(be, a->d, &s->acc);
    if (err < 0) {
        hs_be_free(be, s->xr);
        hs_be_free(be, s->xj);
        free(s);
        return hs__err_prefix(err, "dpsgd: device state of %zu parameters", a->d);
    }
    *out = s;
    return 0;
}

/* begin: x_r is kept, C(x) goes to the out-neighbours. */
int hs__dpsgd_dev_begin(hs_algo *a, hs__dpsgd_dev *s, hs_exchange *ex, uint64_t r,
                        const float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, NULL);
    if (err < 0 || (err = hs_be_copy_f(a->be, s->xr, x, a->d)) < 0 || v.n_out == 0) return err;
    hs_buf *msg;
    hs__algo_wait_room(a, ex, &v, r, 1 + hs_compress_max_bytes(a->comp, a->d));
    if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA,
                               hs_compress_max_bytes(a->comp, a->d))) < 0)
        return err;
    err = hs__compress_encode_be(a->comp, a->be, x, a->d, a->self, hs__algo_key(a, r), msg);
    for (int i = 0; i < v.n_out && err >= 0; i++) err = hs__algo_send(a, ex, v.out[i].id, r, msg);
    hs_buf_unref(msg);
    return err < 0 ? err : 0;
}

/* What a neighbour's message of a round becomes: `fill` then + C(x_j) in s->xj (used: 1), or
 * nothing for a round older than the one waited for (used: -1). */
typedef struct dev_ctx {
    hs__dpsgd_dev *s;
    float fill;
    int used;
} dev_ctx;

static int apply_dev(hs_algo *a, hs__nbr *n, uint64_t round, const uint8_t *p, size_t len,
                     void *vctx) {
    dev_ctx *c = vctx;
    int err = hs__dpsgd_check_type(n, p, len);
    if (err < 0 || c->used == -1) return err;
    err = a->be->ops->fill(a->be, c->s->xj, a->d, c->fill);
    if (err == 0)
        err = hs__compress_decode_add_be(a->comp, a->be, p + 1, len - 1, n->id,
                                         hs__algo_key(a, round), c->s->xj, a->d, 1.0f);
    if (err == 0) c->used = 1;
    return err;
}

/* dpsgd.c's recv_model into the device: 1 when the round-r model came and decoded. */
static int recv_dev(hs_algo *a, hs_exchange *ex, uint64_t r, uint32_t id, dev_ctx *c) {
    hs__nbr *n = hs__algo_nbr(a, id);
    dev_ctx stale = {c->s, 0.0f, -1};
    int err;
    if (n->next_round < r && (err = hs__algo_catch_up(a, ex, n, r - 1, 0, apply_dev, &stale)) < 0)
        return err;
    if (n->next_round < r) n->next_round = r;
    int got = hs__algo_catch_up(a, ex, n, r, a->cfg.recv_timeout_ms, apply_dev, c);
    if (got < 0) return got;
    if (!got || !c->used) a->stats.missing++;
    return got && c->used;
}

int hs__dpsgd_dev_pull(hs_algo *a, hs__dpsgd_dev *s, hs_exchange *ex, uint64_t r, float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, NULL);
    if (err < 0) return err;
    hs_backend *be = a->be;
    const hs_gossip_ops *go = be->ops->gossip;
    size_t d = a->d;
    double wsum = 0, sq = 0;
    a->stats.missing = 0;
    if (v.n_in == 1) {
        dev_ctx c = {s, -0.0f, 0};
        int got = recv_dev(a, ex, r, v.in[0].id, &c);
        if (got < 0) return got;
        if (got && ((err = go->sub(be, s->acc, s->xj, s->xr, d)) < 0 ||
                    (err = go->scale_to(be, s->acc, s->acc, d, (float)v.in[0].w)) < 0 ||
                    (err = go->step_sq(be, x, s->acc, 1.0f, d, &sq)) < 0))
            return err;
        wsum = got ? v.in[0].w : 0;
    } else {
        if ((err = be->ops->fill(be, s->acc, d, 0.0f)) < 0) return err;
        /* In ascending id order, as dpsgd.c. */
        for (int i = 0; i < v.n_in; i++) {
            dev_ctx c = {s, 0.0f, 0};
            int got = recv_dev(a, ex, r, v.in[i].id, &c);
            if (got < 0) return got;
            if (!got) continue;
            if ((err = go->acc_diff(be, s->acc, s->xj, s->xr, d, (float)v.in[i].w)) < 0)
                return err;
            wsum += v.in[i].w;
        }
        if ((err = go->step_sq(be, x, s->acc, 1.0f, d, &sq)) < 0) return err;
    }
    a->stats.disagreement = wsum > 0 ? sq / (wsum * wsum * (double)d) : 0.0;
    return 0;
}
