/* SGP's push-sum blocks on the device (sgp.c's device path past one block of HS__SGP_BLOCK
 * values, which test_cuda_round's models of 1000 never reach): three peers of a model of two
 * blocks and a partial third, each block starting with a weight of its own (a checkpoint
 * loaded), run in lockstep as two jobs, all on the host and with peers 1 and 2 on the device.
 * Each round every peer takes its local step at z = x / w_b (hs_algo_eval_point, or its device
 * form, then back through from_eval_point), and after it every peer's x, its z and its saved
 * state (the weight of every block) must be the same bits in both jobs; z must be x times
 * 1 / w_b, block by block, also taken by hs__algo_eval_range at offsets that straddle blocks.
 * Shares come whole (the simulator's drain) or cut into pieces inside the head and inside and
 * across blocks (an exchange with drain_pieces, as the network runtime's): a host peer then adds
 * an uncompressed share block by block, a device peer gathers it and adds it whole. Uncompressed
 * and fp16.
 *
 * Exit codes as tests/cuda (../cuda_open.h): 77, with a note, without a CUDA build or a GPU; a
 * failure where a GPU cannot be opened or with HEARSAY_REQUIRE_CUDA=1. Runs under
 * ../shared/tools/cuda-emu; `--reference` runs it on gossip_ref.h's reference device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../cuda_open.h"
#include "gossip_ref.h"
#include "algo/algo_internal.h"
#include "algo/sgp_state.h"
#include "compress/compress_ew.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"
#include "tensor/gossip_ops.h"

#define NP 3
#define NB 3
#define ROUNDS 4
/* Two blocks and a partial third. */
static const size_t D = 2 * HS__SGP_BLOCK + 12345;

static hs_backend *dev;
static int reference;

/* The simulator's exchange with drain_pieces (and recv_piece) besides: its ops, the others
 * reused on the same endpoint (they read only ex->impl). drain_pieces hands up every message
 * that arrived in pieces, all at once: cut inside the head, inside block 0 (mid-float), across
 * blocks 0 and 1 and inside block 2 (the cuts past a shorter, compressed message's end left
 * out). */
static const hs_exchange_ops *sim_ops;
static hs_exchange_ops pieces_ops;

static int p_recv_piece(hs_exchange *ex, uint32_t from, uint64_t r, uint64_t at, int t,
                        hs_piece *out) {
    (void)ex, (void)from, (void)r, (void)at, (void)t, (void)out;
    return HS_ETIMEDOUT; /* staleness 0: never waited on */
}

static int p_drain_pieces(hs_exchange *ex, hs_msg_piece *out, int max) {
    if (max == 0) return 0; /* asked for pieces from now on */
    const size_t val0 = 1 + 8 * NB + HS__CHDR, blk = sizeof(float) * HS__SGP_BLOCK;
    const size_t cuts[] = {5, val0 + 4 * 1000 + 2, val0 + blk + 4 * 7, val0 + 2 * blk + 3};
    hs_msg m[8];
    int k = sim_ops->drain(ex, m, 8), n = 0;
    assert_true(k < 8);
    for (int i = 0; i < k; i++) {
        hs_buf *b = m[i].payload;
        size_t off = 0;
        for (size_t c = 0; c <= sizeof(cuts) / sizeof(cuts[0]); c++) {
            size_t end = c < sizeof(cuts) / sizeof(cuts[0]) ? cuts[c] : b->len;
            if (end > b->len) end = b->len;
            if (end <= off) continue;
            assert_true(n < max);
            out[n++] = (hs_msg_piece){m[i].from, m[i].round,
                                      {hs_buf_ref(b), b->data + off, end - off, off, b->len}};
            off = end;
        }
        hs_buf_unref(b);
    }
    return n;
}

/* One job: NP peers; with `mixed`, peers 1 and 2 on dev (x, target, z in its memory). */
typedef struct job {
    hs_topo *topo;
    hs_simnet *sim;
    hs_exchange e[NP]; /* the simulator's endpoints, read in pieces */
    hs_algo *a[NP];
    float *xh[NP], *th[NP];       /* host x and target */
    float *x[NP], *t[NP], *z[NP]; /* where the peer works: xh, th and a host z, or dev's */
    int on_dev[NP];
} job;

/* Value k of peer i's vector `which`: scattered over [-0.5, 0.5), no two peers alike. */
static float start_value(int i, int which, size_t k) {
    uint64_t h = ((uint64_t)k * 2654435761u + (uint64_t)(97 * i + 31 * which)) % 1000003;
    return (float)((double)h / 1000003.0 - 0.5);
}

/* Peer i's weight of block b at the start: every block's its own. */
static double start_weight(int i, size_t b) {
    return 1.0 + 0.25 * (double)(((size_t)i + 2 * b) % 5);
}

/* The push-sum weights at the end of a's saved state (SGP's own field, the last). */
static void saved_weights(const hs_buf *b, double *w) {
    assert_true(b->len >= 8 * NB);
    memcpy(w, b->data + b->len - 8 * NB, 8 * NB);
}

static hs_buf *save(const hs_algo *a) {
    hs_buf *b;
    assert_int_equal(hs_buf_new(&b, 64), 0);
    if (hs_algo_save(a, b) < 0) fail_msg("save: %s", hs_error_message());
    return b;
}

static void job_new(job *j, const char *spec, int mixed) {
    memset(j, 0, sizeof(*j));
    assert_int_equal(hs_topo_new(&j->topo, "ring", NP, 5), 0);
    assert_int_equal(hs_simnet_new(&j->sim, j->topo), 0);
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_SGP;
    cfg.compress = spec;
    cfg.seed = 3;
    cfg.staleness = 0;
    cfg.recv_timeout_ms = 0;
    for (int i = 0; i < NP; i++) {
        hs_exchange *sx = hs_simnet_exchange(j->sim, i);
        if (!sim_ops) {
            sim_ops = sx->ops;
            pieces_ops = *sx->ops;
            pieces_ops.drain_pieces = p_drain_pieces;
            pieces_ops.recv_piece = p_recv_piece;
        }
        j->e[i] = (hs_exchange){&pieces_ops, sx->impl};
        j->xh[i] = malloc(sizeof(float) * D);
        j->th[i] = malloc(sizeof(float) * D);
        assert_true(j->xh[i] && j->th[i]);
        for (size_t k = 0; k < D; k++) {
            j->xh[i][k] = start_value(i, 0, k);
            j->th[i][k] = 4.0f * start_value(i, 1, k);
        }
        if (hs_algo_new(&j->a[i], &cfg, (uint32_t)i, D, j->xh[i]) < 0)
            fail_msg("hs_algo_new: %s", hs_error_message());
        j->on_dev[i] = mixed && (i == 1 || i == 2);
        if (j->on_dev[i] && hs__algo_to_device(j->a[i], dev) != 1)
            fail_msg("peer %d did not move to the device: %s", i, hs_error_message());
        /* Every block its own weight, as a checkpoint of a peer that took shares in pieces
         * holds them. */
        hs_buf *b = save(j->a[i]);
        assert_int_equal(((const sgp_state *)j->a[i]->priv)->nb, NB);
        for (size_t bk = 0; bk < NB; bk++) {
            double w = start_weight(i, bk);
            memcpy(b->data + b->len - 8 * (NB - bk), &w, 8);
        }
        if (hs_algo_load(j->a[i], b->data, b->len) < 0)
            fail_msg("load of peer %d: %s", i, hs_error_message());
        hs_buf_unref(b);
        j->x[i] = j->xh[i];
        j->t[i] = j->th[i];
        if (!j->on_dev[i]) {
            assert_non_null(j->z[i] = malloc(sizeof(float) * D));
            continue;
        }
        assert_int_equal(hs_be_alloc_f(dev, D, &j->x[i]), 0);
        assert_int_equal(hs_be_alloc_f(dev, D, &j->t[i]), 0);
        assert_int_equal(hs_be_alloc_f(dev, D, &j->z[i]), 0);
        assert_int_equal(hs_be_upload(dev, j->x[i], j->xh[i], sizeof(float) * D), 0);
        assert_int_equal(hs_be_upload(dev, j->t[i], j->th[i], sizeof(float) * D), 0);
    }
}

static void job_free(job *j) {
    for (int i = 0; i < NP; i++) {
        if (j->on_dev[i]) {
            hs_be_free(dev, j->x[i]);
            hs_be_free(dev, j->t[i]);
            hs_be_free(dev, j->z[i]);
        } else {
            free(j->z[i]);
        }
        hs_algo_free(j->a[i]); /* before the backend's vectors go */
        free(j->xh[i]);
        free(j->th[i]);
    }
    hs_simnet_free(j->sim);
    hs_topo_free(j->topo);
}

static hs_exchange *ex_of(job *j, int i, int pieces) {
    return pieces ? &j->e[i] : hs_simnet_exchange(j->sim, i);
}

/* Peer i's local step at its evaluation point: z = x / w_b, z += 0.1 (target - z), x = z w_b,
 * where x lives; zout (host) receives the z the step was taken at. */
static void local_step(job *j, int i, float *zout) {
    hs_algo *a = j->a[i];
    if (j->on_dev[i]) {
        if (hs__algo_eval_point_be(a, j->z[i], j->x[i]) < 0)
            fail_msg("device eval point: %s", hs_error_message());
        assert_int_equal(hs_be_download(dev, zout, j->z[i], sizeof(float) * D), 0);
        assert_int_equal(dev->ops->gossip->acc_diff(dev, j->z[i], j->t[i], j->z[i], D, 0.1f),
                         0);
        if (hs__algo_from_eval_point_be(a, j->x[i], j->z[i]) < 0)
            fail_msg("device from eval point: %s", hs_error_message());
        return;
    }
    memcpy(zout, hs_algo_eval_point(a, j->x[i]), sizeof(float) * D);
    memcpy(j->z[i], zout, sizeof(float) * D);
    hs__acc_diff(j->z[i], j->t[i], j->z[i], D, 0.1f);
    memcpy(j->x[i], j->z[i], sizeof(float) * D);
    hs_algo_from_eval_point(a, j->x[i]);
}

/* z must be x (1 / w_b) on each block b of weight w[b], and so must hs__algo_eval_range's, a
 * run of values at a time that starts and ends inside blocks. */
static void check_z(const hs_algo *a, const float *x, const float *z, const double *w,
                    const char *what) {
    for (size_t k = 0; k < D; k++) {
        float want = x[k] * (float)(1.0 / w[k / HS__SGP_BLOCK]);
        if (hs_cw_bits(z[k]) != hs_cw_bits(want))
            fail_msg("%s: z[%zu] (block %zu) %a, x / w_b %a", what, k, k / HS__SGP_BLOCK,
                     (double)z[k], (double)want);
    }
    float *zr = malloc(sizeof(float) * D);
    assert_non_null(zr);
    for (size_t k = 0, run = 100003; k < D; k += run)
        hs__algo_eval_range(a, zr + k, x + k, k, D - k < run ? D - k : run);
    if (memcmp(zr, z, sizeof(float) * D))
        fail_msg("%s: hs__algo_eval_range's z differs from the evaluation point", what);
    free(zr);
}

static void one_round(job *j, uint64_t r, int pieces, float *const *zout) {
    for (int i = 0; i < NP; i++) {
        hs_simnet_set_clock(j->sim, i, (double)r + 0.5);
        if (hs_algo_begin(j->a[i], ex_of(j, i, pieces), r, j->x[i]) < 0)
            fail_msg("begin of peer %d, round %llu: %s", i, (unsigned long long)r,
                     hs_error_message());
        local_step(j, i, zout[i]);
    }
    for (int i = 0; i < NP; i++) {
        hs_simnet_set_clock(j->sim, i, (double)r + 1);
        if (hs_algo_push(j->a[i], ex_of(j, i, pieces), r, j->x[i]) < 0)
            fail_msg("push of peer %d, round %llu: %s", i, (unsigned long long)r,
                     hs_error_message());
    }
    for (int i = 0; i < NP; i++)
        if (hs_algo_pull(j->a[i], ex_of(j, i, pieces), r, j->x[i]) < 0)
            fail_msg("pull of peer %d, round %llu: %s", i, (unsigned long long)r,
                     hs_error_message());
}

/* The two jobs of spec, shares whole or in pieces, round by round: every peer's z of the step,
 * x after the pull and saved state the same bits; z block by block x / w_b in both. */
static void run_pair(const char *spec, int pieces) {
    job host, mixed;
    job_new(&host, spec, 0);
    job_new(&mixed, spec, 1);
    float *zh[NP], *zm[NP], *xm = malloc(sizeof(float) * D);
    assert_non_null(xm);
    for (int i = 0; i < NP; i++) {
        zh[i] = malloc(sizeof(float) * D);
        zm[i] = malloc(sizeof(float) * D);
        assert_true(zh[i] && zm[i]);
    }
    double wlo = 1e300, whi = 0;
    for (uint64_t r = 0; r < ROUNDS; r++) {
        one_round(&host, r, pieces, zh);
        one_round(&mixed, r, pieces, zm);
        /* The steps' z first: a wrong one spreads to every peer's x by the pull. */
        for (int i = 0; i < NP; i++)
            for (size_t k = 0; k < D; k++)
                if (hs_cw_bits(zh[i][k]) != hs_cw_bits(zm[i][k]))
                    fail_msg("%s%s, round %llu, peer %d: the step's z[%zu] (block %zu): host "
                             "job %a, mixed job %a", spec, pieces ? " in pieces" : "",
                             (unsigned long long)r, i, k, k / HS__SGP_BLOCK, (double)zh[i][k],
                             (double)zm[i][k]);
        for (int i = 0; i < NP; i++) {
            char what[96];
            snprintf(what, sizeof(what), "%s%s, round %llu, peer %d", spec,
                     pieces ? " in pieces" : "", (unsigned long long)r, i);
            if (mixed.on_dev[i])
                assert_int_equal(hs_be_download(dev, xm, mixed.x[i], sizeof(float) * D), 0);
            else
                memcpy(xm, mixed.x[i], sizeof(float) * D);
            for (size_t k = 0; k < D; k++)
                if (hs_cw_bits(host.x[i][k]) != hs_cw_bits(xm[k]))
                    fail_msg("%s: x[%zu] (block %zu): host job %a, mixed job %a", what, k,
                             k / HS__SGP_BLOCK, (double)host.x[i][k], (double)xm[k]);
            hs_buf *bh = save(host.a[i]), *bm = save(mixed.a[i]);
            if (bh->len != bm->len || memcmp(bh->data, bm->data, bh->len)) {
                double wh[NB], wm[NB];
                saved_weights(bh, wh);
                saved_weights(bm, wm);
                fail_msg("%s: saved states differ; weights host %a %a %a, mixed %a %a %a", what,
                         wh[0], wh[1], wh[2], wm[0], wm[1], wm[2]);
            }
            double wn[NB];
            saved_weights(bh, wn);
            /* Blocks of one weight would hide a block's weight taken for another's. */
            if (wn[0] == wn[1] || wn[1] == wn[2] || wn[0] == wn[2])
                fail_msg("%s: two blocks of the same weight (%g %g %g)", what, wn[0], wn[1],
                         wn[2]);
            for (int b = 0; b < NB; b++) {
                if (wn[b] < wlo) wlo = wn[b];
                if (wn[b] > whi) whi = wn[b];
            }
            hs_buf_unref(bh);
            hs_buf_unref(bm);
            /* z of the new x and weights: x / w_b on the host, the same bits on the device. */
            memcpy(zh[i], hs_algo_eval_point(host.a[i], host.x[i]), sizeof(float) * D);
            check_z(host.a[i], host.x[i], zh[i], wn, what);
            if (mixed.on_dev[i]) {
                if (hs__algo_eval_point_be(mixed.a[i], mixed.z[i], mixed.x[i]) < 0)
                    fail_msg("%s: device eval point: %s", what, hs_error_message());
                assert_int_equal(hs_be_download(dev, zm[i], mixed.z[i], sizeof(float) * D), 0);
            } else {
                memcpy(zm[i], hs_algo_eval_point(mixed.a[i], xm), sizeof(float) * D);
            }
            for (size_t k = 0; k < D; k++)
                if (hs_cw_bits(zh[i][k]) != hs_cw_bits(zm[i][k]))
                    fail_msg("%s: z[%zu] (block %zu) after the pull: host job %a, mixed job %a",
                             what, k, k / HS__SGP_BLOCK, (double)zh[i][k], (double)zm[i][k]);
        }
    }
    /* In pieces, a host peer fed an uncompressed share's blocks through its block buffer; a
     * device peer, or a compressed share, was gathered. */
    for (int i = 0; pieces && i < NP; i++) {
        const sgp_state *sh = host.a[i]->priv, *sm = mixed.a[i]->priv;
        int fed = !strcmp(spec, "none");
        assert_true(sh->n_rx > 0 && sm->n_rx > 0);
        if ((sh->blocks_fed > 0) != fed || (sm->blocks_fed > 0) != (fed && !mixed.on_dev[i]))
            fail_msg("%s: peer %d took its shares by another path", spec, i);
    }
    printf("# sgp %s%s: %d peers of %zu values (%d blocks), %d rounds, peers 1, 2 on %s: x, z "
           "and every block's weight bit-identical (weights %.4g..%.4g)\n",
           spec, pieces ? " in pieces" : " whole", NP, D, NB, ROUNDS, dev->description, wlo,
           whi);
    for (int i = 0; i < NP; i++) {
        free(zh[i]);
        free(zm[i]);
    }
    free(xm);
    job_free(&host);
    job_free(&mixed);
}

static void test_none_in_pieces(void **state) {
    (void)state;
    run_pair("none", 1);
}

static void test_none_whole(void **state) {
    (void)state;
    run_pair("none", 0);
}

static void test_fp16_in_pieces(void **state) {
    (void)state;
    run_pair("fp16", 1);
}

int main(int argc, char **argv) {
    int rc = gossip_test_open(argc, argv, &dev, &reference);
    if (rc != 0) return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none_in_pieces),
        cmocka_unit_test(test_none_whole),
        cmocka_unit_test(test_fp16_in_pieces),
    };
    int failed = cmocka_run_group_tests_name("cuda-sgp-blocks", tests, NULL, NULL);
    hs_backend_close(dev);
    return failed ? 1 : 0;
}
