/* DCD-PSGD (Tang, Gan, Zhang, Zhang and Liu, NeurIPS 2018, Algorithm 1; DESIGN.md section 4):
 *   x_half = sum_j W_ij xhat_j - gamma g_i       (xhat_i = x_i: every replica is exact)
 *   z_i    = x_half - x_i;  x_i += C(z_i);  every holder of a replica of x_i adds C(z_i)
 * The caller's local steps give x - gamma g at the start of end(); the mix uses the replicas
 * as they were at the start of the round (messages of round r-1 applied), the update C(z_i)
 * goes out, and the neighbours' round-r updates are applied to their replicas afterwards.
 * C must be unbiased (hs_algo_new refuses others): the average of the x_i is then kept in
 * expectation, not exactly, and the method is known to break down at high compression. */
#include <string.h>

#include "algo/algo_internal.h"
#include "core/error_internal.h"

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
    int err = hs__algo_view(a, ex, r, &v, x);
    if (err < 0) return err;
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
                                             hs__apply_replica, NULL);
        if (got < 0) return got;
        present[i] = (uint8_t)(got && n->synced);
        a->stats.missing += !present[i];
    }
    /* z = sum_j W_ij (xhat_j - x_r) + (x - x_r), in ascending order: the mixed model after the
     * local update, minus x_r (differences, so the float weights' rounding cannot move the
     * average; a missing neighbour's weight stays on x_r). */
    memset(acc, 0, sizeof(float) * d);
    double wsum = 0;
    for (int i = 0; i < v.n_in; i++) {
        if (!present[i]) continue;
        hs__acc_diff(acc, hs__algo_nbr(a, v.in[i].id)->rep, xr, d, (float)v.in[i].w);
        wsum += v.in[i].w;
    }
    double sq = 0;
    for (size_t k = 0; k < d; k++) {
        sq += (double)acc[k] * acc[k];
        acc[k] = acc[k] + (x[k] - xr[k]);
    }
    a->stats.disagreement = wsum > 0 ? sq / (wsum * wsum * (double)d) : 0.0;
    hs_buf *msg;
    if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA, hs_compress_max_bytes(a->comp, d))) < 0)
        return err;
    if ((err = hs_compress_encode(a->comp, acc, d, a->self, r, msg)) < 0) goto out;
    /* x_{r+1} = x_r + C(z), decoded from the same bytes the neighbours decode. */
    memcpy(x, xr, sizeof(float) * d);
    if ((err = hs_compress_decode_add(a->comp, msg->data + 1, msg->len - 1, a->self, r, x, d,
                                      1.0f)) < 0)
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
        int got = hs__algo_catch_up(a, ex, n, r, a->cfg.recv_timeout_ms, hs__apply_replica, NULL);
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
    .check_compressor = dcd_check_compressor,
    .begin = dcd_begin,
    .push = dcd_push,
    .pull = dcd_pull,
};
