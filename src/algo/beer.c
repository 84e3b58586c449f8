/* BEER (Zhao, Li, Li, Richtarik and Chi, NeurIPS 2022, "BEER: Fast O(1/T) Rate for
 * Decentralized Nonconvex Optimization with Communication Compression", Algorithm 1): gradient
 * tracking with CHOCO-style compressed gossip of both the model and the tracker.
 *   X^{t+1} = X^t + gamma H^t (W - I) - eta V^t
 *   H^{t+1} = H^t + C(X^{t+1} - H^t)
 *   V^{t+1} = V^t + gamma G^t (W - I) + grad F(X^{t+1}) - grad F(X^t)
 *   G^{t+1} = G^t + C(V^{t+1} - G^t)
 * (columns are peers; H and G are the replicas every neighbour holds, changed only by decoding
 * the bytes that travel). Its rate does not depend on how different the peers' data are: the
 * tracker V_i follows the network's average gradient, so the peers' fixed point is the global
 * optimum, where CHOCO's is biased by the local gradients.
 *
 * How it maps onto a hearsay round r (gamma = cfg.gamma_c, automatic as for CHOCO):
 * - The caller's local optimizer steps move x from X^r; their step s_r = X^r - x_after (eta g
 *   for plain SGD, whatever the optimizer does otherwise) stands for eta grad F(X^r), so V is
 *   kept in step units and eta is the optimizer's: V^r = V^{r-1} + gamma G^{r-1}(W - I) +
 *   s_r - s_{r-1}, with V^{-1} = s_{-1} = G^{-1} = 0, so V^0 = s_0 as in the paper's
 *   initialisation and sum_i V_i = sum_i s_i every round (the mixing terms cancel).
 * - push: V^r and G^r = G^{r-1} + C(V^r - G^{r-1}); X^{r+1} = X^r + gamma H^r(W - I) - V^r and
 *   H^{r+1} = H^r + C(X^{r+1} - H^r). Both need only the replicas of the round before, so one
 *   message per neighbour and round carries both compressed differences (HS_PAYLOAD_DELTA_PARTS:
 *   vector 0 the model's, vector 1 the tracker's).
 * - pull: the neighbours' round-r messages go into their replicas, ready for round r + 1.
 * H starts at X^0 (the replicas of peers that start from the same x0 need no transfer) and G at
 * 0. A joiner starts with V = s_prev = 0 like a fresh peer: its first V is its own step, which
 * keeps sum V = sum s over the new membership; a member's tracker would not.
 * A peer that leaves or crashes takes its V_i - s_i with it, and tracking cannot correct a lost
 * offset: sum V would stay off sum s by it and move the average model by that much every round.
 * So at a membership change (a new epoch, which every member's view shows from the same round)
 * every member restarts its tracker from its last step, V = s_{r-1}, as a fresh peer does: sum
 * V = sum s holds again over the new membership. The replicas G stay; their mixing terms sum to
 * zero on any symmetric W. A neighbour found gone before that leaves the mixes at once
 * (hs__algo_catch_up): its frozen G_j would otherwise add gamma W_ij (G_j - G_i) to V_i every
 * round until the epoch changes. The tracker itself still restarts only with the epoch: a
 * restart at only the leaver's neighbours would drop the survivors' own mixing terms on one
 * side of their edges, and sum V = sum s would not hold over any membership. Memory: two
 * replicas per in-neighbour, own H and G, V, s_{r-1}, X^r and the two mixes. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "compress/device.h"
#include "core/error_internal.h"
#include "core/hd.h"
#include "core/log.h"
#include "tensor/gossip_ops.h"

enum { REBUILD_EVERY = 64 };

typedef struct beer_state {
    float *v;      /* the tracker V_i, in optimizer-step units */
    float *s_prev; /* s_{r-1}, the local steps' displacement of the round before */
    float *xr;     /* X^r: x at the start of the round */
    /* m_H then m_G: sum_j W_ij (rep_j - own) of each part over the synced in-neighbours, kept
     * current from the decoded deltas as CHOCO keeps its one mix, so a round does not pass over
     * every replica twice; mix_wsum = sum_j W_ij of those neighbours. Rebuilt in full when
     * a->reps_dirty is set, and every REBUILD_EVERY rounds: the tracker sums gamma m_G over all
     * rounds, so rounding that builds up in a running sum would move sum_i V_i away from sum_i
     * s_i, and with it the average model (5x farther from the optimum in the unit tests' tracking
     * run without the rebuilds). */
    float *mix;
    float mix_wsum;
    uint64_t epoch; /* the membership epoch of the last round run */
    int have_epoch;
    /* Device mode (a->be): V, s_{r-1}, X^r, the two mixes, own H and G and the two differences
     * in the backend's memory. The host keeps a->own (from the same messages) and mix as the
     * buffer a rebuild is summed in before it is uploaded; v and s_prev are the host's copies
     * a save downloads into and a load fills (uploaded at the next begin: `up`). */
    float *dv, *ds_prev, *dxr, *dmix, *down, *ddh, *ddg;
    int up;
} beer_state;

static int beer_check_compressor(const hs_compressor *c) {
    const char *name = hs_compressor_name(c);
    int ef = hs_compressor_residual(c) != NULL;
    if (ef)
        return hs__err(HS_EINVAL, "--algo beer --compress %s: BEER already compensates the "
                                  "compression error with its replicas (use --compress %s)",
                       name, name + 3);
    if (!(hs_compressor_delta(c) > 0))
        return hs__err(HS_EINVAL, "--algo beer --compress %s: BEER needs a compressor that is "
                                  "a contraction (E||C(x) - x||^2 < ||x||^2); rescaled random-k "
                                  "is not (use randk:K:unscaled or topk:K)",
                       name);
    return 0;
}

static int beer_init(hs_algo *a, const float *x0) {
    (void)x0;
    beer_state *s = a->priv;
    if (!(s->v = calloc(a->d, sizeof(float))) || !(s->s_prev = calloc(a->d, sizeof(float))) ||
        !(s->xr = malloc(sizeof(float) * a->d)) || !(s->mix = calloc(a->dpub, sizeof(float))))
        return hs__err(HS_ENOMEM, "beer: out of memory for %zu parameters", a->d);
    return 0;
}

static void beer_fini(hs_algo *a) {
    beer_state *s = a->priv;
    if (!s) return;
    free(s->v);
    free(s->s_prev);
    free(s->xr);
    free(s->mix);
    if (a->be) {
        float *dev[] = {s->dv, s->ds_prev, s->dxr, s->dmix, s->down, s->ddh, s->ddg};
        for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) hs_be_free(a->be, dev[i]);
    }
}

/* V and s_prev start at 0 on the device as on the host; the mixes and own H and G are uploaded
 * by the first rebuild (the replicas start dirty). */
static int beer_to_device(hs_algo *a, hs_backend *be) {
    beer_state *s = a->priv;
    size_t d = a->d;
    float **dev[] = {&s->dv, &s->ds_prev, &s->dxr, &s->ddh, &s->ddg, &s->dmix, &s->down};
    int err = 0;
    for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]) && err == 0; i++)
        err = hs_be_alloc_f(be, i < 5 ? d : a->dpub, dev[i]);
    if (err == 0) err = be->ops->fill(be, s->dv, d, 0.0f);
    if (err == 0) err = be->ops->fill(be, s->ds_prev, d, 0.0f);
    if (err < 0) {
        for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++) {
            hs_be_free(be, *dev[i]);
            *dev[i] = NULL;
        }
        return hs__err_prefix(err, "beer: device state of %zu parameters", d);
    }
    a->reps_dirty = 1;
    return 0;
}

static int beer_begin(hs_algo *a, hs_exchange *ex, uint64_t r, const float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    beer_state *s = a->priv;
    hs_backend *be = a->be;
    size_t d = a->d;
    if (be && s->up) {
        if ((err = hs_be_upload(be, s->dv, s->v, sizeof(float) * d)) < 0 ||
            (err = hs_be_upload(be, s->ds_prev, s->s_prev, sizeof(float) * d)) < 0)
            return err;
        s->up = 0;
    }
    if (be && (err = hs_be_copy_f(be, s->dxr, x, d)) < 0) return err;
    if (!be) memcpy(s->xr, x, sizeof(float) * d);
    if (s->have_epoch && v.epoch != s->epoch) {
        HS_LOGI("beer: round %llu: membership changed: the tracker restarts from the last step",
                (unsigned long long)r);
        if (!be) memcpy(s->v, s->s_prev, sizeof(float) * d);
        else if ((err = hs_be_copy_f(be, s->dv, s->ds_prev, d)) < 0) return err;
    }
    s->epoch = v.epoch;
    s->have_epoch = 1;
    return 0;
}

/* In device mode the mixes are summed on the host from the replicas there and uploaded with
 * own H and G (which a load or a new start changed on the host only): 4 d floats cross at a
 * neighbourhood change and every REBUILD_EVERY rounds, none in the other rounds. */
static int rebuild_mix(hs_algo *a, const hs_peer_view *v) {
    beer_state *s = a->priv;
    s->mix_wsum = hs__mix_rebuild(a, v, s->mix);
    if (!a->be) return 0;
    int err = hs_be_upload(a->be, s->dmix, s->mix, sizeof(float) * a->dpub);
    return err < 0 ? err : hs_be_upload(a->be, s->down, a->own, sizeof(float) * a->dpub);
}

/* V += gamma m_G + (s - s_prev), s = X^r - x_after; s_prev = s; dg = V - G (the tracker's
 * difference to send), in the one pass. */
HS_VECTOR_CLONES
void hs__beer_track(float *v, float *s_prev, float *dg, const float *mg, const float *g,
                    float gamma, const float *xr, const float *x, size_t d) {
    for (size_t k = 0; k < d; k++) {
        float st = xr[k] - x[k];
        v[k] = v[k] + gamma * mg[k] + (st - s_prev[k]);
        s_prev[k] = st;
        dg[k] = v[k] - g[k];
    }
}

/* x = (X^r + gamma m_H) - V and dh = x - H (the model's difference to send) in one pass;
 * returns sum_k m_H[k]^2 (a statistic, summed in float lanes as hs__step_sq does). */
HS_VECTOR_CLONES
double hs__beer_step_model(float *x, float *dh, const float *xr, const float *mh, const float *v,
                          const float *h, float gamma, size_t d) {
    float lane[16] = {0};
    double sq = 0;
    size_t k = 0;
    for (; k + 16 <= d; k += 16)
        for (int l = 0; l < 16; l++) {
            size_t i = k + (size_t)l;
            x[i] = (xr[i] + gamma * mh[i]) - v[i];
            dh[i] = x[i] - h[i];
            lane[l] = lane[l] + mh[i] * mh[i];
        }
    for (; k < d; k++) {
        x[k] = (xr[k] + gamma * mh[k]) - v[k];
        dh[k] = x[k] - h[k];
        sq += (double)mh[k] * mh[k];
    }
    for (int l = 0; l < 16; l++) sq += lane[l];
    return sq;
}

/* Encodes diff as vector `part` of msg and adds the decoded bytes to own[part], and -(sum_j
 * W_ij) times them to that part's mix. */
static int put_part(hs_algo *a, hs_buf *msg, uint64_t r, int part, float *diff) {
    beer_state *s = a->priv;
    size_t at = msg->len, off = (size_t)part * a->d;
    uint64_t key = hs__part_round(hs__algo_key(a, r), part);
    int err = hs__algo_scale_diff(a, diff);
    if (err < 0) return err;
    if (!a->be) {
        err = hs_compress_encode(a->comp, diff, a->d, a->self, key, msg);
        if (err < 0) return err;
        return hs_compress_decode_add2(a->comp, msg->data + at, msg->len - at, a->self, key,
                                       a->own + off, 1.0f, s->mix + off, -s->mix_wsum, a->d);
    }
    /* The same operations on the device's diff, own part and mix; the host's own part takes
     * the bytes too. */
    err = hs__compress_encode_be(a->comp, a->be, diff, a->d, a->self, key, msg);
    if (err < 0 ||
        (err = hs__compress_decode_add2_be(a->comp, a->be, msg->data + at, msg->len - at,
                                           a->self, key, s->down + off, 1.0f, s->dmix + off,
                                           -s->mix_wsum, a->d)) < 0)
        return err;
    return hs_compress_decode_add(a->comp, msg->data + at, msg->len - at, a->self, key,
                                  a->own + off, a->d, 1.0f);
}

static int beer_push(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    beer_state *s = a->priv;
    size_t d = a->d;
    float gamma = a->cfg.gamma_c, *dh = a->tmp, *dg = a->tmp2;
    if ((a->reps_dirty || r % REBUILD_EVERY == 0) && (err = rebuild_mix(a, &v)) < 0) return err;
    float wsum = s->mix_wsum;
    double sq;
    if (a->be) {
        /* track and step_model on the device, in the same operations. */
        const hs_gossip_ops *go = a->be->ops->gossip;
        dh = s->ddh;
        dg = s->ddg;
        if ((err = go->beer_track(a->be, s->dv, s->ds_prev, dg, s->dmix + d, s->down + d, gamma,
                                  s->dxr, x, d)) < 0 ||
            (err = go->beer_step(a->be, x, dh, s->dxr, s->dmix, s->dv, s->down, gamma, d,
                                 &sq)) < 0)
            return err;
    } else {
        /* V^r from G^{r-1} (the replicas as the last pull left them) and this round's step. */
        hs__beer_track(s->v, s->s_prev, dg, s->mix + d, a->own + d, gamma, s->xr, x, d);
        /* X^{r+1} = X^r + gamma m_H - V^r. */
        sq = hs__beer_step_model(x, dh, s->xr, s->mix, s->v, a->own, gamma, d);
    }
    a->stats.disagreement = wsum > 0 ? sq / ((double)wsum * wsum * (double)d) : 0.0;
    hs_buf *msg;
    size_t cap = 4 + 2 * hs_compress_max_bytes(a->comp, d);
    hs__algo_wait_room(a, ex, &v, r, 1 + cap);
    if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA_PARTS, cap)) < 0) return err;
    uint32_t len0 = 0;
    size_t len_at = msg->len;
    if ((err = hs_buf_append(msg, &len0, 4)) < 0) goto out;
    /* H^{r+1} = H^r + C(X^{r+1} - H^r), then G^r = G^{r-1} + C(V^r - G^{r-1}). */
    if ((err = put_part(a, msg, r, 0, dh)) < 0) goto out;
    len0 = (uint32_t)(msg->len - len_at - 4);
    memcpy(msg->data + len_at, &len0, 4);
    if ((err = put_part(a, msg, r, 1, dg)) < 0) goto out;
    err = hs__algo_send_replica(a, ex, &v, r, msg);
out:
    hs_buf_unref(msg);
    return err < 0 ? err : 0;
}

/* The neighbours' round-r differences go into their replicas. A neighbour whose message is late
 * keeps its replicas of the round before in the next round's mixes (the late message is applied,
 * in order, when it comes), as in CHOCO. */
static int beer_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    (void)x;
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    uint8_t *present;
    if ((err = hs__algo_present(a, v.n_in, &present)) < 0) return err;
    beer_state *s = a->priv;
    /* The deltas go into the mixes as they are decoded while the mixes are current. */
    float *m = a->be ? s->dmix : s->mix;
    int got = hs__algo_recv_replicas(a, ex, &v, r, present, a->reps_dirty ? NULL : m);
    if (got < 0) return got;
    a->stats.missing = v.n_in - got;
    return a->reps_dirty ? rebuild_mix(a, &v) : 0;
}

/* BEER's own checkpoint fields: V and s_{r-1} (d floats each). X^r is set by every begin. In
 * device mode they come from the device first (unless a load not yet uploaded holds them). */
static int beer_save(const hs_algo *a, hs_buf *out) {
    beer_state *s = a->priv;
    int err = 0;
    if (a->be && !s->up &&
        ((err = hs_be_download(a->be, s->v, s->dv, sizeof(float) * a->d)) < 0 ||
         (err = hs_be_download(a->be, s->s_prev, s->ds_prev, sizeof(float) * a->d)) < 0))
        return err;
    err = hs__put_floats(out, s->v, a->d);
    return err < 0 ? err : hs__put_floats(out, s->s_prev, a->d);
}

static int beer_load(hs_algo *a, const uint8_t **p, const uint8_t *end) {
    beer_state *s = a->priv;
    /* Into the scratch vectors first: nothing changes unless the whole state is good. */
    int err;
    if ((err = hs__get_floats(p, end, a->tmp, a->d)) < 0 ||
        (err = hs__get_floats(p, end, a->tmp2, a->d)) < 0)
        return err;
    if (*p != end)
        return hs__err(HS_EFORMAT, "algorithm state: %zu trailing bytes", (size_t)(end - *p));
    memcpy(s->v, a->tmp, sizeof(float) * a->d);
    memcpy(s->s_prev, a->tmp2, sizeof(float) * a->d);
    s->up = a->be != NULL;
    return 0;
}

const hs__algo_ops hs__algo_beer = {
    .name = "beer",
    .synchronous = 1,
    .fixed_neighbours = 1,
    .uses_gamma_c = 1,
    .default_compress = "topk:0.01",
    .default_topology = "ring",
    .needs_replicas = 1,
    .pub_vectors = 2,
    /* dh lives in push alone (and in a load, which the node runs within a call): the node
     * keeps the caller's x there between rounds instead of a copy of its own. */
    .tmp_idle = 1,
    .priv_size = sizeof(beer_state),
    .check_compressor = beer_check_compressor,
    .init = beer_init,
    .fini = beer_fini,
    .begin = beer_begin,
    .push = beer_push,
    .pull = beer_pull,
    .save = beer_save,
    .load = beer_load,
    .to_device = beer_to_device,
};
