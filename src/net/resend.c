/* Recovery of lost DATA frames: the per-neighbour store of the last payloads sent, the RESEND
 * request a waiting receiver sends, and the sender's answer (the round again, or GONE). See
 * resend.h and docs/PROTOCOL.md. Loop thread only, except hs__rs_interval_us (pure). */
#include "net/resend.h"

#include "core/error_internal.h"
#include "net/runtime.h"

void hs__rs_keep(hs__rstore *s, uint64_t round, hs_buf *payload) {
    if (!s->have_top || round > s->top)
        s->top = round;
    s->have_top = 1;
    /* A large payload is not kept: each held round would be a copy of the model that the
     * algorithm's pool cannot reuse. Its loss (a connection cut in the middle) is answered
     * GONE, as for a round evicted. */
    if (payload->len > HS__RS_KEEP_MAX)
        return;
    int slot = 0;
    for (int i = 0; i < HS__RS_DEPTH; i++) {
        if (!s->buf[i]) {
            slot = i;
            break;
        }
        if (s->round[i] < s->round[slot])
            slot = i;
    }
    hs_buf_unref(s->buf[slot]);
    s->buf[slot] = hs_buf_ref(payload);
    s->round[slot] = round;
    s->wconn[slot] = NULL;
}

void hs__rs_clear(hs__rstore *s) {
    for (int i = 0; i < HS__RS_DEPTH; i++) {
        hs_buf_unref(s->buf[i]);
        s->buf[i] = NULL;
    }
}

static int rs_find(const hs__rstore *s, uint64_t round) {
    for (int i = 0; i < HS__RS_DEPTH; i++)
        if (s->buf[i] && s->round[i] == round)
            return i;
    return -1;
}

void hs__rs_written(hs__rstore *s, uint64_t round, const hs__conn *c) {
    int i = rs_find(s, round);
    if (i >= 0) {
        s->wconn[i] = c;
        s->wconn_t[i] = c->t_start_us;
    }
}

uint64_t hs__rs_interval_us(double rtt_us, double emu_oneway_ms, int attempt) {
    double rtt = rtt_us > 0 ? rtt_us : 0;
    if (2e3 * emu_oneway_ms > rtt)
        rtt = 2e3 * emu_oneway_ms;
    double t = 1.5 * rtt;
    if (t < HS__RS_MIN_US)
        t = HS__RS_MIN_US;
    /* A link slower than the ceiling keeps its own round trip as the interval. */
    double cap = t > HS__RS_MAX_US ? t : HS__RS_MAX_US;
    for (int i = 0; i < attempt && t < cap; i++)
        t *= 2;
    return (uint64_t)(t < cap ? t : cap);
}

void hs__rs_gap_note(uint64_t *mask, int have_last, uint64_t last, uint64_t round) {
    if (!have_last) {
        *mask = 0; /* a joiner's first round: what came before is not ours to ask for */
        return;
    }
    uint64_t shift = round - last; /* >= 1 */
    uint64_t old = shift >= 64 ? 0 : *mask << shift;
    uint64_t skipped = shift - 1 >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << (shift - 1)) - 1;
    *mask = old | skipped;
}

int hs__rs_gap_has(uint64_t mask, uint64_t last, uint64_t round) {
    if (round >= last || last - 1 - round >= 64)
        return 0;
    return (int)((mask >> (last - 1 - round)) & 1);
}

void hs__rs_gap_fill(uint64_t *mask, uint64_t last, uint64_t round) {
    if (hs__rs_gap_has(*mask, last, round))
        *mask &= ~((uint64_t)1 << (last - 1 - round));
}

static void count(hs_net *net, uint64_t *ctr) {
    uv_mutex_lock(&net->mu);
    (*ctr)++;
    uv_mutex_unlock(&net->mu);
}

static int send_resend(hs_net *net, hs__peer *p, hs__conn *c, uint8_t kind, uint64_t round) {
    hs__resend r = {kind, round};
    hs_buf *b;
    int err = hs_buf_new(&b, HS__RESEND_LEN);
    if (err < 0)
        return err;
    if ((err = hs__wire_resend_encode(b, &r)) == 0)
        err = c ? hs__send_conn(c, HS__T_RESEND, hs__net_round(net), b)
                : hs__send_peer(net, p, HS__T_RESEND, hs__net_round(net), b);
    hs_buf_unref(b);
    return err;
}

void hs__rs_tick(hs_net *net, uint64_t now_us) {
    for (int i = 0; i < net->mb.n_peers; i++) {
        hs__peer *p = hs__peer_of(net->mb.peers[i]);
        if (!p->m.conn || p->m.conn->state != HS__C_OPEN || p->m.dead ||
            (p->rs.ping_us && now_us - p->rs.ping_us < HS__RS_PING_US))
            continue;
        p->rs.ping_us = now_us;
        hs__heartbeat hb = {HS__HB_PING, ++p->ping_token, hs__net_round(net), 0, 0};
        hs_buf *b;
        if (hs_buf_new(&b, HS__HB_LEN) < 0)
            return;
        if (hs__wire_heartbeat_encode(b, &hb) == 0) {
            p->ping_sent_ns = uv_hrtime();
            hs__send_conn(p->m.conn, HS__T_HEARTBEAT, hb.round, b);
        }
        hs_buf_unref(b);
    }
}

void hs__rs_ask(hs_net *net, hs__peer *p, uint64_t round) {
    /* Without a connection there is nobody to ask; a reconnection carries the peer's queue on,
     * and recv() asks again after its next interval. The request goes on the connection's own
     * queue, ahead of this peer's bulk DATA. */
    if (!p->m.conn || p->m.conn->state != HS__C_OPEN)
        return;
    if (send_resend(net, p, p->m.conn, HS__RS_REQUEST, round) < 0) {
        HS_LOGD("RESEND to peer %u: %s", p->m.id, hs_error_message());
        return;
    }
    if (!p->rs.have_asked || round > p->rs.asked_top)
        p->rs.asked_top = round;
    p->rs.have_asked = 1;
    count(net, &net->st.resend_asked);
}

void hs__rs_withdraw(hs__peer *p, uint64_t round) {
    if (!p->m.conn)
        return;
    hs__fq *q = &p->m.conn->ctlq;
    hs__frame *prev = NULL, *f = q->head;
    while (f) {
        hs__frame *next = f->next;
        hs__resend r;
        /* (a frame that went out in part must finish) */
        if (f->type == HS__T_RESEND && f->off == 0 &&
            hs__wire_resend_decode(f->payload->data, f->payload->len, &r) == 0 &&
            r.kind == HS__RS_REQUEST && r.round <= round) {
            if (prev)
                prev->next = next;
            else
                q->head = next;
            if (q->tail == f)
                q->tail = prev;
            q->bytes -= HS__HDR_LEN + (size_t)f->len;
            q->n--;
            hs__frame_free(f);
        } else {
            prev = f;
        }
        f = next;
    }
}

/* The payload again, flagged RESENT, through the link's emulation like any DATA (a real
 * retransmission can be lost too), behind what is queued for the peer. */
static void resend_data(hs_net *net, hs__peer *p, uint64_t round, hs_buf *b) {
    size_t total = HS__HDR_LEN + b->len;
    uv_mutex_lock(&net->mu);
    int skip = p->m.dead || p->queued_bytes + total > net->cfg.max_buffered;
    if (!skip)
        p->queued_bytes += total;
    uv_mutex_unlock(&net->mu);
    if (skip)
        return; /* a congested link: the receiver asks again later */
    hs__frame *f;
    /* (counted apart from dropped_emulated, which counts each round's first transmission: a
     * frame is then either received or counted there once) */
    int lost = hs__link_lose(&p->link);
    if (lost || hs__frame_new(&f, net->self, HS__T_DATA, round, b) < 0) {
        uv_mutex_lock(&net->mu);
        p->queued_bytes -= total;
        net->st.resend_lost += (uint64_t)lost;
        uv_mutex_unlock(&net->mu);
        return;
    }
    count(net, &net->st.resend_sent);
    hs__frame_set_flags(f, HS__F_RESENT);
    hs__frame_queue(&p->outq, &p->link, f);
    if (p->m.conn)
        net->tr.ops->pump(p->m.conn);
}

static int on_request(hs_net *net, hs__peer *p, uint64_t round) {
    const hs__rstore *s = &p->rs;
    if (p->m.dead) /* (written on this thread only) */
        return 0;
    /* Not handed to the link yet: this peer is behind, the original will come. */
    if (!s->have_top || round > s->top)
        return 0;
    /* Still queued here (emulated delay, pacing, a slow link): it is on its way. */
    for (const hs__frame *f = p->outq.head; f; f = f->next)
        if (f->type == HS__T_DATA && f->round == round)
            return 0;
    int i = rs_find(s, round);
    if (i >= 0) {
        /* Written whole on the connection still open: TCP delivers it, in order; the request
         * crossed it (a busy receiver, a slow link). Only a copy dropped by the emulation, cut
         * by a closing connection or left in a dead connection's buffers is lost. */
        if (s->wconn[i] && s->wconn[i] == p->m.conn && p->m.conn->t_start_us == s->wconn_t[i])
            return 0;
        HS_LOGD("peer %u missed round %llu: sending it again", p->m.id, (unsigned long long)round);
        resend_data(net, p, round, s->buf[i]);
        return 0;
    }
    /* GONE goes behind every DATA already queued for the peer, so that when it arrives every
     * round sent before it has arrived too. */
    HS_LOGD("peer %u missed round %llu, which is no longer held: GONE", p->m.id,
            (unsigned long long)round);
    int err = send_resend(net, p, NULL, HS__RS_GONE, round);
    if (err == 0)
        count(net, &net->st.resend_gone_sent);
    return err == HS_ENOMEM ? err : 0;
}

static int on_gone(hs_net *net, hs__peer *p, uint64_t round) {
    if (!p->rs.have_asked || round > p->rs.asked_top)
        return hs__err(HS_EPROTO, "RESEND GONE for round %llu, which peer %u was never asked for",
                       (unsigned long long)round, p->m.id);
    uv_mutex_lock(&net->mu);
    if (!p->have_gone || round > p->gone_round)
        p->gone_round = round;
    p->have_gone = 1;
    net->st.resend_gone++;
    if (net->recv_waiting && net->recv_from == p->m.id && net->recv_round <= round)
        uv_cond_signal(&net->cv);
    uv_mutex_unlock(&net->mu);
    return 0;
}

int hs__rs_on_frame(hs_net *net, hs__conn *c, const hs__hdr *h, const hs_buf *pay) {
    (void)h;
    hs__peer *p = c->peer;
    if (!p)
        return hs__err(HS_EPROTO, "RESEND on a connection that is not a member's");
    hs__resend r;
    int err = hs__wire_resend_decode(pay->data, pay->len, &r);
    if (err < 0)
        return err;
    return r.kind == HS__RS_GONE ? on_gone(net, p, r.round) : on_request(net, p, r.round);
}
