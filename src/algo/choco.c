/* CHOCO-SGD (Koloskova, Stich and Jaggi, ICML 2019, Algorithm 2; DESIGN.md section 4):
 *   x_half = x_i - gamma g_i                      (the local steps, done by the caller)
 *   q_i    = Q(x_half - xhat_i)                   (any contraction, biased ones included)
 *   xhat_j += q_j on every holder of a replica of j, xhat_i += q_i here
 *   x_i    = x_half + gamma_c sum_j W_ij (xhat_j - xhat_i)
 * Replicas are updated by decoding the very bytes that travel, the sender decoding its own
 * message too, so every holder of xhat_j has the same bits. An edge that is new (a membership
 * change, or the first round when peers did not start from the same x0) carries the sender's
 * full xhat once instead of q. For symmetric doubly stochastic W the gossip step keeps the
 * average of the x_i. Memory: one replica per in-neighbour plus xhat_i (own). */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "compress/device.h"
#include "core/hd.h"
#include "core/error_internal.h"
#include "tensor/gossip_ops.h"

/* CHOCO keeps m = sum_j W_ij (xhat_j - xhat_i) over its synced in-neighbours up to date with
 * sparse updates, so a round's gossip step is one pass x += gamma_c m instead of a pass over
 * every replica. m_w = sum_j W_ij of the neighbours in m. Rebuilt in full when a->reps_dirty
 * says the neighbourhood changed or a replica was replaced. */
typedef struct choco_state {
    float *mix;
    float mix_wsum;
    /* Device mode (a->be): m, xhat_i and the difference x - xhat_i in the backend's memory;
     * mix is then NULL and a->own the host's copy of xhat_i (from the same messages). */
    float *dmix, *down, *ddiff;
} choco_state;

static int choco_check_compressor(const hs_compressor *c) {
    const char *name = hs_compressor_name(c);
    int ef = hs_compressor_residual(c) != NULL;
    double delta = hs_compressor_delta(c);
    /* The operator's spec without the ef: prefix, for the suggested fix. */
    const char *inner = ef ? name + 3 : name;
    if (ef)
        return hs__err(HS_EINVAL, "--algo choco --compress %s: CHOCO already compensates the "
                                  "compression error with its replicas, and error feedback "
                                  "on top adds a stale correction that keeps the peers apart "
                                  "(use --compress %s)",
                       name, inner);
    if (!(delta > 0)) {
        /* Only rescaled random-k is not a contraction; its K is the second field. */
        const char *kf = strchr(name, ':');
        kf = kf ? kf + 1 : "K";
        int kn = (int)strcspn(kf, ":");
        return hs__err(HS_EINVAL, "--algo choco --compress %s: CHOCO needs a compressor that "
                                  "is a contraction (E||C(x) - x||^2 < ||x||^2), and rescaled "
                                  "random-k's error is up to d/k - 1 times ||x||^2 (use "
                                  "--compress randk:%.*s:unscaled or topk:%.*s)",
                       name, kn, kf, kn, kf);
    }
    return 0;
}


/* In device mode m is rebuilt on the host from the replicas there (in a->tmp) and uploaded
 * with xhat_i, which a state load or a new start (reset_x) changed on the host only: d floats
 * cross at a neighbourhood change, none in a steady round. */
static int rebuild_mix(hs_algo *a, const hs_peer_view *v) {
    choco_state *s = a->priv;
    if (!a->be) {
        s->mix_wsum = hs__mix_rebuild(a, v, s->mix);
        return 0;
    }
    s->mix_wsum = hs__mix_rebuild(a, v, a->tmp);
    int err = hs_be_upload(a->be, s->dmix, a->tmp, sizeof(float) * a->d);
    return err < 0 ? err : hs_be_upload(a->be, s->down, a->own, sizeof(float) * a->d);
}

static int choco_init(hs_algo *a, const float *x0) {
    (void)x0;
    choco_state *s = a->priv;
    if (!(s->mix = calloc(a->d, sizeof(float))))
        return hs__err(HS_ENOMEM, "choco: out of memory for %zu parameters", a->d);
    return 0;
}

static void choco_fini(hs_algo *a) {
    choco_state *s = a->priv;
    if (!s) return;
    free(s->mix);
    if (a->be) {
        hs_be_free(a->be, s->dmix);
        hs_be_free(a->be, s->down);
        hs_be_free(a->be, s->ddiff);
    }
}

/* The host's m goes: the device's takes its place. xhat_i is uploaded with m's first
 * rebuild (the replicas start dirty). */
static int choco_to_device(hs_algo *a, hs_backend *be) {
    choco_state *s = a->priv;
    size_t d = a->d;
    int err;
    if ((err = hs_be_alloc_f(be, d, &s->dmix)) < 0 || (err = hs_be_alloc_f(be, d, &s->down)) < 0 ||
        (err = hs_be_alloc_f(be, d, &s->ddiff)) < 0) {
        hs_be_free(be, s->dmix);
        hs_be_free(be, s->down);
        s->dmix = s->down = NULL;
        return hs__err_prefix(err, "choco: device state of %zu parameters", d);
    }
    free(s->mix);
    s->mix = NULL;
    a->reps_dirty = 1;
    return 0;
}

/* choco_push's arithmetic on the device: the same operations (sub, encode, the two decodes of
 * the message), so the same bits; the host's xhat_i takes the message too. */
static int push_dev(hs_algo *a, uint64_t key, const float *x, hs_buf *msg) {
    choco_state *s = a->priv;
    hs_backend *be = a->be;
    size_t d = a->d;
    int err = be->ops->gossip->sub(be, s->ddiff, x, s->down, d);
    if (err < 0 || (err = hs__algo_scale_diff(a, s->ddiff)) < 0 ||
        (err = hs__compress_encode_be(a->comp, be, s->ddiff, d, a->self, key, msg)) < 0 ||
        (err = hs__compress_decode_add2_be(a->comp, be, msg->data + 1, msg->len - 1, a->self, key,
                                           s->down, 1.0f, s->dmix, -s->mix_wsum, d)) < 0)
        return err;
    return hs_compress_decode_add(a->comp, msg->data + 1, msg->len - 1, a->self, key, a->own, d,
                                  1.0f);
}

HS_VECTOR_CLONES
static void sub(float *out, const float *x, const float *y, size_t d) {
    for (size_t k = 0; k < d; k++) out[k] = x[k] - y[k];
}

static int choco_push(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    size_t d = a->d;
    choco_state *s = a->priv;
    float *xh = a->own, *diff = a->tmp;
    if (a->reps_dirty && (err = rebuild_mix(a, &v)) < 0) return err;
    hs_buf *msg;
    hs__algo_wait_room(a, ex, &v, r, 1 + hs_compress_max_bytes(a->comp, d));
    if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA, hs_compress_max_bytes(a->comp, d))) < 0)
        return err;
    if (a->be) {
        if ((err = push_dev(a, hs__algo_key(a, r), x, msg)) >= 0)
            err = hs__algo_send_replica(a, ex, &v, r, msg);
        hs_buf_unref(msg);
        return err < 0 ? err : 0;
    }
    sub(diff, x, xh, d);
    if ((err = hs__algo_scale_diff(a, diff)) < 0) {
        hs_buf_unref(msg);
        return err;
    }
    /* xhat_i += q and m -= (sum_j W_ij) q, both from the bytes that travel. */
    if ((err = hs_compress_encode(a->comp, diff, d, a->self, hs__algo_key(a, r), msg)) >= 0 &&
        (err = hs_compress_decode_add2(a->comp, msg->data + 1, msg->len - 1, a->self,
                                       hs__algo_key(a, r), xh, 1.0f, s->mix, -s->mix_wsum, d)) >= 0)
        err = hs__algo_send_replica(a, ex, &v, r, msg);
    hs_buf_unref(msg);
    return err < 0 ? err : 0;
}

/* The neighbours' q_j go into their replicas and into m as they are decoded; the gossip step is
 * then one pass, x = x_half + gamma_c m. A neighbour whose message is late keeps its replica of
 * the round before in m (it is applied, in order, when it comes): the same replica it holds of
 * this peer, so the two sides of the edge stay symmetric. A neighbour that is gone leaves m at
 * once (hs__algo_catch_up says why). */
static int choco_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    uint8_t *present;
    if ((err = hs__algo_present(a, v.n_in, &present)) < 0) return err;
    choco_state *s = a->priv;
    /* The deltas go into m as they are decoded while m is current. */
    float *m = a->be ? s->dmix : s->mix;
    int got = hs__algo_recv_replicas(a, ex, &v, r, present, a->reps_dirty ? NULL : m);
    if (got < 0) return got;
    a->stats.missing = v.n_in - got;
    if (a->reps_dirty && (err = rebuild_mix(a, &v)) < 0) return err;
    double sq;
    if (!a->be)
        sq = hs__step_sq(x, s->mix, a->cfg.gamma_c, a->d);
    else if ((err = a->be->ops->gossip->step_sq(a->be, x, m, a->cfg.gamma_c, a->d, &sq)) < 0)
        return err;
    double w = s->mix_wsum;
    a->stats.disagreement = w > 0 ? sq / (w * w * (double)a->d) : 0.0;
    return 0;
}

const hs__algo_ops hs__algo_choco = {
    .name = "choco",
    .synchronous = 1,
    .fixed_neighbours = 1,
    .uses_gamma_c = 1,
    /* Signs with one fp32 scale per 512 values: 1.0625 bits a value, 1/30.1 of D-PSGD's bytes
     * (the budget is 1/25). Gossip differences are dense, and sign keeps 65% of their
     * energy where top-5% fp16 kept 26% at the same budget: with local momentum, 0.30 points
     * or less (mean) below D-PSGD on IID shards of 8 and 4 peers and 0.32 or less on
     * Dirichlet(0.5), where top-5% fp16 with hybrid momentum was 0.13-0.60 below on IID
     * (docs/RESULTS.md, "IID gap" and "sign:512 after a resume"). The momentum stays the
     * heavy ball: sign with hybrid (or qg) momentum diverges on small graphs once the loss is
     * near zero (test choco-defaults-small-graphs). */
    .default_compress = "sign:512",
    .default_topology = "ring",
    .needs_replicas = 1,
    /* The difference x - xhat_i lives from push's encode to its decode only. */
    .tmp_idle = 1,
    .qg_momentum = 1,
    .priv_size = sizeof(choco_state),
    .check_compressor = choco_check_compressor,
    .init = choco_init,
    .fini = choco_fini,
    .push = choco_push,
    .pull = choco_pull,
    .to_device = choco_to_device,
};
