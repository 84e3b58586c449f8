/* Joiners that are not joining (plain TCP, --insecure, where anyone's HELLO passes): 12
 * holders with 4 connections each, from one other loopback address, say HELLO as a joiner and
 * then only send heartbeats, reconnecting whenever the server closes them. The server counts
 * such connections against --max-pending-per-addr (no more than 16 of them are open at once)
 * and closes each one at its deadline (no JOIN within the handshake timeout), whatever the
 * heartbeats; and a real joiner gets in meanwhile. */
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

#define HOLDERS 12
#define PER_HOLDER 4
#define NCONN (HOLDERS * PER_HOLDER)
#define PER_ADDR 16 /* netpeer's default --max-pending-per-addr */

static const char *ip, *strangers;
static int port0 = 7070;

static void send_frame(int fd, uint8_t type, const void *pay, size_t len) {
    uint8_t h[HS__HDR_LEN];
    hs__hdr hd = {HS__WIRE_VERSION, type, 0, HS__ID_NONE, (uint32_t)len, 0};
    hs__wire_hdr_encode(h, &hd);
    (void)!send(fd, h, sizeof(h), MSG_NOSIGNAL);
    if (len)
        (void)!send(fd, pay, len, MSG_NOSIGNAL);
}

/* A HELLO without an id (a joiner's), answered with HELLO_ACK: the fd, or -1 when the server
 * closed it instead (its limit). */
static int hold_one(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a, src;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port0);
    inet_pton(AF_INET, ip, &a.sin_addr);
    memset(&src, 0, sizeof(src));
    src.sin_family = AF_INET;
    inet_pton(AF_INET, strangers, &src.sin_addr);
    H_CHECK(bind(fd, (struct sockaddr *)&src, sizeof(src)) == 0, "bind: %s", strerror(errno));
    H_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0, "connect: %s", strerror(errno));
    hs__hello hl;
    memset(&hl, 0, sizeof(hl));
    hl.proto = HS__WIRE_VERSION;
    hl.peer_id = HS__ID_NONE;
    strcpy(hl.run_id, "hearsay");
    snprintf(hl.listen, sizeof(hl.listen), "%s:9", strangers);
    hs_buf *b;
    hs_buf_new(&b, 128);
    hs__wire_hello_encode(b, &hl);
    send_frame(fd, HS__T_HELLO, b->data, b->len);
    hs_buf_unref(b);
    uint8_t hb[HS__HDR_LEN];
    size_t got = 0;
    for (double end = h_now() + 5; got < sizeof(hb) && h_now() < end;) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, hb + got, sizeof(hb) - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    hs__hdr h;
    if (got < sizeof(hb) || hs__wire_hdr_decode(hb, &h) < 0 || h.type != HS__T_HELLO_ACK) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Reads and drops what the server sent; 0 once it closed the connection. */
static int alive(int fd) {
    uint8_t buf[4096];
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (r > 0)
            continue;
        return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
}

static void heartbeat(int fd) {
    hs__heartbeat hb = {HS__HB_BEAT, 0, 0, 0, 0};
    hs_buf *b;
    hs_buf_new(&b, HS__HB_LEN);
    hs__wire_heartbeat_encode(b, &hb);
    send_frame(fd, HS__T_HEARTBEAT, b->data, b->len);
    hs_buf_unref(b);
}

static int fds[NCONN];
static int max_open, opened, closed_by_server;

/* One pass of the holders: heartbeats on the open ones, closed ones noticed and (refill)
 * opened again; tracks the most open at once. */
static int holders_step(int refill) {
    int open = 0;
    for (int i = 0; i < NCONN; i++) {
        if (fds[i] >= 0 && !alive(fds[i])) {
            close(fds[i]);
            fds[i] = -1;
            closed_by_server++;
        }
        if (fds[i] < 0 && refill && (fds[i] = hold_one()) >= 0)
            opened++;
        if (fds[i] >= 0) {
            heartbeat(fds[i]);
            open++;
        }
    }
    if (open > max_open)
        max_open = open;
    return open;
}

int main(void) {
    h_init("net_pending", 100);
    ip = h_ip(1);
    strangers = h_ip(2);
    signal(SIGPIPE, SIG_IGN);
    char log0[600], err0[600], log1[600], err1[600], listen0[64], listen1[64], boot[64];
    snprintf(log0, sizeof(log0), "%s/p0.log", h_dir());
    snprintf(err0, sizeof(err0), "%s/p0.err", h_dir());
    snprintf(log1, sizeof(log1), "%s/p1.log", h_dir());
    snprintf(err1, sizeof(err1), "%s/p1.err", h_dir());
    snprintf(listen0, sizeof(listen0), "%s:%d", ip, port0);
    snprintf(listen1, sizeof(listen1), "%s:%d", ip, port0 + 1);
    snprintf(boot, sizeof(boot), "%s:%d", ip, port0);
    char *argv[40];
    int a = h_netpeer_argv(argv, listen0, NULL);
    char *rest0[] = {"--insecure", "--rounds", "0", "--linger-ms", "60000",
                     "--handshake-timeout-ms", "1500", "--log", log0, NULL};
    for (int i = 0; rest0[i]; i++)
        argv[a++] = rest0[i];
    argv[a] = NULL;
    hproc p0, p1;
    H_CHECK(h_spawn(&p0, argv, NULL, err0) == 0, "spawn");
    H_CHECK(h_wait_for(log0, "\"event\":\"done\"", 30), "the first peer did not start");

    for (int i = 0; i < NCONN; i++)
        fds[i] = -1;
    holders_step(1);
    h_note("%d holders x %d connections from %s: %d said HELLO and got HELLO_ACK", HOLDERS,
           PER_HOLDER, strangers, opened);
    H_CHECK(max_open <= PER_ADDR, "%d joiners without JOIN open at once from one address, the "
            "limit is %d", max_open, PER_ADDR);
    /* Heartbeats are no JOIN: every one is closed at its deadline. */
    int open = 1;
    for (double end = h_now() + 30; open && h_now() < end; h_sleep(0.2))
        open = holders_step(0);
    H_CHECK(!open, "%d holders sending only heartbeats still open after 30 s", open);
    h_note("all closed by the server, heartbeats notwithstanding");

    /* They come back at once, again and again; a real joiner gets in meanwhile. */
    a = h_netpeer_argv(argv, listen1, boot);
    char *rest1[] = {"--insecure", "--rounds", "0", "--join-timeout-ms", "60000", "--log", log1,
                     NULL};
    for (int i = 0; rest1[i]; i++)
        argv[a++] = rest1[i];
    argv[a] = NULL;
    holders_step(1);
    H_CHECK(h_spawn(&p1, argv, NULL, err1) == 0, "spawn");
    int rc = -1;
    for (double end = h_now() + 70; rc < 0 && h_now() < end;) {
        holders_step(1);
        rc = h_wait(&p1, 0.2);
    }
    H_CHECK(rc == 0, "the real joiner failed (exit %d) among the holders", rc);
    H_CHECK(h_contains(log1, "\"event\":\"start\""), "the real joiner did not join");
    H_CHECK(max_open <= PER_ADDR, "%d joiners without JOIN open at once from one address, the "
            "limit is %d", max_open, PER_ADDR);
    h_note("the real joiner got in; holders opened %d connections, the server closed %d, at most "
           "%d open at once", opened, closed_by_server, max_open);
    for (int i = 0; i < NCONN; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    h_kill(&p0, SIGTERM);
    H_CHECK(h_wait(&p0, 10) == 0, "the first peer did not leave cleanly");
    h_done();
    return 0;
}
