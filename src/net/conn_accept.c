/* Connections, the outside of the transport: listening and the limits on accepting strangers,
 * dialing, address resolution, the periodic checks of every connection (heartbeats, handshake
 * deadlines, silence, write progress), and the ops table the layers above call (hs__tcp).
 *
 * Threading: loop thread only. */
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "core/error_internal.h"
#include "net/transport.h"

/* ------------------------------------------------------------------ accepting */

/* Refusals are logged at most once a second, with how many were not: a flood of strangers
 * must not become a flood of log lines. */
static void log_refusal(hs__transport *tr, const char *who, const char *why) {
    uint64_t now = hs__now_us();
    if (tr->refuse_log_us && now - tr->refuse_log_us < 1000000) {
        tr->refuse_quiet++;
        return;
    }
    if (tr->refuse_quiet)
        HS_LOGW("%s: connection refused: %s (and %llu more refused in the last %.1f s)", who, why,
                (unsigned long long)tr->refuse_quiet, (double)(now - tr->refuse_log_us) / 1e6);
    else
        HS_LOGW("%s: connection refused: %s", who, why);
    tr->refuse_log_us = now;
    tr->refuse_quiet = 0;
}

/* A joiner's connection that got no WELCOME yet: HELLO without an id, then only JOIN. */
static int pending_joiner(const hs__conn *c) {
    return !c->outgoing && c->joiner && c->joiner_id == HS__ID_NONE;
}

static void on_connection(uv_stream_t *server, int status) {
    hs__transport *tr = server->data;
    if (status < 0) {
        HS_LOGW("accept: %s", uv_strerror(status));
        return;
    }
    hs__conn *c = hs__conn_new(tr, 0);
    if (!c) {
        HS_LOGE("accept: out of memory");
        return;
    }
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
        c->state = HS__C_CLOSING;
        c->io.notified = 1;
        hs__conn_final_close(c);
        return;
    }
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0)
        hs__conn_sa_format((struct sockaddr *)&ss, c->remote_ip, sizeof(c->remote_ip), c->remote,
                           sizeof(c->remote));
    /* The limits are for strangers: connections that have not finished TLS and HELLO, and
     * joiners not welcomed yet (with --insecure anyone's HELLO passes: a joiner proves nothing
     * until the job admits it). Members' connections never count, so nobody can crowd them
     * out by holding connections open (those are closed at their deadlines: hs__conn_tick). */
    int same = 0, pending = 0;
    for (hs__conn *o = tr->conns; o; o = o->next) {
        if (o == c || o->state == HS__C_CLOSING || (o->state >= HS__C_OPEN && !pending_joiner(o)))
            continue;
        pending++;
        if (!strcmp(o->remote_ip, c->remote_ip))
            same++;
    }
    const char *why = NULL;
    char whybuf[160];
    int leaving = tr->ev->closing(tr->owner);
    uv_mutex_lock(tr->mu);
    tr->st->conns_accepted++;
    uv_mutex_unlock(tr->mu);
    if (leaving) {
        why = "this peer is leaving";
    } else if (pending >= tr->cfg->max_conns) {
        snprintf(whybuf, sizeof(whybuf), "%d unauthenticated connections open, the limit is %d",
                 pending, tr->cfg->max_conns);
        why = whybuf;
    } else if (same >= tr->cfg->max_conns_per_addr) {
        snprintf(whybuf, sizeof(whybuf),
                 "%d unauthenticated connections from %s open, the limit is %d", same, c->remote_ip,
                 tr->cfg->max_conns_per_addr);
        why = whybuf;
    }
    if (why) {
        uv_mutex_lock(tr->mu);
        tr->st->conns_refused++;
        uv_mutex_unlock(tr->mu);
        log_refusal(tr, c->remote, why);
        c->state = HS__C_CLOSING;
        c->io.notified = 1;
        hs__conn_final_close(c);
        return;
    }
    int err = hs__conn_start(c);
    if (err < 0)
        hs__conn_close(c, err, 0, HS_LOG_WARN, "%s", hs_error_message());
}

int hs__conn_listen(hs__transport *tr) {
    struct sockaddr_storage ss;
    char host[HS__ADDR_MAX + 1];
    int port, err;
    if ((err = hs__wire_addr_split(tr->listen_addr, host, sizeof(host), &port)) < 0)
        return err;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
        return hs__err(HS_EINVAL, "listen address %s: host must be an IP address", tr->listen_addr);
    tr->listen_wildcard = !strcmp(host, "0.0.0.0") || !strcmp(host, "::");
    uv_tcp_init(tr->loop, &tr->listener);
    tr->listener.data = tr;
    tr->listening = 1;
    if ((err = uv_tcp_bind(&tr->listener, (struct sockaddr *)&ss, 0)) < 0 ||
        (err = uv_listen((uv_stream_t *)&tr->listener, 128, on_connection)) < 0)
        return hs__err(err, "listen on %s: %s", tr->listen_addr, uv_strerror(err));
    int len = sizeof(ss);
    if ((err = uv_tcp_getsockname(&tr->listener, (struct sockaddr *)&ss, &len)) < 0)
        return hs__err(err, "listen on %s: %s", tr->listen_addr, uv_strerror(err));
    tr->listen_port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                                    : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

void hs__conn_close_listener(hs__transport *tr) {
    if (!tr->listening)
        return;
    tr->listening = 0;
    uv_close((uv_handle_t *)&tr->listener, NULL);
}

/* ------------------------------------------------------------------ dialing */

static void on_connect(uv_connect_t *req, int status) {
    hs__conn *c = req->data;
    if (status == UV_ECANCELED || c->state == HS__C_CLOSING)
        return;
    if (status < 0) {
        hs__conn_close(c, status, 0, HS_LOG_DEBUG, "connect: %s", uv_strerror(status));
        return;
    }
    int err = hs__conn_start(c);
    if (err < 0)
        hs__conn_close(c, err, 0, HS_LOG_WARN, "%s", hs_error_message());
}

int hs__conn_dial_sa(hs__transport *tr, const struct sockaddr *sa, uint32_t expect_id,
                     hs__conn **out) {
    hs__conn *c = hs__conn_new(tr, 1);
    if (!c)
        return hs__err(HS_ENOMEM, "connection: out of memory");
    c->expect_id = expect_id;
    hs__conn_sa_format(sa, c->remote_ip, sizeof(c->remote_ip), c->remote, sizeof(c->remote));
    c->connect_req.data = c;
    int err = uv_tcp_connect(&c->connect_req, &c->tcp, sa, on_connect);
    if (err < 0) {
        c->state = HS__C_CLOSING;
        c->io.notified = 1;
        hs__conn_final_close(c);
        return hs__err(err, "connect to %s: %s", c->remote, uv_strerror(err));
    }
    *out = c;
    return 0;
}

int hs__conn_dial(hs__transport *tr, const char *addr, uint32_t expect_id, hs__conn **out) {
    struct sockaddr_storage ss;
    char host[HS__ADDR_MAX + 1];
    int port, err;
    if ((err = hs__wire_addr_split(addr, host, sizeof(host), &port)) < 0)
        return err;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
        return hs__err(HS_EINVAL, "peer address %s: not an IP address", addr);
    return hs__conn_dial_sa(tr, (struct sockaddr *)&ss, expect_id, out);
}

int hs__conn_resolve(const char *addr, struct sockaddr_storage *out) {
    char host[HS__ADDR_MAX + 1], port[16];
    int p, err;
    if ((err = hs__wire_addr_split(addr, host, sizeof(host), &p)) < 0)
        return err;
    snprintf(port, sizeof(port), "%d", p);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int r = getaddrinfo(host, port, &hints, &res);
    if (r != 0 || !res)
        return hs__err(HS_EINVAL, "address %s: cannot resolve: %s", addr, gai_strerror(r));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

int hs__conn_local_ip(hs__conn *c, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char full[96];
    if (uv_tcp_getsockname(&c->tcp, (struct sockaddr *)&ss, &len) < 0)
        return HS_EINVAL;
    hs__conn_sa_format((struct sockaddr *)&ss, buf, cap, full, sizeof(full));
    return 0;
}

/* ------------------------------------------------------------------ periodic checks */

/* This process did not run for gap_us (SIGSTOP, a VM pause, a suspended job, starvation): the
 * ticks run before the loop reads its sockets, so what the peers sent meanwhile is still
 * unread. Time this process slept counts against nobody: every open connection's clocks move
 * by the gap, and the next ticks judge silence after the loop has read what arrived. */
static void slept(hs__transport *tr, uint64_t now, uint64_t gap_us) {
    int n = 0;
    for (hs__conn *c = tr->conns; c; c = c->next) {
        if (c->state == HS__C_CLOSING || c->state < HS__C_OPEN)
            continue;
        c->last_recv_us = c->last_recv_us + gap_us > now ? now : c->last_recv_us + gap_us;
        c->last_progress_us =
            c->last_progress_us + gap_us > now ? now : c->last_progress_us + gap_us;
        n++;
    }
    if (n)
        HS_LOGW("this process did not run for %llu ms (stopped or starved): the silence of its "
                "%d connections is judged after reading what arrived meanwhile",
                (unsigned long long)(gap_us / 1000), n);
}

void hs__conn_tick(hs__transport *tr, uint64_t now) {
    hs__conn *next;
    /* Ticks come at least every heartbeat/2 (<= peer timeout/8): a gap of half the peer
     * timeout is this process's own, not the network's. */
    uint64_t gap = tr->last_tick_us && now > tr->last_tick_us ? now - tr->last_tick_us : 0;
    tr->last_tick_us = now;
    if (gap > (uint64_t)tr->cfg->peer_timeout_ms * 500)
        slept(tr, now, gap);
    for (hs__conn *c = tr->conns; c; c = next) {
        next = c->next;
        if (c->state == HS__C_CLOSING)
            continue;
        uint64_t hs_to = (uint64_t)tr->cfg->handshake_timeout_ms * 1000;
        uint64_t peer_to = (uint64_t)tr->cfg->peer_timeout_ms * 1000;
        if (c->state < HS__C_OPEN) {
            if (now - c->t_start_us > hs_to) {
                if (!c->outgoing) {
                    uv_mutex_lock(tr->mu);
                    tr->st->conns_refused++;
                    uv_mutex_unlock(tr->mu);
                }
                /* A stranger that never finishes is one of possibly many: its close is logged
                 * at debug level; an outgoing handshake of ours that stalls is worth a warning. */
                hs__conn_close(c, HS_ETIMEDOUT, 0, c->outgoing ? HS_LOG_WARN : HS_LOG_DEBUG,
                               "%shandshake not finished after %d ms; %llu application bytes "
                               "processed",
                               c->outgoing ? "" : "refused: ", tr->cfg->handshake_timeout_ms,
                               (unsigned long long)c->app_bytes);
            }
            continue;
        }
        if (pending_joiner(c)) {
            /* JOIN within the handshake's time; then the sequencer's answer, the version that
             * adds it and a snapshot (snapshot timeout), with a peer timeout to spare. */
            int joined = c->joiner == HS__JOINER_ASKED;
            uint64_t limit = hs_to + (joined ? (uint64_t)tr->cfg->snapshot_timeout_ms * 1000 +
                                                   peer_to
                                             : 0);
            if (now - c->t_start_us > limit) {
                uv_mutex_lock(tr->mu);
                tr->st->conns_refused++;
                uv_mutex_unlock(tr->mu);
                hs__conn_close(c, HS_ETIMEDOUT, 0, HS_LOG_DEBUG,
                               "refused: a joiner %s within %llu ms", joined ? "not admitted" :
                               "that sent no JOIN", (unsigned long long)(limit / 1000));
                continue;
            }
        }
        if (!c->reading_paused && now - c->last_recv_us > peer_to) {
            hs__conn_close(c, HS_ETIMEDOUT, 1, HS_LOG_WARN, "nothing received for %llu ms",
                           (unsigned long long)((now - c->last_recv_us) / 1000));
            continue;
        }
        /* Bytes the other side does not read for peer_to are a slow peer, unless it said it
         * holds its reads on purpose within that time (its application is busy: HOLD), or this
         * side holds its own reads of it (both busy: neither HOLD can pass the other's full
         * socket; this side's own application ends the hold, and the count starts again). */
        if (hs__conn_slow(c, now, peer_to)) {
            hs__conn_close(c, HS_ETIMEDOUT, 0, HS_LOG_WARN,
                           "slow: %zu bytes not written for %llu ms (the peer does not read)",
                           c->inflight, (unsigned long long)((now - c->last_progress_us) / 1000));
            continue;
        }
        uint64_t hb_us = (uint64_t)tr->cfg->heartbeat_ms * 1000;
        int hold = hs__conn_holding(c, now) && now - c->hold_sent_us >= hb_us;
        if ((hold || now - c->last_send_us >= hb_us) && !c->ctlq.head) {
            hs__heartbeat hb = {hold ? HS__HB_HOLD : HS__HB_BEAT, 0, 0, 0, 0};
            if (hold) c->hold_sent_us = now;
            tr->ev->make_heartbeat(tr->owner, &hb);
            hs_buf *b;
            if (hs_buf_new(&b, HS__HB_LEN) == 0) {
                if (hs__wire_heartbeat_encode(b, &hb) == 0)
                    hs__conn_send(c, HS__T_HEARTBEAT, hb.round, b);
                hs_buf_unref(b);
            }
        }
    }
}

const hs__transport_ops hs__tcp = {
    .listen = hs__conn_listen,
    .close_listener = hs__conn_close_listener,
    .dial = hs__conn_dial,
    .dial_sa = hs__conn_dial_sa,
    .send = hs__conn_send,
    .send_tail = hs__conn_send_tail,
    .pump = hs__conn_pump,
    .close = hs__conn_close,
    .abort = hs__conn_abort,
    .closed = hs__conn_closed,
    .flushed = hs__conn_flushed,
    .read_pause = hs__conn_read_pause,
    .set_limits = hs__conn_set_limits,
    .tick = hs__conn_tick,
    .local_ip = hs__conn_local_ip,
    .resolve = hs__conn_resolve,
};
