/* Connections (transport layer), the inside: lifecycle, the handshake (the layer's own, TLS or
 * none, then HELLO / HELLO_ACK or REFUSE, the contents and checks of which the owner's events
 * supply), frames through the validating reader from the plaintext the layer hands up
 * (straight into the payload buffer when it can), and read backpressure. Writing and closing
 * are conn_write.c; the layers layer_plain.c and layer_tls.c; listening, dialing, the periodic
 * checks and the ops table conn_accept.c. Frames of open connections go up through
 * tr->ev->on_frame.
 *
 * Threading: loop thread only. A connection is freed in its handles' close callbacks, after
 * every write callback has run. */
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/error_internal.h"
#include "net/transport.h"

#define RX_CAP (256u * 1024)

/* ------------------------------------------------------------------ reader limits per state */

void hs__conn_set_limits(hs__conn *c) {
    hs__transport *tr = c->tr;
    uint32_t *m = c->rd.max_len;
    memset(c->rd.max_len, 0, sizeof(c->rd.max_len));
    memset(c->rd.max_msg, 0, sizeof(c->rd.max_msg));
    if (c->state < HS__C_OPEN) {
        if (c->outgoing) {
            m[HS__T_HELLO_ACK] = HS__PREAUTH_MAX;
            m[HS__T_REFUSE] = HS__PREAUTH_MAX;
        } else {
            m[HS__T_HELLO] = HS__PREAUTH_MAX;
        }
        return;
    }
    m[HS__T_HEARTBEAT] = HS__HB_LEN;
    m[HS__T_BYE] = HS__PREAUTH_MAX;
    if (c->joiner && c->joiner_id == HS__ID_NONE) {
        m[HS__T_JOIN] = HS__PREAUTH_MAX; /* a joiner may only join */
        return;
    }
    uint64_t big = (uint64_t)tr->cfg->max_frame + 2 * HS__CTL_MAX;
    if (big > HS__FRAME_CAP)
        big = HS__FRAME_CAP;
    /* Messages over a part come in PART frames, within their own limits; only members (and a
     * joiner's bootstrap member, for WELCOME) may send them. */
    uint64_t msg = tr->cfg->max_message;
    m[HS__T_PART] = HS__PART_HDR_LEN + HS__PART_SIZE;
    if (c->bootstrap) {
        m[HS__T_WELCOME] = (uint32_t)big;
        m[HS__T_REFUSE] = HS__PREAUTH_MAX;
        c->rd.max_msg[HS__T_WELCOME] = msg + 2 * HS__CTL_MAX;
    }
    m[HS__T_DATA] = (uint32_t)(tr->cfg->max_frame < msg ? tr->cfg->max_frame : msg);
    c->rd.max_msg[HS__T_DATA] = msg;
    m[HS__T_MEMBERS] = HS__CTL_MAX;
    m[HS__T_SUSPECT] = HS__PREAUTH_MAX;
    m[HS__T_JOIN_FWD] = HS__PREAUTH_MAX;
    m[HS__T_JOIN_ACK] = HS__PREAUTH_MAX;
    m[HS__T_RESEND] = HS__RESEND_LEN;
}

/* ------------------------------------------------------------------ lifecycle */

hs__conn *hs__conn_new(hs__transport *tr, int outgoing) {
    hs__conn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    if (!(c->rx = malloc(RX_CAP))) {
        free(c);
        return NULL;
    }
    c->rx_cap = RX_CAP;
    c->tr = tr;
    c->outgoing = outgoing;
    c->expect_id = HS__ID_NONE;
    c->peer_id = HS__ID_NONE;
    c->joiner_id = HS__ID_NONE;
    c->t_start_us = c->last_recv_us = c->last_send_us = c->last_progress_us = hs__now_us();
    hs__reader_init(&c->rd);
    uv_tcp_init(tr->loop, &c->tcp);
    uv_timer_init(tr->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    c->handles_open = 2;
    c->next = tr->conns;
    if (tr->conns)
        tr->conns->prev = c;
    tr->conns = c;
    tr->n_conns++;
    return c;
}

static void sock_setup(hs__conn *c) {
    uv_tcp_nodelay(&c->tcp, 1);
    if (c->tr->cfg->sock_buf > 0) {
        int v = c->tr->cfg->sock_buf;
        uv_send_buffer_size((uv_handle_t *)&c->tcp, &v);
        v = c->tr->cfg->sock_buf;
        uv_recv_buffer_size((uv_handle_t *)&c->tcp, &v);
    }
}

void hs__conn_sa_format(const struct sockaddr *sa, char *ip, size_t ipcap, char *full,
                      size_t fullcap) {
    int port = 0;
    ip[0] = '\0';
    if (sa->sa_family == AF_INET) {
        uv_ip4_name((const struct sockaddr_in *)sa, ip, ipcap);
        port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
        snprintf(full, fullcap, "%s:%d", ip, port);
    } else if (sa->sa_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)sa, ip, ipcap);
        port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
        snprintf(full, fullcap, "[%s]:%d", ip, port);
    } else {
        snprintf(full, fullcap, "?");
    }
}

/* ------------------------------------------------------------------ handshake and frames */

static void open_conn(hs__conn *c) {
    char nm[128], tl[96];
    c->state = HS__C_OPEN;
    hs__conn_set_limits(c);
    c->last_progress_us = c->last_recv_us = hs__now_us();
    HS_LOGD("%s: authenticated (%s)", hs__conn_name(c, nm, sizeof(nm)),
            c->layer->describe(c, tl, sizeof(tl)));
    c->tr->ev->on_open(c->tr->owner, c);
    hs__conn_pump(c);
}

static int send_hello(hs__conn *c, int type) {
    hs__hello h;
    hs_buf *b;
    c->tr->ev->make_hello(c->tr->owner, &h);
    int err = hs_buf_new(&b, 512);
    if (err < 0)
        return err;
    if ((err = hs__wire_hello_encode(b, &h)) == 0)
        err = hs__conn_send(c, (uint8_t)type, h.round, b);
    hs_buf_unref(b);
    return err;
}

static void refuse(hs__conn *c, uint32_t code, const char *why) {
    hs__transport *tr = c->tr;
    uv_mutex_lock(tr->mu);
    tr->st->conns_refused++;
    uv_mutex_unlock(tr->mu);
    hs_buf *b;
    hs__reason r = {code, ""};
    snprintf(r.text, sizeof(r.text), "%s", why);
    if (hs_buf_new(&b, 64) == 0) {
        if (hs__wire_reason_encode(b, &r) == 0)
            hs__conn_send(c, HS__T_REFUSE, 0, b);
        hs_buf_unref(b);
    }
    hs__conn_close(c, HS_EAUTH, 0, code == HS__REFUSE_RETRY ? HS_LOG_DEBUG : HS_LOG_WARN,
                   "refused: %s", why);
}

static void malformed(hs__conn *c, int err, const char *msg) {
    hs__transport *tr = c->tr;
    uv_mutex_lock(tr->mu);
    tr->st->conns_malformed++;
    uv_mutex_unlock(tr->mu);
    /* Garbage in answer to our HELLO: the other side speaks something else (TLS against plain,
     * say). That is a refusal, not a reason to try again. */
    if (c->outgoing && c->state < HS__C_OPEN) {
        char why[HS__REASON_MAX + 1];
        snprintf(why, sizeof(why), "%s does not speak this protocol: %.400s", c->remote, msg);
        tr->ev->on_refused(tr->owner, c, HS__REFUSE_PROTO, why);
    }
    hs__conn_close(c, err, 1, HS_LOG_WARN, "malformed frame: %s", msg);
}

static void handle_frame(hs__conn *c, const hs__hdr *h, hs_buf *pay) {
    hs__transport *tr = c->tr;
    c->io.last_len = h->len;
    char why[HS__REASON_MAX + 1];
    c->last_recv_us = hs__now_us();
    hs__conn_count(tr, 0, HS__HDR_LEN + (size_t)h->len, h->type);
    if (c->state == HS__C_HELLO && !c->outgoing) {
        hs__hello hello;
        int err = hs__wire_hello_decode(pay->data, pay->len, &hello);
        hs_buf_unref(pay);
        if (err < 0) {
            malformed(c, err, hs_error_message());
            return;
        }
        if (h->sender != hello.peer_id) {
            snprintf(why, sizeof(why), "HELLO header says peer %u, its body peer %u", h->sender,
                     hello.peer_id);
            {
                malformed(c, HS_EPROTO, why);
                return;
            }
        }
        uint32_t code = (uint32_t)tr->ev->check_hello(tr->owner, c, &hello, 1, why, sizeof(why));
        if (code) {
            refuse(c, code, why);
            return;
        }
        c->hello = hello;
        c->peer_id = hello.peer_id;
        c->joiner = hello.peer_id == HS__ID_NONE;
        if ((err = send_hello(c, HS__T_HELLO_ACK)) < 0) {
            hs__conn_close(c, err, 0, HS_LOG_WARN, "HELLO_ACK: %s", hs_error_message());
            return;
        }
        open_conn(c);
        return;
    }
    if (c->state == HS__C_HELLO) {
        if (h->type == HS__T_REFUSE) {
            hs__reason r;
            int err = hs__wire_reason_decode(pay->data, pay->len, &r);
            hs_buf_unref(pay);
            if (err < 0) {
                malformed(c, err, hs_error_message());
                return;
            }
            tr->ev->on_refused(tr->owner, c, r.code, r.text);
            hs__conn_close(c, HS_EAUTH, 0, r.code == HS__REFUSE_RETRY ? HS_LOG_DEBUG : HS_LOG_WARN,
                           "refused by %s: %s", c->remote, r.text);
            return;
        }
        hs__hello ack;
        int err = hs__wire_hello_decode(pay->data, pay->len, &ack);
        hs_buf_unref(pay);
        if (err < 0) {
            malformed(c, err, hs_error_message());
            return;
        }
        if (h->sender != ack.peer_id) {
            snprintf(why, sizeof(why), "HELLO_ACK header says peer %u, its body peer %u", h->sender,
                     ack.peer_id);
            {
                malformed(c, HS_EPROTO, why);
                return;
            }
        }
        uint32_t code = (uint32_t)tr->ev->check_hello(tr->owner, c, &ack, 0, why, sizeof(why));
        if (code) {
            tr->ev->on_refused(tr->owner, c, code, why);
            hs__conn_close(c, HS_EAUTH, 1, HS_LOG_WARN, "refusing %s: %s", c->remote, why);
            return;
        }
        c->hello = ack;
        c->peer_id = ack.peer_id;
        open_conn(c);
        return;
    }
    /* Open. */
    if (h->sender != c->peer_id) {
        if (c->joiner_id != HS__ID_NONE && h->sender == c->joiner_id) {
            c->peer_id = c->joiner_id; /* the joiner got its WELCOME and uses its id now */
        } else if (!(c->joiner_id != HS__ID_NONE && h->sender == HS__ID_NONE)) {
            hs_buf_unref(pay);
            snprintf(why, sizeof(why), "%s frame from peer %u on the connection of peer %u",
                     hs__wire_type_name(h->type), h->sender, c->peer_id);
            {
                malformed(c, HS_EPROTO, why);
                return;
            }
        }
    }
    int err = tr->ev->on_frame(tr->owner, c, h, pay);
    if (err < 0 && c->state != HS__C_CLOSING)
        malformed(c, err, hs_error_message());
}

/* Feeds plaintext to the frame reader, handling every frame it completes. */
void hs__conn_feed(hs__conn *c, const uint8_t *p, size_t n) {
    c->rd.stream = __atomic_load_n(&c->tr->stream_data, __ATOMIC_RELAXED);
    while (n && c->state != HS__C_CLOSING) {
        size_t used = 0;
        hs__hdr h;
        hs_buf *pay = NULL;
        int r = hs__reader_feed(&c->rd, p, n, &used, &h, &pay);
        c->app_bytes += used;
        if (r < 0) {
            malformed(c, r, hs_error_message());
            return;
        }
        p += used;
        n -= used;
        if (r == 1)
            handle_frame(c, &h, pay);
    }
}

void hs__conn_direct_done(hs__conn *c, size_t n) {
    hs__hdr h;
    hs_buf *pay;
    c->app_bytes += n;
    if (hs__reader_direct_done(&c->rd, n, &h, &pay) == 1)
        handle_frame(c, &h, pay);
}

int hs__conn_secured(hs__conn *c) {
    c->state = HS__C_HELLO;
    hs__conn_set_limits(c);
    return c->outgoing ? send_hello(c, HS__T_HELLO) : 0;
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
    hs__conn *c = hd->data;
    (void)suggested;
    c->layer->alloc(c, buf);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    hs__conn *c = s->data;
    if (nread == 0)
        return;
    if (c->state == HS__C_CLOSING) {
        if (nread < 0)
            hs__conn_final_close(c); /* the peer's EOF after our shutdown */
        return;
    }
    if (nread < 0) {
        c->io.eof = 1;
        size_t part = hs__reader_partial(&c->rd);
        if (nread != UV_EOF)
            hs__conn_close(c, HS_ECONNRESET, 0, HS_LOG_INFO, "%s", uv_strerror((int)nread));
        else if (part)
            malformed(c, HS_EPROTO, "truncated frame: end of stream inside a frame");
        else if (c->layer->eof(c))
            ;
        else
            hs__conn_close(c, HS_ECONNRESET, 0, c->got_bye ? HS_LOG_DEBUG : HS_LOG_INFO,
                           "end of stream%s", c->got_bye ? " after BYE" : "");
        return;
    }
    c->last_recv_us = hs__now_us();
    c->layer->read(c, c->io.direct ? NULL : (const uint8_t *)buf->base, (size_t)nread);
}

/* The connection is established (TCP): its layer starts (TLS, or HELLO at once). */
int hs__conn_start(hs__conn *c) {
    int err;
    c->connected = 1;
    c->layer = __atomic_load_n(&c->tr->layer, __ATOMIC_ACQUIRE);
    if (!c->layer)
        c->layer = c->tr->tls ? &hs__layer_tls : &hs__layer_plain;
    sock_setup(c);
    if ((err = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read)) < 0)
        return hs__err(err, "read: %s", uv_strerror(err));
    return c->layer->start(c);
}

void hs__conn_read_pause(hs__conn *c, int pause) {
    if (c->state == HS__C_CLOSING || c->io.final || pause == c->reading_paused)
        return;
    c->reading_paused = pause;
    if (pause) {
        c->paused_us = hs__now_us();
        uv_read_stop((uv_stream_t *)&c->tcp);
        HS_LOGD("%s: mailbox full, not reading", c->remote);
        return;
    }
    /* Silence and stalled writes count from now: while this side held its reads, the other's
     * heartbeats (and its HOLD, when it holds too) waited in the socket. */
    c->hold_sent_us = 0;
    c->last_recv_us = c->last_progress_us = hs__now_us();
    int err = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (err < 0)
        hs__conn_close(c, err, 0, HS_LOG_WARN, "read: %s", uv_strerror(err));
}
