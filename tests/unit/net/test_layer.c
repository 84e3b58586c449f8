/* A layer of the connection stack replaced by an adversary (transport.h, hs__layer): the peer
 * that accepts reads the socket 7 bytes at a time, never straight into a payload, so every
 * header, part header and part of a 5 MiB message (two PART frames) is cut at odd places
 * across reads. The message arrives whole and exact, and a small one after it too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/error.h"
#include "hearsay/exchange.h"
#include "hearsay/net.h"
#include "net/runtime.h"

static uint64_t reads; /* loop thread only; read after the peers stopped */

static void dribble_alloc(hs__conn *c, uv_buf_t *buf) {
    hs__layer_plain.alloc(c, buf);
    c->io.direct = 0;
    buf->base = (char *)c->rx;
    buf->len = buf->len < 7 ? buf->len : 7;
}

static void dribble_read(hs__conn *c, const uint8_t *p, size_t n) {
    reads++;
    hs__layer_plain.read(c, p, n);
}

static void cfg(hs_net_config *c) {
    hs_net_config_init(c);
    c->security = HS_NET_INSECURE;
    c->algo = "dpsgd";
    c->codec = "none";
    c->model_sig = "layer";
    c->n_params = (5u << 20) / 4 + 2;
    c->peer_timeout_ms = 20000;
    c->handshake_timeout_ms = 20000;
    c->join_timeout_ms = 30000;
    c->snapshot_timeout_ms = 500;
    c->change_delay_ms = 50;
}

static void test_dribbling_reads(void **state) {
    (void)state;
    static hs__layer dribble;
    dribble = hs__layer_plain;
    dribble.name = "dribble";
    dribble.alloc = dribble_alloc;
    dribble.read = dribble_read;
    hs_net_config c;
    cfg(&c);
    hs_net *a, *b;
    assert_int_equal(hs_net_start(&a, &c, NULL), 0);
    __atomic_store_n(&a->tr.layer, &dribble, __ATOMIC_RELEASE);
    char boot[64];
    snprintf(boot, sizeof(boot), "127.0.0.1:%d", hs_net_listen_port(a));
    hs_net_config j = c;
    j.bootstrap = boot;
    hs_net_welcome w;
    assert_int_equal(hs_net_start(&b, &j, &w), 0);
    hs_net_welcome_clear(&w);
    assert_int_equal(hs_net_wait_members(a, 2, 30000), 0);
    assert_int_equal(hs_net_wait_members(b, 2, 30000), 0);
    size_t n = (5u << 20) + 5;
    hs_buf *big, *small, *in = NULL;
    assert_int_equal(hs_buf_new(&big, n), 0);
    for (size_t i = 0; i < n; i++)
        big->data[i] = (uint8_t)(i * 131 + 17);
    big->len = n;
    assert_int_equal(hs_buf_new(&small, 3), 0);
    assert_int_equal(hs_buf_append(small, "abc", 3), 0);
    hs_exchange *eb = hs_net_exchange(b), *ea = hs_net_exchange(a);
    assert_int_equal(eb->ops->send(eb, 0, 1, big), 0);
    assert_int_equal(eb->ops->send(eb, 0, 2, small), 0);
    assert_int_equal(ea->ops->recv(ea, 1, 1, 60000, &in), 0);
    assert_int_equal(in->len, n);
    assert_memory_equal(in->data, big->data, n);
    hs_buf_unref(in);
    assert_int_equal(ea->ops->recv(ea, 1, 2, 60000, &in), 0);
    assert_int_equal(in->len, 3);
    assert_memory_equal(in->data, "abc", 3);
    hs_buf_unref(in);
    hs_buf_unref(big);
    hs_buf_unref(small);
    hs_net_free(b);
    hs_net_free(a);
    printf("# %llu reads of at most 7 bytes\n", (unsigned long long)reads);
    assert_true(reads > n / 7); /* the adversary did the reading */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dribbling_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
