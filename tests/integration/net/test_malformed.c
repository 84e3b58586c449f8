/* Malformed frames (plain TCP, --insecure): zero length, length over the limit, length that
 * disagrees with the payload, bad magic, unknown type, truncated frame then end of stream, a
 * type not allowed in the state, a wrong sender, and a replayed DATA round. Each closes only
 * its own connection with the reason logged; meanwhile two peers keep exchanging rounds without
 * a miss and a well-behaved raw connection stays open and answers pings. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "net/wire.h"

static const char *ip;
static int port0;
static char err0[600];

static int raw_connect(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port0);
    inet_pton(AF_INET, ip, &a.sin_addr);
    H_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "connect: %s", strerror(errno));
    return fd;
}

static void send_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        H_CHECK(w > 0, "send: %s", strerror(errno));
        b += w;
        n -= (size_t)w;
    }
}

static void send_frame(int fd, uint8_t type, uint32_t sender, uint32_t len, uint64_t round,
                       const void *pay, size_t paylen) {
    uint8_t h[HS__HDR_LEN];
    hs__hdr hd = {HS__WIRE_VERSION, type, 0, sender, len, round};
    hs__wire_hdr_encode(h, &hd);
    send_all(fd, h, sizeof(h));
    if (paylen)
        send_all(fd, pay, paylen);
}

/* Reads until the server closes (1) or timeout (0). */
static int closed_by_server(int fd, double timeout) {
    double end = h_now() + timeout;
    uint8_t buf[4096];
    while (h_now() < end) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return 1;
    }
    return 0;
}

static int read_exact(int fd, void *p, size_t n, double timeout) {
    uint8_t *b = p;
    double end = h_now() + timeout;
    while (n) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (h_now() > end)
            return -1;
        if (poll(&pf, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, b, n, 0);
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Reads one frame; returns its payload (malloc'd) or NULL. */
static uint8_t *read_frame(int fd, hs__hdr *h) {
    uint8_t hb[HS__HDR_LEN];
    if (read_exact(fd, hb, sizeof(hb), 3) < 0 || hs__wire_hdr_decode(hb, h) < 0)
        return NULL;
    uint8_t *p = malloc(h->len + 1);
    if (read_exact(fd, p, h->len, 3) < 0) {
        free(p);
        return NULL;
    }
    return p;
}

static hs_buf *hello_body(void) {
    hs__hello hl;
    memset(&hl, 0, sizeof(hl));
    hl.proto = HS__WIRE_VERSION;
    hl.peer_id = HS__ID_NONE;
    strcpy(hl.run_id, "hearsay");
    snprintf(hl.listen, sizeof(hl.listen), "%s:9", ip);
    hs_buf *b;
    hs_buf_new(&b, 128);
    hs__wire_hello_encode(b, &hl);
    return b;
}

/* A connection that completed HELLO / HELLO_ACK as a joiner. */
static int handshaken(void) {
    int fd = raw_connect();
    hs_buf *b = hello_body();
    send_frame(fd, HS__T_HELLO, HS__ID_NONE, (uint32_t)b->len, 0, b->data, b->len);
    hs_buf_unref(b);
    hs__hdr h;
    uint8_t *p = read_frame(fd, &h);
    H_CHECK(p && h.type == HS__T_HELLO_ACK, "no HELLO_ACK");
    free(p);
    return fd;
}

/* The server closes this connection, and logs the reason for this very connection (it names
 * the client's address and port). */
static void expect_close(int fd, const char *what, const char *logged) {
    struct sockaddr_in me;
    socklen_t len = sizeof(me);
    H_CHECK(getsockname(fd, (struct sockaddr *)&me, &len) == 0, "getsockname");
    char addr[64], ipb[32];
    inet_ntop(AF_INET, &me.sin_addr, ipb, sizeof(ipb));
    snprintf(addr, sizeof(addr), "%s:%d", ipb, ntohs(me.sin_port));
    H_CHECK(closed_by_server(fd, 20), "%s: the connection stayed open", what);
    close(fd);
    int found = 0;
    for (double end = h_now() + 20; !found && h_now() < end; h_sleep(0.01)) {
        char *log = h_read(err0);
        for (char *line = log ? strtok(log, "\n") : NULL; line && !found; line = strtok(NULL, "\n"))
            found = strstr(line, addr) && strstr(line, "connection closed") && strstr(line, logged);
        free(log);
    }
    H_CHECK(found, "%s: the server did not log '%s' for %s", what, logged, addr);
    h_note("%-34s -> closed, logged \"%s\"", what, logged);
}

static void ping(int fd, uint64_t token) {
    hs__heartbeat hb = {HS__HB_PING, token, 0, 0, 0};
    hs_buf *b;
    hs_buf_new(&b, HS__HB_LEN);
    hs__wire_heartbeat_encode(b, &hb);
    send_frame(fd, HS__T_HEARTBEAT, HS__ID_NONE, (uint32_t)b->len, 0, b->data, b->len);
    hs_buf_unref(b);
    for (;;) { /* skip the server's own heartbeats */
        hs__hdr h;
        uint8_t *p = read_frame(fd, &h);
        H_CHECK(p != NULL, "the good connection died");
        hs__heartbeat r;
        int ok = h.type == HS__T_HEARTBEAT && hs__wire_heartbeat_decode(p, h.len, &r) == 0 &&
                 r.kind == HS__HB_PONG && r.token == token;
        free(p);
        if (ok)
            return;
    }
}

static void start_peer(hproc *p, int i, const char *logp, const char *errp, const char *rounds,
                       const char *linger) {
    char listen[64], boot[64];
    snprintf(listen, sizeof(listen), "%s:%d", ip, port0 + i);
    snprintf(boot, sizeof(boot), "%s:%d", ip, port0);
    char *argv[40];
    int a = h_netpeer_argv(argv, listen, i ? boot : NULL);
    char *rest[] = {"--insecure",
                    "--topo",
                    "ring",
                    "--rounds",
                    (char *)rounds,
                    "--round-sleep-ms",
                    "5",
                    "--dim",
                    "64",
                    "--wait-members",
                    i || rounds[0] != '0' ? "2" : "1",
                    /* generous: nobody dies here, and a peer starved of CPU on a busy
                     * machine must not miss a round */
                    "--peer-timeout-ms",
                    "10000",
                    "--recv-timeout-ms",
                    "20000",
                    /* the well-behaved raw connection is a joiner that never sends JOIN: it
                     * must outlive the test (a joiner's deadline is the handshake's) */
                    "--handshake-timeout-ms",
                    "60000",
                    "--linger-ms",
                    (char *)linger,
                    "--log",
                    (char *)logp,
                    NULL};
    for (int r = 0; rest[r]; r++)
        argv[a++] = rest[r];
    argv[a] = NULL;
    H_CHECK(h_spawn(p, argv, NULL, errp) == 0, "spawn");
}

int main(void) {
    h_init("net_malformed", 100);
    ip = h_ip(1);
    port0 = 7070;
    char log0[600], log1[600], err1[600];
    snprintf(log0, sizeof(log0), "%s/p0.log", h_dir());
    snprintf(err0, sizeof(err0), "%s/p0.err", h_dir());
    snprintf(log1, sizeof(log1), "%s/p1.log", h_dir());
    snprintf(err1, sizeof(err1), "%s/p1.err", h_dir());
    hproc p0, p1;
    start_peer(&p0, 0, log0, err0, "500", "0");
    start_peer(&p1, 1, log1, err1, "500", "0");
    H_CHECK(h_wait_for(log0, "\"event\":\"view\"", 60) &&
                h_wait_for(log1, "\"event\":\"view\"", 60),
            "the peers did not start");

    int good = handshaken();
    ping(good, 1);

    hs_buf *hb = hello_body();
    int fd;
    fd = raw_connect();
    send_frame(fd, HS__T_HELLO, HS__ID_NONE, 0, 0, NULL, 0);
    expect_close(fd, "zero length", "zero-length HELLO frame");

    fd = raw_connect();
    send_frame(fd, HS__T_HELLO, HS__ID_NONE, 100000, 0, NULL, 0);
    expect_close(fd, "length over the limit", "HELLO frame of 100000 bytes, over the limit");

    fd = raw_connect();
    {
        uint8_t body[512];
        memcpy(body, hb->data, hb->len);
        memcpy(body + hb->len, "xyz", 3);
        send_frame(fd, HS__T_HELLO, HS__ID_NONE, (uint32_t)hb->len + 3, 0, body, hb->len + 3);
    }
    expect_close(fd, "length disagrees with the payload", "length disagrees");

    fd = raw_connect();
    send_all(fd, "GET / HTTP/1.1\r\nHost: hearsay\r\n\r\n", 34);
    expect_close(fd, "bad magic", "bad magic");

    fd = raw_connect();
    send_frame(fd, 99, HS__ID_NONE, 10, 0, "0123456789", 10);
    expect_close(fd, "unknown type", "unknown frame type 99");

    fd = raw_connect();
    send_frame(fd, HS__T_HELLO, HS__ID_NONE, (uint32_t)hb->len, 0, hb->data, hb->len / 2);
    shutdown(fd, SHUT_WR);
    expect_close(fd, "truncated frame, then end of stream", "truncated frame");

    fd = raw_connect();
    send_frame(fd, HS__T_HELLO, HS__ID_NONE, (uint32_t)hb->len, 0, hb->data, hb->len);
    hs__hdr h;
    uint8_t *p = read_frame(fd, &h);
    free(p);
    send_frame(fd, HS__T_HELLO, HS__ID_NONE, (uint32_t)hb->len, 0, hb->data, hb->len);
    expect_close(fd, "second HELLO after the handshake", "HELLO frame not accepted");

    fd = handshaken();
    send_frame(fd, HS__T_DATA, HS__ID_NONE, 8, 1, "abcdefgh", 8);
    expect_close(fd, "DATA before joining", "DATA frame not accepted in this state");

    fd = handshaken();
    {
        hs__heartbeat beat = {HS__HB_BEAT, 0, 0, 0, 0};
        hs_buf *b;
        hs_buf_new(&b, HS__HB_LEN);
        hs__wire_heartbeat_encode(b, &beat);
        send_frame(fd, HS__T_HEARTBEAT, 5, (uint32_t)b->len, 0, b->data, b->len);
        hs_buf_unref(b);
    }
    expect_close(fd, "wrong sender", "frame from peer 5 on the connection of peer 4294967295");

    fd = handshaken();
    send_frame(fd, HS__T_JOIN, HS__ID_NONE, 5000, 0, NULL, 0);
    expect_close(fd, "JOIN over the limit", "JOIN frame of 5000 bytes, over the limit of 4096");

    ping(good, 2); /* the well-behaved connection is still served */
    close(good);

    for (hproc *q = &p0; q; q = q == &p0 ? &p1 : NULL) {
        int rc = h_wait(q, 30);
        H_CHECK(rc == 0, "a peer exited with %d", rc);
    }
    const char *logs[2] = {log0, log1};
    for (int i = 0; i < 2; i++) {
        cJSON **ev;
        int n = h_events(logs[i], "done", &ev);
        H_CHECK(n == 1 && h_num(ev[0], "rounds") == 500 && h_num(ev[0], "misses") == 0,
                "peer %d did not keep exchanging cleanly", i);
        if (i == 0)
            H_CHECK(h_num(ev[0], "conns_malformed") >= 9, "peer 0 counted %g malformed",
                    h_num(ev[0], "conns_malformed"));
        h_free_events(ev, n);
    }
    h_note("both peers finished 500 rounds without a miss");

    /* A replayed DATA round needs a member: join as one on a peer that runs no rounds. */
    port0 = 7080;
    snprintf(log0, sizeof(log0), "%s/q0.log", h_dir());
    snprintf(err0, sizeof(err0), "%s/q0.err", h_dir());
    start_peer(&p0, 0, log0, err0, "0", "20000");
    H_CHECK(h_wait_for(log0, "\"event\":\"done\"", 10), "q0 did not start");
    fd = handshaken();
    hs__join j;
    memset(&j, 0, sizeof(j));
    j.nonce = 12345;
    j.via = j.id = HS__ID_NONE;
    snprintf(j.addr, sizeof(j.addr), "%s:9", ip);
    hs_buf *jb;
    hs_buf_new(&jb, 64);
    hs__wire_join_encode(jb, &j);
    send_frame(fd, HS__T_JOIN, HS__ID_NONE, (uint32_t)jb->len, 0, jb->data, jb->len);
    hs_buf_unref(jb);
    uint32_t id = HS__ID_NONE;
    for (int k = 0; k < 10 && id == HS__ID_NONE; k++) {
        p = read_frame(fd, &h);
        H_CHECK(p != NULL, "no WELCOME");
        hs__welcome w;
        if (h.type == HS__T_WELCOME && hs__wire_welcome_decode(p, h.len, &w) == 0) {
            id = w.id;
            hs__members_clear(&w.members);
        }
        free(p);
    }
    H_CHECK(id == 1, "joined as %u", id);
    send_frame(fd, HS__T_DATA, id, 4, 5, "abcd", 4);
    send_frame(fd, HS__T_DATA, id, 4, 5, "abcd", 4);
    expect_close(fd, "replayed DATA round", "stale or replayed DATA round 5 from peer 1");
    h_kill(&p0, SIGTERM);
    H_CHECK(h_wait(&p0, 10) == 0, "q0 did not leave cleanly");
    hs_buf_unref(hb);
    h_done();
    return 0;
}
