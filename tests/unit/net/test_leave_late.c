/* A leaver's last message still on its way when the job already dropped it: three hs_net peers
 * in one process (127.0.0.1, port 0). Peer 1's link to peer 2 is emulated slow; it sends its
 * last round, has what it needs, and leaves. The sequencer (peer 0) hears its BYE at once and
 * issues a member list without it, which reaches peer 2 long before peer 1's message does.
 * That message was sent before peer 1's BYE on the same stream: peer 2 must still get it, not
 * take the new list for the end of peer 1's messages. Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <pthread.h>

#include "hearsay/error.h"
#include "hearsay/exchange.h"
#include "hearsay/net.h"

#define SLOW_MS 1000 /* peer 1 -> peer 2: what a thin link takes for a large last message */

static char secret[64];

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void config(hs_net_config *c) {
    hs_net_config_init(c);
    c->security = HS_NET_SECRET;
    c->secret_file = secret;
    c->algo = "dpsgd";
    c->codec = "none";
    c->model_sig = "leave-late";
    c->n_params = 1;
    c->topo_spec = "complete";
    /* Above the emulated delay, which heartbeats to peer 2 pay too. */
    c->peer_timeout_ms = 4 * SLOW_MS;
    c->join_timeout_ms = 30000;
    c->change_delay_ms = 50;
}

static hs_net *start(hs_net_config *c, const char *boot) {
    hs_net *net;
    hs_net_welcome w;
    c->bootstrap = boot;
    int err = hs_net_start(&net, c, boot ? &w : NULL);
    if (err < 0)
        print_error("start: %s\n", hs_error_message());
    assert_int_equal(err, 0);
    if (boot)
        hs_net_welcome_clear(&w);
    return net;
}

static void *leave(void *net) {
    intptr_t err = hs_net_leave(net, 20000);
    return (void *)err;
}

static int members(hs_net *net) {
    hs_net_member *m;
    int n = 0;
    assert_int_equal(hs_net_members(net, &m, &n, NULL, NULL), 0);
    free(m);
    return n;
}

static void test_last_message_after_removal(void **state) {
    (void)state;
    hs_net_config c;
    config(&c);
    hs_net *nets[3];
    nets[0] = start(&c, NULL);
    char boot[64];
    snprintf(boot, sizeof(boot), "127.0.0.1:%d", hs_net_listen_port(nets[0]));
    hs_net_config slow = c;
    hs_net_link_emulation to2;
    memset(&to2, 0, sizeof(to2));
    to2.to = 2;
    char spec[32];
    snprintf(spec, sizeof(spec), "delay=%dms", SLOW_MS);
    assert_int_equal(hs_net_emulation_parse(spec, &to2.emu), 0);
    slow.link_emulate = &to2;
    slow.n_link_emulate = 1;
    nets[1] = start(&slow, boot);
    nets[2] = start(&c, boot);
    for (int i = 0; i < 3; i++)
        assert_int_equal(hs_net_wait_members(nets[i], 3, 30000), 0);
    hs_net_member *m;
    int n;
    uint64_t r;
    assert_int_equal(hs_net_members(nets[2], &m, &n, NULL, &r), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(m[i].id, (uint32_t)i); /* ids in join order: the emulation's target */
    free(m);

    /* Round r: everyone sends to everyone; peer 1 has its round (nothing slow comes to it). */
    for (int i = 0; i < 3; i++) {
        hs_exchange *ex = hs_net_exchange(nets[i]);
        hs_buf *b;
        float v = (float)(10 + i);
        assert_int_equal(hs_buf_new(&b, 4), 0);
        hs_buf_append(b, &v, 4);
        for (int k = 0; k < 3; k++)
            if (k != i)
                assert_int_equal(ex->ops->send(ex, (uint32_t)k, r, b), 0);
        hs_buf_unref(b);
    }
    hs_exchange *ex1 = hs_net_exchange(nets[1]);
    for (uint32_t k = 0; k < 3; k += 2) {
        hs_buf *in = NULL;
        assert_int_equal(ex1->ops->recv(ex1, k, r, 30000, &in), 0);
        hs_buf_unref(in);
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, leave, nets[1]), 0);

    /* The sequencer drops peer 1 on its BYE; peer 2 learns it from the new member list while
     * peer 1's message (and its BYE after it) are still on their way. */
    double t0 = mono_s();
    while (members(nets[2]) != 2) {
        assert_true(mono_s() - t0 < 30);
        usleep(5000);
    }
    hs_exchange *ex2 = hs_net_exchange(nets[2]);
    hs_buf *in = NULL;
    int err = ex2->ops->recv(ex2, 1, r, 30000, &in);
    if (err < 0)
        print_error("recv from the leaver: %s\n", hs_error_message());
    assert_int_equal(err, 0);
    float got;
    assert_int_equal(in->len, 4);
    memcpy(&got, in->data, 4);
    assert_true(got == 11.0f);
    hs_buf_unref(in);
    /* Past its BYE nothing more comes: a later round is refused as gone, not waited for. */
    err = ex2->ops->recv(ex2, 1, r + 1, 30000, &in);
    assert_int_equal(err, HS_ECONNRESET);

    void *rc;
    assert_int_equal(pthread_join(t, &rc), 0);
    assert_int_equal((intptr_t)rc, 0);
    for (int i = 0; i < 3; i++)
        hs_net_free(nets[i]);
}

int main(void) {
    strcpy(secret, "/tmp/hs-test-secret-XXXXXX");
    int fd = mkstemp(secret);
    const char *s = "a secret for the leave test, long enough";
    if (fd < 0 || write(fd, s, strlen(s)) != (ssize_t)strlen(s))
        return 1;
    close(fd);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_last_message_after_removal)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(secret);
    return rc;
}
