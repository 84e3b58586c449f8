/* D-PSGD (Lian et al., NeurIPS 2017, Algorithm 1): x_i <- sum_j W_ij x_j - gamma g_i(x_i).
 * The model of round r is sent at the start of the round, so it travels while the gradient is
 * computed; at the end the peer mixes what it received and adds its own local update:
 *   x_{r+1} = x_r + sum_j W_ij (C(x_j,r) - x_r) + (x_after_local_steps - x_r).
 * The wire carries C(x) (C = none for the paper's algorithm; a lossy cast such as fp16 is
 * accepted as well). A neighbour whose model does not come is left out: its weight goes to the
 * peer's own x_r. */
#include <string.h>

#include "algo/algo_internal.h"
#include "compress/codec.h"
#include "core/error_internal.h"
#include "core/log.h"

/* With a compressor whose message is x itself (none), the round's message is x_r: it is kept
 * from begin to pull instead of a copy in a->own, and a neighbour's is read where it arrived. */
typedef struct dpsgd_state {
    hs_buf *sent;         /* this round's message, while x_r is read from it */
    const uint8_t *sent_x; /* x_r inside sent, checked once when it was sent */
    hs__dpsgd_dev *dev;    /* device mode (a->be): the round there (dpsgd_dev.c) */

    int own_x;            /* a->own holds x_r (from begin to pull) */
} dpsgd_state;

static void dpsgd_fini(hs_algo *a) {
    dpsgd_state *s = a->priv;
    if (s) hs_buf_unref(s->sent);
    if (s) hs__dpsgd_dev_free(a, s->dev);
}

static int dpsgd_to_device(hs_algo *a, hs_backend *be) {
    return hs__dpsgd_dev_new(a, be, &((dpsgd_state *)a->priv)->dev);
}

/* D-PSGD mixes C(x_j) itself: a compressor whose error is a rounding (the casts: delta >= 1 -
 * 2^-16) only perturbs the model within its float precision, but one that drops or coarsens
 * values without error feedback loses that information every round. */
#define DPSGD_MIN_DELTA (1.0 - 0x1p-12)

static int dpsgd_check_compressor(const hs_compressor *c) {
    const char *name = hs_compressor_name(c);
    int ef = hs_compressor_residual(c) != NULL;
    int unbiased = hs_compressor_unbiased(c);
    double delta = hs_compressor_delta(c);
    if (!ef && !unbiased && delta < DPSGD_MIN_DELTA)
        return hs__err(HS_EINVAL, "--algo dpsgd --compress %s: D-PSGD mixes the compressed "
                                  "models themselves, and %s drops information every round "
                                  "without error feedback (use --algo choco, or --compress "
                                  "ef:%s)",
                       name, name, name);
    return 0;
}

static int dpsgd_begin(hs_algo *a, hs_exchange *ex, uint64_t r, const float *x) {
    if (a->be) return hs__dpsgd_dev_begin(a, ((dpsgd_state *)a->priv)->dev, ex, r, x);
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, NULL);
    if (err < 0) return err;
    dpsgd_state *s = a->priv;
    hs_buf_unref(s->sent);
    s->sent = NULL;
    s->sent_x = NULL;
    s->own_x = 0;
    const uint8_t *vals;
    if (v.n_out == 0) {
        memcpy(a->own, x, sizeof(float) * a->d);
        s->own_x = 1;
        return 0;
    }
    hs_buf *msg;
    size_t cap = hs_compress_max_bytes(a->comp, a->d);
    hs__algo_wait_room(a, ex, &v, r, 1 + cap);
    if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA, cap)) < 0) return err;
    if ((err = hs_compress_encode(a->comp, x, a->d, a->self, hs__algo_key(a, r), msg)) < 0)
        goto out;
    if (hs__compress_values_raw(a->comp) &&
        hs__compress_f32_values(a->comp, msg->data + 1, msg->len - 1, &vals) == 0) {
        s->sent = hs_buf_ref(msg);
        s->sent_x = vals;
    } else {
        memcpy(a->own, x, sizeof(float) * a->d);
        s->own_x = 1;
    }
    for (int i = 0; i < v.n_out && err >= 0; i++) err = hs__algo_send(a, ex, v.out[i].id, r, msg);
out:
    hs_buf_unref(msg);
    return err < 0 ? err : 0;
}

static const void *dpsgd_round_x(const hs_algo *a) {
    const dpsgd_state *s = a->priv;
    return s->sent ? (const void *)s->sent_x : s->own_x ? (const void *)a->own : NULL;
}

/* x_r: where the round's message holds it, or a->own. */
static const uint8_t *sent_values(hs_algo *a) {
    dpsgd_state *s = a->priv;
    return s->sent ? s->sent_x : NULL;
}

/* x += w (x_j - x_r) from the values where they are (unaligned, little-endian fp32), through
 * a small block: the same operations as the in-place path, to the bit. Returns the sum of the
 * term's squares. */
static double mix_values(float *x, const uint8_t *xj, const uint8_t *xr, float w, size_t d) {
    float t[1024], b[1024];
    double sq = 0;
    for (size_t k = 0; k < d; k += 1024) {
        size_t n = d - k < 1024 ? d - k : 1024;
        memcpy(t, xj + 4 * k, sizeof(float) * n);
        memcpy(b, xr + 4 * k, sizeof(float) * n);
        for (size_t i = 0; i < n; i++) t[i] = w * (t[i] - b[i]);
        sq += hs__step_sq(x + k, t, 1.0f, n);
    }
    return sq;
}

/* x += w (x_j - x_r) as x_j's message arrives in pieces (hs__algo_recv_pieces): its head (the
 * payload type and the codec header) checked against the message's total before any value is
 * read, then each block of 1024 values checked finite before it is mixed, in the blocks and the
 * operations of mix_values, so the result is the same to the bit. Of a message that stops
 * (timeout, the neighbour gone, a bad value), the blocks mixed stay mixed and the rest keep
 * x_r's weight, as a message that does not come does: each coordinate's update is D-PSGD's own
 * (with or without that neighbour), none is half done. */
typedef struct mix_stream {
    float *x;
    const uint8_t *xr;
    float w;
    uint8_t head[1 + HS__CHDR];
    size_t head_have;
    hs__runs runs; /* values mixed: runs.k */
    double sq;
} mix_stream;

static int mix_run(hs_algo *a, const uint8_t *v, size_t n, size_t first, void *ctx) {
    mix_stream *m = ctx;
    int err = hs__compress_f32_check(a->comp, v, n, first);
    if (err < 0) return err;
    m->sq += mix_values(m->x + first, v, m->xr + 4 * first, m->w, n); /* one block */
    return 0;
}

static int mix_piece(hs_algo *a, const uint8_t *p, size_t len, uint64_t off, uint64_t total,
                     void *ctx) {
    mix_stream *m = ctx;
    uint64_t end = off + len;
    while (len && m->head_have < sizeof(m->head)) {
        m->head[m->head_have++] = *p++;
        len--;
        if (m->head_have < sizeof(m->head)) continue;
        if (m->head[0] != HS_PAYLOAD_DELTA)
            return hs__err(HS_EPROTO, "a payload of type %d to dpsgd", m->head[0]);
        int err = hs__compress_f32_head(a->comp, m->head + 1, (size_t)(total - 1));
        if (err < 0) return err;
    }
    /* A message that ends inside its head was never checked: not a model (else it would count
     * as mixed, with nothing of it mixed). */
    if (m->head_have < sizeof(m->head) && end >= total)
        return hs__err(HS_EPROTO, "a dpsgd message of %llu bytes, shorter than its %zu-byte head",
                       (unsigned long long)total, sizeof(m->head));
    return hs__algo_feed_runs(a, &m->runs, p, len, mix_run, m);
}

enum { MIX_BUF, MIX_IN_PLACE, MIX_VALUES };
typedef struct mix_ctx {
    float *buf; /* receives C(x_j), or (MIX_IN_PLACE) holds -x_r and receives C(x_j) - x_r */
    int used;
    int mode;
    /* MIX_VALUES: x += w (x_j - x_r) straight from the message; sq: the term's squares */
    float *x;
    const uint8_t *xr;
    float w;
    double sq;
} mix_ctx;

int hs__dpsgd_check_type(const hs__nbr *n, const uint8_t *p, size_t len) {
    if (len < 1 || p[0] != HS_PAYLOAD_DELTA)
        return hs__err(HS_EPROTO, "peer %u sent a payload of type %d to dpsgd", n->id,
                       len ? p[0] : -1);
    return 0;
}

/* Only the message of the current round is mixed; older ones (from a round in which the
 * neighbour was late) are consumed and dropped: D-PSGD keeps no replicas. */
static int apply_model(hs_algo *a, hs__nbr *n, uint64_t round, const uint8_t *p, size_t len,
                       void *vctx) {
    mix_ctx *c = vctx;
    int err = hs__dpsgd_check_type(n, p, len);
    if (err < 0) return err;
    if (c->used == -1) return 0; /* a stale round: drop */
    if (c->mode == MIX_VALUES) {
        const uint8_t *xj;
        err = hs__compress_f32_values(a->comp, p + 1, len - 1, &xj);
        if (err < 0) return err;
        c->sq = mix_values(c->x, xj, c->xr, c->w, a->d);
        c->used = 1;
        return 0;
    }
    if (c->mode == MIX_BUF) memset(c->buf, 0, sizeof(float) * a->d);
    /* In place, -x_r + C(x_j) is C(x_j) - x_r to the bit (IEEE subtraction is the addition of
     * the negation); on error the buffer is unchanged. */
    err = hs_compress_decode_add(a->comp, p + 1, len - 1, n->id, hs__algo_key(a, round), c->buf,
                                 a->d, 1.0f);
    if (err == 0) c->used = 1;
    return err;
}

/* Receives neighbour id's message of round r into c (older rounds it still owes are taken
 * without waiting and dropped): 1 when it came and decoded, 0 when it is missing. */
static int recv_model(hs_algo *a, hs_exchange *ex, uint64_t r, uint32_t id, mix_ctx *c) {
    hs__nbr *n = hs__algo_nbr(a, id);
    mix_ctx stale = {c->buf, -1, MIX_BUF, NULL, NULL, 0, 0};
    int err;
    if (n->next_round < r && (err = hs__algo_catch_up(a, ex, n, r - 1, 0, apply_model, &stale)) < 0)
        return err;
    if (n->next_round < r) n->next_round = r;
    int got = hs__algo_catch_up(a, ex, n, r, a->cfg.recv_timeout_ms, apply_model, c);
    if (got < 0) return got;
    if (!got || !c->used) a->stats.missing++;
    return got && c->used;
}

/* One neighbour (a pair, a path's end): x += w (x_j - x_r) from the two messages where they
 * are (MIX_VALUES), or x_r's own storage becomes w (x_j - x_r), the term the general case
 * accumulates; so the round needs no vector beyond x and x_r (a model of several GB mixes
 * without scratch vectors). x_r is dead once the round is mixed: the next begin writes it
 * again. Returns the sum of the term's squares. */
static int pull_one(hs_algo *a, hs_exchange *ex, uint64_t r, const hs_nbr *nb, float *x,
                    double *sq) {
    size_t d = a->d;
    const uint8_t *xr = sent_values(a);
    if (xr && ex->ops->recv_piece) {
        mix_stream m = {x, xr, (float)nb->w, {0}, 0, {{0}, 0, 0, 4}, 0};
        uint64_t taken = 0;
        int got = hs__algo_recv_pieces(a, ex, hs__algo_nbr(a, nb->id), r, a->cfg.recv_timeout_ms,
                                       mix_piece, &m, &taken);
        if (got < 0) return got;
        if (!got && m.runs.k)
            HS_LOGW("round %llu: the model of peer %u stopped after %zu of %zu values: those are "
                    "mixed, the others keep this peer's own, as for a model that does not come",
                    (unsigned long long)r, nb->id, m.runs.k, d);
        if (!got) a->stats.missing++;
        *sq = m.sq;
        return got;
    }
    if (xr) {
        mix_ctx c = {NULL, 0, MIX_VALUES, x, xr, (float)nb->w, 0};
        int got = recv_model(a, ex, r, nb->id, &c);
        *sq = c.sq;
        return got;
    }
    float *m = a->own;
    mix_ctx c = {m, 0, MIX_IN_PLACE, NULL, NULL, 0, 0};
    for (size_t k = 0; k < d; k++) m[k] = -m[k];
    int got = recv_model(a, ex, r, nb->id, &c);
    if (got <= 0) return got;
    float w = (float)nb->w;
    for (size_t k = 0; k < d; k++) m[k] = w * m[k];
    *sq = hs__step_sq(x, m, 1.0f, d);
    return 1;
}

static int dpsgd_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    if (a->be) return hs__dpsgd_dev_pull(a, ((dpsgd_state *)a->priv)->dev, ex, r, x);
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, NULL);
    if (err < 0) return err;
    size_t d = a->d;
    double wsum = 0, sq = 0;
    a->stats.missing = 0;
    ((dpsgd_state *)a->priv)->own_x = 0; /* own becomes the mix's scratch below */
    if (v.n_in == 1) {
        int got = pull_one(a, ex, r, &v.in[0], x, &sq);
        if (got < 0) return got;
        wsum = got ? v.in[0].w : 0;
    } else {
        const uint8_t *vals = sent_values(a);
        if (vals) memcpy(a->own, vals, sizeof(float) * d); /* x_r for the sum below */
        const float *xr = a->own;
        float *acc = a->tmp, *xj = a->tmp2;
        memset(acc, 0, sizeof(float) * d);
        /* In ascending id order, so every run (simulated or networked) sums in the same order. */
        for (int i = 0; i < v.n_in; i++) {
            mix_ctx c = {xj, 0, MIX_BUF, NULL, NULL, 0, 0};
            int got = recv_model(a, ex, r, v.in[i].id, &c);
            if (got < 0) return got;
            if (!got) continue;
            hs__acc_diff(acc, xj, xr, d, (float)v.in[i].w);
            wsum += v.in[i].w;
        }
        /* x_{r+1} = x_r + sum_j W_ij (x_j - x_r) + (x - x_r) = x + sum_j W_ij (x_j - x_r).
         * Mixing differences rather than weighted values keeps the network average exact for
         * any float weights w_ij = w_ji (the terms of an edge cancel), where W_ii x_r + sum_j
         * W_ij x_j would drift with the rounding of the weights' sum. A missing neighbour's
         * weight stays on x_r. */
        sq = hs__step_sq(x, acc, 1.0f, d);
    }
    a->stats.disagreement = wsum > 0 ? sq / (wsum * wsum * (double)d) : 0.0;
    dpsgd_state *s = a->priv;
    hs_buf_unref(s->sent); /* sent or not, the round is mixed */
    s->sent = NULL;
    s->sent_x = NULL;
    s->own_x = 0;
    return 0;
}

const hs__algo_ops hs__algo_dpsgd = {
    .name = "dpsgd",
    .synchronous = 1,
    .default_compress = "none",
    .default_topology = "ring",
    .needs_replicas = 0,
    .qg_momentum = 1,
    .priv_size = sizeof(dpsgd_state),
    .check_compressor = dpsgd_check_compressor,
    .fini = dpsgd_fini,
    .begin = dpsgd_begin,
    .pull = dpsgd_pull,
    .to_device = dpsgd_to_device,

    .round_x = dpsgd_round_x,
};
