/* Stochastic Gradient Push (Assran, Loizou, Ballas and Rabbat, ICML 2019, Algorithm 1):
 * push-sum over a directed, possibly time-varying graph with column-stochastic shares p_ji.
 *   x_half = x_i - gamma g(z_i),  z_i = x_i / w_i          (local steps, by the caller)
 *   keep p_ii (x_half, w_i); push (p_ji x_half, p_ji w_i) to each out-neighbour j
 *   x_i, w_i += every (x, w) share that has arrived, of any round
 * Peers never wait for each other in lockstep: a share is added whenever it arrives, so a slow
 * peer slows nobody. With --staleness TAU > 0 a peer waits (up to the receive timeout) for the
 * shares of round r - TAU from in-neighbours that keep up; one that misses the wait is marked
 * lagging and not waited for again until its shares catch up (stragglers and crashed peers never
 * stall the others): a share is waited for at most SGP_WAIT_ROUNDS times this peer's own round
 * (its time outside the wait) plus the wait its most punctual other in-neighbour usually costs
 * (what the links cost everyone), once the sender's share before was already that late (one
 * late share, a pause of a busy host, is waited for in full), so a peer that computes several
 * times slower is found lagging at its second late share instead of holding everyone to its
 * pace for as long as the receive timeout allows, while links that delay every share alike are
 * still waited for. Mass is conserved: a
 * compressed share C(p x) leaves its compression error p x - C(p x) with the sender, so the sum
 * of all x (and of all w), shares in flight included, is unchanged by a round. w is one weight a
 * block of x (sgp_state.h), so that a share taken in pieces as it arrives (sgp_recv.c) adds each
 * block with its own weight, never values without theirs: each block is a push-sum of its own,
 * and all blocks' weights are equal while every share comes whole in one pull. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "algo/sgp_share.h"
#include "algo/sgp_state.h"
#include "compress/device.h"
#include "core/clock.h"
#include "core/error_internal.h"
#include "core/log.h"
#include "tensor/gossip_ops.h"

/* The smallest weight a peer pushes from. One that gets no share (its in-neighbours paused or
 * far behind, which staleness 0 never waits for) halves w each round: 128 such rounds and 1 / w
 * is no float, z = x / w not finite. Below this, x = w z still holds z to a float's precision,
 * and a share of it would add less than a float's rounding to any peer of weight above 1e-13. */
#define SGP_MIN_WEIGHT 1e-20
/* The longest staleness wait, in this peer's own rounds (each with the most punctual
 * in-neighbour's usual wait). A peer that keeps up is late by less than that (its share was
 * sent about when ours was); one that computes 4x slower, with staleness 1, by about 3 rounds:
 * waiting for it would run every peer at its pace (docs/WAN.md). */
#define SGP_WAIT_ROUNDS 2.0
/* The shortest such budget: a share of a consensus-only round of a millisecond that a busy host
 * delays by a few is not a lagging peer. */
#define SGP_WAIT_MIN_S 0.1

static int sgp_check_compressor(const hs_compressor *c) {
    const char *name = hs_compressor_name(c);
    int ef = hs_compressor_residual(c) != NULL;
    /* The operator's spec without the ef: prefix, for the suggested fix. */
    const char *inner = ef ? name + 3 : name;
    if (ef)
        return hs__err(HS_EINVAL, "--algo sgp --compress %s: the error-feedback residual "
                                  "holds push-sum mass that no peer counts, so the average "
                                  "drifts (use --compress %s: SGP already keeps each "
                                  "share's compression error with its sender)",
                       name, inner);
    return 0;
}

static double sgp_now(hs_exchange *ex) {
    return ex->ops->now ? ex->ops->now(ex) : hs__mono_s();
}

static int sgp_init(hs_algo *a, const float *x0) {
    (void)x0;
    sgp_state *s = a->priv;
    s->lossless = hs_compressor_codec(a->comp) == HS_CODEC_NONE;
    if (!(s->z = malloc(sizeof(float) * a->d)) ||
        (!s->lossless && !(s->res = malloc(sizeof(float) * a->d))))
        return hs__err(HS_ENOMEM, "sgp: out of memory for %zu parameters", a->d);
    s->cap_msgs = 64;
    s->nb = (a->d + HS__SGP_BLOCK - 1) / HS__SGP_BLOCK;
    if (!(s->msgs = malloc(sizeof(hs_msg) * (size_t)s->cap_msgs)) ||
        !(s->pcs = malloc(sizeof(hs_msg_piece) * (size_t)s->cap_msgs)) ||
        !(s->w = malloc(sizeof(double) * s->nb)) || !(s->wk = malloc(sizeof(double) * s->nb)))
        return hs__err(HS_ENOMEM, "sgp: out of memory");
    for (size_t b = 0; b < s->nb; b++) s->w[b] = 1.0;
    return 0;
}

static void sgp_fini(hs_algo *a) {
    sgp_state *s = a->priv;
    if (!s) return;
    free(s->z);
    free(s->res);
    free(s->snd);
    free(s->msgs);
    free(s->pcs);
    free(s->w);
    free(s->wk);
    hs__sgp_rx_free(s);
    if (a->be) {
        hs_be_free(a->be, s->dkeep);
        hs_be_free(a->be, s->dshare);
        hs_be_free(a->be, s->dres);
    }
}

static int sgp_to_device(hs_algo *a, hs_backend *be) {
    sgp_state *s = a->priv;
    int err = hs_be_alloc_f(be, a->d, &s->dkeep);
    if (err == 0) err = hs_be_alloc_f(be, a->d, &s->dshare);
    if (err == 0) err = hs_be_alloc_f(be, a->d, &s->dres);
    if (err < 0) {
        hs_be_free(be, s->dkeep);
        hs_be_free(be, s->dshare);
        s->dkeep = s->dshare = NULL;
        return hs__err_prefix(err, "sgp: device state of %zu parameters", a->d);
    }
    return 0;
}

/* The weights of a share p x: p w_b for each block b, after its type byte. */
static int put_weights(const sgp_state *s, double p, hs_buf *msg) {
    int err = 0;
    for (size_t b = 0; b < s->nb && err == 0; b++) {
        double wj = p * s->w[b];
        err = hs_buf_append(msg, &wj, 8);
    }
    return err;
}

/* The kept weights, summed in s->wk as a push goes (p_ii w, then each share that stayed), then
 * made the weights. */
static void keep_begin(sgp_state *s, double pself) {
    for (size_t b = 0; b < s->nb; b++) s->wk[b] = pself * s->w[b];
}
static void keep_add(sgp_state *s, double p) {
    for (size_t b = 0; b < s->nb; b++) s->wk[b] += p * s->w[b];
}
static void keep_end(sgp_state *s) { memcpy(s->w, s->wk, sizeof(double) * s->nb); }

/* The smallest weight of a block, and whether every one is a positive number. */
static double min_weight(const sgp_state *s) {
    double m = s->w[0];
    for (size_t b = 1; b < s->nb; b++)
        if (!(s->w[b] >= m)) m = s->w[b];
    return m;
}

/* sgp_push's shares on the device, in its operations: keep = p_ii x, share = p_ji x, and
 * keep + share (an out-neighbour gone) or keep + (share - res) (the compression error), with
 * res = 0 + C(share) from the bytes sent. */
static int push_dev(hs_algo *a, hs_exchange *ex, uint64_t r, float *x, const hs_peer_view *v) {
    sgp_state *s = a->priv;
    hs_backend *be = a->be;
    const hs_gossip_ops *go = be->ops->gossip;
    size_t d = a->d;
    int err = go->scale_to(be, s->dkeep, x, d, (float)v->self_w);
    size_t hl = hs__sgp_head_len(s);
    keep_begin(s, v->self_w);
    for (int i = 0; i < v->n_out && err == 0; i++) {
        if ((err = go->scale_to(be, s->dshare, x, d, (float)v->out[i].w)) < 0) break;
        hs_buf *msg;
        if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_PUSH,
                                   hl - 1 + hs_compress_max_bytes(a->comp, d))) < 0)
            break;
        if ((err = put_weights(s, v->out[i].w, msg)) == 0 &&
            (err = hs__compress_encode_be(a->comp, be, s->dshare, d, a->self, hs__algo_key(a, r),
                                          msg)) >= 0)
            err = hs__algo_send(a, ex, v->out[i].id, r, msg);
        if (err == 1) {
            /* The out-neighbour is gone: its share stays here, mass and all. */
            err = hs_be_axpy(be, s->dkeep, s->dshare, d, 1.0f);
            keep_add(s, v->out[i].w);
        } else if (err >= 0 && !s->lossless) {
            if ((err = be->ops->fill(be, s->dres, d, 0.0f)) == 0 &&
                (err = hs__compress_decode_add_be(a->comp, be, msg->data + hl, msg->len - hl,
                                                  a->self, hs__algo_key(a, r), s->dres, d,
                                                  1.0f)) == 0)
                err = go->acc_diff(be, s->dkeep, s->dshare, s->dres, d, 1.0f);
        }
        hs_buf_unref(msg);
    }
    if (err >= 0) err = hs_be_copy_f(be, x, s->dkeep, d);
    if (err < 0) return err;
    keep_end(s);
    return 0;
}

/* z = x / w_b on values [first, first + n), each with its block's weight. */
static void sgp_eval_range(const hs_algo *a, float *z, const float *x, size_t first, size_t n) {
    const sgp_state *s = a->priv;
    for (size_t k = 0; k < n;) {
        size_t b = (first + k) / HS__SGP_BLOCK, end = (b + 1) * HS__SGP_BLOCK - first;
        float inv = (float)(1.0 / s->w[b]);
        for (end = end < n ? end : n; k < end; k++) z[k] = x[k] * inv;
    }
}

static void sgp_from_eval_range(const hs_algo *a, float *z, size_t first, size_t n) {
    const sgp_state *s = a->priv;
    for (size_t k = 0; k < n;) {
        size_t b = (first + k) / HS__SGP_BLOCK, end = (b + 1) * HS__SGP_BLOCK - first;
        float w = (float)s->w[b];
        for (end = end < n ? end : n; k < end; k++) z[k] = z[k] * w;
    }
}

static const float *sgp_eval_point(hs_algo *a, const float *x) {
    sgp_state *s = a->priv;
    sgp_eval_range(a, s->z, x, 0, a->d);
    return s->z;
}

/* The two above on the device, in their operations, a block at a time: z = x (1 / w) and
 * x = z w. */
static int sgp_eval_point_be(hs_algo *a, float *z, const float *x) {
    const sgp_state *s = a->priv;
    int err = 0;
    for (size_t b = 0; b < s->nb && err == 0; b++) {
        size_t k = b * HS__SGP_BLOCK;
        err = a->be->ops->gossip->scale_to(a->be, z + k, x + k, hs__sgp_block_len(a->d, b),
                                           (float)(1.0 / s->w[b]));
    }
    return err;
}

static int sgp_from_eval_point_be(hs_algo *a, float *x, const float *z) {
    const sgp_state *s = a->priv;
    int err = 0;
    for (size_t b = 0; b < s->nb && err == 0; b++) {
        size_t k = b * HS__SGP_BLOCK;
        err = a->be->ops->gossip->scale_to(a->be, x + k, z + k, hs__sgp_block_len(a->d, b),
                                           (float)s->w[b]);
    }
    return err;
}

static void sgp_metrics(const hs_algo *a, hs_algo_metric_fn emit, void *ctx) {
    emit(ctx, "push_weight", a->stats.push_weight, 0);
    emit(ctx, "staleness_max", a->stats.staleness_max, 1);
    emit(ctx, "staleness_mean", a->stats.staleness_mean, 0);
    /* receives that blocked for a neighbour's share (the straggler test reads it) */
    emit(ctx, "waits", (double)a->stats.waits, 1);
}

/* The weight share of a PUSH payload, its first block's (every block's, for a share that came
 * whole); the share's bytes are validated on receipt. */
static double sgp_payload_weight(const uint8_t *p, size_t len) {
    return len >= 9 && p[0] == HS_PAYLOAD_PUSH ? hs__sgp_weight(p, 0) : 0;
}

/* SGP's own checkpoint field, the last of the state: the push-sum weights (f64), one a block
 * (one for a model of one block, as before blocks). */
static int sgp_save(const hs_algo *a, hs_buf *out) {
    const sgp_state *s = a->priv;
    int err = 0;
    for (size_t b = 0; b < s->nb && err == 0; b++) err = hs__put_f64(out, s->w[b]);
    return err;
}

/* A file written before blocks holds one weight, every block's. */
static int sgp_load(hs_algo *a, const uint8_t **p, const uint8_t *end) {
    sgp_state *s = a->priv;
    size_t n = (size_t)(end - *p) / 8;
    if (n != 1 && n != s->nb)
        return hs__err(HS_EFORMAT, "algorithm state: %zu bytes of push-sum weights, want 8 or %zu "
                                   "(one a block of %zu values)",
                       (size_t)(end - *p), 8 * s->nb, HS__SGP_BLOCK);
    const uint8_t *q = *p;
    for (size_t b = 0; b < n; b++) {
        double w;
        int err = hs__get_f64(&q, end, &w);
        if (err < 0) return err;
        if (!(w > 0.0) || w > SGP_MAX_WEIGHT)
            return hs__err(HS_EFORMAT, "algorithm state: push-sum weight %g of block %zu", w, b);
    }
    if (q != end)
        return hs__err(HS_EFORMAT, "algorithm state: %zu trailing bytes", (size_t)(end - q));
    for (size_t b = 0; b < s->nb; b++) {
        const uint8_t *at = *p + 8 * (n == 1 ? 0 : b);
        (void)hs__get_f64(&at, end, &s->w[b]);
    }
    *p = end;
    a->stats.push_weight = min_weight(s);
    return 0;
}

/* Whether shares are taken in pieces as they arrive, from an exchange that hands up pieces (the
 * network runtime's): block by block uncompressed on the host, gathered whole otherwise. */
static int in_pieces(const hs_exchange *ex) {
    return ex->ops->drain_pieces && ex->ops->recv_piece;
}

/* Whether out-neighbour `to` can take a message of `bytes` now, asked without waiting (SGP never
 * waits for a link): 0 when its link still holds an earlier share (or it is gone), so that no
 * share is built only to be refused by send() (a second message of the model's size in memory). */
static int room_now(hs_exchange *ex, uint32_t to, size_t bytes) {
    if (!ex->ops->wait_room) return 1;
    int err = ex->ops->wait_room(ex, to, bytes, 0);
    return err != HS_ETIMEDOUT && err != HS_ECONNRESET;
}

/* sgp_push without a compressor (none): each share p_ji x is written into its message as it is
 * computed, and x becomes the kept part in place, p_ii x plus the shares that stayed (an
 * out-neighbour gone, or its link still busy with the share before), in the operations and order
 * of the general case below, so that the floats are the same: no vector but x and the messages.
 * Out-neighbours of the same weight (every graph with uniform weights) get the same bytes: one
 * message, sent to each of them, not one a neighbour. */
static int push_raw(hs_algo *a, hs_exchange *ex, uint64_t r, float *x, const hs_peer_view *v) {
    sgp_state *s = a->priv;
    size_t d = a->d, bytes = hs__sgp_head_len(s) + hs_compress_max_bytes(a->comp, d);
    uint8_t *kept;
    int err = hs__algo_present(a, v->n_out, &kept), nkept = 0;
    if (err < 0) return err;
    double p_msg = 0;
    keep_begin(s, v->self_w);
    hs_buf *msg = NULL; /* the share p_msg x (weights p_msg w), built for an out-neighbour before */
    for (int i = 0; i < v->n_out; i++) {
        if (!room_now(ex, v->out[i].id, bytes)) {
            HS_LOGD("round %llu: the share to peer %u stays here: its link still carries the one "
                    "before, or it is gone", (unsigned long long)r, v->out[i].id);
            err = 1;
        } else {
            if (msg && v->out[i].w != p_msg) {
                hs_buf_unref(msg);
                msg = NULL;
            }
            err = 0;
            if (!msg && ((err = hs__payload_new(a, &msg, HS_PAYLOAD_PUSH, bytes - 1)) < 0 ||
                         (err = put_weights(s, v->out[i].w, msg)) < 0 ||
                         (err = hs__sgp_put_share(a, x, (float)v->out[i].w, msg)) < 0)) {
                hs_buf_unref(msg);
                return err;
            }
            p_msg = v->out[i].w;
            err = hs__algo_send(a, ex, v->out[i].id, r, msg); /* 1: gone, the share stays */
        }
        if (err < 0) {
            hs_buf_unref(msg);
            return err;
        }
        kept[i] = err == 1;
        if (kept[i]) keep_add(s, v->out[i].w);
        nkept += kept[i];
    }
    hs_buf_unref(msg);
    float pself = (float)v->self_w;
    if (!nkept) {
        for (size_t k = 0; k < d; k++) x[k] = pself * x[k];
    } else {
        for (size_t k = 0; k < d; k++) {
            float t = pself * x[k];
            for (int i = 0; i < v->n_out; i++)
                if (kept[i]) t = t + (float)v->out[i].w * x[k];
            x[k] = t;
        }
    }
    keep_end(s);
    return 0;
}

static int sgp_push(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    sgp_state *s = a->priv;
    if (!s->started) {
        s->first_round = r;
        s->started = 1;
        /* From the first share on, large ones come in pieces (none taken yet). */
        if (in_pieces(ex)) (void)ex->ops->drain_pieces(ex, s->pcs, 0);
    }
    hs_peer_view v;
    int err = ex->ops->view(ex, r, &v);
    if (err < 0) return err;
    if (min_weight(s) < SGP_MIN_WEIGHT) {
        /* Every share stays here, mass and all, until one comes in (a pull adds its weight). */
        HS_LOGD("round %llu: push-sum weight %g, too small to share: nothing pushed",
                (unsigned long long)r, min_weight(s));
        return 0;
    }
    if (a->be) return push_dev(a, ex, r, x, &v);
    if (s->lossless) return push_raw(a, ex, r, x, &v);
    size_t d = a->d;
    /* The kept part: p_ii x and p_ii w, plus each share's compression residual. */
    float *keep = a->tmp, *share = a->tmp2;
    float pself = (float)v.self_w;
    for (size_t k = 0; k < d; k++) keep[k] = pself * x[k];
    size_t hl = hs__sgp_head_len(s);
    keep_begin(s, v.self_w);
    for (int i = 0; i < v.n_out; i++) {
        float p = (float)v.out[i].w;
        for (size_t k = 0; k < d; k++) share[k] = p * x[k];
        hs_buf *msg;
        if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_PUSH,
                                   hl - 1 + hs_compress_max_bytes(a->comp, d))) < 0)
            return err;
        if ((err = put_weights(s, v.out[i].w, msg)) < 0 ||
            (err = hs_compress_encode(a->comp, share, d, a->self, hs__algo_key(a, r), msg)) < 0) {
            hs_buf_unref(msg);
            return err;
        }
        err = hs__algo_send(a, ex, v.out[i].id, r, msg);
        if (err == 1) {
            /* The out-neighbour is gone: its share stays here, mass and all. */
            for (size_t k = 0; k < d; k++) keep[k] = keep[k] + share[k];
            keep_add(s, v.out[i].w);
            err = 0;
        } else if (err == 0 && !s->lossless) {
            /* The compression error p x - C(p x) stays with the sender. */
            memset(s->res, 0, sizeof(float) * d);
            err = hs_compress_decode_add(a->comp, msg->data + hl, msg->len - hl, a->self,
                                         hs__algo_key(a, r), s->res, d, 1.0f);
            if (err == 0)
                for (size_t k = 0; k < d; k++) keep[k] = keep[k] + (share[k] - s->res[k]);
        }
        hs_buf_unref(msg);
        if (err < 0) return err;
    }
    memcpy(x, keep, sizeof(float) * d);
    keep_end(s);
    return 0;
}

/* The longest wait for a share of sn, in seconds: SGP_WAIT_ROUNDS times this peer's own round
 * plus the usual wait of its most punctual other in-neighbour that keeps up (what the links
 * cost everyone), at least SGP_WAIT_MIN_S. Without such a one (a single in-neighbour, or none
 * measured yet): -1, nothing then tells sn's lateness from the links'. */
static double wait_budget_s(const sgp_state *s, const sender *sn) {
    double links = -1;
    for (int i = 0; i < s->n_snd; i++) {
        const sender *o = &s->snd[i];
        if (o == sn || o->lagging || o->wait_s < 0) continue;
        if (links < 0 || o->wait_s < links) links = o->wait_s;
    }
    if (links < 0 || !(s->round_s > 0)) return -1;
    double b = SGP_WAIT_ROUNDS * (s->round_s + links);
    return b > SGP_WAIT_MIN_S ? b : SGP_WAIT_MIN_S;
}

/* The receive's timeout for sn's share: the budget only for a sender whose previous share was
 * already later than it. One late share (a pause of a loaded host) is waited for in full, up to
 * the receive timeout, so it costs no mass: only a sender late twice running, as a peer that
 * computes several times slower is, is let go. */
static int wait_ms(const hs_algo *a, const sender *sn, double budget) {
    if (budget < 0 || !sn->late) return a->cfg.recv_timeout_ms;
    double b = budget * 1e3;
    return b < a->cfg.recv_timeout_ms ? (int)ceil(b) : a->cfg.recv_timeout_ms;
}

/* A payload or a piece of one drained: a share that came whole is added as one. */
static int take_piece(hs_algo *a, float *x, uint64_t r, const hs_msg_piece *m, double *dis,
                      int *nshares) {
    const hs_piece *pc = &m->pc;
    if (pc->off == 0 && pc->len == pc->total) {
        a->stats.bytes_recv += pc->len;
        return hs__sgp_add_whole(a, x, r, m->from, m->round, pc->p, pc->len, dis, nshares);
    }
    int err = hs__sgp_add_piece(a, x, r, m->from, m->round, pc, dis, nshares);
    return err < 0 ? err : 0;
}

/* The share of `old` from `from`, waited for up to ms: whole, or in pieces from where it stands
 * until all of it came (or the rest of it was dropped); recv's errors. */
static int await_share(hs_algo *a, hs_exchange *ex, float *x, uint64_t r, uint32_t from,
                       uint64_t old, int ms, double *dis, int *nshares) {
    sgp_state *s = a->priv;
    if (!in_pieces(ex)) {
        hs_buf *b = NULL;
        int got = ex->ops->recv(ex, from, old, ms, &b);
        if (got < 0) return got;
        a->stats.bytes_recv += b->len;
        got = hs__sgp_add_whole(a, x, r, from, old, b->data, b->len, dis, nshares);
        hs_buf_unref(b);
        return got;
    }
    double end = sgp_now(ex) + 1e-3 * ms;
    for (;;) {
        double left = end - sgp_now(ex);
        hs_msg_piece m = {from, old, {0}};
        int got = ex->ops->recv_piece(ex, from, old, hs__sgp_piece_at(s, from, old),
                                      left > 0 ? (int)ceil(1e3 * left) : 0, &m.pc);
        if (got < 0) return got;
        got = take_piece(a, x, r, &m, dis, nshares);
        hs_buf_unref(m.pc.buf);
        if (got < 0 || !hs__sgp_piece_at(s, from, old)) return got;
    }
}

static int sgp_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    sgp_state *s = a->priv;
    size_t d = a->d;
    int err = 0;
    a->stats.staleness_max = 0;
    a->stats.staleness_mean = 0;
    a->stats.missing = 0;
    double dis = 0;
    int nshares = 0;
    /* Everything that has arrived, of any round (in pieces: what has of each share). */
    int pieces = in_pieces(ex);
    for (;;) {
        int n = pieces ? ex->ops->drain_pieces(ex, s->pcs, s->cap_msgs)
                       : ex->ops->drain(ex, s->msgs, s->cap_msgs);
        if (n < 0) return n;
        for (int i = 0, e; i < n; i++) {
            if (pieces) {
                e = take_piece(a, x, r, &s->pcs[i], &dis, &nshares);
                hs_buf_unref(s->pcs[i].pc.buf);
            } else {
                const hs_buf *b = s->msgs[i].payload;
                a->stats.bytes_recv += b->len;
                e = hs__sgp_add_whole(a, x, r, s->msgs[i].from, s->msgs[i].round, b->data,
                                      b->len, &dis, &nshares);
                hs_buf_unref(s->msgs[i].payload);
            }
            if (e < 0 && err >= 0) err = e; /* a device's failure; the rest are let go */
        }
        if (err < 0) return err;
        if (n < s->cap_msgs) break;
    }
    /* This round's time outside the pull (the local steps and the push), averaged: what a
     * peer that keeps up may keep us waiting. */
    double now = sgp_now(ex);
    if (s->t_pull > 0 && now > s->t_pull)
        s->round_s = s->round_s > 0 ? 0.75 * s->round_s + 0.25 * (now - s->t_pull)
                                    : now - s->t_pull;
    /* Bounded staleness for the peers that keep up: wait for the shares of round r - TAU. */
    if (a->cfg.staleness > 0 && r >= s->first_round + (uint64_t)a->cfg.staleness) {
        uint64_t old = r - (uint64_t)a->cfg.staleness;
        hs_peer_view ov;
        if ((err = ex->ops->view(ex, old, &ov)) < 0) return err;
        for (int i = 0; i < ov.n_in; i++) {
            sender *sn = hs__sgp_sender(s, ov.in[i].id, old);
            if (!sn) return hs__err(HS_ENOMEM, "sgp: out of memory");
            if (sn->lagging) continue;
            if (sn->next_round > old) { /* in already: no wait */
                sn->wait_s = sn->wait_s > 0 ? 0.75 * sn->wait_s : 0;
                sn->late = 0;
                continue;
            }
            /* Everything that had arrived was drained above: this receive blocks. */
            a->stats.waits++;
            double t0 = sgp_now(ex), budget = wait_budget_s(s, sn);
            int got = await_share(a, ex, x, r, sn->id, old, wait_ms(a, sn, budget), &dis,
                                  &nshares);
            double w = sgp_now(ex) - t0;
            sn->late = budget >= 0 && w > budget;
            sn->wait_s = sn->wait_s >= 0 ? 0.75 * sn->wait_s + 0.25 * w : w;
            if (got == HS_ETIMEDOUT || got == HS_ECONNRESET) {
                sn->lagging = 1;
                a->stats.missing++;
                a->stats.wait_timeouts++;
                HS_LOGI("sgp: round %llu: peer %u is more than %d rounds behind; not waiting for it",
                        (unsigned long long)r, sn->id, a->cfg.staleness);
                continue;
            }
            if (got == HS_ENOENT) {
                /* Never coming, and not for being late: the sender kept that share (its link
                 * still carried the one before) and a later one of its is on the way. */
                HS_LOGD("sgp: round %llu: peer %u sent no share of round %llu",
                        (unsigned long long)r, sn->id, (unsigned long long)old);
                a->stats.missing++;
                continue;
            }
            if (got < 0) return got;
        }
    }
    s->t_pull = sgp_now(ex);
    if (nshares) a->stats.staleness_mean /= nshares;
    a->stats.disagreement = nshares ? dis / ((double)nshares * (double)d) : 0.0;
    double wmin = min_weight(s);
    a->stats.push_weight = wmin;
    if (!(wmin > 0.0) || !isfinite(wmin))
        return hs__err(HS_EDIVERGED, "sgp: push-sum weight became %g at round %llu", wmin,
                       (unsigned long long)r);
    return 0;
}

const hs__algo_ops hs__algo_sgp = {
    .name = "sgp",
    .synchronous = 0,
    .default_compress = "none",
    .default_topology = "onepeer-exp",
    /* Waiting for the shares of the round before from peers that keep up keeps the push-sum
     * weights nearer 1 on a loaded machine (smallest w 0.17-0.28 against 0.02-0.18 with 0).
     * The divergence issue 19 saw at 0 was the node applying the caller's step as change / w
     * (node/vec.c); both train since that was fixed (docs/RESULTS.md). */
    .default_staleness = 1,
    .needs_replicas = 0,
    .priv_size = sizeof(sgp_state),
    .check_compressor = sgp_check_compressor,
    .init = sgp_init,
    .fini = sgp_fini,
    .push = sgp_push,
    .pull = sgp_pull,
    .eval_point = sgp_eval_point,
    .eval_range = sgp_eval_range,
    .from_eval_range = sgp_from_eval_range,
    .metrics = sgp_metrics,
    .payload_weight = sgp_payload_weight,
    .save = sgp_save,
    .load = sgp_load,
    .to_device = sgp_to_device,
    .eval_point_be = sgp_eval_point_be,
    .from_eval_point_be = sgp_from_eval_point_be,
};
