/* The peer runtime's core: lifecycle, the loop thread, commands from the application threads,
 * the mailbox keyed by (round, neighbour), the hs_exchange the algorithms use, HELLO checks
 * and the dispatch of frames to membership.c and bootstrap.c.
 *
 * Threading: hs_net_start/leave/free on the application's thread; exchange ops on the training
 * thread; everything else here runs on the loop thread except what is marked. The two sides
 * meet under net->mu: commands go to the loop through a list and a uv_async; the loop hands
 * messages, deaths and member lists back through the mailbox and net->cv. */
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/net_internal.h"
#include "net/resend.h"

#define TICK_MS_MAX 25

uint64_t hs__now_us(void) { return uv_hrtime() / 1000; }

const char *hs_net_security_name(hs_net_security s) {
    switch (s) {
    case HS_NET_SECRET:
        return "secret";
    case HS_NET_CERT:
        return "cert";
    case HS_NET_INSECURE:
        return "insecure";
    }
    return "?";
}

void hs_net_config_init(hs_net_config *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen = "127.0.0.1:0";
    cfg->security = HS_NET_SECRET;
    cfg->run_id = "hearsay";
    cfg->model_sig = "";
    cfg->algo = "";
    cfg->codec = "";
    cfg->topo_spec = "ring";
    cfg->max_frame = 64u << 20;
    cfg->max_conns = 256;
    cfg->max_conns_per_addr = 16;
    cfg->handshake_timeout_ms = 2000;
    cfg->peer_timeout_ms = 3000;
    cfg->join_timeout_ms = 30000;
    cfg->snapshot_timeout_ms = 5000;
    cfg->change_rounds = 4;
    cfg->change_delay_ms = 300;
    cfg->tune_malloc = 1;
}

void hs_net_welcome_clear(hs_net_welcome *w) {
    if (!w)
        return;
    free(w->members);
    free(w->topo_spec);
    free(w->app_config);
    hs_buf_unref(w->snapshot);
    memset(w, 0, sizeof(*w));
}

/* ------------------------------------------------------------------ frames and queues */

static size_t frame_left(const hs__frame *f) { return HS__HDR_LEN + (size_t)f->len - f->off; }

void hs__fq_push(hs__fq *q, hs__frame *f) {
    f->next = NULL;
    if (q->tail)
        q->tail->next = f;
    else
        q->head = f;
    q->tail = f;
    q->bytes += frame_left(f);
    q->n++;
}

void hs__fq_push_front(hs__fq *q, hs__frame *f) {
    f->next = q->head;
    q->head = f;
    if (!q->tail)
        q->tail = f;
    q->bytes += frame_left(f);
    q->n++;
}

hs__frame *hs__fq_pop(hs__fq *q) {
    hs__frame *f = q->head;
    if (!f)
        return NULL;
    q->head = f->next;
    if (!q->head)
        q->tail = NULL;
    q->bytes -= frame_left(f);
    q->n--;
    f->next = NULL;
    return f;
}

void hs__frame_free(hs__frame *f) {
    if (!f)
        return;
    hs_buf_unref(f->payload);
    free(f);
}

void hs__fq_clear(hs__fq *q) {
    hs__frame *f;
    while ((f = hs__fq_pop(q)))
        hs__frame_free(f);
}

int hs__frame_new(hs__frame **out, hs_net *net, uint8_t type, uint64_t round, hs_buf *payload) {
    hs__frame *f = calloc(1, sizeof(*f));
    if (!f)
        return hs__err(HS_ENOMEM, "frame: out of memory");
    hs__hdr h = {HS__WIRE_VERSION, type, 0, net->self, (uint32_t)payload->len, round};
    hs__wire_hdr_encode(f->hdr, &h);
    f->type = type;
    f->len = (uint32_t)payload->len;
    f->round = round;
    f->payload = hs_buf_ref(payload);
    *out = f;
    return 0;
}

int hs__send_peer(hs_net *net, hs__peer *p, uint8_t type, uint64_t round, hs_buf *payload) {
    hs__frame *f;
    int err = hs__frame_new(&f, net, type, round, payload);
    if (err < 0)
        return err;
    if (!hs_net_emulation_none(&p->link.e))
        f->release_us = hs__link_release(&p->link, hs__now_us());
    hs__fq_push(&p->outq, f);
    if (p->conn)
        hs__conn_pump(p->conn);
    return 0;
}

int hs__send_conn(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload) {
    hs__frame *f;
    int err = hs__frame_new(&f, c->net, type, round, payload);
    if (err < 0)
        return err;
    if (c->peer && !hs_net_emulation_none(&c->peer->link.e))
        f->release_us = hs__link_release(&c->peer->link, hs__now_us());
    hs__fq_push(&c->ctlq, f);
    hs__conn_pump(c);
    return 0;
}

int hs__send_reason(hs_net *net, hs__peer *p, hs__conn *c, uint8_t type, uint32_t code,
                    const char *text) {
    hs__reason r;
    r.code = code;
    snprintf(r.text, sizeof(r.text), "%s", text);
    hs_buf *b;
    int err = hs_buf_new(&b, 64 + strlen(r.text));
    if (err < 0)
        return err;
    if ((err = hs__wire_reason_encode(b, &r)) == 0)
        err = p ? hs__send_peer(net, p, type, hs__net_round(net), b)
                : hs__send_conn(c, type, hs__net_round(net), b);
    hs_buf_unref(b);
    return err;
}

/* ------------------------------------------------------------------ peers */

hs__peer *hs__peer_find(hs_net *net, uint32_t id) {
    for (int i = 0; i < net->n_peers; i++)
        if (net->peers[i]->id == id)
            return net->peers[i];
    return NULL;
}

/* The emulation of the link to p: a per-peer override of the config, else the topology file's
 * spec for this link, else the global one. */
void hs__net_link_init(hs_net *net, hs__peer *p) {
    hs_net_emulation e = net->cfg.emulate;
    int found = 0;
    for (int i = 0; i < net->cfg.n_link_emulate; i++)
        if (net->link_emu[i].to == p->id) {
            e = net->link_emu[i].emu;
            found = 1;
        }
    /* In a topology file ranks are peer ids. */
    if (!found && net->topo_file && net->self != HS__ID_NONE &&
        net->self < (uint32_t)hs_topo_n(net->topo_file) &&
        p->id < (uint32_t)hs_topo_n(net->topo_file)) {
        const char *spec = hs_topo_link_emulation(net->topo_file, (int)net->self, (int)p->id);
        hs_net_emulation f;
        if (spec && hs_net_emulation_parse(spec, &f) == 0)
            e = f;
        else if (spec)
            HS_LOGW("topology %s: link %u -> %u: %s (using the global emulation)", net->s_topo,
                    net->self, p->id, hs_error_message());
    }
    hs__link_init(&p->link, &e, net->cfg.seed, net->self, p->id);
    uv_mutex_lock(&net->mu);
    p->emu_oneway_ms = e.delay_ms + e.jitter_ms;
    uv_mutex_unlock(&net->mu);
}

hs__peer *hs__peer_get(hs_net *net, uint32_t id, const char *addr) {
    hs__peer *p = hs__peer_find(net, id);
    if (p) {
        if (addr && strcmp(p->addr, addr))
            snprintf(p->addr, sizeof(p->addr), "%s", addr);
        return p;
    }
    if (!(p = calloc(1, sizeof(*p))))
        return NULL;
    p->id = id;
    if (addr)
        snprintf(p->addr, sizeof(p->addr), "%s", addr);
    hs__net_link_init(net, p);
    p->backoff_ms = 50;
    uv_mutex_lock(&net->mu);
    if (net->n_peers == net->cap_peers) {
        int cap = net->cap_peers ? 2 * net->cap_peers : 16;
        hs__peer **np = realloc(net->peers, (size_t)cap * sizeof(*np));
        if (!np) {
            uv_mutex_unlock(&net->mu);
            free(p);
            return NULL;
        }
        net->peers = np;
        net->cap_peers = cap;
    }
    net->peers[net->n_peers++] = p;
    uv_mutex_unlock(&net->mu);
    return p;
}

void hs__net_wake(hs_net *net) { uv_cond_broadcast(&net->cv); }

uint64_t hs__net_round(hs_net *net) { return __atomic_load_n(&net->cur_round, __ATOMIC_RELAXED); }

/* ------------------------------------------------------------------ HELLO */

void hs__net_make_hello(hs_net *net, hs__hello *h) {
    memset(h, 0, sizeof(*h));
    h->proto = HS__WIRE_VERSION;
    h->peer_id = net->self;
    snprintf(h->run_id, sizeof(h->run_id), "%s", net->s_run);
    snprintf(h->listen, sizeof(h->listen), "%s", net->advertise);
    snprintf(h->model_sig, sizeof(h->model_sig), "%s", net->s_sig);
    h->n_params = net->cfg.n_params;
    snprintf(h->algo, sizeof(h->algo), "%s", net->s_algo);
    snprintf(h->codec, sizeof(h->codec), "%s", net->s_codec);
    hs__mview *mv = hs__mb_newest(net);
    if (mv) {
        h->mver = mv->m.version;
        h->missuer = mv->m.issuer;
    }
    h->round = hs__net_round(net);
}

int hs__net_check_hello(hs_net *net, hs__conn *c, const hs__hello *h, int server, char *why,
                        size_t cap) {
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
    hs__mview *mv = hs__mb_newest(net);
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

void hs__net_on_open(hs_net *net, hs__conn *c) {
    if (c->bootstrap) {
        hs__bs_join_start(net); /* sends JOIN on it */
        return;
    }
    if (c->joiner)
        return;
    uv_mutex_lock(&net->mu);
    net->n_open++;
    uv_mutex_unlock(&net->mu);
    hs__mb_on_open(net, c);
}

void hs__net_on_refused(hs_net *net, hs__conn *c, uint32_t code, const char *text) {
    if (c->bootstrap) {
        hs__bs_on_refused(net, c, code, text);
        return;
    }
    hs__peer *p = c->expect_id != HS__ID_NONE ? hs__peer_find(net, c->expect_id) : NULL;
    if (!p)
        return;
    uint64_t now = hs__now_us();
    /* A member holds a list without this peer: a majority agreed to remove it. */
    if (code == HS__REFUSE_NOT_MEMBER && p->member) {
        hs__q_removed(net, "peer %u (%s) refused it: %s", p->id, p->addr, text);
        return;
    }
    if (code == HS__REFUSE_RETRY) {
        p->next_dial_us = now + (uint64_t)p->backoff_ms * 1000;
        p->backoff_ms = p->backoff_ms * 2 > 1000 ? 1000 : p->backoff_ms * 2;
    } else {
        p->next_dial_us = now + 5000000;
    }
}

void hs__net_on_closed(hs_net *net, hs__conn *c, int err, int dial_failed) {
    uv_mutex_lock(&net->mu);
    int stopping = net->stopping || net->leaving;
    uv_mutex_unlock(&net->mu);
    if (stopping) {
        /* Nothing to repair while leaving, but the peer must not keep pointing at a connection
         * about to be freed: the quorum count reads it until the loop ends. */
        hs__peer *p = c->peer;
        if (p && p->conn == c) {
            p->conn = NULL;
            uv_mutex_lock(&net->mu);
            net->n_open--;
            uv_mutex_unlock(&net->mu);
        }
        if (p && p->dialing == c)
            p->dialing = NULL;
        if (p && p->pending_conn == c)
            p->pending_conn = NULL;
        return;
    }
    hs__bs_conn_gone(net, c);
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
    if (p->dialing == c)
        p->dialing = NULL;
    if (p->pending_conn == c)
        p->pending_conn = NULL;
    int was_attached = p->conn == c;
    if (was_attached) {
        p->conn = NULL;
        uv_mutex_lock(&net->mu);
        net->n_open--;
        uv_mutex_unlock(&net->mu);
    }
    if (was_attached || c->outgoing)
        hs__mb_conn_lost(net, p, c, err, dial_failed, was_attached);
}

/* ------------------------------------------------------------------ mailbox */

static void mail_remove(hs_net *net, int i) {
    hs__peer *p = hs__peer_find(net, net->mail[i].from);
    if (p)
        p->mailbox_bytes -= net->mail[i].buf->len;
    memmove(net->mail + i, net->mail + i + 1, (size_t)(net->n_mail - i - 1) * sizeof(*net->mail));
    net->n_mail--;
}

static int post(hs_net *net, int type, uint32_t to, uint64_t round, hs_buf *buf, int locked);

/* The application took messages: connections held back read again once their sender's share
 * fell to half the cap. mu held; either thread. */
static void mail_taken(hs_net *net) {
    int kick = 0;
    for (int i = 0; i < net->n_peers; i++) {
        hs__peer *p = net->peers[i];
        if (p->rx_paused && p->mailbox_bytes <= net->cfg.max_buffered / 2) {
            p->rx_paused = 0;
            kick = 1;
        }
    }
    if (kick)
        post(net, HS__CMD_KICK, 0, 0, NULL, 1);
}

/* Stores a DATA payload (reference taken over). Caller holds mu. */
static int mail_put(hs_net *net, hs__peer *p, uint64_t round, hs_buf *buf, int resent) {
    int gap =
        resent && p->have_data_round && hs__rs_gap_has(p->gap_mask, p->last_data_round, round);
    if (gap) {
        hs__rs_gap_fill(&p->gap_mask, p->last_data_round, round);
    } else if (p->have_data_round && round <= p->last_data_round) {
        return hs__err(HS_EPROTO,
                       "stale or replayed DATA round %llu from peer %u (newest was %llu)",
                       (unsigned long long)round, p->id, (unsigned long long)p->last_data_round);
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
    net->mail[net->n_mail++] = (hs__mail){p->id, round, buf};
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
    if (net->recv_waiting && net->recv_from == p->id && round >= net->recv_round)
        uv_cond_signal(&net->cv);
    return 0;
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
        hs__q_on_status(net, c, &hb);
        return 0;
    }
    hs__mb_on_heartbeat(net, c, &hb);
    return 0;
}

int hs__net_dispatch(hs_net *net, hs__conn *c, const hs__hdr *h, hs_buf *pay) {
    int err = 0;
    hs__peer *p = c->peer;
    if (p && h->round > p->known_round)
        p->known_round = h->round;
    switch (h->type) {
    case HS__T_DATA:
        if (!p) {
            err = hs__err(HS_EPROTO, "DATA on a connection that is not a member's");
            break;
        }
        uv_mutex_lock(&net->mu);
        /* A resent copy of a round that came after all (it was only late) is no replay. */
        int resent = (h->flags & HS__F_RESENT) != 0;
        int dup = !p->dead && resent && p->have_data_round && h->round <= p->last_data_round &&
                  !hs__rs_gap_has(p->gap_mask, p->last_data_round, h->round);
        net->st.resend_dup += (uint64_t)dup;
        int drop = p->dead || dup;
        err = drop ? 0 : mail_put(net, p, h->round, pay, resent);
        int pause = p->rx_paused;
        uv_mutex_unlock(&net->mu);
        if (pause)
            hs__conn_read_pause(c, 1);
        if (err == 0 && !drop) {
            hs__rs_withdraw(p, h->round);
            return 0; /* the mailbox has the reference */
        }
        break;
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
            hs__mb_peer_dead(net, p, HS__LEFT);
        hs_buf_unref(pay);
        hs__conn_close(c, HS_ECONNRESET, 0, HS_LOG_DEBUG, "BYE");
        return 0;
    }
    case HS__T_MEMBERS: {
        hs__members m;
        if ((err = hs__wire_members_decode(pay->data, pay->len, &m)) < 0)
            break;
        hs__mb_on_members(net, c, &m);
        hs__members_clear(&m);
        break;
    }
    case HS__T_SUSPECT: {
        hs__reason r;
        if ((err = hs__wire_reason_decode(pay->data, pay->len, &r)) < 0)
            break;
        hs__mb_on_suspect(net, c, &r);
        break;
    }
    case HS__T_JOIN:
    case HS__T_JOIN_FWD:
    case HS__T_JOIN_ACK: {
        hs__join j;
        if ((err = hs__wire_join_decode(pay->data, pay->len, &j)) < 0)
            break;
        if (h->type == HS__T_JOIN)
            hs__bs_on_join(net, c, &j);
        else if (h->type == HS__T_JOIN_FWD)
            hs__bs_on_join_fwd(net, c, &j);
        else
            hs__bs_on_join_ack(net, &j);
        break;
    }
    case HS__T_WELCOME:
        err = hs__bs_on_welcome(net, c, pay->data, pay->len);
        break;
    case HS__T_REFUSE: {
        hs__reason r;
        if ((err = hs__wire_reason_decode(pay->data, pay->len, &r)) < 0)
            break;
        hs__bs_on_refused(net, c, r.code, r.text);
        hs_buf_unref(pay);
        hs__conn_close(c, HS_EAUTH, 0, HS_LOG_WARN, "join refused by %s: %s", c->remote, r.text);
        return 0;
    }
    default:
        err = hs__err(HS_EPROTO, "%s frame on an open connection", hs__wire_type_name(h->type));
    }
    hs_buf_unref(pay);
    return err;
}

/* ------------------------------------------------------------------ loop thread */

static void close_cb_count(uv_handle_t *h) { (void)h; }

static void do_stop(hs_net *net) {
    hs__conn *next;
    for (hs__conn *c = net->conns; c; c = next) {
        next = c->next;
        hs__conn_close(c, HS_ECANCELED, 0, HS_LOG_DEBUG, "stopping");
    }
    /* Connections still flushing are cut now: nothing waits on a stopped peer. */
    for (hs__conn *c = net->conns; c; c = c->next)
        hs__conn_abort(c);
    hs__conn_close_listener(net);
    if (!uv_is_closing((uv_handle_t *)&net->tick))
        uv_close((uv_handle_t *)&net->tick, close_cb_count);
    if (!uv_is_closing((uv_handle_t *)&net->change_timer))
        uv_close((uv_handle_t *)&net->change_timer, close_cb_count);
    if (!uv_is_closing((uv_handle_t *)&net->async))
        uv_close((uv_handle_t *)&net->async, close_cb_count);
}

static void leave_step(hs_net *net, uint64_t now) {
    if (!net->leave_closing) {
        /* Flushed: every open connection wrote its queues (the last DATA, then BYE).
         * Connections still being set up carry nothing of ours. */
        const hs__conn *busy = NULL;
        for (hs__conn *c = net->conns; c && !busy; c = c->next)
            if (c->state == HS__C_OPEN && !hs__conn_flushed(c))
                busy = c;
        if (busy && now < net->leave_deadline_us)
            return;
        if (busy)
            HS_LOGW("leave: %s still has %zu bytes queued and %d writes pending; closing anyway",
                    busy->remote, busy->ctlq.bytes + (busy->peer ? busy->peer->outq.bytes : 0),
                    busy->nwrites);
        net->leave_closing = busy ? -1 : 1;
        for (int i = 0; i < net->n_peers; i++) {
            hs__peer *p = net->peers[i];
            if (p->outq.head)
                HS_LOGW("leave: %zu frames for peer %u not sent (connection %s)", p->outq.n, p->id,
                        !p->conn                       ? "none"
                        : p->conn->state == HS__C_OPEN ? "open"
                                                       : "not open");
        }
        /* Close each connection the polite way (shutdown, then wait for the other side's end
         * of stream): a socket closed with unread input is reset, and a reset can destroy the
         * last frames we sent before they are read. */
        hs__conn *next;
        for (hs__conn *c = net->conns; c; c = next) {
            next = c->next;
            hs__conn_close(c, HS_ECANCELED, 0, HS_LOG_DEBUG, "this peer left the run");
        }
        /* The rest of the caller's timeout (at least half a second) for the ends of stream. */
        if (net->leave_deadline_us < now + 500000)
            net->leave_deadline_us = now + 500000;
    }
    int open = 0;
    for (hs__conn *c = net->conns; c; c = c->next)
        open += !hs__conn_closed(c);
    if (open && now < net->leave_deadline_us)
        return;
    uv_mutex_lock(&net->mu);
    net->left = net->leave_closing;
    net->stopping = 1;
    hs__net_wake(net);
    uv_mutex_unlock(&net->mu);
    do_stop(net);
}

static void start_leave(hs_net *net, uint64_t deadline) {
    net->leave_deadline_us = deadline;
    net->leave_started = 1;
    hs__conn_close_listener(net);
    HS_LOGI("leaving the run");
    uv_mutex_lock(&net->mu);
    uint32_t code = net->bye_code ? net->bye_code : HS__BYE_LEAVE;
    char why[HS__REASON_MAX + 1];
    snprintf(why, sizeof(why), "%s", net->bye_why[0] ? net->bye_why : "leaving");
    uv_mutex_unlock(&net->mu);
    for (int i = 0; i < net->n_peers; i++) {
        hs__peer *p = net->peers[i];
        if (p->conn && p->conn->state == HS__C_OPEN)
            hs__send_reason(net, p, NULL, HS__T_BYE, code, why);
    }
    leave_step(net, hs__now_us());
}

static void on_tick(uv_timer_t *t) {
    hs_net *net = t->data;
    uint64_t now = hs__now_us();
    uv_mutex_lock(&net->mu);
    int stopping = net->stopping, leaving = net->leaving;
    uv_mutex_unlock(&net->mu);
    if (stopping)
        return;
    hs__conn_tick(net, now);
    if (leaving) {
        /* Only once the LEAVE command ran (it may still be queued behind the last sends):
         * before, there is no deadline and nothing was flushed. */
        if (net->leave_started)
            leave_step(net, now);
        return;
    }
    hs__bs_join_tick(net, now);
    hs__mb_tick(net, now);
    hs__rs_tick(net, now);
}

static void on_async(uv_async_t *a) {
    hs_net *net = a->data;
    uv_mutex_lock(&net->mu);
    hs__cmd *list = net->cmd_head;
    net->cmd_head = net->cmd_tail = NULL;
    uv_mutex_unlock(&net->mu);
    uint64_t now = hs__now_us();
    while (list) {
        hs__cmd *cmd = list;
        list = cmd->next;
        hs__peer *p =
            (cmd->type == HS__CMD_SEND || cmd->type == HS__CMD_PING || cmd->type == HS__CMD_RESEND)
                ? hs__peer_find(net, cmd->to)
                : NULL;
        switch (cmd->type) {
        case HS__CMD_SEND: {
            size_t total = HS__HDR_LEN + cmd->buf->len;
            int sent = 0;
            if (p && !p->dead)
                hs__rs_keep(&p->rs, cmd->round, cmd->buf); /* lost or not: RESEND may ask */
            if (p && !p->dead && !hs__link_lose(&p->link))
                sent = hs__send_peer(net, p, HS__T_DATA, cmd->round, cmd->buf) == 0;
            else if (p && !p->dead) {
                uv_mutex_lock(&net->mu);
                net->st.dropped_emulated++;
                uv_mutex_unlock(&net->mu);
            }
            if (!sent && p) {
                uv_mutex_lock(&net->mu);
                p->queued_bytes -= total;
                uv_mutex_unlock(&net->mu);
            }
            break;
        }
        case HS__CMD_PING:
            if (p && p->conn && p->conn->state == HS__C_OPEN) {
                hs__heartbeat hb = {HS__HB_PING, ++p->ping_token, hs__net_round(net), 0, 0};
                hs_buf *b;
                if (hs_buf_new(&b, HS__HB_LEN) == 0) {
                    if (hs__wire_heartbeat_encode(b, &hb) == 0) {
                        p->ping_sent_ns = uv_hrtime();
                        hs__send_conn(p->conn, HS__T_HEARTBEAT, hb.round, b);
                    }
                    hs_buf_unref(b);
                }
            }
            break;
        case HS__CMD_RESEND:
            if (p && !p->dead)
                hs__rs_ask(net, p, cmd->round);
            break;
        case HS__CMD_LEAVE:
            start_leave(net, now + cmd->round * 1000);
            break;
        case HS__CMD_STOP:
            do_stop(net);
            break;
        case HS__CMD_JOIN:
            hs__bs_join_start(net);
            break;
        case HS__CMD_KICK:
            hs__bs_try_welcomes(net);
            for (int i = 0; i < net->n_peers; i++) {
                hs__peer *q = net->peers[i];
                if (!q->conn || !q->conn->reading_paused)
                    continue;
                uv_mutex_lock(&net->mu);
                int still = q->rx_paused;
                uv_mutex_unlock(&net->mu);
                if (!still)
                    hs__conn_read_pause(q->conn, 0);
            }
            break;
        }
        hs_buf_unref(cmd->buf);
        free(cmd);
    }
}

static void loop_main(void *arg) {
    hs_net *net = arg;
    /* Every socket write happens on this thread: with SIGPIPE blocked here, a write to a
     * closed connection fails with EPIPE instead of killing the process, whatever the
     * application does with the signal. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    uv_run(&net->loop, UV_RUN_DEFAULT);
}

/* Queues a command for the loop (takes a reference to buf on success). */
static int post(hs_net *net, int type, uint32_t to, uint64_t round, hs_buf *buf, int locked) {
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
    hs__mview *mv = hs__mb_at(net, round);
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
    if (!payload || payload->len == 0 || payload->len > net->cfg.max_frame)
        return hs__err(HS_EINVAL, "send to peer %u: payload of %zu bytes (want 1 to %zu)", to,
                       payload ? payload->len : 0, net->cfg.max_frame);
    size_t total = HS__HDR_LEN + payload->len;
    int err = 0;
    uv_mutex_lock(&net->mu);
    bump_round(net, round);
    hs__peer *p = hs__peer_find(net, to);
    if (net->stopping || net->removed || net->leaving)
        err = hs__err(HS_ECANCELED, "send to peer %u: this peer is leaving or was removed", to);
    else if (!p || to == net->self)
        err = hs__err(HS_EINVAL, "send to peer %u: not a member", to);
    else if (p->dead)
        err = hs__err(HS_ECONNRESET, "send to peer %u: it is gone", to);
    else if (p->have_sent_round && round <= p->last_sent_round)
        err = hs__err(HS_EINVAL, "send to peer %u: round %llu after round %llu", to,
                      (unsigned long long)round, (unsigned long long)p->last_sent_round);
    else if (p->queued_bytes + total > net->cfg.max_buffered)
        err = hs__err(HS_EAGAIN, "send to peer %u: %zu bytes queued, the limit is %zu (slow link?)",
                      to, p->queued_bytes, net->cfg.max_buffered);
    if (err == 0) {
        p->queued_bytes += total;
        p->have_sent_round = 1;
        p->last_sent_round = round;
        if ((err = post(net, HS__CMD_SEND, to, round, payload, 1)) < 0)
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
        if (p->dead) {
            err = hs__err(HS_ECONNRESET, "recv from peer %u: it is gone", from);
            break;
        }
        if (net->stopping || net->removed) {
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
        if (now >= ask && !p->rx_paused && post(net, HS__CMD_RESEND, from, round, NULL, 1) == 0)
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

static const hs_exchange_ops net_ops = {ex_view, ex_send, ex_recv, ex_drain, ex_stats};

/* ------------------------------------------------------------------ public API */

static char *dup_or(const char *s, const char *dflt) {
    if (!s)
        s = dflt;
    return s ? strdup(s) : NULL;
}

static int copy_config(hs_net *net, const hs_net_config *in) {
    net->cfg = *in;
    hs_net_config *c = &net->cfg;
    if (!(net->s_listen = dup_or(in->listen, "127.0.0.1:0")) ||
        !(net->s_run = dup_or(in->run_id, "hearsay")) ||
        !(net->s_sig = dup_or(in->model_sig, "")) || !(net->s_algo = dup_or(in->algo, "")) ||
        !(net->s_codec = dup_or(in->codec, "")) || !(net->s_topo = dup_or(in->topo_spec, "ring")))
        return hs__err(HS_ENOMEM, "config: out of memory");
    if ((in->advertise && !(net->s_advertise = strdup(in->advertise))) ||
        (in->bootstrap && !(net->s_bootstrap = strdup(in->bootstrap))) ||
        (in->secret_file && !(net->s_secret = strdup(in->secret_file))) ||
        (in->ca_file && !(net->s_ca = strdup(in->ca_file))) ||
        (in->cert_file && !(net->s_cert = strdup(in->cert_file))) ||
        (in->key_file && !(net->s_key = strdup(in->key_file))) ||
        (in->app_config && !(net->s_app_config = strdup(in->app_config))))
        return hs__err(HS_ENOMEM, "config: out of memory");
    c->listen = net->s_listen;
    c->advertise = net->s_advertise;
    c->bootstrap = net->s_bootstrap;
    c->secret_file = net->s_secret;
    c->ca_file = net->s_ca;
    c->cert_file = net->s_cert;
    c->key_file = net->s_key;
    c->run_id = net->s_run;
    c->model_sig = net->s_sig;
    c->algo = net->s_algo;
    c->codec = net->s_codec;
    c->topo_spec = net->s_topo;
    c->app_config = net->s_app_config;
    if (in->n_link_emulate > 0) {
        if (!(net->link_emu = malloc((size_t)in->n_link_emulate * sizeof(*net->link_emu))))
            return hs__err(HS_ENOMEM, "config: out of memory");
        memcpy(net->link_emu, in->link_emulate,
               (size_t)in->n_link_emulate * sizeof(*net->link_emu));
    }
    c->link_emulate = net->link_emu;
    if (c->max_frame == 0)
        c->max_frame = 64u << 20;
    if (c->max_frame > HS__FRAME_CAP)
        return hs__err(HS_EINVAL, "max frame %zu is over the hard cap of %u bytes", c->max_frame,
                       HS__FRAME_CAP);
    if (c->max_buffered == 0)
        c->max_buffered = 2 * c->max_frame + (1u << 20);
    if (c->max_buffered < c->max_frame + HS__HDR_LEN)
        return hs__err(HS_EINVAL, "max buffered %zu is below max frame %zu", c->max_buffered,
                       c->max_frame);
    if (c->max_conns <= 0)
        c->max_conns = 256;
    if (c->max_conns_per_addr <= 0)
        c->max_conns_per_addr = 16;
    if (c->handshake_timeout_ms <= 0)
        c->handshake_timeout_ms = 2000;
    if (c->peer_timeout_ms <= 0)
        c->peer_timeout_ms = 3000;
    if (c->heartbeat_ms <= 0)
        c->heartbeat_ms = c->peer_timeout_ms / 4;
    if (c->heartbeat_ms < 1)
        c->heartbeat_ms = 1;
    if (c->join_timeout_ms <= 0)
        c->join_timeout_ms = 30000;
    if (c->snapshot_timeout_ms <= 0)
        c->snapshot_timeout_ms = 5000;
    if (c->change_rounds <= 0)
        c->change_rounds = 4;
    if (c->change_delay_ms < 0)
        c->change_delay_ms = 0;
    for (size_t i = 0; i < strlen(net->s_run); i++)
        if (net->s_run[i] < 0x20 || net->s_run[i] > 0x7e)
            return hs__err(HS_EINVAL, "run id has a non-printable character");
    if (strlen(net->s_run) > HS__RUNID_MAX || strlen(net->s_sig) > HS__SIG_MAX ||
        strlen(net->s_algo) > HS__NAME_MAX || strlen(net->s_codec) > HS__NAME_MAX ||
        strlen(net->s_topo) > HS__SPEC_MAX)
        return hs__err(HS_EINVAL, "config: run id, model signature, algorithm, codec or topology "
                                  "string too long");
    return 0;
}

/* Topology files fix the number of peers (and so the ids that can join). */
int hs__net_topo_file(hs_net *net) {
    const char *s = net->s_topo;
    size_t n = strlen(s);
    hs_topo_free(net->topo_file);
    net->topo_file = NULL;
    net->topo_file_n = 0;
    if (!strchr(s, '/') && !(n > 5 && !strcmp(s + n - 5, ".json")))
        return 0;
    int err = hs_topo_new(&net->topo_file, s, 0, net->cfg.topo_seed);
    if (err < 0)
        return err;
    net->topo_file_n = hs_topo_n(net->topo_file);
    return 0;
}

static int wait_join(hs_net *net) {
    uint64_t deadline = hs__now_us() + (uint64_t)net->cfg.join_timeout_ms * 1000 + 2000000;
    uv_mutex_lock(&net->mu);
    while (net->join_state != HS__JOIN_DONE && net->join_state != HS__JOIN_FAILED) {
        uint64_t now = hs__now_us();
        if (now >= deadline) {
            net->join_state = HS__JOIN_FAILED;
            net->join_err = HS_ETIMEDOUT;
            snprintf(net->join_msg, sizeof(net->join_msg),
                     "join through %s: no WELCOME within %d ms", net->s_bootstrap,
                     net->cfg.join_timeout_ms);
            break;
        }
        uv_cond_timedwait(&net->cv, &net->mu, (deadline - now) * 1000);
    }
    int err = net->join_state == HS__JOIN_DONE ? 0 : net->join_err;
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", net->join_msg);
    uv_mutex_unlock(&net->mu);
    return err < 0 ? hs__err(err, "%s", msg) : 0;
}

int hs_net_start(hs_net **out, const hs_net_config *cfg, hs_net_welcome *welcome) {
    int err;
    hs_net *net = calloc(1, sizeof(*net));
    if (!net)
        return hs__err(HS_ENOMEM, "peer runtime: out of memory");
    uv_mutex_init(&net->mu);
    uv_cond_init(&net->cv);
    net->self = HS__ID_NONE;
    net->ex.ops = &net_ops;
    net->ex.impl = net;
    if (welcome)
        memset(welcome, 0, sizeof(*welcome));
    if ((err = copy_config(net, cfg)) < 0)
        goto fail;
    if ((err = hs__net_topo_file(net)) < 0)
        goto fail;
    if (net->cfg.tune_malloc) {
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
        mallopt(M_TRIM_THRESHOLD, 512 << 20);
    }
    if (net->cfg.security == HS_NET_INSECURE) {
        HS_LOGW("--insecure: plain TCP, peers are neither authenticated nor encrypted");
    } else if ((err = hs__tls_ctx_new(&net->tls, &net->cfg)) < 0) {
        goto fail;
    }
    if (net->s_bootstrap && (err = hs__conn_resolve(net->s_bootstrap, &net->bootstrap_sa)) < 0)
        goto fail;
    if ((err = uv_loop_init(&net->loop)) < 0) {
        err = hs__err(err, "event loop: %s", uv_strerror(err));
        goto fail;
    }
    net->loop_init = 1;
    uv_async_init(&net->loop, &net->async, on_async);
    net->async.data = net;
    uv_timer_init(&net->loop, &net->tick);
    net->tick.data = net;
    uv_timer_init(&net->loop, &net->change_timer);
    net->change_timer.data = net;
    if ((err = hs__conn_listen(net)) < 0)
        goto fail;
    char host[HS__ADDR_MAX + 1];
    int port;
    hs__wire_addr_split(net->s_listen, host, sizeof(host), &port);
    if (net->s_advertise)
        snprintf(net->advertise, sizeof(net->advertise), "%s", net->s_advertise);
    else if (strchr(host, ':'))
        snprintf(net->advertise, sizeof(net->advertise), "[%.200s]:%d", host, net->listen_port);
    else
        snprintf(net->advertise, sizeof(net->advertise), "%.200s:%d", host, net->listen_port);
    uint64_t tick = (uint64_t)net->cfg.heartbeat_ms / 2;
    if (tick > TICK_MS_MAX)
        tick = TICK_MS_MAX;
    if (tick < 1)
        tick = 1;
    uv_timer_start(&net->tick, on_tick, tick, tick);
    if (!net->s_bootstrap && (err = hs__mb_init_first(net)) < 0)
        goto fail;
    /* Read before the loop thread starts: from then on a joiner may commit a newer list (and
     * move the schedule) at any moment. */
    uint64_t first_version = net->s_bootstrap ? 0 : hs__mb_newest(net)->m.version;
    if (net->s_bootstrap)
        net->join_deadline_us = hs__now_us() + (uint64_t)net->cfg.join_timeout_ms * 1000;
    if ((err = uv_thread_create(&net->thread, loop_main, net)) < 0) {
        err = hs__err(err, "loop thread: %s", uv_strerror(err));
        goto fail;
    }
    net->thread_started = 1;
    HS_LOGI("listening on %s (%s)", net->advertise, hs_net_security_name(net->cfg.security));
    if (net->s_bootstrap) {
        uv_mutex_lock(&net->mu);
        net->welcome = welcome;
        net->join_state = HS__JOIN_DIALING;
        uv_mutex_unlock(&net->mu);
        /* (the loop's tick may run before the JOIN command: it must not see a zero deadline) */
        if ((err = post(net, HS__CMD_JOIN, 0, 0, NULL, 0)) == 0)
            err = wait_join(net);
        uv_mutex_lock(&net->mu);
        net->welcome = NULL;
        uv_mutex_unlock(&net->mu);
        if (err < 0)
            goto fail;
    } else if (welcome) {
        welcome->self = net->self;
        welcome->version = first_version;
        welcome->n_members = 1;
        welcome->topo_seed = net->cfg.topo_seed;
        if (!(welcome->members = calloc(1, sizeof(*welcome->members))) ||
            !(welcome->topo_spec = strdup(net->s_topo)) ||
            (net->s_app_config && !(welcome->app_config = strdup(net->s_app_config)))) {
            err = hs__err(HS_ENOMEM, "welcome: out of memory");
            goto fail;
        }
        welcome->members[0].id = net->self;
        snprintf(welcome->members[0].addr, sizeof(welcome->members[0].addr), "%s", net->advertise);
    }
    *out = net;
    return 0;
fail : {
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", hs_error_message());
    hs_net_welcome_clear(welcome);
    hs_net_free(net);
    return hs__err(err, "%s", msg);
}
}

hs_exchange *hs_net_exchange(hs_net *net) { return &net->ex; }

uint32_t hs_net_self(const hs_net *net) { return net->self; }

int hs_net_listen_port(const hs_net *net) { return net->listen_port; }

int hs_net_publish_snapshot(hs_net *net, uint64_t round, hs_buf *snapshot) {
    if (!snapshot)
        return hs__err(HS_EINVAL, "publish snapshot: no buffer");
    if (snapshot->len > net->cfg.max_frame)
        return hs__err(HS_EINVAL, "snapshot of %zu bytes is over the max frame of %zu",
                       snapshot->len, net->cfg.max_frame);
    uv_mutex_lock(&net->mu);
    hs_buf_unref(net->snap);
    net->snap = hs_buf_ref(snapshot);
    net->snap_round = round;
    net->snap_ever = 1;
    /* The application is at `round`: membership changes take effect after it (a peer resumed
     * alone at a late round must not welcome joiners into rounds it has left behind). */
    if (round > net->cur_round)
        __atomic_store_n(&net->cur_round, round, __ATOMIC_RELAXED);
    int wanted = net->snap_wanted;
    net->snap_wanted = 0;
    uv_mutex_unlock(&net->mu);
    if (wanted)
        post(net, HS__CMD_KICK, 0, 0, NULL, 0);
    return 0;
}

int hs_net_snapshot_wanted(hs_net *net) {
    uv_mutex_lock(&net->mu);
    int w = net->snap_wanted;
    uv_mutex_unlock(&net->mu);
    return w;
}

int hs_net_members(hs_net *net, hs_net_member **out, int *n, uint64_t *version,
                   uint64_t *eff_round) {
    uv_mutex_lock(&net->mu);
    hs__mview *mv = net->n_sched ? net->sched[net->n_sched - 1] : NULL;
    if (!mv) {
        uv_mutex_unlock(&net->mu);
        return hs__err(HS_ENOENT, "no member list yet");
    }
    hs_net_member *m = calloc(mv->m.n, sizeof(*m));
    if (!m) {
        uv_mutex_unlock(&net->mu);
        return hs__err(HS_ENOMEM, "member list: out of memory");
    }
    for (uint32_t i = 0; i < mv->m.n; i++) {
        m[i].id = mv->m.m[i].id;
        snprintf(m[i].addr, sizeof(m[i].addr), "%s", mv->m.m[i].addr);
    }
    *out = m;
    *n = (int)mv->m.n;
    if (version)
        *version = mv->m.version;
    if (eff_round)
        *eff_round = mv->m.eff_round;
    uv_mutex_unlock(&net->mu);
    return 0;
}

int hs_net_wait_members(hs_net *net, int n, int timeout_ms) {
    uint64_t deadline = hs__now_us() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000;
    uv_mutex_lock(&net->mu);
    for (;;) {
        hs__mview *mv = net->n_sched ? net->sched[net->n_sched - 1] : NULL;
        if (mv && (int)mv->m.n >= n)
            break;
        uint64_t now = hs__now_us();
        if (now >= deadline || net->stopping || net->removed) {
            int have = mv ? (int)mv->m.n : 0;
            uv_mutex_unlock(&net->mu);
            return hs__err(HS_ETIMEDOUT, "%d members after %d ms, waiting for %d", have, timeout_ms,
                           n);
        }
        uv_cond_timedwait(&net->cv, &net->mu, (deadline - now) * 1000);
    }
    uv_mutex_unlock(&net->mu);
    return 0;
}

void hs_net_stats_get(hs_net *net, hs_net_stats *out) {
    uv_mutex_lock(&net->mu);
    memset(out, 0, sizeof(*out));
    out->dropped_emulated = net->st.dropped_emulated;
    out->dropped_late = net->st.dropped_late;
    out->conns_accepted = net->st.conns_accepted;
    out->conns_refused = net->st.conns_refused;
    out->conns_malformed = net->st.conns_malformed;
    out->peers_dead = net->st.peers_dead;
    out->resend_asked = net->st.resend_asked;
    out->resend_sent = net->st.resend_sent;
    out->resend_lost = net->st.resend_lost;
    out->resend_dup = net->st.resend_dup;
    out->resend_gone = net->st.resend_gone;
    out->resend_gone_sent = net->st.resend_gone_sent;
    out->recv_timeouts = net->st.recv_timeouts;
    /* the per-frame counters are written atomically by the loop thread */
    out->frames_sent = __atomic_load_n(&net->st.frames_sent, __ATOMIC_RELAXED);
    out->frames_recv = __atomic_load_n(&net->st.frames_recv, __ATOMIC_RELAXED);
    out->bytes_sent = __atomic_load_n(&net->st.bytes_sent, __ATOMIC_RELAXED);
    out->bytes_recv = __atomic_load_n(&net->st.bytes_recv, __ATOMIC_RELAXED);
    out->ex.msgs_sent = __atomic_load_n(&net->st.ex.msgs_sent, __ATOMIC_RELAXED);
    out->ex.msgs_recv = __atomic_load_n(&net->st.ex.msgs_recv, __ATOMIC_RELAXED);
    out->ex.bytes_sent = __atomic_load_n(&net->st.ex.bytes_sent, __ATOMIC_RELAXED);
    out->ex.bytes_recv = __atomic_load_n(&net->st.ex.bytes_recv, __ATOMIC_RELAXED);
    hs__mview *at = hs__mb_at(net, net->cur_round);
    out->version = at ? at->m.version : 0;
    out->n_members = net->n_sched ? (int)net->sched[net->n_sched - 1]->m.n : 0;
    out->n_conns = net->n_open;
    uv_mutex_unlock(&net->mu);
}

int hs_net_ping(hs_net *net, uint32_t peer, int timeout_ms, double *rtt_us) {
    uint64_t deadline = hs__now_us() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000;
    uv_mutex_lock(&net->mu);
    hs__peer *p = hs__peer_find(net, peer);
    if (!p || peer == net->self) {
        uv_mutex_unlock(&net->mu);
        return hs__err(HS_EINVAL, "ping peer %u: not a member", peer);
    }
    p->pong = 0;
    int err = post(net, HS__CMD_PING, peer, 0, NULL, 1);
    while (err == 0 && !p->pong) {
        uint64_t now = hs__now_us();
        if (now >= deadline) {
            err = hs__err(HS_ETIMEDOUT, "ping peer %u: no answer within %d ms", peer, timeout_ms);
            break;
        }
        uv_cond_timedwait(&net->cv, &net->mu, (deadline - now) * 1000);
    }
    if (err == 0)
        *rtt_us = p->rtt_us;
    uv_mutex_unlock(&net->mu);
    return err;
}

int hs_net_leave(hs_net *net, int timeout_ms) { return hs_net_leave_diverged(net, timeout_ms, NULL); }

int hs_net_nbr_diverged(hs_net *net, uint32_t *peer, char *why, size_t cap) {
    uv_mutex_lock(&net->mu);
    int d = net->nbr_diverged;
    if (d) {
        if (peer)
            *peer = net->nbr_diverged_id;
        if (why && cap)
            snprintf(why, cap, "%s", net->nbr_diverged_why);
    }
    uv_mutex_unlock(&net->mu);
    return d;
}

int hs_net_leave_diverged(hs_net *net, int timeout_ms, const char *why) {
    if (timeout_ms <= 0)
        timeout_ms = 1000;
    uint64_t deadline = hs__now_us() + (uint64_t)timeout_ms * 1000 + 1000000;
    uv_mutex_lock(&net->mu);
    if (net->stopping || net->leaving) {
        uv_mutex_unlock(&net->mu);
        return 0;
    }
    if (why) {
        net->bye_code = HS__BYE_DIVERGED;
        snprintf(net->bye_why, sizeof(net->bye_why), "%s", why);
    }
    net->leaving = 1;
    int err = post(net, HS__CMD_LEAVE, 0, (uint64_t)timeout_ms, NULL, 1);
    while (err == 0 && !net->left) {
        uint64_t now = hs__now_us();
        if (now >= deadline)
            break;
        uv_cond_timedwait(&net->cv, &net->mu, (deadline - now) * 1000);
    }
    if (err == 0 && net->left != 1)
        err = hs__err(HS_ETIMEDOUT, "leave: queues not flushed within %d ms", timeout_ms);
    uv_mutex_unlock(&net->mu);
    return err;
}

void hs_net_free(hs_net *net) {
    if (!net)
        return;
    if (net->thread_started) {
        uv_mutex_lock(&net->mu);
        net->stopping = 1;
        hs__net_wake(net);
        uv_mutex_unlock(&net->mu);
        post(net, HS__CMD_STOP, 0, 0, NULL, 0);
        uv_thread_join(&net->thread);
        /* Close callbacks of handles closed last run here. */
        uv_run(&net->loop, UV_RUN_DEFAULT);
    } else if (net->loop_init) {
        uv_mutex_lock(&net->mu);
        net->stopping = 1;
        uv_mutex_unlock(&net->mu);
        do_stop(net);
        uv_run(&net->loop, UV_RUN_DEFAULT);
    }
    if (net->loop_init && uv_loop_close(&net->loop) != 0)
        HS_LOGW("event loop closed with handles open");
    while (net->cmd_head) {
        hs__cmd *c = net->cmd_head;
        net->cmd_head = c->next;
        hs_buf_unref(c->buf);
        free(c);
    }
    for (int i = 0; i < net->n_mail; i++)
        hs_buf_unref(net->mail[i].buf);
    free(net->mail);
    hs_buf_unref(net->snap);
    free(net->joins);
    free(net->removals);
    free(net->pjoins);
    free(net->view_in);
    free(net->view_out);
    hs__tls_ctx_free(net->tls);
    hs_topo_free(net->topo_file);
    free(net->s_listen);
    free(net->s_advertise);
    free(net->s_bootstrap);
    free(net->s_secret);
    free(net->s_ca);
    free(net->s_cert);
    free(net->s_key);
    free(net->s_run);
    free(net->s_sig);
    free(net->s_algo);
    free(net->s_codec);
    free(net->s_topo);
    free(net->s_app_config);
    free(net->link_emu);
    for (int i = 0; i < net->n_sched; i++) {
        hs__members_clear(&net->sched[i]->m);
        hs_topo_free(net->sched[i]->topo);
        free(net->sched[i]->needs);
        free(net->sched[i]);
    }
    free(net->sched);
    for (int i = 0; i < net->n_peers; i++) {
        hs__fq_clear(&net->peers[i]->outq);
        hs__rs_clear(&net->peers[i]->rs);
        free(net->peers[i]);
    }
    free(net->peers);
    uv_cond_destroy(&net->cv);
    uv_mutex_destroy(&net->mu);
    free(net);
}
