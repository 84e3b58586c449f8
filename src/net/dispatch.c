/* Where the layers meet (runtime layer): HELLO, the transport's events, the dispatch of frames
 * to membership, quorum, bootstrap, resend and the mailbox, and membership's env. The layers
 * below name none of each other; this file wires them.
 *
 * Threading: loop thread, except what takes net->mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/runtime.h"
#include "net/tls_hint.h"

/* ------------------------------------------------------------------ HELLO */

static void make_hello(void *owner, hs__hello *h) {
    hs_net *net = owner;
    memset(h, 0, sizeof(*h));
    h->proto = HS__WIRE_VERSION;
    h->peer_id = net->self;
    snprintf(h->run_id, sizeof(h->run_id), "%s", net->s_run);
    snprintf(h->listen, sizeof(h->listen), "%s", net->advertise);
    snprintf(h->model_sig, sizeof(h->model_sig), "%s", net->s_sig);
    h->n_params = net->cfg.n_params;
    snprintf(h->algo, sizeof(h->algo), "%s", net->s_algo);
    snprintf(h->codec, sizeof(h->codec), "%s", net->s_codec);
    hs__mview *mv = hs__mb_newest(&net->mb);
    if (mv) {
        h->mver = mv->m.version;
        h->missuer = mv->m.issuer;
    }
    h->round = hs__net_round(net);
}

static int check_hello(void *owner, hs__conn *c, const hs__hello *h, int server, char *why,
                       size_t cap) {
    hs_net *net = owner;
    const char *who = h->listen[0] ? h->listen : c->remote;
    if (h->proto != HS__WIRE_VERSION) {
        snprintf(why, cap, "peer %s speaks protocol %u, this peer %u", who, h->proto,
                 HS__WIRE_VERSION);
        return HS__REFUSE_MISMATCH;
    }
    if (strcmp(h->run_id, net->s_run)) {
        snprintf(why, cap, "peer %s belongs to run '%s', this run is '%s'", who, h->run_id,
                 net->s_run);
        return HS__REFUSE_MISMATCH;
    }
    if (strcmp(h->model_sig, net->s_sig) || h->n_params != net->cfg.n_params) {
        snprintf(why, cap,
                 "peer %s trains model '%s' (%llu parameters), this run trains '%s' (%llu)", who,
                 h->model_sig, (unsigned long long)h->n_params, net->s_sig,
                 (unsigned long long)net->cfg.n_params);
        return HS__REFUSE_MISMATCH;
    }
    if (strcmp(h->algo, net->s_algo)) {
        snprintf(why, cap, "peer %s runs algo %s, this run uses %s", who, h->algo, net->s_algo);
        return HS__REFUSE_MISMATCH;
    }
    if (strcmp(h->codec, net->s_codec)) {
        snprintf(why, cap, "peer %s uses codec %s, this run uses %s", who, h->codec, net->s_codec);
        return HS__REFUSE_MISMATCH;
    }
    if (!server) {
        if (h->peer_id == HS__ID_NONE) {
            snprintf(why, cap, "peer %s answered without a peer id", who);
            return HS__REFUSE_PROTO;
        }
        if (c->expect_id != HS__ID_NONE && h->peer_id != c->expect_id) {
            snprintf(why, cap, "dialed peer %u at %s but found peer %u", c->expect_id, c->remote,
                     h->peer_id);
            return HS__REFUSE_MISMATCH;
        }
        return 0;
    }
    uv_mutex_lock(&net->mu);
    int leaving = net->leaving || net->stopping;
    uv_mutex_unlock(&net->mu);
    if (net->self == HS__ID_NONE) {
        snprintf(why, cap, "this peer has not joined yet");
        return HS__REFUSE_RETRY;
    }
    if (leaving) {
        snprintf(why, cap, "this peer is leaving");
        return HS__REFUSE_RETRY;
    }
    if (h->peer_id == HS__ID_NONE)
        return 0; /* a joiner: it may only send JOIN */
    if (h->peer_id == net->self) {
        snprintf(why, cap, "peer %s claims id %u, which is this peer's", who, h->peer_id);
        return HS__REFUSE_MISMATCH;
    }
    hs__mview *mv = hs__mb_newest(&net->mb);
    if (mv && hs__mb_is_member(mv, h->peer_id))
        return 0;
    if (!mv || h->peer_id >= mv->m.next_id) {
        snprintf(why, cap, "peer id %u is not known here yet", h->peer_id);
        return HS__REFUSE_RETRY;
    }
    snprintf(why, cap,
             "peer %s (id %u) was removed from this run (members v%llu); it may join again as a "
             "new peer",
             who, h->peer_id, (unsigned long long)mv->m.version);
    return HS__REFUSE_NOT_MEMBER;
}

/* ------------------------------------------------------------------ connection events */

static void on_open(void *owner, hs__conn *c) {
    hs_net *net = owner;
    if (c->bootstrap) {
        hs__bs_join_start(net); /* sends JOIN on it */
        return;
    }
    if (c->joiner)
        return;
    hs__net_attach(net, c);
}

static void on_refused(void *owner, hs__conn *c, uint32_t code, const char *text) {
    hs_net *net = owner;
    if (c->bootstrap) {
        hs__bs_on_refused(net, c, code, text);
        return;
    }
    hs__peer *p = c->expect_id != HS__ID_NONE ? hs__peer_find(net, c->expect_id) : NULL;
    if (!p)
        return;
    uint64_t now = hs__now_us();
    /* A member holds a list without this peer: a majority agreed to remove it. */
    if (code == HS__REFUSE_NOT_MEMBER && p->m.member) {
        hs__q_removed(&net->mb, "peer %u (%s) refused it: %s", p->m.id, p->m.addr, text);
        return;
    }
    if (code == HS__REFUSE_RETRY) {
        p->m.next_dial_us = now + (uint64_t)p->m.backoff_ms * 1000;
        p->m.backoff_ms = p->m.backoff_ms * 2 > 1000 ? 1000 : p->m.backoff_ms * 2;
    } else {
        p->m.next_dial_us = now + 5000000;
    }
}

static void on_closed(void *owner, hs__conn *c, int err, int dial_failed) {
    hs_net *net = owner;
    uv_mutex_lock(&net->mu);
    int stopping = net->stopping || net->leaving;
    uv_mutex_unlock(&net->mu);
    if (stopping) {
        /* Nothing to repair while leaving, but the peer must not keep pointing at a connection
         * about to be freed: the quorum count reads it until the loop ends. */
        hs__peer *p = c->peer;
        if (p && p->m.conn == c) {
            p->m.conn = NULL;
            uv_mutex_lock(&net->mu);
            net->n_open--;
            uv_mutex_unlock(&net->mu);
        }
        if (p && p->m.dialing == c)
            p->m.dialing = NULL;
        if (p && p->m.pending_conn == c)
            p->m.pending_conn = NULL;
        return;
    }
    hs__bs_conn_gone(net, c);
    if (!c->outgoing && err == HS_EAUTH && strstr(c->why, HS__TLS_HINT_WRONG_SECRET)) {
        uv_mutex_lock(&net->mu);
        net->wrong_secret_us = hs__now_us();
        net->wrong_secret_n = net->mb.n_sched ? (int)hs__mb_newest(&net->mb)->m.n : 0;
        snprintf(net->wrong_secret_msg, sizeof(net->wrong_secret_msg), "%s: %s", c->remote,
                 c->why);
        uv_cond_broadcast(&net->cv);
        uv_mutex_unlock(&net->mu);
    }
    if (c->bootstrap && net->join_conn == c) {
        hs__bs_join_conn_failed(net, c, err, c->why);
        if (!c->peer)
            return;
    }
    hs__peer *p = c->peer;
    if (!p && c->outgoing && c->expect_id != HS__ID_NONE)
        p = hs__peer_find(net, c->expect_id);
    if (!p)
        return;
    if (p->m.dialing == c)
        p->m.dialing = NULL;
    if (p->m.pending_conn == c)
        p->m.pending_conn = NULL;
    int was_attached = p->m.conn == c;
    if (was_attached) {
        p->m.conn = NULL;
        uv_mutex_lock(&net->mu);
        net->n_open--;
        p->rx_open = 0;
        hs__net_wake(net); /* a receiver waiting on a dead peer's last messages: no more come */
        uv_mutex_unlock(&net->mu);
    }
    if (was_attached || c->outgoing)
        hs__mb_conn_lost(&net->mb, &p->m, err, dial_failed, was_attached, c->got_bye, c->why);
}

static void make_heartbeat(void *owner, hs__heartbeat *hb) {
    hs_net *net = owner;
    hb->round = hs__net_round(net);
    hs__mview *mv = hs__mb_newest(&net->mb);
    if (mv) {
        hb->mver = mv->m.version;
        hb->missuer = mv->m.issuer;
    }
}

static int closing(void *owner) {
    hs_net *net = owner;
    uv_mutex_lock(&net->mu);
    int leaving = net->leaving || net->stopping;
    uv_mutex_unlock(&net->mu);
    return leaving;
}

static hs__fq *peer_queue(hs__conn *c) {
    return c->peer && c->peer->m.conn == c ? &c->peer->outq : NULL;
}

static hs__link *peer_link(hs__conn *c) { return c->peer ? &c->peer->link : NULL; }

/* DATA bytes leave the peer's send() budget once written or cut; a DATA frame written whole
 * is one that RESEND may have to account for. The frame has let go of its payload already
 * (hs__frame_drop_bufs): a sender waiting for room (wait_room) builds its next message only
 * once the last one's memory is free. */
static void peer_frame_done(void *owner, hs__conn *c, const hs__frame *f, int written) {
    hs_net *net = owner;
    if (f->type != HS__T_DATA)
        return;
    uv_mutex_lock(&net->mu);
    c->peer->queued_bytes -= HS__HDR_LEN + (size_t)f->len;
    hs__net_wake(net);
    uv_mutex_unlock(&net->mu);
    if (written)
        hs__rs_written(&c->peer->rs, f->round, c);
}

/* ------------------------------------------------------------------ dispatch */

static int on_heartbeat(hs_net *net, hs__conn *c, hs_buf *pay) {
    hs__heartbeat hb;
    int err = hs__wire_heartbeat_decode(pay->data, pay->len, &hb);
    if (err < 0)
        return err;
    if (hb.kind == HS__HB_PING) {
        /* The answer is the same bytes with the kind turned (the payload is ours alone). */
        pay->data[0] = HS__HB_PONG;
        return hs__send_conn(c, HS__T_HEARTBEAT, hs__net_round(net), pay);
    }
    if (hb.kind == HS__HB_PONG) {
        hs__peer *p = c->peer;
        if (p && hb.token == p->ping_token && p->ping_sent_ns) {
            uv_mutex_lock(&net->mu);
            p->rtt_us = (double)(uv_hrtime() - p->ping_sent_ns) / 1e3;
            p->pong = 1;
            hs__net_wake(net);
            uv_mutex_unlock(&net->mu);
        }
        return 0;
    }
    if (hb.kind == HS__HB_QUORUM) {
        hs__q_on_status(&net->mb, c->peer ? &c->peer->m : NULL, c->peer_id, &hb);
        return 0;
    }
    if (hb.kind == HS__HB_HOLD)
        c->held_us = hs__now_us();
    if (c->peer)
        hs__mb_on_heartbeat(&net->mb, &c->peer->m, &hb);
    return 0;
}

static int on_frame(void *owner, hs__conn *c, const hs__hdr *h, hs_buf *pay) {
    hs_net *net = owner;
    int err = 0;
    hs__peer *p = c->peer;
    if (p && h->round > p->m.known_round)
        p->m.known_round = h->round;
    switch (h->type) {
    case HS__T_DATA:
        if (!p) {
            err = hs__err(HS_EPROTO, "DATA on a connection that is not a member's");
            break;
        }
        uv_mutex_lock(&net->mu);
        /* A resent copy of a round that came after all (it was only late) is no replay. */
        int resent = (h->flags & HS__F_RESENT) != 0;
        int dup = hs__net_mail_dup(p, h->round, resent);
        net->st.resend_dup += (uint64_t)dup;
        /* A dead peer's DATA on its open connection was sent before its BYE: a member list
         * that dropped it on another peer's word reached us first. Copies sent again are
         * never asked of a dead peer (resend.c): one is stale. */
        int drop = dup || (p->m.dead && resent);
        err = drop ? 0 : hs__net_mail_put(net, p, h->round, pay, resent);
        int pause = p->rx_paused;
        uv_mutex_unlock(&net->mu);
        if (pause)
            net->tr.ops->read_pause(c, 1);
        if (err == 0 && !drop) {
            hs__rs_withdraw(p, h->round);
            return 0; /* the mailbox has the reference */
        }
        break;
    case HS__T_PART: { /* a piece of a DATA message, handed up as it came (net/pieces.h) */
        if (!p) {
            err = hs__err(HS_EPROTO, "DATA on a connection that is not a member's");
            break;
        }
        uv_mutex_lock(&net->mu);
        err = hs__net_mail_put_piece(net, p, h->round, pay);
        int hold = p->rx_paused;
        uv_mutex_unlock(&net->mu);
        if (hold)
            net->tr.ops->read_pause(c, 2);
        if (err == 1) {
            hs__rs_withdraw(p, h->round);
            return 0; /* the mailbox has the reference */
        }
        break;
    }
    case HS__T_HEARTBEAT:
        err = on_heartbeat(net, c, pay);
        break;
    case HS__T_RESEND:
        err = hs__rs_on_frame(net, c, h, pay);
        break;
    case HS__T_BYE: {
        hs__reason r;
        if ((err = hs__wire_reason_decode(pay->data, pay->len, &r)) < 0)
            break;
        int leave = r.code == HS__BYE_LEAVE || r.code == HS__BYE_DIVERGED;
        c->got_bye = leave ? 2 : 1;
        if (r.code == HS__BYE_DIVERGED) {
            /* The application decides whether its own run stops too (hs_net_nbr_diverged). */
            HS_LOGW("peer %u (%s) leaves the run: it diverged: %s", c->peer_id, c->remote, r.text);
            uv_mutex_lock(&net->mu);
            if (!net->nbr_diverged) {
                net->nbr_diverged = 1;
                net->nbr_diverged_id = c->peer_id;
                snprintf(net->nbr_diverged_why, sizeof(net->nbr_diverged_why), "%s", r.text);
            }
            hs__net_wake(net);
            uv_mutex_unlock(&net->mu);
        } else {
            HS_LOGI("peer %u (%s) says BYE: %s", c->peer_id, c->remote,
                    leave ? "leaving the run" : "closing the connection");
            if (r.text[0])
                HS_LOGD("peer %u BYE reason: %s", c->peer_id, r.text);
        }
        if (leave && p)
            hs__mb_peer_dead(&net->mb, &p->m, HS__LEFT);
        hs_buf_unref(pay);
        net->tr.ops->close(c, HS_ECONNRESET, 0, HS_LOG_DEBUG, "BYE");
        return 0;
    }
    case HS__T_MEMBERS: {
        hs__members m;
        if ((err = hs__wire_members_decode(pay->data, pay->len, &m)) < 0)
            break;
        hs__mb_on_members(&net->mb, c->peer ? &c->peer->m : NULL, c->peer_id, &m);
        hs__members_clear(&m);
        break;
    }
    case HS__T_SUSPECT: {
        hs__reason r;
        if ((err = hs__wire_reason_decode(pay->data, pay->len, &r)) < 0)
            break;
        hs__mb_on_suspect(&net->mb, c->peer_id, &r);
        break;
    }
    case HS__T_JOIN:
    case HS__T_JOIN_FWD:
    case HS__T_JOIN_ACK: {
        hs__join j;
        if ((err = hs__wire_join_decode(pay->data, pay->len, &j)) < 0)
            break;
        if (h->type == HS__T_JOIN)
            hs__bs_on_join(net, c, &j, h->round);
        else if (h->type == HS__T_JOIN_FWD)
            hs__bs_on_join_fwd(net, c, &j);
        else
            hs__bs_on_join_ack(net, &j);
        break;
    }
    case HS__T_WELCOME:
        err = hs__bs_on_welcome(net, c, pay);
        break;
    case HS__T_REFUSE: {
        hs__reason r;
        if ((err = hs__wire_reason_decode(pay->data, pay->len, &r)) < 0)
            break;
        hs__bs_on_refused(net, c, r.code, r.text);
        hs_buf_unref(pay);
        net->tr.ops->close(c, HS_EAUTH, 0, HS_LOG_WARN, "join refused by %s: %s", c->remote,
                           r.text);
        return 0;
    }
    default:
        err = hs__err(HS_EPROTO, "%s frame on an open connection", hs__wire_type_name(h->type));
    }
    hs_buf_unref(pay);
    return err;
}

/* ------------------------------------------------------------------ membership's env */

static uint64_t env_now(void *ctx) {
    (void)ctx;
    return hs__now_us();
}

static uint64_t env_round(void *ctx) { return hs__net_round(ctx); }

static void env_lock(void *ctx) { uv_mutex_lock(&((hs_net *)ctx)->mu); }

static void env_unlock(void *ctx) { uv_mutex_unlock(&((hs_net *)ctx)->mu); }

static void env_wake(void *ctx) { hs__net_wake(ctx); }

static hs__mpeer *env_peer_new(void *ctx, uint32_t id, const char *addr) {
    hs__peer *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->m.id = id;
    if (addr)
        snprintf(p->m.addr, sizeof(p->m.addr), "%s", addr);
    hs__net_link_init(ctx, p);
    return &p->m;
}

static uint64_t env_heard(void *ctx, const hs__mpeer *p) {
    (void)ctx;
    return p->conn ? p->conn->last_recv_us : 0;
}

static int env_send(void *ctx, hs__mpeer *m, int on_conn, uint8_t type, uint64_t round,
                    hs_buf *payload) {
    if (on_conn)
        return hs__send_conn(m->conn, type, round, payload);
    return hs__send_peer(ctx, hs__peer_of(m), type, round, payload);
}

static int env_dial(void *ctx, hs__mpeer *p, hs__conn **out) {
    hs_net *net = ctx;
    return net->tr.ops->dial(&net->tr, p->addr, p->id, out);
}

static void env_close(void *ctx, hs__conn *c, int err, int bye, hs_log_level level,
                      const char *why) {
    hs_net *net = ctx;
    net->tr.ops->close(c, err, bye, level, "%s", why);
}

static void env_dead(void *ctx, hs__mpeer *m, int left, int locked) {
    hs_net *net = ctx;
    hs__peer *p = hs__peer_of(m);
    if (locked) {
        if (!left)
            net->st.peers_dead++;
        p->queued_bytes = 0;
        return;
    }
    hs__fq_clear(&p->outq);
    hs__rs_clear(&p->rs);
}

static void env_join_ack(void *ctx, const hs__join *ack) { hs__bs_on_join_ack(ctx, ack); }

static void env_accepted(void *ctx) { hs__bs_try_welcomes(ctx); }

static void on_change_timer(uv_timer_t *t) {
    hs_net *net = t->data;
    hs__mb_commit(&net->mb);
}

static void env_schedule(void *ctx, int ms) {
    hs_net *net = ctx;
    uv_timer_start(&net->change_timer, on_change_timer, (uint64_t)ms, 0);
}

const hs__mb_env hs__net_mb_env = {
    .now_us = env_now,
    .round = env_round,
    .lock = env_lock,
    .unlock = env_unlock,
    .wake = env_wake,
    .quiet = closing,
    .peer_new = env_peer_new,
    .heard_us = env_heard,
    .send = env_send,
    .dial = env_dial,
    .close = env_close,
    .dead = env_dead,
    .join_ack = env_join_ack,
    .accepted = env_accepted,
    .schedule = env_schedule,
};

const hs__transport_events hs__net_events = {
    .make_hello = make_hello,
    .check_hello = check_hello,
    .make_heartbeat = make_heartbeat,
    .closing = closing,
    .on_open = on_open,
    .on_refused = on_refused,
    .on_closed = on_closed,
    .on_frame = on_frame,
    .peer_queue = peer_queue,
    .peer_link = peer_link,
    .peer_frame_done = peer_frame_done,
};

