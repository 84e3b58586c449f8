/* The training thread's side of the runtime: the commands it posts to the loop (which runs them
 * in net.c), the mailbox where DATA payloads wait, keyed by (sender, round), until its recv()
 * or drain() takes them, and the hs_exchange the algorithms use (view() reads the member-list
 * version in force; send() hands payloads to the loop as commands).
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
 * fell to half the cap. mu held; either thread. */
static void mail_taken(hs_net *net) {
    int kick = 0;
    for (int i = 0; i < net->mb.n_peers; i++) {
        hs__peer *p = hs__peer_of(net->mb.peers[i]);
        if (p->rx_paused && p->mailbox_bytes <= net->cfg.max_buffered / 2) {
            p->rx_paused = 0;
            kick = 1;
        }
    }
    if (kick)
        hs__net_post(net, HS__CMD_KICK, 0, 0, NULL, 1);
}

/* Stores a DATA payload (reference taken over). Caller holds mu. */
int hs__net_mail_put(hs_net *net, hs__peer *p, uint64_t round, hs_buf *buf, int resent) {
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
    /* Nothing is dropped for being old: push-sum adds shares whenever they arrive (a
     * straggler's are many rounds behind), and losing one would lose its mass. The
     * synchronous algorithms take every round they are sent, in order; the per-sender cap
     * below bounds what waits. */
    if (net->n_mail == net->cap_mail) {
        int cap = net->cap_mail ? 2 * net->cap_mail : 64;
        hs__mail *m = realloc(net->mail, (size_t)cap * sizeof(*m));
        if (!m)
            return hs__err(HS_ENOMEM, "mailbox: out of memory");
        net->mail = m;
        net->cap_mail = cap;
    }
    net->mail[net->n_mail++] = (hs__mail){p->m.id, round, buf};
    p->mailbox_bytes += buf->len;
    /* Backpressure, not loss: over its cap, the sender's connection stops reading until the
     * application has taken enough (its queue then fills, and a sender that cannot write for
     * the peer timeout declares this peer slow). */
    if (p->mailbox_bytes > net->cfg.max_buffered)
        p->rx_paused = 1;
    /* Wake the training thread only for what it waits for: with k neighbours, waking it for
     * every arrival would cost up to k - 1 useless context switches per round (a later round
     * from the same sender wakes it too: it means the awaited one is lost). drain() users
     * do not wait. */
    if (net->recv_waiting && net->recv_from == p->m.id && round >= net->recv_round)
        uv_cond_signal(&net->cv);
    return 0;
}

/* ------------------------------------------------------------------ the exchange */

/* Written under mu by the training thread; the loop reads it without (hs__net_round). */
static void bump_round(hs_net *net, uint64_t round) {
    if (round > net->cur_round)
        __atomic_store_n(&net->cur_round, round, __ATOMIC_RELAXED);
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
    if ((err = hs_topo_view(mv->topo, mv->rank_self, round, &v)) < 0)
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
    /* A message over the limit goes alone: references to the caller's buffer, sent in parts
     * as the socket takes them, so the queue costs no memory of its own. */
    else if (p->queued_bytes && p->queued_bytes + total > net->cfg.max_buffered)
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

static int ex_recv(hs_exchange *ex, uint32_t from, uint64_t round, int timeout_ms, hs_buf **out) {
    hs_net *net = ex->impl;
    if (timeout_ms < 0)
        timeout_ms = net->cfg.peer_timeout_ms; /* never wait without a limit */
    uint64_t start = hs__now_us(), deadline = start + (uint64_t)timeout_ms * 1000, ask = 0;
    int err, asked = 0;
    uv_mutex_lock(&net->mu);
    bump_round(net, round);
    for (;;) {
        for (int i = 0; i < net->n_mail; i++)
            if (net->mail[i].from == from && net->mail[i].round == round) {
                *out = net->mail[i].buf;
                mail_remove(net, i);
                mail_taken(net);
                uv_mutex_unlock(&net->mu);
                return 0;
            }
        hs__peer *p = hs__peer_find(net, from);
        uint64_t now = hs__now_us();
        if (!p) {
            err = hs__err(HS_EINVAL, "recv from peer %u: not a member", from);
            break;
        }
        if (p->m.dead) {
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
        /* A frame lost on the way costs a round trip: ask the sender again, backing off. */
        if (!ask || (gap && !asked))
            ask = gap ? now : start + hs__rs_interval_us(p->rtt_us, p->emu_oneway_ms, 0);
        if (now >= ask && !p->rx_paused &&
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

static int ex_drain(hs_exchange *ex, hs_msg *out, int max) {
    hs_net *net = ex->impl;
    uv_mutex_lock(&net->mu);
    int n = net->n_mail < max ? net->n_mail : max;
    for (int i = 0; i < n; i++) {
        out[i].from = net->mail[i].from;
        out[i].round = net->mail[i].round;
        out[i].payload = net->mail[i].buf;
        hs__peer *p = hs__peer_find(net, net->mail[i].from);
        if (p)
            p->mailbox_bytes -= net->mail[i].buf->len;
    }
    /* (an empty mailbox may not be allocated yet: memmove of NULL is undefined even for 0) */
    if (net->n_mail > n)
        memmove(net->mail, net->mail + n, (size_t)(net->n_mail - n) * sizeof(*net->mail));
    net->n_mail -= n;
    mail_taken(net);
    uv_mutex_unlock(&net->mu);
    return n;
}

static void ex_stats(hs_exchange *ex, hs_exchange_stats *out) {
    hs_net *net = ex->impl;
    out->msgs_sent = __atomic_load_n(&net->st.ex.msgs_sent, __ATOMIC_RELAXED);
    out->msgs_recv = __atomic_load_n(&net->st.ex.msgs_recv, __ATOMIC_RELAXED);
    out->bytes_sent = __atomic_load_n(&net->st.ex.bytes_sent, __ATOMIC_RELAXED);
    out->bytes_recv = __atomic_load_n(&net->st.ex.bytes_recv, __ATOMIC_RELAXED);
}

const hs_exchange_ops hs__net_exchange_ops = {ex_view, ex_send, ex_recv, ex_drain, ex_stats, NULL};

