/* Quorum: whether this peer is in touch with a majority of the last agreed member list, what it
 * tells its peers about that, and how it learns that the job removed it.
 *
 * Agreed lists. The first list is agreed. A list the sequencer commits is agreed once a
 * majority of the agreed list before it holds it (members ack every list they accept, and
 * HELLO and heartbeats name the list held). The sequencer commits a change only while it
 * reaches a majority of the agreed list (membership.c asks hs__q_majority), and lists it
 * committed meanwhile do not lower that bar until they are agreed: a minority can commit a
 * list or two with connections that are not known dead yet, but never gets one agreed, so it
 * never shrinks its way to a "majority" of itself. Reaching a member means an authenticated
 * connection on which something arrived within 3/4 of the peer timeout: an idle link carries a
 * heartbeat at least every 3/8 of it, and in a partition every link falls silent at once, so
 * the stale ones stop voting before the first of them is declared dead. Members that left with
 * BYE do not vote (they agreed to go), nor do members whose port refused a connection (their
 * process is gone: it trains in no group). The sequencer names the agreed list in its QUORUM
 * heartbeats, so that a peer that takes over as sequencer starts from a recent one.
 *
 * Each peer is in one of three states (loop thread; hs_net_in_job reads the outcome):
 *
 *   IN JOB   the sequencer: it reaches a majority of the agreed list. Any other member: its
 *            connection to the sequencer is open and the sequencer's last QUORUM heartbeat on
 *            it said 1.
 *   CUT OFF  neither. The application stops training; no change is committed; the peer dials
 *            every member it lost, whatever the ids, at most once a second, to find the job
 *            again when the partition heals or the freeze ends.
 *   REMOVED  a member list without this peer arrived, or a member refused its HELLO with
 *            NOT_MEMBER (that member holds a list without this peer, which a majority agreed
 *            to). Final for this hs_net: the application joins again as a new peer or exits.
 *
 * IN JOB <-> CUT OFF as connections come and go (hs__q_update after every event that can
 * change it, and on every tick); either -> REMOVED. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/net_internal.h"

#define REDIAL_US 1000000

static hs__mview *agreed(hs_net *net) {
    if (!net->agreed && net->n_sched)
        net->agreed = net->sched[0]; /* the first list this peer got: the job's, or WELCOME's */
    return net->agreed;
}

/* Voting members of the agreed list, and those reached (live) or holding mv (acked): 1 when
 * they are a majority. */
static int count(hs_net *net, const hs__mview *mv, uint32_t *got, uint32_t *voters) {
    hs__mview *base = agreed(net);
    uint64_t now = hs__now_us(), fresh = (uint64_t)net->cfg.peer_timeout_ms * 750;
    *got = *voters = 0;
    if (!base)
        return 0;
    for (uint32_t i = 0; i < base->m.n; i++) {
        uint32_t id = base->m.m[i].id;
        hs__peer *p = id == net->self ? NULL : hs__peer_find(net, id);
        if (p && (p->left || p->gone))
            continue;
        (*voters)++;
        if (id == net->self)
            *got += !mv || hs__mb_is_member(hs__mb_newest(net), id);
        else if (!mv)
            *got += p && p->conn && !p->dead && now - p->conn->last_recv_us < fresh;
        else
            *got += p && hs__mb_cmp(p->has_ver, p->has_iss, mv->m.version, mv->m.issuer) >= 0;
    }
    return 2 * *got > *voters;
}

static int majority(hs_net *net, uint32_t *reached, uint32_t *voters) {
    return count(net, NULL, reached, voters);
}

/* The sequencer: the newest list a majority of the agreed one holds becomes the agreed one. */
static void advance_agreed(hs_net *net) {
    hs__mview *base = agreed(net);
    uint32_t got, voters;
    for (int i = net->n_sched - 1; i >= 0 && net->sched[i] != base; i--) {
        if (count(net, net->sched[i], &got, &voters)) {
            net->agreed = net->sched[i];
            HS_LOGD("members v%llu agreed (%u of %u hold it)",
                    (unsigned long long)net->agreed->m.version, got, voters);
            return;
        }
    }
}

void hs__q_ack(hs_net *net, hs__peer *p, uint64_t ver, uint32_t iss) {
    if (hs__mb_cmp(ver, iss, p->has_ver, p->has_iss) <= 0)
        return;
    p->has_ver = ver;
    p->has_iss = iss;
    hs__q_update(net);
}

void hs__q_tell(hs_net *net, hs__peer *p) {
    hs__heartbeat hb = {HS__HB_BEAT, 0, hs__net_round(net), 0, 0};
    hs__mview *mv = hs__mb_newest(net);
    hs_buf *b;
    if (!mv || !p->conn || hs_buf_new(&b, HS__HB_LEN) < 0)
        return;
    hb.mver = mv->m.version;
    hb.missuer = mv->m.issuer;
    if (hs__wire_heartbeat_encode(b, &hb) == 0)
        hs__send_conn(p->conn, HS__T_HEARTBEAT, hb.round, b);
    hs_buf_unref(b);
}

int hs__q_majority(hs_net *net) {
    uint32_t reached, voters;
    return majority(net, &reached, &voters);
}

/* QUORUM: ok, and (in the membership fields) the agreed list. */
static void send_status(hs_net *net, hs__peer *p, int ok) {
    hs__heartbeat hb = {HS__HB_QUORUM, (uint64_t)ok, hs__net_round(net), 0, 0};
    hs__mview *mv = agreed(net);
    if (mv) {
        hb.mver = mv->m.version;
        hb.missuer = mv->m.issuer;
    }
    hs_buf *b;
    if (hs_buf_new(&b, HS__HB_LEN) < 0)
        return;
    if (hs__wire_heartbeat_encode(b, &hb) == 0 &&
        hs__send_conn(p->conn, HS__T_HEARTBEAT, hb.round, b) == 0) {
        p->told_quorum = ok + 1;
        p->told_agreed = hb.mver;
    }
    hs_buf_unref(b);
}

void hs__q_update(hs_net *net) {
    uv_mutex_lock(&net->mu);
    int skip = net->stopping || net->leaving || net->self == HS__ID_NONE;
    int removed = net->removed, was = net->in_job;
    uv_mutex_unlock(&net->mu);
    if (skip)
        return;
    if (!removed && net->is_sequencer)
        advance_agreed(net);
    uint32_t reached = 0, voters = 0;
    int seq_ok = !removed && net->is_sequencer && majority(net, &reached, &voters);
    int in = seq_ok;
    if (!removed && !net->is_sequencer) {
        hs__peer *s = hs__peer_find(net, net->sequencer);
        in = s && s->conn && !s->dead && s->says_quorum;
    }
    if (in != was) {
        uv_mutex_lock(&net->mu);
        net->in_job = in;
        hs__net_wake(net);
        uv_mutex_unlock(&net->mu);
        if (in)
            HS_LOGI("in touch with the job (a majority of members v%llu)%s",
                    (unsigned long long)agreed(net)->m.version,
                    net->is_sequencer ? ", as its sequencer" : "");
        else if (!removed && net->is_sequencer)
            HS_LOGW(
                "cut off from the job: this sequencer reaches %u of %u members, not a majority; "
                "no training and no membership change until it does",
                reached, voters);
        else if (!removed)
            HS_LOGW("cut off from the job: the sequencer (peer %u) is not reachable or reaches no "
                    "majority; no training until it does",
                    net->sequencer);
    }
    for (int i = 0; i < net->n_peers; i++) {
        hs__peer *p = net->peers[i];
        if (p->conn &&
            (p->told_quorum != seq_ok + 1 || (seq_ok && p->told_agreed != net->agreed->m.version)))
            send_status(net, p, seq_ok);
    }
}

void hs__q_on_status(hs_net *net, hs__conn *c, const hs__heartbeat *hb) {
    if (!c->peer)
        return;
    c->peer->says_quorum = hb->token != 0;
    /* The sequencer's agreed list, if this peer holds it: the base should it take over. */
    hs__mview *base = agreed(net);
    for (int i = net->n_sched - 1; hb->token && c->peer_id == net->sequencer && i >= 0; i--) {
        hs__mview *mv = net->sched[i];
        if (mv == base)
            break;
        if (mv->m.version == hb->mver && mv->m.issuer == hb->missuer) {
            net->agreed = mv;
            break;
        }
    }
    hs__q_update(net);
}

void hs__q_on_open(hs__peer *p) {
    p->told_quorum = 0;
    p->says_quorum = 0;
}

int hs__q_redial(hs_net *net, hs__peer *p, uint64_t now) {
    if (net->in_job || !p->member || p->gone || p->dialing || p->conn || now < p->next_dial_us)
        return 0;
    /* A live one the lower id dials as usual unless that takes long (crossing dials would
     * replace each other's connections). */
    uint64_t late = (uint64_t)net->cfg.peer_timeout_ms * 500;
    if (!p->dead && (!p->unreachable_since_us || now - p->unreachable_since_us < late))
        return 0;
    p->next_dial_us = now + REDIAL_US;
    hs__conn *c;
    if (net->tr.ops->dial(&net->tr, p->addr, p->id, &c) == 0)
        p->dialing = c;
    return 1;
}

void hs__q_removed(hs_net *net, const char *fmt, ...) {
    char why[sizeof(net->removed_why)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    uv_mutex_lock(&net->mu);
    int was = net->removed;
    net->removed = 1;
    net->in_job = 0;
    if (!was)
        snprintf(net->removed_why, sizeof(net->removed_why), "%s", why);
    hs__net_wake(net);
    uv_mutex_unlock(&net->mu);
    if (!was)
        HS_LOGE("this peer (id %u) was removed from the job: %s", net->self, why);
}

int hs_net_in_job(hs_net *net, int wait_ms) {
    uint64_t end = hs__now_us() + (uint64_t)(wait_ms > 0 ? wait_ms : 0) * 1000;
    uv_mutex_lock(&net->mu);
    for (;;) {
        if (net->removed) {
            int err = hs__err(HS_ECANCELED, "peer %u: %s", net->self, net->removed_why);
            uv_mutex_unlock(&net->mu);
            return err;
        }
        uint64_t now = hs__now_us();
        if (net->in_job || now >= end || net->stopping)
            break;
        uv_cond_timedwait(&net->cv, &net->mu, (end - now) * 1000);
    }
    int in = net->in_job;
    uv_mutex_unlock(&net->mu);
    return in;
}
