/* CHOCO-SGD (Koloskova, Stich and Jaggi, ICML 2019, Algorithm 2; DESIGN.md section 4):
 *   x_half = x_i - gamma g_i                      (the local steps, done by the caller)
 *   q_i    = Q(x_half - xhat_i)                   (any compressor, biased ones included)
 *   xhat_j += q_j on every holder of a replica of j, xhat_i += q_i here
 *   x_i    = x_half + gamma_c sum_j W_ij (xhat_j - xhat_i)
 * Replicas are updated by decoding the very bytes that travel, the sender decoding its own
 * message too, so every holder of xhat_j has the same bits. An edge that is new (a membership
 * change, or the first round when peers did not start from the same x0) carries the sender's
 * full xhat once instead of q. For symmetric doubly stochastic W the gossip step keeps the
 * average of the x_i. Memory: one replica per in-neighbour plus xhat_i (own). */
#include <string.h>

#include "algo/algo_internal.h"
#include "core/error_internal.h"

static int choco_push(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    size_t d = a->d;
    float *xh = a->own, *diff = a->tmp;
    for (size_t k = 0; k < d; k++) diff[k] = x[k] - xh[k];
    hs_buf *msg;
    if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA, hs_compress_max_bytes(a->comp, d))) < 0)
        return err;
    if ((err = hs_compress_encode(a->comp, diff, d, a->self, r, msg)) >= 0 &&
        (err = hs_compress_decode_add(a->comp, msg->data + 1, msg->len - 1, a->self, r, xh, d,
                                      1.0f)) >= 0)
        err = hs__algo_send_replica(a, ex, &v, r, msg);
    hs_buf_unref(msg);
    return err < 0 ? err : 0;
}

static int choco_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, a->own);
    if (err < 0) return err;
    size_t d = a->d;
    float *xh = a->own;
    uint8_t *present;
    if ((err = hs__algo_present(a, v.n_in, &present)) < 0) return err;
    int got = hs__algo_recv_replicas(a, ex, &v, r, present);
    if (got < 0) return got;
    a->stats.missing = v.n_in - got;
    /* x = x_half + gamma_c sum_j W_ij (xhat_j - xhat_i), in ascending neighbour order; a missing
     * neighbour's weight goes to the peer itself, where xhat_i - xhat_i contributes nothing. */
    int m;
    if ((err = hs__algo_mix_present(a, &v, present, &m)) < 0) return err;
    double dis = hs__mix(HS_MIX_STEP, x, x, a->cfg.gamma_c, xh, a->mix_nb, a->mix_w, m, d);
    a->stats.disagreement = dis / (double)d;
    return 0;
}

const hs__algo_ops hs__algo_choco = {
    .needs_replicas = 1,
    .push = choco_push,
    .pull = choco_pull,
};
