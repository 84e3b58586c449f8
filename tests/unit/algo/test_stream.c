/* D-PSGD with one neighbour taking the neighbour's model in pieces (algo/stream.c, dpsgd.c's
 * mix_piece), through an exchange that hands the simulator's message up in pieces of odd sizes
 * (1 byte, a value cut in two, several blocks): the mix is the whole message's to the bit; a
 * value that is not finite, a message that stops, or a bad head leave the blocks mixed before
 * them mixed and every other value at this peer's own (the neighbour counted missing). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "algo/algo_internal.h"
#include "hearsay/algo.h"
#include "hearsay/error.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"

/* An exchange over the simulator's that hands a message up in pieces, optionally spoiled. */
typedef struct pex {
    hs_exchange ex, *inner;
    hs_buf *cur; /* the message being handed up (a copy: the sender's stays as it was) */
    uint64_t round;
    size_t nan_at;  /* value index made NaN (SIZE_MAX: none) */
    size_t stop_at; /* bytes handed up before the "timeout" */
    int bad_type;   /* the payload's type byte changed */
    size_t cut_to;  /* the message handed up as one of this many bytes (0: as it is) */
    int pieces;
} pex;

static int p_view(hs_exchange *ex, uint64_t r, hs_peer_view *v) {
    hs_exchange *in = ((pex *)ex->impl)->inner;
    return in->ops->view(in, r, v);
}
static int p_send(hs_exchange *ex, uint32_t to, uint64_t r, hs_buf *b) {
    hs_exchange *in = ((pex *)ex->impl)->inner;
    return in->ops->send(in, to, r, b);
}
static int p_recv(hs_exchange *ex, uint32_t from, uint64_t r, int t, hs_buf **out) {
    hs_exchange *in = ((pex *)ex->impl)->inner;
    return in->ops->recv(in, from, r, t, out);
}
static int p_drain(hs_exchange *ex, hs_msg *out, int max) {
    hs_exchange *in = ((pex *)ex->impl)->inner;
    return in->ops->drain(in, out, max);
}
static void p_stats(hs_exchange *ex, hs_exchange_stats *out) {
    hs_exchange *in = ((pex *)ex->impl)->inner;
    in->ops->stats(in, out);
}

static const size_t sizes[] = {1, 7, 4097, 13, 3001, 2, 65536};

static int p_recv_piece(hs_exchange *ex, uint32_t from, uint64_t r, uint64_t at, int t,
                        hs_piece *out) {
    pex *e = ex->impl;
    if (!e->cur || e->round != r) {
        hs_buf *b;
        int err = e->inner->ops->recv(e->inner, from, r, t, &b);
        if (err < 0) return err;
        hs_buf_unref(e->cur);
        assert_int_equal(hs_buf_new(&e->cur, b->len), 0);
        memcpy(e->cur->data, b->data, b->len);
        e->cur->len = b->len;
        hs_buf_unref(b);
        e->round = r;
        if (e->nan_at != SIZE_MAX) {
            float nan = NAN;
            memcpy(e->cur->data + 1 + 12 + 4 * e->nan_at, &nan, 4);
        }
        if (e->bad_type) e->cur->data[0] = 2;
        if (e->cut_to) e->cur->len = e->cut_to;
    }
    if (at >= e->stop_at) return HS_ETIMEDOUT;
    size_t n = sizes[e->pieces++ % (sizeof(sizes) / sizeof(sizes[0]))];
    if (n > e->cur->len - at) n = e->cur->len - (size_t)at;
    if (n > e->stop_at - at) n = e->stop_at - (size_t)at;
    *out = (hs_piece){hs_buf_ref(e->cur), e->cur->data + at, n, at, e->cur->len};
    return 0;
}

static const hs_exchange_ops pex_ops = {.view = p_view, .send = p_send, .recv = p_recv,
                                        .drain = p_drain, .stats = p_stats,
                                        .recv_piece = p_recv_piece};

enum { D = 5003 };

/* One round of a D-PSGD pair, peer 0 taking peer 1's model through e; checks peer 0's x: the
 * values below `mixed` are the whole mix's to the bit, the others this peer's own. */
static void run(pex *e, size_t mixed, int missing) {
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    assert_int_equal(hs_algo_kind_parse("dpsgd", &cfg.kind), 0);
    cfg.compress = "none";
    cfg.recv_timeout_ms = 0;
    hs_topo *topo;
    hs_simnet *sim;
    assert_int_equal(hs_topo_new(&topo, "ring", 2, 5), 0);
    assert_int_equal(hs_simnet_new(&sim, topo), 0);
    double W[4];
    assert_int_equal(hs_topo_matrix(topo, 0, W), 0);
    hs_algo *a[2];
    float *x[2], *xr[2], *want = malloc(sizeof(float) * D);
    for (int i = 0; i < 2; i++) {
        x[i] = malloc(sizeof(float) * D);
        xr[i] = malloc(sizeof(float) * D);
        for (size_t k = 0; k < D; k++) x[i][k] = (float)(k % 97) * 0.013f - (float)i * 0.7f;
        assert_int_equal(hs_algo_new(&a[i], &cfg, (uint32_t)i, D, x[i]), 0);
    }
    e->inner = hs_simnet_exchange(sim, 0);
    e->ex.ops = &pex_ops;
    e->ex.impl = e;
    for (int i = 0; i < 2; i++) {
        memcpy(xr[i], x[i], sizeof(float) * D);
        assert_int_equal(hs_algo_begin(a[i], hs_simnet_exchange(sim, i), 0, x[i]), 0);
        for (size_t k = 0; k < D; k++) x[i][k] -= 0.01f * (x[i][k] - (float)i);
    }
    float w = (float)W[1];
    for (size_t k = 0; k < D; k++) want[k] = k < mixed ? x[0][k] + w * (xr[1][k] - xr[0][k]) : x[0][k];
    for (int i = 0; i < 2; i++) hs_simnet_set_clock(sim, i, 1.0);
    assert_int_equal(hs_algo_pull(a[0], &e->ex, 0, x[0]), 0);
    for (size_t k = 0; k < D; k++)
        if (x[0][k] != want[k])
            fail_msg("[%zu]: %.9g, want %.9g (mixed below %zu)", k, (double)x[0][k],
                     (double)want[k], mixed);
    hs_algo_stats st;
    hs_algo_get_stats(a[0], &st);
    assert_int_equal(st.missing, missing);
    assert_true(e->pieces > 3 || e->bad_type || e->cut_to);
    hs_buf_unref(e->cur);
    for (int i = 0; i < 2; i++) {
        hs_algo_free(a[i]);
        free(x[i]);
        free(xr[i]);
    }
    free(want);
    hs_simnet_free(sim);
    hs_topo_free(topo);
}

static void test_pieces_mix_to_the_bit(void **state) {
    (void)state;
    pex e = {.nan_at = SIZE_MAX, .stop_at = SIZE_MAX};
    run(&e, D, 0);
}

/* Value 3000 (block 2: values 2048-3071) is NaN: blocks 0 and 1 are mixed, no other value. */
static void test_bad_value_stops_at_its_block(void **state) {
    (void)state;
    pex e = {.nan_at = 3000, .stop_at = SIZE_MAX};
    run(&e, 2048, 1);
}

/* The message stops after 1500 values: block 0 is mixed, the part of block 1 that came is not. */
static void test_cut_message(void **state) {
    (void)state;
    pex e = {.nan_at = SIZE_MAX, .stop_at = 1 + 12 + 4 * 1500};
    run(&e, 1024, 1);
}

static void test_bad_head_mixes_nothing(void **state) {
    (void)state;
    pex e = {.nan_at = SIZE_MAX, .stop_at = SIZE_MAX, .bad_type = 1};
    run(&e, 0, 1);
}

/* A whole message shorter than its head (the sender's total says so): nothing to mix, and
 * the neighbour is missing, not taken as mixed; one whose head is complete but whose values
 * are short is refused by the head's length check. */
static void test_short_message_is_missing(void **state) {
    (void)state;
    pex e = {.nan_at = SIZE_MAX, .stop_at = SIZE_MAX, .cut_to = 5};
    run(&e, 0, 1);
    pex f = {.nan_at = SIZE_MAX, .stop_at = SIZE_MAX, .cut_to = 1 + 12 + 4 * 100};
    run(&f, 0, 1);
}

/* CHOCO's replica of a neighbour taken in pieces (algo/replica_stream.c): with a message of 16
 * MiB (4M fp32 values, the size from which it streams), two rounds give peer 0 the x of the
 * whole-message path (the simulator's exchange, which has no recv_piece) to the bit; a message
 * that stops midway, or carries a value that is not finite, loses the replica: a full one is
 * asked for (resyncs), the neighbour missing, and x the same as for a message that did not
 * come at all. The same with fp16 deltas (8M values: 2 bytes each, runs of that width), where
 * a run width taken as 4 bytes would put every value elsewhere. */
enum { DC = 1 << 22, DC16 = 1 << 23 };

static void choco_rounds(pex *e, const char *comp, size_t dc, float *x0out, hs_algo_stats *st) {
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    assert_int_equal(hs_algo_kind_parse("choco", &cfg.kind), 0);
    cfg.compress = comp;
    cfg.gamma_c = 0.25f;
    cfg.same_start = 1;
    cfg.recv_timeout_ms = 0;
    hs_topo *topo;
    hs_simnet *sim;
    assert_int_equal(hs_topo_new(&topo, "ring", 2, 5), 0);
    assert_int_equal(hs_simnet_new(&sim, topo), 0);
    hs_algo *a[2];
    float *x[2];
    for (int i = 0; i < 2; i++) {
        x[i] = malloc(sizeof(float) * dc);
        for (size_t k = 0; k < dc; k++) x[i][k] = (float)(k % 97) * 0.013f;
        assert_int_equal(hs_algo_new(&a[i], &cfg, (uint32_t)i, dc, x[i]), 0);
    }
    hs_exchange *ex0 = hs_simnet_exchange(sim, 0);
    if (e) {
        e->inner = ex0;
        e->ex.ops = &pex_ops;
        e->ex.impl = e;
        ex0 = &e->ex;
    }
    for (uint64_t r = 0; r < 2; r++) {
        for (int i = 0; i < 2; i++) {
            for (size_t k = 0; k < dc; k++) x[i][k] -= 0.1f * (x[i][k] - (float)i);
            assert_int_equal(hs_algo_push(a[i], hs_simnet_exchange(sim, i), r, x[i]), 0);
        }
        for (int i = 0; i < 2; i++) hs_simnet_set_clock(sim, i, (double)r + 1.0);
        assert_int_equal(hs_algo_pull(a[0], ex0, r, x[0]), 0);
        assert_int_equal(hs_algo_pull(a[1], hs_simnet_exchange(sim, 1), r, x[1]), 0);
        if (e && r == 0) {
            e->stop_at = SIZE_MAX; /* the spoiled message was round 0's */
            e->nan_at = SIZE_MAX;
        }
    }
    memcpy(x0out, x[0], sizeof(float) * dc);
    hs_algo_get_stats(a[0], st);
    if (e) hs_buf_unref(e->cur);
    for (int i = 0; i < 2; i++) {
        hs_algo_free(a[i]);
        free(x[i]);
    }
    hs_simnet_free(sim);
    hs_topo_free(topo);
}

/* comp's messages of d values, `width` bytes each: taken in pieces, the whole message's bits;
 * with `bad`, round 0's message cut a third of the way, or with a value that is not finite (a
 * float NaN's bytes, which are an fp16 NaN too): the replica is lost. */
static void choco_stream_case(const char *comp, size_t d, size_t width, int bad_cases) {
    float *want = malloc(sizeof(float) * d), *got = malloc(sizeof(float) * d);
    hs_algo_stats st;
    choco_rounds(NULL, comp, d, want, &st);
    assert_int_equal(st.resyncs, 0);
    pex e = {.nan_at = SIZE_MAX, .stop_at = SIZE_MAX};
    choco_rounds(&e, comp, d, got, &st);
    assert_true(e.pieces > 100); /* it streamed */
    assert_int_equal(st.resyncs, 0);
    assert_int_equal(st.missing, 0);
    assert_memory_equal(got, want, sizeof(float) * d);
    pex cut = {.nan_at = SIZE_MAX, .stop_at = 1 + 12 + width * (d / 3)};
    pex nan = {.nan_at = d / 2 * width / 4, .stop_at = SIZE_MAX}; /* in 4-byte units */
    pex *bad[] = {&cut, &nan};
    for (int i = 0; i < 2 * bad_cases; i++) {
        choco_rounds(bad[i], comp, d, got, &st);
        assert_int_equal(st.resyncs, 1);
        assert_int_equal(st.missing, 1); /* round 1's: no replica to apply its delta to */
        assert_memory_not_equal(got, want, sizeof(float) * d);
    }
    free(want);
    free(got);
}

static void test_choco_replica_in_pieces(void **state) {
    (void)state;
    choco_stream_case("none", DC, 4, 1);
}

static void test_choco_fp16_replica_in_pieces(void **state) {
    (void)state;
    /* The bad messages' handling is the width's as well, and fp16's 8M values cost seconds. */
    choco_stream_case("fp16", DC16, 2, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_choco_replica_in_pieces),
        cmocka_unit_test(test_choco_fp16_replica_in_pieces),
        cmocka_unit_test(test_pieces_mix_to_the_bit),
        cmocka_unit_test(test_bad_value_stops_at_its_block),
        cmocka_unit_test(test_cut_message),
        cmocka_unit_test(test_bad_head_mixes_nothing),
        cmocka_unit_test(test_short_message_is_missing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
