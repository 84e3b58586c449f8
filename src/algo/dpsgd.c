/* D-PSGD (Lian et al., NeurIPS 2017, Algorithm 1): x_i <- sum_j W_ij x_j - gamma g_i(x_i).
 * The model of round r is sent at the start of the round, so it travels while the gradient is
 * computed; at the end the peer mixes what it received and adds its own local update:
 *   x_{r+1} = x_r + sum_j W_ij (C(x_j,r) - x_r) + (x_after_local_steps - x_r).
 * The wire carries C(x) (C = none for the paper's algorithm; a lossy cast such as fp16 is
 * accepted as well). A neighbour whose model does not come is left out: its weight goes to the
 * peer's own x_r. */
#include <string.h>

#include "algo/algo_internal.h"
#include "core/error_internal.h"

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
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, NULL);
    if (err < 0) return err;
    memcpy(a->own, x, sizeof(float) * a->d);
    if (v.n_out == 0) return 0;
    hs_buf *msg;
    if ((err = hs__payload_new(a, &msg, HS_PAYLOAD_DELTA, hs_compress_max_bytes(a->comp, a->d))) < 0)
        return err;
    if ((err = hs_compress_encode(a->comp, x, a->d, a->self, r, msg)) < 0) goto out;
    for (int i = 0; i < v.n_out && err >= 0; i++) err = hs__algo_send(a, ex, v.out[i].id, r, msg);
out:
    hs_buf_unref(msg);
    return err < 0 ? err : 0;
}

typedef struct mix_ctx {
    float *buf; /* receives C(x_j) */
    int used;
} mix_ctx;

/* Only the message of the current round is mixed; older ones (from a round in which the
 * neighbour was late) are consumed and dropped: D-PSGD keeps no replicas. */
static int apply_model(hs_algo *a, hs__nbr *n, uint64_t round, const uint8_t *p, size_t len,
                       void *vctx) {
    mix_ctx *c = vctx;
    if (len < 1 || p[0] != HS_PAYLOAD_DELTA)
        return hs__err(HS_EPROTO, "peer %u sent a payload of type %d to dpsgd", n->id, len ? p[0] : -1);
    if (c->used == -1) return 0; /* a stale round: drop */
    memset(c->buf, 0, sizeof(float) * a->d);
    int err = hs_compress_decode_add(a->comp, p + 1, len - 1, n->id, round, c->buf, a->d, 1.0f);
    if (err == 0) c->used = 1;
    return err;
}

static int dpsgd_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    hs_peer_view v;
    int err = hs__algo_view(a, ex, r, &v, NULL);
    if (err < 0) return err;
    size_t d = a->d;
    const float *xr = a->own;
    float *acc = a->tmp, *xj = a->tmp2;
    double wsum = 0;
    memset(acc, 0, sizeof(float) * d);
    a->stats.missing = 0;
    /* In ascending id order, so every run (simulated or networked) sums in the same order. */
    for (int i = 0; i < v.n_in; i++) {
        hs__nbr *n = hs__algo_nbr(a, v.in[i].id);
        /* Rounds this neighbour still owes from earlier are taken without waiting and dropped. */
        mix_ctx stale = {xj, -1};
        if (n->next_round < r &&
            (err = hs__algo_catch_up(a, ex, n, r - 1, 0, apply_model, &stale)) < 0)
            return err;
        if (n->next_round < r) n->next_round = r;
        mix_ctx c = {xj, 0};
        int got = hs__algo_catch_up(a, ex, n, r, a->cfg.recv_timeout_ms, apply_model, &c);
        if (got < 0) return got;
        if (!got || !c.used) {
            a->stats.missing++;
            continue;
        }
        hs__acc_diff(acc, xj, xr, d, (float)v.in[i].w);
        wsum += v.in[i].w;
    }
    /* x_{r+1} = x_r + sum_j W_ij (x_j - x_r) + (x - x_r) = x + sum_j W_ij (x_j - x_r). Mixing
     * differences rather than weighted values keeps the network average exact for any float
     * weights w_ij = w_ji (the terms of an edge cancel), where W_ii x_r + sum_j W_ij x_j would
     * drift with the rounding of the weights' sum. A missing neighbour's weight stays on x_r. */
    double sq = hs__step_sq(x, acc, 1.0f, d);
    a->stats.disagreement = wsum > 0 ? sq / (wsum * wsum * (double)d) : 0.0;
    return 0;
}

const hs__algo_ops hs__algo_dpsgd = {
    .name = "dpsgd",
    .synchronous = 1,
    .default_compress = "none",
    .default_topology = "ring",
    .needs_replicas = 0,
    .qg_momentum = 1,
    .check_compressor = dpsgd_check_compressor,
    .begin = dpsgd_begin,
    .pull = dpsgd_pull,
};
