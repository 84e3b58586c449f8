/* Joining a running job, on both sides.
 *
 * Joiner: dials the bootstrap address (retrying while nobody listens or connections close
 * without a reason, until join_timeout),
 * says HELLO with no id, sends JOIN (a random nonce and its listen address) and waits for
 * WELCOME: its id, the member list that adds it (and so its first round), the topology, the
 * application's config and a snapshot. The connection then serves as an ordinary one.
 *
 * Member: a JOIN goes to the sequencer (JOIN_FWD, unless this member is the sequencer), which
 * answers JOIN_ACK with the id and version; once that version is here and the application has
 * published a snapshot at least as new as the request (or snapshot_timeout passed), the member
 * sends WELCOME. Repeated requests carry the same nonce and get the same id.
 *
 * Threading: loop thread. The joiner's outcome goes to hs_net_start under net->mu. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error_internal.h"
#include "core/rng.h"
#include "net/runtime.h"

#define FORWARD_RETRY_US 1000000
#define JOIN_TTL 4

void hs__bs_fail(hs_net *net, int err, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    uv_mutex_lock(&net->mu);
    if (net->join_state != HS__JOIN_DONE && net->join_state != HS__JOIN_FAILED) {
        net->join_state = HS__JOIN_FAILED;
        net->join_err = err;
        snprintf(net->join_msg, sizeof(net->join_msg), "%s", msg);
        hs__net_wake(net);
        HS_LOGE("%s", msg);
    }
    uv_mutex_unlock(&net->mu);
    if (net->join_conn) {
        hs__conn *c = net->join_conn;
        net->join_conn = NULL;
        net->tr.ops->close(c, HS_ECANCELED, 0, HS_LOG_DEBUG, "join failed");
    }
}

static int join_state(hs_net *net) {
    uv_mutex_lock(&net->mu);
    int s = net->join_state;
    uv_mutex_unlock(&net->mu);
    return s;
}

/* ------------------------------------------------------------------ joiner */

/* What a join that timed out saw: closes during the handshake without a reason. */
static const char *handshake_hint(const hs_net *net, char *hint, size_t cap) {
    hint[0] = '\0';
    if (!net->join_handshake_fails)
        return hint;
    snprintf(hint, cap,
             "; it closed the connection during the handshake %d times without a reason: is it "
             "at its limit of unauthenticated connections from this address "
             "(--max-pending-per-addr), or does it use another security mode?",
             net->join_handshake_fails);
    return hint;
}

static void join_dial(hs_net *net) {
    uint64_t now = hs__now_us();
    if (!net->join_nonce) {
        /* Unique per attempt: the run seed alone is shared by every peer of a test. */
        hs_rng r;
        hs__rng_init(&r, net->cfg.seed ^ uv_hrtime(), HS_RNG_NET, (uint32_t)getpid(),
                    (uint32_t)net->tr.listen_port);
        while (!net->join_nonce)
            net->join_nonce = hs__rng_u64(&r);
        if (!net->join_deadline_us)
            net->join_deadline_us = now + (uint64_t)net->cfg.join_timeout_ms * 1000;
        net->join_backoff_ms = 50;
    }
    hs__conn *c;
    if (net->tr.ops->dial_sa(&net->tr, (struct sockaddr *)&net->bootstrap_sa, HS__ID_NONE, &c) <
        0) {
        net->join_next_dial_us = now + (uint64_t)net->join_backoff_ms * 1000;
        return;
    }
    c->bootstrap = 1;
    net->join_conn = c;
}

void hs__bs_join_start(hs_net *net) {
    hs__conn *c = net->join_conn;
    if (join_state(net) != HS__JOIN_DIALING)
        return;
    if (!c) {
        join_dial(net);
        return;
    }
    if (c->state != HS__C_OPEN)
        return;
    /* Open: send JOIN with the address the others will dial. */
    if (net->tr.listen_wildcard && !net->s_advertise) {
        char ip[64];
        if (net->tr.ops->local_ip(c, ip, sizeof(ip)) == 0)
            snprintf(net->advertise, sizeof(net->advertise), strchr(ip, ':') ? "[%s]:%d" : "%s:%d",
                     ip, net->tr.listen_port);
    }
    hs__join j;
    memset(&j, 0, sizeof(j));
    j.nonce = net->join_nonce;
    j.via = HS__ID_NONE;
    j.id = HS__ID_NONE;
    snprintf(j.addr, sizeof(j.addr), "%s", net->advertise);
    hs_buf *b;
    if (hs_buf_new(&b, 64) < 0)
        return;
    /* The frame's round: a resumed joiner's checkpoint round (hs_net_config.resume_round). */
    if (hs__wire_join_encode(b, &j) == 0 &&
        hs__send_conn(c, HS__T_JOIN, net->cfg.resume_round, b) == 0) {
        uv_mutex_lock(&net->mu);
        net->join_state = HS__JOIN_WAITING;
        uv_mutex_unlock(&net->mu);
        HS_LOGI("joining through %s as %s", c->remote, net->advertise);
    }
    hs_buf_unref(b);
}

void hs__bs_join_conn_failed(hs_net *net, hs__conn *c, int err, const char *why) {
    (void)err;
    if (net->join_conn != c)
        return;
    net->join_conn = NULL;
    int s = join_state(net);
    if (s == HS__JOIN_DONE || s == HS__JOIN_FAILED)
        return;
    uint64_t now = hs__now_us();
    /* A close during the handshake without a reason is no verdict: a member at its limit of
     * unauthenticated connections (strangers may hold them all, --max-pending-per-addr) closes
     * at once, and so does one still starting. A peer that will not have us says so (REFUSE,
     * or a TLS alert: hs__bs_on_refused), so only the deadline ends this. */
    if (c->connected && c->state_before_close < HS__C_OPEN && !c->refused_retry)
        net->join_handshake_fails++;
    if (now >= net->join_deadline_us) {
        char hint[400];
        hs__bs_fail(net, HS_ETIMEDOUT, "join through %s: %s (gave up after %d ms)%s",
                    net->s_bootstrap, why, net->cfg.join_timeout_ms,
                    handshake_hint(net, hint, sizeof(hint)));
        return;
    }
    /* Nobody listening yet, or the connection broke: try again (a repeated JOIN is safe). */
    uv_mutex_lock(&net->mu);
    net->join_state = HS__JOIN_DIALING;
    uv_mutex_unlock(&net->mu);
    net->join_next_dial_us = now + (uint64_t)net->join_backoff_ms * 1000;
    net->join_backoff_ms = net->join_backoff_ms * 2 > 1000 ? 1000 : net->join_backoff_ms * 2;
    HS_LOGD("join through %s: %s; retrying", net->s_bootstrap, why);
}

void hs__bs_on_refused(hs_net *net, hs__conn *c, uint32_t code, const char *text) {
    if (!c->bootstrap || net->join_conn != c)
        return;
    if (code == HS__REFUSE_RETRY) {
        c->refused_retry = 1; /* the close that follows retries, whatever the handshake count */
        return;
    }
    hs__bs_fail(net, code == HS__REFUSE_MISMATCH ? HS_EMISMATCH : HS_EAUTH, "refused by %s: %s",
                net->s_bootstrap, text);
}

void hs__bs_join_tick(hs_net *net, uint64_t now) {
    int s = join_state(net);
    if (s == HS__JOIN_DIALING || s == HS__JOIN_WAITING) {
        if (net->join_deadline_us && now >= net->join_deadline_us) {
            char hint[400];
            hs__bs_fail(net, HS_ETIMEDOUT, "join through %s: no WELCOME within %d ms%s",
                        net->s_bootstrap, net->cfg.join_timeout_ms,
                        handshake_hint(net, hint, sizeof(hint)));
            return;
        }
        if (s == HS__JOIN_DIALING && !net->join_conn && now >= net->join_next_dial_us)
            join_dial(net);
    }
    /* Member side: joins whose forward got no answer (the sequencer changed) go again. */
    for (int i = 0; i < net->n_pjoins; i++) {
        hs__pending_join *pj = &net->pjoins[i];
        if (pj->done || pj->id != HS__ID_NONE || now - pj->t_forward_us < FORWARD_RETRY_US)
            continue;
        pj->t_forward_us = now;
        if (net->mb.is_sequencer) {
            hs__mb_request_join(&net->mb, pj->nonce, net->self, pj->addr, pj->resume_round);
            continue;
        }
        hs__peer *seq = hs__peer_find(net, net->mb.sequencer);
        hs__join j;
        memset(&j, 0, sizeof(j));
        j.nonce = pj->nonce;
        j.via = net->self;
        j.id = HS__ID_NONE;
        j.ttl = JOIN_TTL;
        snprintf(j.addr, sizeof(j.addr), "%s", pj->addr);
        hs_buf *b;
        if (seq && hs_buf_new(&b, 64) == 0) {
            if (hs__wire_join_encode(b, &j) == 0)
                hs__send_peer(net, seq, HS__T_JOIN_FWD, hs__net_round(net), b);
            hs_buf_unref(b);
        }
    }
    hs__bs_try_welcomes(net);
}

int hs__bs_on_welcome(hs_net *net, hs__conn *c, hs_buf *pay) {
    if (!c->bootstrap || net->join_conn != c || join_state(net) != HS__JOIN_WAITING)
        return hs__err(HS_EPROTO, "WELCOME that nobody asked for");
    hs__welcome w;
    int err = hs__wire_welcome_decode(pay->data, pay->len, &w);
    if (err < 0)
        return err;
    char *spec = strdup(w.topo_spec);
    if (!spec) {
        hs__members_clear(&w.members);
        return hs__err(HS_ENOMEM, "WELCOME: out of memory");
    }
    free(net->s_topo);
    net->s_topo = spec;
    net->cfg.topo_spec = spec;
    net->cfg.topo_seed = w.topo_seed;
    if (hs__net_topo_file(net) < 0) {
        char msg[600];
        snprintf(msg, sizeof(msg), "%s", hs_error_message());
        hs__members_clear(&w.members);
        hs__bs_fail(net, HS_EINVAL, "the run's topology %s: %s", spec, msg);
        return 0;
    }
    uv_mutex_lock(&net->mu);
    net->self = w.id;
    uv_mutex_unlock(&net->mu);
    /* Links made before the id was known draw from the right stream from now on. */
    for (int i = 0; i < net->mb.n_peers; i++)
        hs__net_link_init(net, hs__peer_of(net->mb.peers[i]));
    err = hs__mb_accept(&net->mb, &w.members, "WELCOME");
    if (err < 0) {
        hs__members_clear(&w.members);
        return err;
    }
    /* Fill the application's welcome. */
    uv_mutex_lock(&net->mu);
    hs_net_welcome *out = net->welcome;
    if (out) {
        out->self = w.id;
        out->round = w.round;
        out->join_round = w.join_round;
        out->version = w.members.version;
        out->topo_seed = w.topo_seed;
        out->snapshot_round = w.snap_round;
        out->members = calloc(w.members.n, sizeof(*out->members));
        out->topo_spec = strdup(w.topo_spec);
        if (w.config_len && (out->app_config = malloc(w.config_len + 1))) {
            memcpy(out->app_config, w.config, w.config_len);
            out->app_config[w.config_len] = '\0';
        }
        /* The snapshot is the payload's tail: moved to its front, the payload becomes it
         * (no second copy of a model-sized buffer). */
        if (w.snap_len) {
            memmove(pay->data, w.snap, (size_t)w.snap_len);
            pay->len = (size_t)w.snap_len;
            out->snapshot = hs_buf_ref(pay);
        }
        if (out->members) {
            out->n_members = (int)w.members.n;
            for (uint32_t i = 0; i < w.members.n; i++) {
                out->members[i].id = w.members.m[i].id;
                snprintf(out->members[i].addr, sizeof(out->members[i].addr), "%s",
                         w.members.m[i].addr);
            }
        }
        if (!out->members || !out->topo_spec || (w.config_len && !out->app_config) ||
            (w.snap_len && !out->snapshot)) {
            uv_mutex_unlock(&net->mu);
            hs__members_clear(&w.members);
            hs__bs_fail(net, HS_ENOMEM, "WELCOME: out of memory");
            return 0;
        }
    }
    net->join_state = HS__JOIN_DONE;
    hs__net_wake(net);
    uv_mutex_unlock(&net->mu);
    HS_LOGI("joined as peer %u through %s: %u members, first round %llu, snapshot of %llu "
            "bytes from round %llu",
            w.id, c->remote, w.members.n, (unsigned long long)w.join_round,
            (unsigned long long)w.snap_len,
            (unsigned long long)w.snap_round);
    hs__members_clear(&w.members);
    /* The bootstrap connection is an ordinary one from now on. */
    net->join_conn = NULL;
    c->bootstrap = 0;
    net->tr.ops->set_limits(c);
    hs__net_attach(net, c);
    return 0;
}

/* ------------------------------------------------------------------ member side */

/* Join requests with a connection and no answer yet, for hs_net_welcomes_pending. */
static void count_open(hs_net *net) {
    int k = 0;
    for (int i = 0; i < net->n_pjoins; i++)
        k += !net->pjoins[i].done && net->pjoins[i].conn;
    __atomic_store_n(&net->welcomes_open, k, __ATOMIC_RELEASE);
}

static hs__pending_join *pjoin_by_nonce(hs_net *net, uint64_t nonce) {
    for (int i = 0; i < net->n_pjoins; i++)
        if (net->pjoins[i].nonce == nonce)
            return &net->pjoins[i];
    return NULL;
}

static void forward(hs_net *net, const hs__join *in, uint8_t ttl) {
    hs__peer *seq = hs__peer_find(net, net->mb.sequencer);
    if (!seq)
        return;
    hs__join j = *in;
    j.ttl = ttl;
    hs_buf *b;
    if (hs_buf_new(&b, 64) < 0)
        return;
    if (hs__wire_join_encode(b, &j) == 0)
        hs__send_peer(net, seq, HS__T_JOIN_FWD, hs__net_round(net), b);
    hs_buf_unref(b);
}

void hs__bs_on_join(hs_net *net, hs__conn *c, const hs__join *j, uint64_t resume_round) {
    char host[HS__ADDR_MAX + 1];
    int port;
    if (hs__wire_addr_split(j->addr, host, sizeof(host), &port) < 0 || port == 0) {
        hs__send_reason(net, NULL, c, HS__T_REFUSE, HS__REFUSE_PROTO,
                        "JOIN without a listen address (HOST:PORT)");
        net->tr.ops->close(c, HS_EPROTO, 0, HS_LOG_WARN, "JOIN with listen address '%s'", j->addr);
        return;
    }
    c->joiner = HS__JOINER_ASKED; /* its deadline is now the admission's (hs__conn_tick) */
    hs__pending_join *pj = pjoin_by_nonce(net, j->nonce);
    if (!pj) {
        for (int i = 0; i < net->n_pjoins; i++)
            if (net->pjoins[i].conn == c) {
                net->tr.ops->close(c, HS_EPROTO, 1, HS_LOG_WARN, "second JOIN on one connection");
                return;
            }
        /* Forget finished joins before growing. */
        int k = 0;
        for (int i = 0; i < net->n_pjoins; i++)
            if (!net->pjoins[i].done)
                net->pjoins[k++] = net->pjoins[i];
        net->n_pjoins = k;
        if (net->n_pjoins == net->cap_pjoins) {
            int cap = net->cap_pjoins ? 2 * net->cap_pjoins : 8;
            hs__pending_join *np = realloc(net->pjoins, (size_t)cap * sizeof(*np));
            if (!np)
                return;
            net->pjoins = np;
            net->cap_pjoins = cap;
        }
        pj = &net->pjoins[net->n_pjoins++];
        memset(pj, 0, sizeof(*pj));
        pj->nonce = j->nonce;
        pj->id = HS__ID_NONE;
    }
    pj->conn = c;
    pj->done = 0;
    snprintf(pj->addr, sizeof(pj->addr), "%s", j->addr);
    pj->t_request_us = pj->t_forward_us = hs__now_us();
    pj->round_at_request = hs__net_round(net);
    pj->resume_round = resume_round;
    HS_LOGI("join request from %s (listening at %s)", c->remote, j->addr);
    count_open(net);
    /* A first peer listening on a wildcard address learns here what the joiners dial. */
    if (net->tr.listen_wildcard && !net->s_advertise &&
        (!strncmp(net->advertise, "0.0.0.0:", 8) || !strncmp(net->advertise, "[::]:", 5))) {
        char ip[64];
        if (net->tr.ops->local_ip(c, ip, sizeof(ip)) == 0) {
            snprintf(net->advertise, sizeof(net->advertise), strchr(ip, ':') ? "[%s]:%d" : "%s:%d",
                     ip, net->tr.listen_port);
            HS_LOGI("advertising %s", net->advertise);
        }
    }
    if (pj->id != HS__ID_NONE) {
        hs__bs_try_welcomes(net);
        return;
    }
    if (net->mb.is_sequencer) {
        hs__mb_request_join(&net->mb, j->nonce, net->self, j->addr, resume_round);
    } else {
        hs__join f = *j;
        f.via = net->self;
        forward(net, &f, JOIN_TTL);
    }
}

void hs__bs_on_join_fwd(hs_net *net, hs__conn *c, const hs__join *j) {
    (void)c;
    if (net->mb.is_sequencer)
        hs__mb_request_join(&net->mb, j->nonce, j->via, j->addr, 0);
    else if (j->ttl > 0)
        forward(net, j, (uint8_t)(j->ttl - 1));
}

void hs__bs_on_join_ack(hs_net *net, const hs__join *ack) {
    hs__pending_join *pj = pjoin_by_nonce(net, ack->nonce);
    if (!pj || pj->done)
        return;
    if (ack->id == HS__ID_NONE) {
        pj->done = 1;
        count_open(net);
        if (pj->conn) {
            hs__send_reason(net, NULL, pj->conn, HS__T_REFUSE, HS__REFUSE_LIMIT, ack->addr);
            net->tr.ops->close(pj->conn, HS_EAUTH, 0, HS_LOG_WARN, "join refused: %s", ack->addr);
        }
        return;
    }
    pj->id = ack->id;
    pj->mver = ack->mver;
    hs__peer *p = hs__peer_get(net, pj->id, pj->addr);
    if (p && pj->conn)
        p->m.pending_conn = pj->conn;
    hs__bs_try_welcomes(net);
}

static hs__mview *version(hs_net *net, uint64_t v) {
    for (int i = net->mb.n_sched - 1; i >= 0; i--)
        if (net->mb.sched[i]->m.version == v)
            return net->mb.sched[i];
    return NULL;
}

static void try_welcome(hs_net *net, hs__pending_join *pj) {
    if (pj->done || !pj->conn || pj->id == HS__ID_NONE)
        return;
    hs__mview *mv = version(net, pj->mver);
    if (!mv)
        return; /* the version that adds it is not here yet */
    hs__conn *c = pj->conn;
    uint64_t now = hs__now_us();
    int late = now - pj->t_request_us > (uint64_t)net->cfg.snapshot_timeout_ms * 1000;
    uv_mutex_lock(&net->mu);
    /* An application that never published a snapshot does not use them: no waiting. */
    int fresh = !net->snap_ever ||
                (net->snap && !net->snap_stale && net->snap_round >= pj->round_at_request);
    if (!fresh && !late) {
        net->snap_wanted = 1;
        uv_mutex_unlock(&net->mu);
        return;
    }
    hs_buf *snap = net->snap ? hs_buf_ref(net->snap) : NULL;
    hs_buf *head = snap && net->snap_head ? hs_buf_ref(net->snap_head) : NULL;
    uint64_t snap_round = net->snap_round;
    uint64_t round = net->cur_round;
    uv_mutex_unlock(&net->mu);
    if (!fresh)
        HS_LOGW("no snapshot newer than round %llu within %d ms: welcoming peer %u with %s",
                (unsigned long long)pj->round_at_request, net->cfg.snapshot_timeout_ms, pj->id,
                snap ? "an older one" : "none");
    hs__welcome w;
    memset(&w, 0, sizeof(w));
    w.id = pj->id;
    w.round = round;
    w.join_round = mv->m.eff_round;
    snprintf(w.topo_spec, sizeof(w.topo_spec), "%s", net->s_topo);
    w.topo_seed = net->cfg.topo_seed;
    w.members = mv->m;
    w.config = (const uint8_t *)net->s_app_config;
    w.config_len = net->s_app_config ? (uint32_t)strlen(net->s_app_config) : 0;
    w.snap_round = snap ? snap_round : 0;
    w.snap = snap ? snap->data : NULL;
    w.snap_len = snap ? (head ? head->len : 0) + snap->len : 0;
    hs_buf *b;
    int err = hs_buf_new(&b, 4096 + w.config_len + mv->m.n * 64u);
    if (err == 0) {
        /* The snapshot goes from the published buffer itself, after the other fields. */
        if ((err = hs__wire_welcome_encode_head(b, &w)) == 0 && head)
            err = hs_buf_append(b, head->data, head->len);
        if (err == 0)
            err = snap ? hs__send_conn_tail(c, HS__T_WELCOME, round, b, snap)
                       : hs__send_conn(c, HS__T_WELCOME, round, b);
        hs_buf_unref(b);
    }
    hs_buf_unref(snap);
    hs_buf_unref(head);
    pj->done = 1;
    if (err < 0) {
        net->tr.ops->close(c, err, 0, HS_LOG_ERROR, "WELCOME for peer %u: %s", pj->id,
                       hs_error_message());
        return;
    }
    HS_LOGI("welcomed peer %u (%s): first round %llu, snapshot of %llu bytes from round %llu",
            pj->id, pj->addr, (unsigned long long)w.join_round, (unsigned long long)w.snap_len,
            (unsigned long long)w.snap_round);
    /* The joiner's connection is its ordinary connection from now on. */
    hs__peer *p = hs__peer_get(net, pj->id, pj->addr);
    c->joiner_id = pj->id;
    c->peer_id = pj->id;
    c->joiner = 0;
    net->tr.ops->set_limits(c);
    if (p) {
        p->m.pending_conn = NULL;
        hs__net_attach(net, c);
    }
}

void hs__bs_try_welcomes(hs_net *net) {
    for (int i = 0; i < net->n_pjoins; i++)
        try_welcome(net, &net->pjoins[i]);
    count_open(net);
}

void hs__bs_conn_gone(hs_net *net, hs__conn *c) {
    for (int i = 0; i < net->n_pjoins; i++)
        if (net->pjoins[i].conn == c) {
            net->pjoins[i].conn = NULL;
            net->pjoins[i].done = 1;
            hs__peer *p =
                net->pjoins[i].id != HS__ID_NONE ? hs__peer_find(net, net->pjoins[i].id) : NULL;
            if (p && p->m.pending_conn == c)
                p->m.pending_conn = NULL;
        }
    count_open(net);
}
