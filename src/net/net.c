/* The peer runtime's core, the top of the net/ stack: lifecycle, the loop thread and its tick,
 * the commands from the application threads (send, ping, leave, join, stop), leaving, and the
 * public API. The mailbox and hs_exchange are mailbox.c; where the layers below meet,
 * dispatch.c; the configuration, config.c.
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
#include "net/runtime.h"
#include "net/resend.h"

#define TICK_MS_MAX 25
#define WRONG_SECRET_GRACE_US 2000000

/* ------------------------------------------------------------------ loop thread */

static void close_cb_count(uv_handle_t *h) { (void)h; }

static void do_stop(hs_net *net) {
    hs__conn *next;
    for (hs__conn *c = net->tr.conns; c; c = next) {
        next = c->next;
        net->tr.ops->close(c, HS_ECANCELED, 0, HS_LOG_DEBUG, "stopping");
    }
    /* Connections still flushing are cut now: nothing waits on a stopped peer. */
    for (hs__conn *c = net->tr.conns; c; c = c->next)
        net->tr.ops->abort(c);
    net->tr.ops->close_listener(&net->tr);
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
        for (hs__conn *c = net->tr.conns; c && !busy; c = c->next)
            if (c->state == HS__C_OPEN && !net->tr.ops->flushed(c))
                busy = c;
        if (busy && now < net->leave_deadline_us)
            return;
        if (busy)
            HS_LOGW("leave: %s still has %zu bytes queued and %d writes pending; closing anyway",
                    busy->remote, busy->ctlq.bytes + (busy->peer ? busy->peer->outq.bytes : 0),
                    busy->nwrites);
        net->leave_closing = busy ? -1 : 1;
        /* Only unsent DATA is a loss to the job: membership reports (a SUSPECT for a member
         * that left, queued for a successor sequencer not connected yet at the end of a job)
         * concern a job this peer is leaving. */
        for (int i = 0; i < net->mb.n_peers; i++) {
            hs__peer *p = hs__peer_of(net->mb.peers[i]);
            size_t data = 0;
            for (const hs__frame *f = p->outq.head; f; f = f->next)
                data += f->type == HS__T_DATA;
            if (p->outq.head)
                hs__log(data ? HS_LOG_WARN : HS_LOG_DEBUG,
                       "leave: %zu frames (%zu of data) for peer %u not sent (connection %s)",
                       p->outq.n, data, p->m.id,
                       !p->m.conn                       ? "none"
                       : p->m.conn->state == HS__C_OPEN ? "open"
                                                        : "not open");
        }
        /* Close each connection the polite way (shutdown, then wait for the other side's end
         * of stream): a socket closed with unread input is reset, and a reset can destroy the
         * last frames we sent before they are read. */
        hs__conn *next;
        for (hs__conn *c = net->tr.conns; c; c = next) {
            next = c->next;
            net->tr.ops->close(c, HS_ECANCELED, 0, HS_LOG_DEBUG, "this peer left the run");
        }
        /* The rest of the caller's timeout (at least half a second) for the ends of stream. */
        if (net->leave_deadline_us < now + 500000)
            net->leave_deadline_us = now + 500000;
    }
    int open = 0;
    for (hs__conn *c = net->tr.conns; c; c = c->next)
        open += !net->tr.ops->closed(c);
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
    net->tr.ops->close_listener(&net->tr);
    HS_LOGI("leaving the run");
    uv_mutex_lock(&net->mu);
    uint32_t code = net->bye_code ? net->bye_code : HS__BYE_LEAVE;
    char why[HS__REASON_MAX + 1];
    snprintf(why, sizeof(why), "%s", net->bye_why[0] ? net->bye_why : "leaving");
    uv_mutex_unlock(&net->mu);
    for (int i = 0; i < net->mb.n_peers; i++) {
        hs__peer *p = hs__peer_of(net->mb.peers[i]);
        if (p->m.conn && p->m.conn->state == HS__C_OPEN)
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
    net->tr.ops->tick(&net->tr, now);
    if (leaving) {
        /* Only once the LEAVE command ran (it may still be queued behind the last sends):
         * before, there is no deadline and nothing was flushed. */
        if (net->leave_started)
            leave_step(net, now);
        return;
    }
    hs__bs_join_tick(net, now);
    hs__mb_tick(&net->mb, now);
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
            if (p && !p->m.dead)
                hs__rs_keep(&p->rs, cmd->round, cmd->buf); /* lost or not: RESEND may ask */
            if (p && !p->m.dead && !hs__link_lose(&p->link))
                sent = hs__send_peer(net, p, HS__T_DATA, cmd->round, cmd->buf) == 0;
            else if (p && !p->m.dead) {
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
            if (p && p->m.conn && p->m.conn->state == HS__C_OPEN) {
                hs__heartbeat hb = {HS__HB_PING, ++p->ping_token, hs__net_round(net), 0, 0};
                hs_buf *b;
                if (hs_buf_new(&b, HS__HB_LEN) == 0) {
                    if (hs__wire_heartbeat_encode(b, &hb) == 0) {
                        p->ping_sent_ns = uv_hrtime();
                        hs__send_conn(p->m.conn, HS__T_HEARTBEAT, hb.round, b);
                    }
                    hs_buf_unref(b);
                }
            }
            break;
        case HS__CMD_RESEND:
            if (p && !p->m.dead)
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
            /* Every connection of the peer: the one held may not be the one in use for it
             * now (both sides dialled; a joiner's connection), and would stay held. */
            for (hs__conn *c = net->tr.conns, *next; c; c = next) {
                next = c->next;
                hs__peer *q = c->peer;
                if (!q || !c->reading_paused)
                    continue;
                uv_mutex_lock(&net->mu);
                int still = q->rx_paused;
                uv_mutex_unlock(&net->mu);
                if (!still)
                    net->tr.ops->read_pause(c, 0);
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

/* ------------------------------------------------------------------ public API */

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
    net->ex.ops = &hs__net_exchange_ops;
    net->ex.impl = net;
    if (welcome)
        memset(welcome, 0, sizeof(*welcome));
    if ((err = hs__net_copy_config(net, cfg)) < 0)
        goto fail;
    net->tr.ops = &hs__tcp;
    net->tr.ev = &hs__net_events;
    net->tr.owner = net;
    net->tr.loop = &net->loop;
    net->tr.cfg = &net->cfg;
    net->tr.st = &net->st;
    net->tr.mu = &net->mu;
    net->tr.self = &net->self;
    net->tr.stream_data = net->cfg.data_in_pieces != 0;
    net->tr.listen_addr = net->s_listen;
    net->mb.env = &hs__net_mb_env;
    net->mb.ctx = net;
    net->mb.cfg = &net->cfg;
    net->mb.self = &net->self;
    net->mb.advertise = net->advertise;
    net->mb.topo_spec = net->s_topo;
    if ((err = hs__net_topo_file(net)) < 0)
        goto fail;
    if (net->cfg.tune_malloc) {
        mallopt(M_MMAP_THRESHOLD, 32 << 20);
        mallopt(M_TRIM_THRESHOLD, 512 << 20);
    }
    if (net->cfg.security == HS_NET_INSECURE) {
        HS_LOGW("--insecure: plain TCP, peers are neither authenticated nor encrypted");
    } else if ((err = hs__tls_ctx_new(&net->tr.tls, &net->cfg)) < 0) {
        goto fail;
    }
    if (net->s_bootstrap && (err = net->tr.ops->resolve(net->s_bootstrap, &net->bootstrap_sa)) < 0)
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
    if ((err = net->tr.ops->listen(&net->tr)) < 0)
        goto fail;
    char host[HS__ADDR_MAX + 1];
    int port;
    hs__wire_addr_split(net->s_listen, host, sizeof(host), &port);
    if (net->s_advertise)
        snprintf(net->advertise, sizeof(net->advertise), "%s", net->s_advertise);
    else if (strchr(host, ':'))
        snprintf(net->advertise, sizeof(net->advertise), "[%.200s]:%d", host, net->tr.listen_port);
    else
        snprintf(net->advertise, sizeof(net->advertise), "%.200s:%d", host, net->tr.listen_port);
    uint64_t tick = (uint64_t)net->cfg.heartbeat_ms / 2;
    if (tick > TICK_MS_MAX)
        tick = TICK_MS_MAX;
    if (tick < 1)
        tick = 1;
    uv_timer_start(&net->tick, on_tick, tick, tick);
    /* The first tick's gap counts from here: a process stopped before it (just after joining)
     * slept as much as one stopped later, and is judged so (hs__conn_tick, hs__mb_tick). */
    net->tr.last_tick_us = net->mb.last_tick_us = hs__now_us();
    if (!net->s_bootstrap) {
        uv_mutex_lock(&net->mu);
        net->self = 0;
        uv_mutex_unlock(&net->mu);
    }
    if (!net->s_bootstrap && (err = hs__mb_init_first(&net->mb)) < 0)
        goto fail;
    /* Read before the loop thread starts: from then on a joiner may commit a newer list (and
     * move the schedule) at any moment. */
    uint64_t first_version = net->s_bootstrap ? 0 : hs__mb_newest(&net->mb)->m.version;
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
        if ((err = hs__net_post(net, HS__CMD_JOIN, 0, 0, NULL, 0)) == 0)
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

int hs_net_listen_port(const hs_net *net) { return net->tr.listen_port; }

int hs_net_publish_snapshot(hs_net *net, uint64_t round, hs_buf *snapshot) {
    return hs_net_publish_snapshot_parts(net, round, NULL, snapshot);
}

int hs_net_publish_snapshot_parts(hs_net *net, uint64_t round, hs_buf *head, hs_buf *body) {
    if (!body)
        return hs__err(HS_EINVAL, "publish snapshot: no buffer");
    size_t len = (head ? head->len : 0) + body->len;
    if (len > net->cfg.max_message)
        return hs__err(HS_EINVAL, "snapshot of %zu bytes is over the max message of %llu",
                       len, (unsigned long long)net->cfg.max_message);
    uv_mutex_lock(&net->mu);
    hs_buf_unref(net->snap);
    hs_buf_unref(net->snap_head);
    net->snap = hs_buf_ref(body);
    net->snap_head = head ? hs_buf_ref(head) : NULL;
    net->snap_round = round;
    net->snap_ever = 1;
    net->snap_stale = 0;
    /* The application is at `round`: membership changes take effect after it (a peer resumed
     * alone at a late round must not welcome joiners into rounds it has left behind). */
    if (round > net->cur_round)
        __atomic_store_n(&net->cur_round, round, __ATOMIC_RELAXED);
    int wanted = net->snap_wanted;
    net->snap_wanted = 0;
    uv_mutex_unlock(&net->mu);
    if (wanted)
        hs__net_post(net, HS__CMD_KICK, 0, 0, NULL, 0);
    return 0;
}

int hs_net_withdraw_snapshot(hs_net *net, uint64_t round, hs_buf *fallback) {
    if (!fallback) return hs__err(HS_EINVAL, "withdraw snapshot: no fallback");
    uv_mutex_lock(&net->mu);
    hs_buf_unref(net->snap);
    hs_buf_unref(net->snap_head);
    net->snap = hs_buf_ref(fallback);
    net->snap_head = NULL;
    net->snap_stale = 1;
    net->snap_ever = 1;
    /* As a publication at `round`: membership changes take effect after it. */
    if (round > net->cur_round)
        __atomic_store_n(&net->cur_round, round, __ATOMIC_RELAXED);
    uv_mutex_unlock(&net->mu);
    return 0;
}

int hs_net_welcomes_pending(hs_net *net) {
    return __atomic_load_n(&net->welcomes_open, __ATOMIC_ACQUIRE);
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
    hs__mview *mv = net->mb.n_sched ? net->mb.sched[net->mb.n_sched - 1] : NULL;
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

/* Stranded (quorum.c): nobody can let this peer in again. Called under net->mu, released here. */
static int stranded_err(hs_net *net) {
    int err = hs__err(HS_ECONNRESET, "peer %u: %s", net->self, net->mb.stranded_why);
    uv_mutex_unlock(&net->mu);
    return err;
}

int hs_net_wait_members(hs_net *net, int n, int timeout_ms) {
    uint64_t deadline = hs__now_us() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000;
    uv_mutex_lock(&net->mu);
    for (;;) {
        hs__mview *mv = net->mb.n_sched ? net->mb.sched[net->mb.n_sched - 1] : NULL;
        if (mv && (int)mv->m.n >= n)
            break;
        uint64_t now = hs__now_us();
        int have = mv ? (int)mv->m.n : 0;
        /* A peer of this job with another secret will not get in by waiting: said at once,
         * after a moment for the others still on their way. */
        uint64_t auth_end = net->wrong_secret_us && have <= net->wrong_secret_n
                                ? net->wrong_secret_us + WRONG_SECRET_GRACE_US
                                : UINT64_MAX;
        if (now >= auth_end) {
            char msg[sizeof(net->wrong_secret_msg)];
            snprintf(msg, sizeof(msg), "%s", net->wrong_secret_msg);
            uv_mutex_unlock(&net->mu);
            return hs__err(HS_EAUTH,
                           "%d members, waiting for %d: a peer with another secret was refused "
                           "and nobody joined since (every peer needs the same --secret-file): %s",
                           have, n, msg);
        }
        if (net->mb.stranded)
            return stranded_err(net);
        if (now >= deadline || net->stopping || net->mb.removed) {
            uv_mutex_unlock(&net->mu);
            return hs__err(HS_ETIMEDOUT, "%d members after %d ms, waiting for %d", have, timeout_ms,
                           n);
        }
        uv_cond_timedwait(&net->cv, &net->mu,
                          ((auth_end < deadline ? auth_end : deadline) - now) * 1000);
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
    hs__mview *at = hs__mb_at(&net->mb, net->cur_round);
    out->version = at ? at->m.version : 0;
    out->n_members = net->mb.n_sched ? (int)net->mb.sched[net->mb.n_sched - 1]->m.n : 0;
    out->n_conns = net->n_open;
    uv_mutex_unlock(&net->mu);
}

int hs_net_in_job(hs_net *net, int wait_ms) {
    uint64_t end = hs__now_us() + (uint64_t)(wait_ms > 0 ? wait_ms : 0) * 1000;
    uv_mutex_lock(&net->mu);
    for (;;) {
        if (net->mb.removed) {
            int err = hs__err(HS_ECANCELED, "peer %u: %s", net->self, net->mb.removed_why);
            uv_mutex_unlock(&net->mu);
            return err;
        }
        if (net->mb.stranded)
            return stranded_err(net);
        uint64_t now = hs__now_us();
        if (net->mb.in_job || now >= end || net->stopping)
            break;
        uv_cond_timedwait(&net->cv, &net->mu, (end - now) * 1000);
    }
    int in = net->mb.in_job;
    uv_mutex_unlock(&net->mu);
    return in;
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
    int err = hs__net_post(net, HS__CMD_PING, peer, 0, NULL, 1);
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
    int err = hs__net_post(net, HS__CMD_LEAVE, 0, (uint64_t)timeout_ms, NULL, 1);
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
        hs__net_post(net, HS__CMD_STOP, 0, 0, NULL, 0);
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
    hs_buf_unref(net->snap_head);
    free(net->pjoins);
    free(net->view_in);
    free(net->view_out);
    hs__tls_ctx_free(net->tr.tls);
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
    for (int i = 0; i < net->mb.n_peers; i++) {
        hs__peer *p = hs__peer_of(net->mb.peers[i]);
        hs__fq_clear(&p->outq);
        hs__rs_clear(&p->rs);
        free(p);
    }
    hs__mb_free(&net->mb);
    uv_cond_destroy(&net->cv);
    uv_mutex_destroy(&net->mu);
    free(net);
}
