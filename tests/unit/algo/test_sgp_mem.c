/* SGP without a compressor (none) holds no vector but x and its messages (algo/sgp_share.c): a
 * pair of peers in the simulator, 16 MiB a vector, whose resident memory beyond their own x is
 * measured after each push and each pull (it was 3 scratch vectors a peer: the kept part, the
 * share, the decoded share); a share whose link is still busy is kept without being built or
 * sent, and SGP never waits for that link; the floats are push-sum's own to the bit; a bad share
 * leaves x and w as they were; out-neighbours of the same weight get one message between them. */
#include <malloc.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "algo/algo_internal.h"
#include "hearsay/algo.h"
#include "hearsay/error.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"

#include "resident.h"

/* 16 MiB and a little: a message of it is not kept in the algorithm's pool of small payloads
 * for reuse (HS__POOL_MAX_BYTES), as no model's of several GB is. */
enum { D = (1 << 22) + 5 };

/* An exchange over the simulator's: counts sends, answers wait_room with `busy` (a link that
 * still carries a share) and records the longest wait asked; `spoil` changes the next share
 * drained (1: a NaN value, 2: cut short by a byte, 3: a weight of 0). */
typedef struct wex {
    hs_exchange ex, *inner;
    int sends, rooms, busy, spoil;
    int max_wait_ms;
    const hs_buf *sent[4]; /* the first payloads sent */
} wex;

static int w_view(hs_exchange *ex, uint64_t r, hs_peer_view *v) {
    hs_exchange *in = ((wex *)ex->impl)->inner;
    return in->ops->view(in, r, v);
}
static int w_send(hs_exchange *ex, uint32_t to, uint64_t r, hs_buf *b) {
    wex *e = ex->impl;
    if (e->sends < 4) e->sent[e->sends] = b;
    e->sends++;
    return e->inner->ops->send(e->inner, to, r, b);
}
static int w_recv(hs_exchange *ex, uint32_t from, uint64_t r, int t, hs_buf **out) {
    hs_exchange *in = ((wex *)ex->impl)->inner;
    return in->ops->recv(in, from, r, t, out);
}
static int w_drain(hs_exchange *ex, hs_msg *out, int max) {
    wex *e = ex->impl;
    int n = e->inner->ops->drain(e->inner, out, max);
    for (int i = 0; i < n && e->spoil; i++) {
        hs_buf *b = out[i].payload;
        float nan = NAN;
        double zero = 0;
        if (e->spoil == 1) memcpy(b->data + 9 + 12 + 4 * 1000, &nan, 4);
        if (e->spoil == 2) b->len--;
        if (e->spoil == 3) memcpy(b->data + 1, &zero, 8);
        e->spoil = 0;
    }
    return n;
}
static void w_stats(hs_exchange *ex, hs_exchange_stats *out) {
    hs_exchange *in = ((wex *)ex->impl)->inner;
    in->ops->stats(in, out);
}
static int w_wait_room(hs_exchange *ex, uint32_t to, size_t bytes, int timeout_ms) {
    (void)to;
    (void)bytes;
    wex *e = ex->impl;
    e->rooms++;
    if (timeout_ms > e->max_wait_ms) e->max_wait_ms = timeout_ms;
    return e->busy ? HS_ETIMEDOUT : 0;
}

static const hs_exchange_ops wex_ops = {.view = w_view, .send = w_send, .recv = w_recv,
                                        .drain = w_drain, .stats = w_stats,
                                        .wait_room = w_wait_room};

typedef struct pair {
    hs_topo *topo;
    hs_simnet *sim;
    hs_algo *a[2];
    float *x[2];
    wex e[2];
} pair;

static void pair_new(pair *p, int staleness) {
    memset(p, 0, sizeof(*p));
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_SGP;
    cfg.compress = "none";
    cfg.staleness = staleness;
    cfg.recv_timeout_ms = 0;
    assert_int_equal(hs_topo_new(&p->topo, "onepeer-exp", 2, 5), 0);
    assert_int_equal(hs_simnet_new(&p->sim, p->topo), 0);
    for (int i = 0; i < 2; i++) {
        p->x[i] = malloc(sizeof(float) * D);
        assert_non_null(p->x[i]);
        for (size_t k = 0; k < D; k++) p->x[i][k] = (float)(k % 97) * 0.013f - (float)i * 0.7f;
        assert_int_equal(hs_algo_new(&p->a[i], &cfg, (uint32_t)i, D, p->x[i]), 0);
        p->e[i] = (wex){{&wex_ops, &p->e[i]}, hs_simnet_exchange(p->sim, i), 0, 0, 0, 0, 0, {0}};
    }
}

static void pair_free(pair *p) {
    for (int i = 0; i < 2; i++) {
        hs_algo_free(p->a[i]);
        free(p->x[i]);
    }
    hs_simnet_free(p->sim);
    hs_topo_free(p->topo);
}

static double weight(const hs_algo *a) {
    hs_algo_stats st;
    hs_algo_get_stats(a, &st);
    return st.push_weight;
}

/* Not built under a sanitizer, whose allocator keeps freed blocks resident; left out rather
 * than skipped, since cmocka's TAP output writes a skip as "not ok # SKIP", which meson counts
 * as a failure. */
#if !SANITIZED
/* Three rounds of the pair, both peers pushing before either pulls (each share in flight
 * meanwhile): beyond the two x, at most the two shares after the pushes (one vector each) and
 * nothing after the pulls, with 0.25 of a vector for the allocator's and the loader's noise. */
static void test_no_scratch_vectors(void **state) {
    (void)state;
    /* Blocks of a vector's size are mapped and unmapped as they come and go (glibc would raise
     * its threshold past them after the first free and keep them in its heap), and nothing
     * writes into a block that was only allocated (MALLOC_PERTURB_). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_PERTURB, 0);
    pair p;
    pair_new(&p, 0);
    double vec = sizeof(float) * (double)D, base = rss(), worst_push = 0, worst_pull = 0;
    for (uint64_t r = 0; r < 3; r++) {
        for (int i = 0; i < 2; i++) {
            hs_simnet_set_clock(p.sim, i, (double)r + 1);
            assert_int_equal(hs_algo_push(p.a[i], &p.e[i].ex, r, p.x[i]), 0);
        }
        double m = (rss() - base) / vec;
        if (m > worst_push) worst_push = m;
        for (int i = 0; i < 2; i++)
            assert_int_equal(hs_algo_pull(p.a[i], &p.e[i].ex, r, p.x[i]), 0);
        m = (rss() - base) / vec;
        if (m > worst_pull) worst_pull = m;
    }
    printf("# beyond the two x: %.2f vectors after the pushes, %.2f after the pulls\n", worst_push,
           worst_pull);
    assert_true(worst_push <= 2.25);
    assert_true(worst_pull <= 0.25);
    for (int i = 0; i < 2; i++) assert_true(fabs(weight(p.a[i]) - 1.0) < 1e-12);
    pair_free(&p);
}
#endif

/* The pushes and pulls of round 0 to the bit: each peer keeps p_ii x and sends p_ji x (both 1/2
 * on two peers), then adds the share that came; x_i = 0.5 x_i + (0 + 0.5 x_j). */
static void test_push_sum_to_the_bit(void **state) {
    (void)state;
    pair p;
    pair_new(&p, 0);
    float *want = malloc(sizeof(float) * D);
    assert_non_null(want);
    for (size_t k = 0; k < D; k++) want[k] = 0.5f * p.x[0][k] + (0.0f + 0.5f * p.x[1][k]);
    for (int i = 0; i < 2; i++) assert_int_equal(hs_algo_push(p.a[i], &p.e[i].ex, 0, p.x[i]), 0);
    assert_int_equal(p.e[0].sends, 1);
    assert_int_equal(hs_algo_pull(p.a[0], &p.e[0].ex, 0, p.x[0]), 0);
    for (size_t k = 0; k < D; k++)
        if (memcmp(&p.x[0][k], &want[k], 4))
            fail_msg("x[%zu] = %.9g, want %.9g", k, (double)p.x[0][k], (double)want[k]);
    assert_true(weight(p.a[0]) == 1.0);
    free(want);
    pair_free(&p);
}

/* Peer 0's link still carries its share before: the new share is neither built nor sent, it
 * stays with peer 0 (x and w as they were: 0.5 x + 0.5 x is x), and SGP asked for room without
 * waiting; peer 1, which gets nothing, keeps half. With room again, the share goes. */
static void test_busy_link_keeps_share(void **state) {
    (void)state;
    pair p;
    pair_new(&p, 0);
    float *x0 = malloc(sizeof(float) * D);
    assert_non_null(x0);
    memcpy(x0, p.x[0], sizeof(float) * D);
    p.e[0].busy = 1;
    p.e[0].max_wait_ms = -1;
    assert_int_equal(hs_algo_push(p.a[0], &p.e[0].ex, 0, p.x[0]), 0);
    assert_int_equal(p.e[0].rooms, 1);
    assert_int_equal(p.e[0].max_wait_ms, 0);
    assert_int_equal(p.e[0].sends, 0);
    assert_int_equal(hs_simnet_queued(p.sim), 0);
    assert_int_equal(hs_algo_pull(p.a[0], &p.e[0].ex, 0, p.x[0]), 0);
    assert_memory_equal(p.x[0], x0, sizeof(float) * D);
    assert_true(weight(p.a[0]) == 1.0);
    assert_int_equal(hs_algo_push(p.a[1], &p.e[1].ex, 0, p.x[1]), 0);
    assert_int_equal(hs_algo_pull(p.a[1], &p.e[1].ex, 0, p.x[1]), 0);
    assert_true(weight(p.a[1]) == 0.5);
    assert_true(hs_simnet_inflight_weight(p.sim) == 0.5); /* peer 1's share */
    p.e[0].busy = 0;
    assert_int_equal(hs_algo_push(p.a[0], &p.e[0].ex, 1, p.x[0]), 0);
    assert_int_equal(p.e[0].sends, 1);
    assert_true(hs_simnet_inflight_weight(p.sim) == 1.0); /* and peer 0's, half its weight */
    free(x0);
    pair_free(&p);
}

/* A share that never comes is missing: with staleness 1, peer 1 waits at round 1 for peer 0's
 * share of round 0, which peer 0 kept (its link was busy) while its share of round 1 is on the
 * way (sent, not arrived: a latency): the wait ends at once (HS_ENOENT), not in a timeout, and
 * the share counts in `missing`, as a neighbour's message that did not come does in every
 * other algorithm. */
static void test_kept_share_is_missing(void **state) {
    (void)state;
    pair p;
    pair_new(&p, 1);
    p.e[0].busy = 1;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(hs_algo_push(p.a[i], &p.e[i].ex, 0, p.x[i]), 0);
        assert_int_equal(hs_algo_pull(p.a[i], &p.e[i].ex, 0, p.x[i]), 0);
    }
    assert_int_equal(p.e[0].sends, 0);
    p.e[0].busy = 0;
    hs_simnet_set_latency(p.sim, 1.0);
    assert_int_equal(hs_algo_push(p.a[0], &p.e[0].ex, 1, p.x[0]), 0);
    assert_int_equal(p.e[0].sends, 1);
    assert_int_equal(hs_algo_push(p.a[1], &p.e[1].ex, 1, p.x[1]), 0);
    assert_int_equal(hs_algo_pull(p.a[1], &p.e[1].ex, 1, p.x[1]), 0);
    hs_algo_stats st;
    hs_algo_get_stats(p.a[1], &st);
    assert_int_equal(st.waits, 1);
    assert_int_equal(st.wait_timeouts, 0);
    assert_int_equal(st.missing, 1);
    pair_free(&p);
}

/* A share with a value that is not finite, one cut short by a byte, one of weight 0: dropped
 * whole, the receiver's x and w as they were before the pull. */
static void test_bad_share_changes_nothing(void **state) {
    (void)state;
    for (int spoil = 1; spoil <= 3; spoil++) {
        pair p;
        pair_new(&p, 0);
        float *x0 = malloc(sizeof(float) * D);
        assert_non_null(x0);
        for (int i = 0; i < 2; i++)
            assert_int_equal(hs_algo_push(p.a[i], &p.e[i].ex, 0, p.x[i]), 0);
        memcpy(x0, p.x[0], sizeof(float) * D);
        p.e[0].spoil = spoil;
        assert_int_equal(hs_algo_pull(p.a[0], &p.e[0].ex, 0, p.x[0]), 0);
        assert_int_equal(p.e[0].spoil, 0); /* the share came, and was spoiled */
        assert_memory_equal(p.x[0], x0, sizeof(float) * D);
        assert_true(weight(p.a[0]) == 0.5);
        free(x0);
        pair_free(&p);
    }
}

/* On a ring of 4 each peer pushes a third of x to each of its two out-neighbours: one message,
 * sent to both (a vector in flight, not one a neighbour), with the share's bytes p x. */
static void test_equal_weights_one_message(void **state) {
    (void)state;
    enum { N = 4, DS = 3001 };
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_SGP;
    cfg.compress = "none";
    cfg.staleness = 0;
    hs_topo *topo;
    hs_simnet *sim;
    assert_int_equal(hs_topo_new(&topo, "ring", N, 5), 0);
    assert_int_equal(hs_simnet_new(&sim, topo), 0);
    float x[DS];
    for (size_t k = 0; k < DS; k++) x[k] = (float)(k % 89) * 0.017f - 0.3f;
    hs_algo *a;
    assert_int_equal(hs_algo_new(&a, &cfg, 0, DS, x), 0);
    wex e = {{&wex_ops, &e}, hs_simnet_exchange(sim, 0), 0, 0, 0, 0, 0, {0}};
    hs_peer_view v;
    assert_int_equal(e.inner->ops->view(e.inner, 0, &v), 0);
    assert_int_equal(v.n_out, 2);
    float p = (float)v.out[0].w, want[DS];
    for (size_t k = 0; k < DS; k++) want[k] = p * x[k];
    assert_int_equal(hs_algo_push(a, &e.ex, 0, x), 0);
    assert_int_equal(e.sends, 2);
    assert_ptr_equal(e.sent[0], e.sent[1]);
    hs_msg m[4];
    hs_exchange *to = hs_simnet_exchange(sim, (int)v.out[0].id);
    int n = to->ops->drain(to, m, 4);
    assert_int_equal(n, 1);
    assert_int_equal(m[0].payload->len, 9 + 12 + sizeof(want));
    assert_memory_equal(m[0].payload->data + 9 + 12, want, sizeof(want));
    hs_buf_unref(m[0].payload);
    hs_algo_free(a);
    hs_simnet_free(sim);
    hs_topo_free(topo);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#if !SANITIZED
        cmocka_unit_test(test_no_scratch_vectors),
#endif
        cmocka_unit_test(test_push_sum_to_the_bit),
        cmocka_unit_test(test_busy_link_keeps_share),
        cmocka_unit_test(test_kept_share_is_missing),
        cmocka_unit_test(test_bad_share_changes_nothing),
        cmocka_unit_test(test_equal_weights_one_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
