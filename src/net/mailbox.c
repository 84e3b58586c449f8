/* The training thread's side of the runtime: the commands it posts to the loop (which runs them
 * in net.c), the mailbox where DATA payloads (or their pieces, net/pieces.h) wait, keyed by
 * (sender, round), until its recv(), recv_piece() or drain() takes them, and the hs_exchange
 * the algorithms use (view() reads the member-list version in force; send() hands payloads to
 * the loop as commands).
 * Backpressure: a sender over its share of the mailbox stops being read until it is taken.
 *
 * Threading: the exchange ops run on the training thread; hs__net_mail_put on the loop thread;
 * both under net->mu. */
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/runtime.h"

/* Queues a command for the loop (takes a reference to buf on success). */
int hs__net_post(hs_net *net, int type, uint32_t to, uint64_t round, hs_buf *buf, int locked) {
    hs__cmd *cmd = calloc(1, sizeof(*cmd));
    if (!cmd)
        return hs__err(HS_ENOMEM, "command: out of memory");
    cmd->type = type;
    cmd->to = to;
    cmd->round = round;
    cmd->buf = buf ? hs_buf_ref(buf) : NULL;
    if (!locked)
        uv_mutex_lock(&net->mu);
    if (net->cmd_tail)
        net->cmd_tail->next = cmd;
    else
        net->cmd_head = cmd;
    net->cmd_tail = cmd;
    if (!locked)
        uv_mutex_unlock(&net->mu);
    uv_async_send(&net->async);
    return 0;
}

static void mail_remove(hs_net *net, int i) {
    hs__peer *p = hs__peer_find(net, net->mail[i].from);
    if (p)
        p->mailbox_bytes -= net->mail[i].buf->len;
    memmove(net->mail + i, net->mail + i + 1, (size_t)(net->n_mail - i - 1) * sizeof(*net->mail));
    net->n_mail--;
}

/* The application took messages: connections held back read again once their sender's share
 * fell to half the cap that held them. mu held; either thread. */
static void mail_taken(hs_net *net) {
    int kick = 0;
    for (int i = 0; i < net->mb.n_peers; i++) {
        hs__peer *p = hs__peer_of(net->mb.peers[i]);
        if (p->rx_paused && p->mailbox_bytes <= p->rx_cap / 2) {
            p->rx_paused = 0;
            kick = 1;
        }
    }
    if (kick)
        hs__net_post(net, HS__CMD_KICK, 0, 0, NULL, 1);
}

int hs__net_mail_dup(hs__peer *p, uint64_t round, int resent) {
    return !p->m.dead && resent && p->have_data_round && round <= p->last_data_round &&
           !hs__rs_gap_has(p->gap_mask, p->last_data_round, round);
}

/* A new DATA round from p (a whole payload, or the first piece of one): replays are refused,
 * a resent copy fills its gap. */
static int round_check(hs__peer *p, uint64_t round, int resent) {
    int gap =
        resent && p->have_data_round && hs__rs_gap_has(p->gap_mask, p->last_data_round, round);
    if (gap) {
        hs__rs_gap_fill(&p->gap_mask, p->last_data_round, round);
    } else if (p->have_data_round && round <= p->last_data_round) {
        return hs__err(HS_EPROTO,
                       "stale or replayed DATA round %llu from peer %u (newest was %llu)",
                       (unsigned long long)round, p->m.id, (unsigned long long)p->last_data_round);
    } else {
        hs__rs_gap_note(&p->gap_mask, p->have_data_round, p->last_data_round, round);
        p->have_data_round = 1;
        p->last_data_round = round;
    }
    return 0;
}

static int mail_add(hs_net *net, hs__peer *p, hs__mail m, size_t cap) {
    /* Nothing is dropped for being old: push-sum adds shares whenever they arrive (a
     * straggler's are many rounds behind), and losing one would lose its mass. The
     * synchronous algorithms take every round they are sent, in order; the per-sender cap
     * below bounds what waits. */
    if (net->n_mail == net->cap_mail) {
        int slots = net->cap_mail ? 2 * net->cap_mail : 64;
        hs__mail *grown = realloc(net->mail, (size_t)slots * sizeof(*grown));
        if (!grown)
            return hs__err(HS_ENOMEM, "mailbox: out of memory");
        net->mail = grown;
        net->cap_mail = slots;
    }
    net->mail[net->n_mail++] = m;
    p->mailbox_bytes += m.buf->len;
    /* Backpressure, not loss: over its cap, the sender's connection stops reading until the
     * application has taken enough (its queue then fills; the transport says HOLD, so that the
     * sender does not take it for a peer that stopped reading). */
    if (p->mailbox_bytes > cap) {
        p->rx_paused = 1;
        p->rx_cap = cap;
    }
    uint64_t round = m.round;
    /* Wake the training thread only for what it waits for: with k neighbours, waking it for
     * every arrival would cost up to k - 1 useless context switches per round (a later round
     * from the same sender wakes it too: it means the awaited one is lost). drain() users
     * do not wait. */
    if (net->recv_waiting && net->recv_from == p->m.id && round >= net->recv_round)
        uv_cond_signal(&net->cv);
    return 0;
}

/* Stores a DATA payload (reference taken over). Caller holds mu. */
int hs__net_mail_put(hs_net *net, hs__peer *p, uint64_t round, hs_buf *buf, int resent) {
    int err = round_check(p, round, resent);
    hs__mail m = {p->m.id, round, buf, 0, buf->len, 0};
    return err < 0 ? err : mail_add(net, p, m, net->cfg.max_buffered);
}

int hs__net_mail_put_piece(hs_net *net, hs__peer *p, uint64_t round, hs_buf *buf) {
    hs__part part;
    int err = hs__wire_part_decode(buf->data, &part); /* the reader checked the rest */
    if (err < 0)
        return err;
    if (part.type != HS__T_DATA)
        return hs__err(HS_EPROTO, "PART: a %s message handed up in pieces",
                       hs__wire_type_name(part.type));
    int resent = (part.flags & HS__F_RESENT) != 0;
    uint64_t n = buf->len - HS__PART_HDR_LEN, from = 0;
    int k = hs__pstream_accept(&p->pstream, round, part.off, n, part.total, resent, &from);
    if (k < 0 || k == HS__PIECE_DUP)
        return k < 0 ? k : 0;
    if (k == HS__PIECE_NEW) {
        /* The message's round is checked at its first piece, as a whole message's. */
        int dup = hs__net_mail_dup(p, round, resent);
        net->st.resend_dup += (uint64_t)dup;
        if (dup || (p->m.dead && resent)) { /* (as a whole message: dispatch.c) */
            hs__pstream_drop(&p->pstream);
            return 0;
        }
        if ((err = round_check(p, round, resent)) < 0)
            return err;
    }
    size_t skip = HS__PART_HDR_LEN + (size_t)(from - part.off);
    hs__mail m = {p->m.id, round, buf, from, part.total, skip};
    return (err = mail_add(net, p, m, HS__PIECES_CAP(net))) < 0 ? err : 1;
}

/* ------------------------------------------------------------------ the exchange */

/* Written under mu by the training thread; the loop reads it without (hs__net_round). */
static void bump_round(hs_net *net, uint64_t round) {
    if (round > net->cur_round)
        __atomic_store_n(&net->cur_round, round, __ATOMIC_RELAXED);
}

void hs_net_set_first_round(hs_net *net, uint64_t round) {
    uv_mutex_lock(&net->mu);
    net->first_round = round;
    uv_mutex_unlock(&net->mu);
}

static int ex_view(hs_exchange *ex, uint64_t round, hs_peer_view *out) {
    hs_net *net = ex->impl;
    int err = 0;
    uv_mutex_lock(&net->mu);
    bump_round(net, round);
    mail_taken(net);
    hs__mview *mv = hs__mb_at(&net->mb, round);
    hs_view v;
    memset(&v, 0, sizeof(v));
    if (!mv) {
        err =
            hs__err(HS_ENOENT, "no member list in force at round %llu", (unsigned long long)round);
        goto out;
    }
    if (mv->rank_self < 0) {
        err = hs__err(HS_ENOENT, "peer %u is not a member at round %llu (version %llu)", net->self,
                      (unsigned long long)round, (unsigned long long)mv->m.version);
        goto out;
    }
    if (!mv->topo) {
        err = hs__err(HS_EINVAL, "topology '%s' could not be built for %u members", net->s_topo,
                      mv->m.n);
        goto out;
    }
    if ((err = hs_topo_view(mv->topo, mv->rank_self, round - net->first_round, &v)) < 0)
        goto out;
    int need = v.n_in > v.n_out ? v.n_in : v.n_out;
    if (need > net->view_cap) {
        hs_nbr *a = realloc(net->view_in, (size_t)need * sizeof(*a));
        if (a)
            net->view_in = a;
        hs_nbr *b = realloc(net->view_out, (size_t)need * sizeof(*b));
        if (b)
            net->view_out = b;
        if (!a || !b) {
            err = hs__err(HS_ENOMEM, "view: out of memory");
            goto out;
        }
        net->view_cap = need;
    }
    for (int i = 0; i < v.n_in; i++)
        net->view_in[i] = (hs_nbr){mv->m.m[v.in[i].peer].id, v.in[i].w};
    for (int i = 0; i < v.n_out; i++)
        net->view_out[i] = (hs_nbr){mv->m.m[v.out[i].peer].id, v.out[i].w};
    out->epoch = mv->m.version;
    out->self = net->self;
    out->n_members = (int)mv->m.n;
    out->self_w = v.self_w;
    out->n_in = v.n_in;
    out->n_out = v.n_out;
    out->in = net->view_in;
    out->out = net->view_out;
out:
    hs_view_free(&v);
    uv_mutex_unlock(&net->mu);
    return err;
}

/* What is queued towards p leaves no room for a message of total bytes, under mu. A message over
 * the limit goes alone: references to the caller's buffer, sent in parts as the socket takes
 * them, so the queue costs no memory of its own. */
static int no_room(const hs_net *net, const hs__peer *p, size_t total) {
    return p->queued_bytes && p->queued_bytes + total > net->cfg.max_buffered;
}

static int ex_send(hs_exchange *ex, uint32_t to, uint64_t round, hs_buf *payload) {
    hs_net *net = ex->impl;
    if (!payload || payload->len == 0 || payload->len > net->cfg.max_message)
        return hs__err(HS_EINVAL, "send to peer %u: payload of %zu bytes (want 1 to %llu)", to,
                       payload ? payload->len : 0, (unsigned long long)net->cfg.max_message);
    size_t total = HS__HDR_LEN + payload->len;
    int err = 0;
    uv_mutex_lock(&net->mu);
    bump_round(net, round);
    hs__peer *p = hs__peer_find(net, to);
    if (net->stopping || net->mb.removed || net->leaving)
        err = hs__err(HS_ECANCELED, "send to peer %u: this peer is leaving or was removed", to);
    else if (!p || to == net->self)
        err = hs__err(HS_EINVAL, "send to peer %u: not a member", to);
    else if (p->m.dead)
        err = hs__err(HS_ECONNRESET, "send to peer %u: it is gone", to);
    else if (p->have_sent_round && round <= p->last_sent_round)
        err = hs__err(HS_EINVAL, "send to peer %u: round %llu after round %llu", to,
                      (unsigned long long)round, (unsigned long long)p->last_sent_round);
    else if (no_room(net, p, total))
        err = hs__err(HS_EAGAIN, "send to peer %u: %zu bytes queued, the limit is %zu (slow link?)",
                      to, p->queued_bytes, net->cfg.max_buffered);
    if (err == 0) {
        p->queued_bytes += total;
        p->have_sent_round = 1;
        p->last_sent_round = round;
        if ((err = hs__net_post(net, HS__CMD_SEND, to, round, payload, 1)) < 0)
            p->queued_bytes -= total;
    }
    uv_mutex_unlock(&net->mu);
    return err;
}

/* Room is made as the loop thread finishes writing a DATA frame (peer_frame_done, which
 * wakes cv once the frame has let go of its payload); the wait also looks again every
 * 100 ms, for the ways a peer ends (declared dead, this peer stopping). */
static int ex_wait_room(hs_exchange *ex, uint32_t to, size_t bytes, int timeout_ms) {
    hs_net *net = ex->impl;
    size_t total = HS__HDR_LEN + bytes;
    uint64_t deadline = hs__now_us() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000;
    int err = 0;
    uv_mutex_lock(&net->mu);
    for (;;) {
        hs__peer *p = hs__peer_find(net, to);
        uint64_t now = hs__now_us();
        if (net->stopping || net->mb.removed || net->leaving) {
            err = hs__err(HS_ECANCELED, "wait to send to peer %u: this peer is leaving", to);
            break;
        }
        if (!p || p->m.dead) {
            err = hs__err(HS_ECONNRESET, "wait to send to peer %u: it is gone", to);
            break;
        }
        if (!no_room(net, p, total))
            break;
        if (now >= deadline) {
            err = hs__err(HS_ETIMEDOUT,
                          "wait to send to peer %u: %zu bytes still queued after %d ms (slow "
                          "link?)",
                          to, p->queued_bytes, timeout_ms);
            break;
        }
        uint64_t until = deadline - now < 100000 ? deadline : now + 100000;
        uv_cond_timedwait(&net->cv, &net->mu, (until - now) * 1000);
    }
    uv_mutex_unlock(&net->mu);
    return err;
}

/* What a waiting reader looks for, under mu: 1 found and taken, 0 not (yet), < 0 an error. */
typedef int (*take_fn)(hs_net *net, uint32_t from, uint64_t round, void *ctx);

/* Waits for what take finds of (from, round), or for the reason it will not come. */
static int mail_wait(hs_net *net, uint32_t from, uint64_t round, int timeout_ms, take_fn take,
                     void *ctx) {
    if (timeout_ms < 0)
        timeout_ms = net->cfg.peer_timeout_ms; /* never wait without a limit */
    uint64_t start = hs__now_us(), deadline = start + (uint64_t)timeout_ms * 1000, ask = 0;
    int err, asked = 0;
    uv_mutex_lock(&net->mu);
    bump_round(net, round);
    for (;;) {
        int got = take(net, from, round, ctx);
        mail_taken(net);
        if (got != 0) {
            err = got < 0 ? got : 0;
            break;
        }
        hs__peer *p = hs__peer_find(net, from);
        uint64_t now = hs__now_us();
        if (!p) {
            err = hs__err(HS_EINVAL, "recv from peer %u: not a member", from);
            break;
        }
        /* Gone once its connection is: a peer dropped by a member list (its BYE went to the
         * sequencer first) may still be sending what it sent before the BYE it owes us. */
        if (p->m.dead && !p->rx_open) {
            err = hs__err(HS_ECONNRESET, "recv from peer %u: it is gone", from);
            break;
        }
        if (net->stopping || net->mb.removed) {
            err = hs__err(HS_ECANCELED, "recv from peer %u: this peer stopped", from);
            break;
        }
        /* Rounds on a link only go up: a later round in means this one is lost; a waiting
         * receiver asks for it again at once (it may still be held), others give up. */
        int gap = timeout_ms > 0 && p->have_data_round &&
                  hs__rs_gap_has(p->gap_mask, p->last_data_round, round);
        if (p->have_data_round && p->last_data_round > round && !gap) {
            err = hs__err(HS_ENOENT, "recv from peer %u: round %llu lost (round %llu came)",
                          from, (unsigned long long)round, (unsigned long long)p->last_data_round);
            break;
        }
        /* Reads from this sender are paused on a later round of its that fills the mailbox,
         * and nothing of this round is in or arriving: its copy sent again, or its GONE,
         * waits behind that round in the socket, which is read again only once this receiver
         * takes the later round, after this wait. Waiting would end at the timeout, every
         * frame of that sender (its heartbeats too) unread meanwhile: a slow link whose sender
         * dropped a round (its queue full) stalled a 25M-parameter job this way. */
        int arriving = p->pstream.active && p->pstream.round == round;
        if (p->rx_paused && p->have_data_round && p->last_data_round > round && !arriving) {
            err = hs__err(HS_ENOENT,
                          "recv from peer %u: round %llu lost (its round %llu fills the "
                          "mailbox; what it sends again would come behind it)",
                          from, (unsigned long long)round,
                          (unsigned long long)p->last_data_round);
            break;
        }
        if (p->have_gone && p->gone_round >= round) {
            err = hs__err(HS_ENOENT,
                          "recv from peer %u: round %llu lost (the sender no longer "
                          "holds it)",
                          from, (unsigned long long)round);
            break;
        }
        if (now >= deadline) {
            net->st.recv_timeouts += timeout_ms > 0;
            err = hs__err(HS_ETIMEDOUT, "recv from peer %u: no round %llu within %d ms", from,
                          (unsigned long long)round, timeout_ms);
            break;
        }
        /* A frame lost on the way costs a round trip: ask the sender again, backing off (not
         * while its pieces are arriving). */
        if (!ask || (gap && !asked))
            ask = gap ? now : start + hs__rs_interval_us(p->rtt_us, p->emu_oneway_ms, 0);
        if (now >= ask && !p->rx_paused && !arriving &&
            hs__net_post(net, HS__CMD_RESEND, from, round, NULL, 1) == 0)
            ask = now + hs__rs_interval_us(p->rtt_us, p->emu_oneway_ms, ++asked);
        uint64_t until = ask > now && ask < deadline ? ask : deadline;
        net->recv_waiting = 1;
        net->recv_from = from;
        net->recv_round = round;
        uv_cond_timedwait(&net->cv, &net->mu, (until - now) * 1000);
        net->recv_waiting = 0;
    }
    uv_mutex_unlock(&net->mu);
    return err;
}

static int is_whole(const hs__mail *m) {
    return m->skip == 0 && m->off == 0 && m->buf->len == m->total;
}

/* Drops mail i (its reference too). */
static void mail_drop(hs_net *net, int i) {
    hs_buf *b = net->mail[i].buf;
    mail_remove(net, i);
    hs_buf_unref(b);
}

/* recv(): the payload whole, or its pieces gathered in order into one buffer (an exchange that
 * hands up pieces: net/pieces.h); pieces of older rounds of that sender are dropped, as the
 * piece reader's next call would. */
typedef struct whole_ctx {
    hs_buf *gather, *out;
    uint64_t have;
} whole_ctx;

static int take_whole(hs_net *net, uint32_t from, uint64_t round, void *vc) {
    whole_ctx *c = vc;
    for (int i = 0; i < net->n_mail; i++) {
        hs__mail *m = &net->mail[i];
        if (m->from != from || m->round > round || (m->round < round && is_whole(m)))
            continue;
        if (!c->gather && m->round == round && is_whole(m)) {
            c->out = m->buf;
            mail_remove(net, i);
            return 1;
        }
        uint64_t len = m->buf->len - m->skip, skip = 0;
        int fit = m->round < round ? -1 : hs__piece_fits(m->off, len, c->have, &skip);
        if (fit == 0)
            continue;
        if (fit > 0) {
            if (!c->gather && hs_buf_new(&c->gather, (size_t)m->total) < 0)
                return HS_ENOMEM;
            memcpy(c->gather->data + c->have, m->buf->data + m->skip + skip, (size_t)(len - skip));
            c->have += len - skip;
        }
        uint64_t total = m->total;
        mail_drop(net, i);
        i = -1; /* from the start: the piece that follows may have come before */
        if (c->gather && c->have == total) {
            c->gather->len = (size_t)total;
            c->out = c->gather;
            c->gather = NULL;
            return 1;
        }
    }
    return 0;
}

static int ex_recv(hs_exchange *ex, uint32_t from, uint64_t round, int timeout_ms, hs_buf **out) {
    whole_ctx c = {NULL, NULL, 0};
    int err = mail_wait(ex->impl, from, round, timeout_ms, take_whole, &c);
    hs_buf_unref(c.gather); /* pieces of a payload that did not complete: lost with it */
    if (err == 0)
        *out = c.out;
    return err;
}

typedef struct piece_ctx {
    uint64_t at;
    hs_piece *out;
} piece_ctx;

static int take_piece(hs_net *net, uint32_t from, uint64_t round, void *vc) {
    piece_ctx *c = vc;
    for (int i = 0; i < net->n_mail; i++) {
        hs__mail *m = &net->mail[i];
        if (m->from != from || m->round > round)
            continue;
        uint64_t len = m->buf->len - m->skip, skip = 0;
        int fit = m->round < round ? -1 : hs__piece_fits(m->off, len, c->at, &skip);
        if (fit < 0)
            mail_drop(net, i--);
        if (fit <= 0)
            continue;
        *c->out = (hs_piece){m->buf, m->buf->data + m->skip + skip, (size_t)(len - skip), c->at,
                             m->total};
        mail_remove(net, i);
        return 1;
    }
    return 0;
}

static int ex_recv_piece(hs_exchange *ex, uint32_t from, uint64_t round, uint64_t at,
                         int timeout_ms, hs_piece *out) {
    hs_net *net = ex->impl;
    /* From the next message begun on, large ones come up in pieces. */
    __atomic_store_n(&net->tr.stream_data, 1, __ATOMIC_RELAXED);
    piece_ctx c = {at, out};
    return mail_wait(net, from, round, timeout_ms, take_piece, &c);
}

/* Takes up to max of the mail, in the order it came: into whole (whole payloads only, the rest
 * left waiting) or, when whole is NULL, into pieces (whole payloads and pieces alike). Taking
 * mail lets a sender held back for its share of the mailbox be read again. */
static int take_mail(hs_net *net, int max, hs_msg *whole, hs_msg_piece *pieces) {
    uv_mutex_lock(&net->mu);
    int n = 0, kept = 0;
    for (int i = 0; i < net->n_mail; i++) {
        hs__mail *m = &net->mail[i];
        if (n < max && (!whole || is_whole(m))) {
            if (whole)
                whole[n++] = (hs_msg){m->from, m->round, m->buf};
            else
                pieces[n++] = (hs_msg_piece){m->from, m->round,
                                             {m->buf, m->buf->data + m->skip,
                                              m->buf->len - m->skip, m->off, m->total}};
            hs__peer *p = hs__peer_find(net, m->from);
            if (p)
                p->mailbox_bytes -= m->buf->len;
        } else {
            net->mail[kept++] = *m;
        }
    }
    net->n_mail = kept;
    mail_taken(net);
    uv_mutex_unlock(&net->mu);
    return n;
}

/* Whole payloads only: an exchange read by drain() never hands up pieces (recv_piece turns
 * them on). */
static int ex_drain(hs_exchange *ex, hs_msg *out, int max) {
    return take_mail(ex->impl, max, out, NULL);
}

/* Whole payloads and pieces alike (a sender's pieces arrive in the order of their bytes:
 * net/pieces.h), so what waits here for an asynchronous reader stays within the sender's share
 * of the mailbox (HS__PIECES_CAP for pieces) and a part. */
static int ex_drain_pieces(hs_exchange *ex, hs_msg_piece *out, int max) {
    hs_net *net = ex->impl;
    __atomic_store_n(&net->tr.stream_data, 1, __ATOMIC_RELAXED);
    return take_mail(net, max, NULL, out);
}

static void ex_stats(hs_exchange *ex, hs_exchange_stats *out) {
    hs_net *net = ex->impl;
    out->msgs_sent = __atomic_load_n(&net->st.ex.msgs_sent, __ATOMIC_RELAXED);
    out->msgs_recv = __atomic_load_n(&net->st.ex.msgs_recv, __ATOMIC_RELAXED);
    out->bytes_sent = __atomic_load_n(&net->st.ex.bytes_sent, __ATOMIC_RELAXED);
    out->bytes_recv = __atomic_load_n(&net->st.ex.bytes_recv, __ATOMIC_RELAXED);
}

const hs_exchange_ops hs__net_exchange_ops = {.view = ex_view,
                                              .send = ex_send,
                                              .recv = ex_recv,
                                              .drain = ex_drain,
                                              .stats = ex_stats,
                                              .recv_piece = ex_recv_piece,
                                              .wait_room = ex_wait_room,
                                              .drain_pieces = ex_drain_pieces};

