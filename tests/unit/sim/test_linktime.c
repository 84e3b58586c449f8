/* Unit tests of the simulator's link time (src/sim/linktime.c) from tools/wan's profiles: a
 * two-peer exchange of B bytes over rate R and delay D takes D + 8B/R virtual seconds, to the
 * float; messages queue on shared links; a receive that waits (D-PSGD) is held up by a slow
 * link where a drain (SGP) is not; the ring all-reduce follows the alpha-beta model; the TCP
 * models slow only what their rule counts as congested. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/buf.h"
#include "hearsay/error.h"
#include "hearsay/exchange.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"
#include "sim/linktime.h"
#include "wan/profile.h"

static hs__wan_profile *parse(const char *json) {
    hs__wan_profile *p = NULL;
    if (hs__wan_profile_parse(&p, json, "test.json") < 0)
        fail_msg("%s: %s", json, hs_error_message());
    return p;
}

static hs_buf *payload(size_t len) {
    hs_buf *b = NULL;
    assert_int_equal(hs_buf_new(&b, len), 0);
    b->len = len;
    memset(b->data, 7, len);
    return b;
}

/* Peer i sends `len` bytes of round r to j at its clock. */
static void send(hs_simnet *net, int i, int j, uint64_t r, size_t len) {
    hs_exchange *ex = hs_simnet_exchange(net, i);
    hs_buf *b = payload(len);
    assert_int_equal(ex->ops->send(ex, (uint32_t)j, r, b), 0);
    hs_buf_unref(b);
}

static void test_two_peers(void **state) {
    (void)state;
    hs__wan_profile *p = parse("{\"peers\": 2, \"delay_ms\": 37, \"rate_mbit\": 13}");
    hs_topo *t = NULL;
    hs_simnet *net = NULL;
    hs__linktime *lt = NULL;
    assert_int_equal(hs_topo_new(&t, "complete", 2, 1), 0);
    assert_int_equal(hs_simnet_new(&net, t), 0);
    assert_int_equal(hs__linktime_new(&lt, p), 0);
    hs__simnet_set_links(net, lt);
    const size_t B = 123457;
    const double D = p->pair[0 * 2 + 1].delay_s, R = p->up_bps[0];
    send(net, 0, 1, 0, B);
    hs_exchange *ex = hs_simnet_exchange(net, 1);
    hs_buf *got = NULL;
    assert_int_equal(ex->ops->recv(ex, 0, 0, -1, &got), 0);
    assert_int_equal(got->len, B);
    hs_buf_unref(got);
    /* Exactly D + 8B/R: the receive waited for the last byte, no more and no less. */
    double want = D + 8.0 * (double)B / R;
    if (hs_simnet_clock(net, 1) != want)
        fail_msg("clock %.17g, expected D + 8B/R = %.17g", hs_simnet_clock(net, 1), want);
    /* A second message sent at 0 queues behind the first on the uplink. */
    send(net, 0, 1, 1, B);
    assert_int_equal(ex->ops->recv(ex, 0, 1, -1, &got), 0);
    hs_buf_unref(got);
    if (fabs(hs_simnet_clock(net, 1) - (D + 16.0 * (double)B / R)) > 1e-12)
        fail_msg("second message at %.17g, expected D + 16B/R", hs_simnet_clock(net, 1));
    hs__linktime_free(lt);
    hs_simnet_free(net);
    hs_topo_free(t);
    hs__wan_profile_free(p);
}

/* Two senders into one downlink take turns on it; a faster uplink does not help. */
static void test_shared_downlink(void **state) {
    (void)state;
    hs__wan_profile *p = parse("{\"peers\": 3, \"delay_ms\": 10, \"rate_mbit\": 100, "
                               "\"peer\": [{\"id\": 2, \"down_mbit\": 10}]}");
    hs__linktime *lt = NULL;
    assert_int_equal(hs__linktime_new(&lt, p), 0);
    double a = hs__linktime_arrival(lt, 0, 2, 125000, 0);
    double b = hs__linktime_arrival(lt, 1, 2, 125000, 0);
    /* 1 Mbit over 10 Mbit/s: 0.1 s each, after 10 ms of delay. */
    if (fabs(a - 0.11) > 1e-12 || fabs(b - 0.21) > 1e-12)
        fail_msg("arrivals %.17g and %.17g, expected 0.11 and 0.21", a, b);
    hs__linktime_free(lt);
    hs__wan_profile_free(p);
}

/* Peer 1 hears from 0 over a slow link and from 2 over a fast one. A receive of 0's round
 * (what the synchronous D-PSGD does) moves peer 1's clock to the slow arrival; a drain at the
 * same clock (what SGP does) takes 2's message and leaves the clock alone. */
static void test_wait_or_drain(void **state) {
    (void)state;
    hs__wan_profile *p = parse("{\"peers\": 3, \"delay_ms\": 5, \"rate_mbit\": 100, \"links\": "
                               "[{\"from\": 0, \"to\": 1, \"delay_ms\": 200, \"rate_mbit\": 1}]}");
    hs_topo *t = NULL;
    hs_simnet *net = NULL;
    hs__linktime *lt = NULL;
    assert_int_equal(hs_topo_new(&t, "complete", 3, 1), 0);
    for (int mode = 0; mode < 2; mode++) {
        assert_int_equal(hs_simnet_new(&net, t), 0);
        assert_int_equal(hs__linktime_new(&lt, p), 0);
        hs__simnet_set_links(net, lt);
        send(net, 0, 1, 0, 10000);
        send(net, 2, 1, 0, 10000);
        hs_exchange *ex = hs_simnet_exchange(net, 1);
        hs_simnet_set_clock(net, 1, 0.01); /* 2's message (5 ms + 0.8 ms) is in, 0's is not */
        if (mode == 0) {
            hs_buf *got = NULL;
            assert_int_equal(ex->ops->recv(ex, 0, 0, -1, &got), 0);
            hs_buf_unref(got);
            /* 200 ms + 80 kbit at 1 Mbit/s */
            assert_true(fabs(hs_simnet_clock(net, 1) - 0.28) < 1e-12);
        } else {
            hs_msg m[4];
            int k = ex->ops->drain(ex, m, 4);
            assert_int_equal(k, 1);
            assert_int_equal(m[0].from, 2);
            hs_buf_unref(m[0].payload);
            assert_true(hs_simnet_clock(net, 1) == 0.01);
        }
        hs_simnet_free(net);
        hs__linktime_free(lt);
    }
    hs_topo_free(t);
    hs__wan_profile_free(p);
}

static void test_allreduce(void **state) {
    (void)state;
    hs__wan_profile *p = parse("{\"peers\": 4, \"delay_ms\": 50, \"rate_mbit\": 20}");
    hs__linktime *lt = NULL;
    assert_int_equal(hs__linktime_new(&lt, p), 0);
    const size_t S = 827688;
    /* 2 (n - 1) (alpha + S / (n beta)), alpha two one-way delays (gloo's receiver-ready notice,
     * then the data) */
    double want = 2.0 * 3 * (2 * 0.05 + 8.0 * (double)S / 4 / 20e6);
    assert_true(fabs(hs__linktime_allreduce(lt, S) - want) < 1e-12);
    hs__linktime_free(lt);
    hs__wan_profile_free(p);
    /* Two clusters in index order: the ring crosses the 50 Mbit/s pipe once each way, so that
     * step (2 x 40 ms + S/4 at 50 Mbit/s) sets the pace. */
    p = parse("{\"peers\": 4, \"rate_mbit\": 1000, \"delay_ms\": 0.5, \"clusters\": "
              "[{\"peers\": [0, 1]}, {\"peers\": [2, 3]}], \"between\": {\"delay_ms\": 40, "
              "\"rate_mbit\": 50}}");
    assert_int_equal(hs__linktime_new(&lt, p), 0);
    want = 2.0 * 3 * (2 * 0.04 + 8.0 * (double)S / 4 / 50e6);
    assert_true(fabs(hs__linktime_allreduce(lt, S) - want) < 1e-12);
    hs__linktime_free(lt);
    hs__wan_profile_free(p);
}

/* With TCP/IP headers on, a message costs its payload plus 52 bytes per packet of at most
 * mtu - 52 payload bytes: B = 100,000 at mtu 1500 is 70 packets (69 full ones of 1448), so
 * 103,640 bytes on the wire, over one link and in each all-reduce chunk. Without, the payload. */
static void test_headers(void **state) {
    (void)state;
    hs__wan_profile *p = parse("{\"peers\": 2, \"delay_ms\": 50, \"rate_mbit\": 100}");
    hs__linktime *lt = NULL;
    assert_int_equal(hs__linktime_new(&lt, p), 0);
    assert_true(hs__linktime_wire_bytes(lt, 100000) == 100000);
    hs__linktime_set_headers(lt, HS__LINKTIME_TCP_HEADERS);
    assert_true(hs__linktime_wire_bytes(lt, 100000) == 103640);
    assert_true(hs__linktime_wire_bytes(lt, 1448) == 1500); /* one full packet */
    assert_true(hs__linktime_wire_bytes(lt, 1449) == 1449 + 104);
    double got = hs__linktime_arrival(lt, 0, 1, 100000, 1.0);
    double want = 1.0 + 0.05 + 8.0 * 103640 / 100e6;
    if (fabs(got - want) > 1e-12) fail_msg("arrival %.17g, expected %.17g", got, want);
    /* Two peers: chunks of 200,000 bytes, 139 packets each. */
    want = 2.0 * (2 * 0.05 + 8.0 * (200000 + 139 * 52) / 100e6);
    got = hs__linktime_allreduce(lt, 400000);
    if (fabs(got - want) > 1e-12) fail_msg("all-reduce %.17g, expected %.17g", got, want);
    hs__linktime_set_headers(lt, 0);
    assert_true(hs__linktime_wire_bytes(lt, 100000) == 100000);
    hs__linktime_free(lt);
    hs__wan_profile_free(p);
}

/* The TCP models' decision. 20 Mbit/s, 50 ms each way, queue_ms 250: a round trip of 0.1 s,
 * so reno's queue overflows once a message waits and passes for more than 0.35 s. A lone
 * message is exactly D + 8B/R under every model; what waits is stretched by 1 / share, the
 * share of one connection alone or of one taking turns with another. */
static void test_tcp_models(void **state) {
    (void)state;
    hs__wan_profile *p = parse("{\"peers\": 3, \"delay_ms\": 50, \"rate_mbit\": 20}");
    const double D = 0.05, R = 20e6, B = 500000, dur = 8 * B / R; /* 0.2 s */
    hs__linktime *lt = NULL;
    assert_int_equal(hs__linktime_new(&lt, p), 0);
    assert_int_equal(hs__linktime_set_tcp(lt, "cubic"), HS_EINVAL);
    assert_string_equal(hs__linktime_tcp_model(lt)->name, "fluid");
    const char *models[] = {"fluid", "bbr", "reno"};
    for (int m = 0; m < 3; m++) {
        for (int to2 = 1; to2 <= 2; to2++) { /* the second message: same connection, another */
            hs__linktime_free(lt);
            assert_int_equal(hs__linktime_new(&lt, p), 0);
            assert_int_equal(hs__linktime_set_tcp(lt, models[m]), 0);
            const hs__linktime_tcp *t = hs__linktime_tcp_model(lt);
            double a = hs__linktime_arrival(lt, 0, 1, (size_t)B, 0);
            if (a != D + dur)
                fail_msg("%s: lone message at %.17g, expected D + 8B/R", models[m], a);
            /* Sent at once, it waits 0.2 s and passes in 0.2 s: 0.4 s > 0.35 s overflows reno's
             * queue; bbr counts any wait; fluid none. */
            double b = hs__linktime_arrival(lt, 0, to2, (size_t)B, 0);
            double share = to2 == 1 ? t->share_alone : t->share_shared;
            int congested = m > 0;
            double want = D + dur + (congested ? dur / share : dur);
            if (fabs(b - want) > 1e-12)
                fail_msg("%s, second message to %d: at %.17g, expected %.17g", models[m], to2, b,
                         want);
            assert_true(congested ? b > D + 2 * dur + 0.01 : b == D + 2 * dur);
        }
        /* A wait short of the queue: reno passes at the full rate, bbr does not. */
        hs__linktime_free(lt);
        assert_int_equal(hs__linktime_new(&lt, p), 0);
        assert_int_equal(hs__linktime_set_tcp(lt, models[m]), 0);
        assert_int_equal(hs__linktime_congested(hs__linktime_tcp_model(lt), 0.1, 0.2, 0.25, 0.1),
                         m == 1);
        assert_int_equal(hs__linktime_congested(hs__linktime_tcp_model(lt), 0.0, 0.2, 0.25, 0.1),
                         0);
        assert_int_equal(hs__linktime_congested(hs__linktime_tcp_model(lt), 0.2, 0.2, 0.25, 0.1),
                         m > 0);
    }
    hs__linktime_free(lt);
    hs__wan_profile_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_peers),
        cmocka_unit_test(test_shared_downlink),
        cmocka_unit_test(test_wait_or_drain),
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_headers),
        cmocka_unit_test(test_tcp_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
