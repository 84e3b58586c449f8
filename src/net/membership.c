/* Membership: the versions of the member list, the views they give through the topology, the
 * sequencer that orders changes, failure handling, and whom this peer keeps connections to.
 *
 * Protocol (docs/PROTOCOL.md): the live member with the lowest id is the sequencer. Joins and
 * suspicions go to it; it folds them into the next version (ids assigned from next_id, so
 * concurrent joins never collide), picks the round at which it takes effect (the highest round
 * it knows plus a margin) and sends it to every member. Versions are ordered by (version,
 * issuer); peers that meet compare theirs in HELLO and heartbeats and the one ahead pushes its
 * list (anti-entropy), so a version reaches everybody even when its issuer died halfway.
 *
 * Threading: loop thread. Versions are appended under net->mu (the training thread reads them
 * in view()); a version is never changed or freed once published. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/net_internal.h"

#define NEEDS_PERIOD_MAX 64
#define CHANGE_COALESCE_MS 5
#define JOIN_MEMORY 256

int hs__mb_cmp(uint64_t v1, uint32_t i1, uint64_t v2, uint32_t i2) {
    if (v1 != v2)
        return v1 < v2 ? -1 : 1;
    if (i1 != i2)
        return i1 < i2 ? -1 : 1;
    return 0;
}

hs__mview *hs__mb_newest(hs_net *net) { return net->n_sched ? net->sched[net->n_sched - 1] : NULL; }

hs__mview *hs__mb_at(hs_net *net, uint64_t round) {
    for (int i = net->n_sched - 1; i >= 0; i--)
        if (net->sched[i]->m.eff_round <= round)
            return net->sched[i];
    return NULL;
}

static int member_index(const hs__members *m, uint32_t id) {
    int lo = 0, hi = (int)m->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (m->m[mid].id == id)
            return mid;
        if (m->m[mid].id < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int hs__mb_is_member(hs__mview *mv, uint32_t id) { return member_index(&mv->m, id) >= 0; }

/* ------------------------------------------------------------------ views */

static int add_need(hs__mview *mv, uint32_t id, int *cap) {
    for (int i = 0; i < mv->n_needs; i++)
        if (mv->needs[i] == id)
            return 0;
    if (mv->n_needs == *cap) {
        int nc = *cap ? 2 * *cap : 8;
        uint32_t *n = realloc(mv->needs, (size_t)nc * sizeof(*n));
        if (!n)
            return HS_ENOMEM;
        mv->needs = n;
        *cap = nc;
    }
    mv->needs[mv->n_needs++] = id;
    return 0;
}

/* The topology over this version's ranks. Generators are rebuilt for the new count; a file (or
 * a generator that cannot take the new count) keeps its graph and re-weights the survivors by
 * Metropolis-Hastings through hs_topo_restrict. */
static void build_topo(hs_net *net, hs__mview *mv, hs__mview *prev) {
    const char *spec = net->s_topo;
    hs_topo *t = NULL;
    int err;
    if (net->topo_file_n > 0) {
        hs_topo *base;
        if ((err = hs_topo_new(&base, spec, 0, net->cfg.topo_seed)) < 0) {
            HS_LOGE("topology %s: %s", spec, hs_error_message());
            return;
        }
        int nf = hs_topo_n(base);
        uint8_t *alive = calloc((size_t)nf, 1);
        int ok = alive != NULL;
        for (uint32_t i = 0; ok && i < mv->m.n; i++) {
            if (mv->m.m[i].id >= (uint32_t)nf) {
                HS_LOGE("topology %s has %d peers; member id %u has no place in it", spec, nf,
                        mv->m.m[i].id);
                ok = 0;
            } else {
                alive[mv->m.m[i].id] = 1;
            }
        }
        if (ok && (int)mv->m.n == nf) {
            t = base;
            base = NULL;
        } else if (ok && hs_topo_restrict(&t, base, alive) < 0) {
            HS_LOGE("topology %s restricted to %u members: %s", spec, mv->m.n, hs_error_message());
            t = NULL;
        }
        free(alive);
        hs_topo_free(base);
        mv->topo = t;
        return;
    }
    if ((err = hs_topo_new(&t, spec, (int)mv->m.n, net->cfg.topo_seed)) == 0) {
        mv->topo = t;
        return;
    }
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", hs_error_message());
    /* Only removals since prev: keep prev's graph over the survivors. */
    if (prev && prev->topo && hs_topo_n(prev->topo) == (int)prev->m.n) {
        uint8_t *alive = calloc(prev->m.n, 1);
        int subset = alive != NULL;
        for (uint32_t i = 0; subset && i < mv->m.n; i++) {
            int k = member_index(&prev->m, mv->m.m[i].id);
            if (k < 0)
                subset = 0;
            else
                alive[k] = 1;
        }
        if (subset && hs_topo_restrict(&t, prev->topo, alive) == 0) {
            HS_LOGW("topology %s cannot take %u members (%s): re-weighting the survivors of "
                    "version %llu",
                    spec, mv->m.n, msg, (unsigned long long)prev->m.version);
            mv->topo = t;
            free(alive);
            return;
        }
        free(alive);
    }
    HS_LOGE("topology %s for %u members: %s", spec, mv->m.n, msg);
}

static void build_needs(hs__mview *mv) {
    int cap = 0;
    if (mv->rank_self < 0)
        return;
    if (!mv->topo)
        return;
    int period = hs_topo_period(mv->topo);
    if (period > NEEDS_PERIOD_MAX) {
        for (uint32_t i = 0; i < mv->m.n; i++)
            if ((int)i != mv->rank_self && add_need(mv, mv->m.m[i].id, &cap) < 0)
                return;
        return;
    }
    for (int r = 0; r < period; r++) {
        hs_view v;
        memset(&v, 0, sizeof(v));
        if (hs_topo_view(mv->topo, mv->rank_self, mv->m.eff_round + (uint64_t)r, &v) < 0) {
            HS_LOGE("topology view of rank %d: %s", mv->rank_self, hs_error_message());
            return;
        }
        for (int i = 0; i < v.n_in; i++)
            add_need(mv, mv->m.m[v.in[i].peer].id, &cap);
        for (int i = 0; i < v.n_out; i++)
            add_need(mv, mv->m.m[v.out[i].peer].id, &cap);
        hs_view_free(&v);
    }
}

/* ------------------------------------------------------------------ the sequencer */

static void update_sequencer(hs_net *net);

static void on_change_timer(uv_timer_t *t) { hs__mb_commit(t->data); }

static void schedule_commit(hs_net *net) {
    if (net->change_pending)
        return;
    net->change_pending = 1;
    uv_timer_start(&net->change_timer, on_change_timer, CHANGE_COALESCE_MS, 0);
}

static void add_removal(hs_net *net, uint32_t id) {
    for (int i = 0; i < net->n_removals; i++)
        if (net->removals[i] == id)
            return;
    if (net->n_removals == net->cap_removals) {
        int cap = net->cap_removals ? 2 * net->cap_removals : 8;
        uint32_t *r = realloc(net->removals, (size_t)cap * sizeof(*r));
        if (!r)
            return;
        net->removals = r;
        net->cap_removals = cap;
    }
    net->removals[net->n_removals++] = id;
}

static void update_sequencer(hs_net *net) {
    hs__mview *mv = hs__mb_newest(net);
    if (!mv || net->self == HS__ID_NONE)
        return;
    uint32_t seq = HS__ID_NONE;
    for (uint32_t i = 0; i < mv->m.n; i++) {
        uint32_t id = mv->m.m[i].id;
        hs__peer *p = id == net->self ? NULL : hs__peer_find(net, id);
        if (id == net->self || (p && !p->dead)) {
            seq = id;
            break;
        }
    }
    int was = net->is_sequencer;
    net->sequencer = seq;
    net->is_sequencer = seq == net->self;
    if (net->is_sequencer && !was && net->n_sched > 1) {
        HS_LOGI("peer %u is the sequencer now", net->self);
        for (uint32_t i = 0; i < mv->m.n; i++) {
            hs__peer *p = hs__peer_find(net, mv->m.m[i].id);
            if (p && p->dead)
                add_removal(net, p->id);
        }
        if (net->n_removals)
            schedule_commit(net);
    }
}

void hs__mb_send_members(hs_net *net, hs__peer *p) {
    hs__mview *mv = hs__mb_newest(net);
    hs_buf *b;
    if (!mv || hs_buf_new(&b, 64 + mv->m.n * 32u) < 0)
        return;
    if (hs__wire_members_encode(b, &mv->m) == 0 &&
        hs__send_peer(net, p, HS__T_MEMBERS, hs__net_round(net), b) == 0) {
        p->members_sent_ver = mv->m.version;
        p->members_sent_iss = mv->m.issuer;
    }
    hs_buf_unref(b);
}

static void send_join_ack(hs_net *net, hs__join_req *j) {
    hs__join ack;
    memset(&ack, 0, sizeof(ack));
    ack.nonce = j->nonce;
    ack.via = j->via;
    ack.id = j->id;
    ack.mver = j->mver;
    if (j->id == HS__ID_NONE)
        snprintf(ack.addr, sizeof(ack.addr), "%s", j->addr);
    if (j->via == net->self) {
        hs__bs_on_join_ack(net, &ack);
        return;
    }
    hs__peer *p = hs__peer_find(net, j->via);
    hs_buf *b;
    if (!p || hs_buf_new(&b, 64) < 0)
        return;
    if (hs__wire_join_encode(b, &ack) == 0)
        hs__send_peer(net, p, HS__T_JOIN_ACK, hs__net_round(net), b);
    hs_buf_unref(b);
}

/* The round a change takes effect: the highest round known plus a margin of at least
 * change_rounds rounds and change_delay_ms at the observed round rate, so the new list reaches
 * everybody before anybody gets there. */
static uint64_t choose_eff(hs_net *net) {
    uint64_t maxr = hs__net_round(net);
    hs__mview *mv = hs__mb_newest(net);
    for (uint32_t i = 0; mv && i < mv->m.n; i++) {
        hs__peer *p = hs__peer_find(net, mv->m.m[i].id);
        if (p && !p->dead && p->known_round > maxr)
            maxr = p->known_round;
    }
    uint64_t margin = (uint64_t)net->cfg.change_rounds;
    double by_rate = ceil(net->round_rate * net->cfg.change_delay_ms / 1000.0);
    if (by_rate > (double)margin && by_rate < 1e9)
        margin = (uint64_t)by_rate;
    uint64_t eff = maxr + margin;
    if (mv && eff < mv->m.eff_round)
        eff = mv->m.eff_round;
    return eff;
}

void hs__mb_request_join(hs_net *net, uint64_t nonce, uint32_t via, const char *addr) {
    for (int i = 0; i < net->n_joins; i++) {
        hs__join_req *j = &net->joins[i];
        if (j->nonce != nonce)
            continue;
        j->via = via;
        if (j->id != HS__ID_NONE || j->acked)
            send_join_ack(net, j); /* a repeated request */
        return;
    }
    if (net->n_joins == JOIN_MEMORY) {
        memmove(net->joins, net->joins + 1, (JOIN_MEMORY - 1) * sizeof(*net->joins));
        net->n_joins--;
    }
    if (net->n_joins == net->cap_joins) {
        int cap = net->cap_joins ? 2 * net->cap_joins : 16;
        hs__join_req *r = realloc(net->joins, (size_t)cap * sizeof(*r));
        if (!r)
            return;
        net->joins = r;
        net->cap_joins = cap;
    }
    hs__join_req *j = &net->joins[net->n_joins++];
    memset(j, 0, sizeof(*j));
    j->nonce = nonce;
    j->via = via;
    j->id = HS__ID_NONE;
    snprintf(j->addr, sizeof(j->addr), "%s", addr);
    schedule_commit(net);
}

void hs__mb_commit(hs_net *net) {
    net->change_pending = 0;
    /* Without a majority of the newest list this side may be the minority of a partition: its
     * change would fork the job. Joins and removals wait (mb_tick tries again). */
    if (!net->is_sequencer || !hs__q_majority(net))
        return;
    uv_mutex_lock(&net->mu);
    int leaving = net->leaving || net->stopping;
    uv_mutex_unlock(&net->mu);
    if (leaving)
        return;
    hs__mview *mv = hs__mb_newest(net);
    hs__members nm;
    memset(&nm, 0, sizeof(nm));
    int changed = 0;
    uint32_t next_id = mv->m.next_id;
    int n_new = 0;
    for (int i = 0; i < net->n_joins; i++)
        n_new += net->joins[i].id == HS__ID_NONE && !net->joins[i].acked;
    nm.m = calloc(mv->m.n + (size_t)n_new, sizeof(*nm.m));
    if (!nm.m) {
        HS_LOGE("membership change: out of memory");
        return;
    }
    for (uint32_t i = 0; i < mv->m.n; i++) {
        uint32_t id = mv->m.m[i].id;
        int gone = 0;
        hs__peer *p = hs__peer_find(net, id);
        for (int k = 0; k < net->n_removals; k++) /* not one that came back meanwhile */
            gone |= net->removals[k] == id && id != net->self && (!p || p->dead);
        if (gone) {
            changed = 1;
            continue;
        }
        nm.m[nm.n] = mv->m.m[i];
        if (id == net->self && strcmp(nm.m[nm.n].addr, net->advertise)) {
            snprintf(nm.m[nm.n].addr, sizeof(nm.m[nm.n].addr), "%s", net->advertise);
            changed = 1;
        }
        nm.n++;
    }
    net->n_removals = 0;
    for (int i = 0; i < net->n_joins; i++) {
        hs__join_req *j = &net->joins[i];
        if (j->id != HS__ID_NONE || j->acked)
            continue;
        if (net->topo_file_n > 0 && next_id >= (uint32_t)net->topo_file_n) {
            snprintf(j->addr, sizeof(j->addr),
                     "topology %s has %d peers and all their ids are "
                     "taken",
                     net->s_topo, net->topo_file_n);
            j->acked = 1;
            send_join_ack(net, j);
            continue;
        }
        j->id = next_id++;
        nm.m[nm.n].id = j->id;
        snprintf(nm.m[nm.n].addr, sizeof(nm.m[nm.n].addr), "%s", j->addr);
        nm.n++;
        changed = 1;
    }
    if (!changed) {
        free(nm.m);
        return;
    }
    nm.version = mv->m.version + 1;
    nm.issuer = net->self;
    nm.next_id = next_id;
    nm.eff_round = choose_eff(net);
    /* Acks for joins through this peer first, so it knows whose connection the joiner's is
     * before the new list makes it want to dial it. */
    for (int i = 0; i < net->n_joins; i++) {
        hs__join_req *j = &net->joins[i];
        if (j->id != HS__ID_NONE && !j->acked) {
            j->mver = nm.version;
            if (j->via == net->self) {
                j->acked = 1;
                send_join_ack(net, j);
            }
        }
    }
    hs__mb_accept(net, &nm, "this sequencer");
    free(nm.m);
    mv = hs__mb_newest(net);
    for (int i = 0; i < net->n_joins; i++) {
        hs__join_req *j = &net->joins[i];
        if (j->id != HS__ID_NONE && !j->acked) {
            j->acked = 1;
            send_join_ack(net, j);
        }
    }
    for (uint32_t i = 0; i < mv->m.n; i++) {
        if (mv->m.m[i].id == net->self)
            continue;
        hs__peer *p = hs__peer_find(net, mv->m.m[i].id);
        if (p)
            hs__mb_send_members(net, p);
    }
}

/* ------------------------------------------------------------------ accepting a version */

int hs__mb_init_first(hs_net *net) {
    hs__member self;
    memset(&self, 0, sizeof(self));
    self.id = 0;
    snprintf(self.addr, sizeof(self.addr), "%s", net->advertise);
    hs__members m = {1, 0, 0, 1, 1, &self};
    uv_mutex_lock(&net->mu);
    net->self = 0;
    uv_mutex_unlock(&net->mu);
    return hs__mb_accept(net, &m, "the first peer");
}

static void connect_needed(hs_net *net);

int hs__mb_accept(hs_net *net, const hs__members *m, const char *from) {
    hs__mview *prev = hs__mb_newest(net);
    if (prev && hs__mb_cmp(m->version, m->issuer, prev->m.version, prev->m.issuer) <= 0)
        return 0;
    hs__mview *mv = calloc(1, sizeof(*mv));
    if (!mv)
        return hs__err(HS_ENOMEM, "member list: out of memory");
    int err = hs__members_copy(&mv->m, m);
    if (err < 0) {
        free(mv);
        return err;
    }
    mv->rank_self = member_index(&mv->m, net->self);
    build_topo(net, mv, prev);
    build_needs(mv);
    /* Peers exist (and removed ones are dead) before the version is visible to view() and
     * send() on the training thread. */
    for (uint32_t i = 0; i < m->n; i++) {
        if (m->m[i].id == net->self)
            continue;
        hs__peer *p = hs__peer_get(net, m->m[i].id, m->m[i].addr);
        if (p)
            p->member = 1;
    }
    for (int i = 0; i < net->n_peers; i++) {
        hs__peer *p = net->peers[i];
        if (!p->member || member_index(&mv->m, p->id) >= 0)
            continue;
        p->member = 0;
        HS_LOGI("peer %u (%s) is no longer a member", p->id, p->addr);
        if (!p->dead) {
            uv_mutex_lock(&net->mu);
            p->dead = 1;
            hs__net_wake(net);
            uv_mutex_unlock(&net->mu);
        }
    }
    uint64_t round = hs__net_round(net);
    uv_mutex_lock(&net->mu);
    hs__mview **s = realloc(net->sched, (size_t)(net->n_sched + 1) * sizeof(*s));
    if (!s) {
        uv_mutex_unlock(&net->mu);
        hs__members_clear(&mv->m);
        hs_topo_free(mv->topo);
        free(mv->needs);
        free(mv);
        return hs__err(HS_ENOMEM, "member list: out of memory");
    }
    net->sched = s;
    net->sched[net->n_sched++] = mv;
    int removed = prev && prev->rank_self >= 0 && mv->rank_self < 0;
    hs__net_wake(net);
    uv_mutex_unlock(&net->mu);

    char ids[512];
    size_t o = 0;
    ids[0] = '\0';
    for (uint32_t i = 0; i < m->n && o + 16 < sizeof(ids); i++)
        o += (size_t)snprintf(ids + o, sizeof(ids) - o, "%s%u", i ? " " : "", m->m[i].id);
    if (m->n && o + 16 >= sizeof(ids))
        snprintf(ids + o, sizeof(ids) - o, " ...");
    HS_LOGI("members v%llu from %s (issuer %u, in force from round %llu): %u peers [%s]",
            (unsigned long long)m->version, from, m->issuer, (unsigned long long)m->eff_round, m->n,
            ids);
    if (m->eff_round < round && prev)
        HS_LOGW("members v%llu arrived late: in force from round %llu, this peer is at round %llu",
                (unsigned long long)m->version, (unsigned long long)m->eff_round,
                (unsigned long long)round);
    if (removed)
        hs__q_removed(net, "members v%llu from %s leave it out", (unsigned long long)m->version,
                      from);

    update_sequencer(net);
    connect_needed(net);
    hs__bs_try_welcomes(net);
    hs__q_update(net);
    return 0;
}

void hs__mb_on_members(hs_net *net, hs__conn *c, const hs__members *m) {
    hs__mview *mv = hs__mb_newest(net);
    char from[64];
    snprintf(from, sizeof(from), "peer %u", c->peer_id);
    if (mv && hs__mb_cmp(m->version, m->issuer, mv->m.version, mv->m.issuer) < 0) {
        if (c->peer)
            hs__mb_send_members(net, c->peer); /* it is behind: push ours */
        return;
    }
    hs__mb_accept(net, m, from);
    if (c->peer) { /* both hold it now: the sequencer counts this ack */
        hs__q_tell(net, c->peer);
        hs__q_ack(net, c->peer, m->version, m->issuer);
    }
}

void hs__mb_on_heartbeat(hs_net *net, hs__conn *c, const hs__heartbeat *hb) {
    hs__peer *p = c->peer;
    hs__mview *mv = hs__mb_newest(net);
    if (!p || !mv)
        return;
    if (hb->round > p->known_round)
        p->known_round = hb->round;
    hs__q_ack(net, p, hb->mver, hb->missuer);
    if (hs__mb_cmp(hb->mver, hb->missuer, mv->m.version, mv->m.issuer) < 0 &&
        hs__mb_cmp(p->members_sent_ver, p->members_sent_iss, mv->m.version, mv->m.issuer) < 0)
        hs__mb_send_members(net, p);
}

/* ------------------------------------------------------------------ failures */

static void send_suspect(hs_net *net, hs__peer *dead) {
    hs__peer *seq = hs__peer_find(net, net->sequencer);
    dead->last_suspect_us = hs__now_us();
    if (!seq || seq == dead || seq->dead)
        return;
    char why[400];
    if (dead->left)
        snprintf(why, sizeof(why), "%s", HS__LEFT);
    else
        snprintf(why, sizeof(why), "peer %u (%s) is unreachable from peer %u", dead->id, dead->addr,
                 net->self);
    hs__send_reason(net, seq, NULL, HS__T_SUSPECT, dead->id, why);
}

void hs__mb_peer_dead(hs_net *net, hs__peer *p, const char *fmt, ...) {
    if (p->dead || p->id == net->self)
        return;
    char why[HS__REASON_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    int left = !strcmp(why, HS__LEFT);
    p->left = left;
    uv_mutex_lock(&net->mu);
    p->dead = 1;
    if (!left)
        net->st.peers_dead++;
    p->queued_bytes = 0;
    hs__net_wake(net);
    uv_mutex_unlock(&net->mu);
    p->next_dial_us = hs__now_us() + 1000000; /* a cut-off peer tries it again, not at once */
    hs__fq_clear(&p->outq);
    hs__rs_clear(&p->rs);
    if (left)
        HS_LOGI("peer %u (%s) left the run", p->id, p->addr);
    else
        HS_LOGW("peer %u (%s) declared dead: %s", p->id, p->addr, why);
    if (p->conn)
        net->tr.ops->close(p->conn, HS_ECONNRESET, 0, HS_LOG_DEBUG, "peer declared dead");
    if (p->dialing)
        net->tr.ops->close(p->dialing, HS_ECANCELED, 0, HS_LOG_DEBUG, "peer declared dead");
    if (!p->member)
        return;
    update_sequencer(net);
    if (net->is_sequencer) {
        add_removal(net, p->id);
        schedule_commit(net);
    } else {
        send_suspect(net, p);
    }
    hs__q_update(net);
}

void hs__mb_conn_lost(hs_net *net, hs__peer *p, hs__conn *c, int err, int dial_failed,
                      int attached) {
    uint64_t now = hs__now_us();
    /* Its host answers and nothing listens: it trains in no group of a partition. */
    int gone = dial_failed && err == HS_ECONNREFUSED && p->member;
    if (gone && p->dead && !p->gone) {
        p->gone = 1;
        hs__q_update(net);
    }
    if (!p->member || p->dead)
        return;
    if (c->got_bye == 2) {
        hs__mb_peer_dead(net, p, HS__LEFT);
        return;
    }
    if (dial_failed || !attached) {
        if (gone) {
            p->gone = 1;
            hs__mb_peer_dead(net, p, "connection refused at %s (its process is gone)", p->addr);
            return;
        }
        if (p->next_dial_us < now + (uint64_t)p->backoff_ms * 1000) {
            p->next_dial_us = now + (uint64_t)p->backoff_ms * 1000;
            p->backoff_ms = p->backoff_ms * 2 > 1000 ? 1000 : p->backoff_ms * 2;
        }
        return;
    }
    /* An open connection went away. A peer that closes on purpose says BYE first, so silence
     * (timeout) or an end of stream without BYE means the peer is gone. */
    if (err == HS_ETIMEDOUT) {
        hs__mb_peer_dead(net, p, "%s", c->why);
    } else if (err == HS_ECONNRESET && !c->got_bye) {
        hs__mb_peer_dead(net, p, "connection lost without BYE (%s)", c->why);
    } else {
        p->next_dial_us = now; /* redial (if ours to dial) */
        p->unreachable_since_us = now;
    }
}

void hs__mb_on_suspect(hs_net *net, hs__conn *c, const hs__reason *r) {
    hs__peer *p = hs__peer_find(net, r->code);
    if (!net->is_sequencer || !p || !p->member || p->id == net->self)
        return;
    if (p->dead) {
        add_removal(net, p->id);
        schedule_commit(net);
        return;
    }
    uint64_t now = hs__now_us();
    if (p->conn && now - p->conn->last_recv_us < (uint64_t)net->cfg.peer_timeout_ms * 500) {
        HS_LOGI("peer %u suspects peer %u (%s), but it is alive here", c->peer_id, p->id, r->text);
        return;
    }
    if (!strcmp(r->text, HS__LEFT)) /* it said BYE to the reporter, not (yet) to us */
        hs__mb_peer_dead(net, p, HS__LEFT);
    else
        hs__mb_peer_dead(net, p, "reported by peer %u: %s", c->peer_id, r->text);
}

/* ------------------------------------------------------------------ connections */

void hs__mb_on_open(hs_net *net, hs__conn *c) {
    hs__peer *p = hs__peer_find(net, c->peer_id);
    if (!p)
        p = hs__peer_get(net, c->peer_id, c->hello.listen);
    if (!p) {
        net->tr.ops->close(c, HS_ENOMEM, 1, HS_LOG_ERROR, "out of memory");
        return;
    }
    if (p->dialing == c)
        p->dialing = NULL;
    if (p->conn && p->conn != c) {
        hs__conn *old = p->conn;
        p->conn = NULL;
        uv_mutex_lock(&net->mu);
        net->n_open--;
        uv_mutex_unlock(&net->mu);
        net->tr.ops->close(old, HS_ECANCELED, 1, HS_LOG_DEBUG, "replaced by a newer connection");
    }
    p->conn = c;
    c->peer = p;
    p->ever_connected = 1;
    p->gone = 0;
    p->unreachable_since_us = 0;
    p->backoff_ms = 50;
    if (p->dead && p->member) {
        uv_mutex_lock(&net->mu);
        p->dead = 0;
        uv_mutex_unlock(&net->mu);
        HS_LOGI("peer %u (%s) is reachable again", p->id, p->addr);
        update_sequencer(net);
    }
    hs__q_on_open(p);
    HS_LOGD("peer %u (%s) connected (%s)", p->id, p->addr, c->outgoing ? "dialed" : "accepted");
    hs__mview *mv = hs__mb_newest(net);
    if (mv && hs__mb_cmp(c->hello.mver, c->hello.missuer, mv->m.version, mv->m.issuer) < 0)
        hs__mb_send_members(net, p);
    if (c->hello.round > p->known_round)
        p->known_round = c->hello.round;
    hs__q_ack(net, p, c->hello.mver, c->hello.missuer);
    hs__q_update(net);
    net->tr.ops->pump(c);
}

/* Dials the peers this one exchanges with, under the version in force now and every later
 * one, plus the sequencer (which itself keeps a connection to everybody). The lower id dials;
 * the higher waits, and a needed peer that stays unreachable past the timeout is dead. */
static void connect_needed(hs_net *net) {
    uv_mutex_lock(&net->mu);
    int skip = net->leaving || net->stopping || net->removed || net->self == HS__ID_NONE;
    uint64_t round = net->cur_round;
    uv_mutex_unlock(&net->mu);
    if (skip || !net->n_sched)
        return;
    uint64_t now = hs__now_us();
    int first = 0;
    for (int i = net->n_sched - 1; i >= 0; i--)
        if (net->sched[i]->m.eff_round <= round) {
            first = i;
            break;
        }
    hs__mview *newest = hs__mb_newest(net);
    for (int k = 0; k < net->n_peers; k++) {
        hs__peer *p = net->peers[k];
        if (p->id == net->self)
            continue;
        int needed = 0;
        if (hs__q_redial(net, p, now))
            continue;
        if (p->member && !p->dead) {
            needed = net->is_sequencer || p->id == net->sequencer;
            for (int i = first; i < net->n_sched && !needed; i++) {
                hs__mview *mv = net->sched[i];
                for (int j = 0; j < mv->n_needs; j++)
                    needed |= mv->needs[j] == p->id;
            }
        }
        if (!needed || p->conn) {
            p->unreachable_since_us = 0;
            continue;
        }
        if (!p->unreachable_since_us)
            p->unreachable_since_us = now;
        if (!p->dialing && !p->pending_conn && net->self < p->id && now >= p->next_dial_us) {
            hs__conn *c;
            if (net->tr.ops->dial(&net->tr, p->addr, p->id, &c) == 0) {
                p->dialing = c;
            } else {
                HS_LOGW("dial peer %u: %s", p->id, hs_error_message());
                p->next_dial_us = now + 1000000;
            }
        }
        uint64_t limit = (uint64_t)net->cfg.peer_timeout_ms;
        if (!p->ever_connected)
            limit +=
                (uint64_t)net->cfg.snapshot_timeout_ms + (uint64_t)net->cfg.handshake_timeout_ms;
        if (now - p->unreachable_since_us > limit * 1000)
            hs__mb_peer_dead(net, p, "unreachable for %llu ms",
                             (unsigned long long)((now - p->unreachable_since_us) / 1000));
    }
    (void)newest;
}

void hs__mb_tick(hs_net *net, uint64_t now) {
    uint64_t round = hs__net_round(net);
    /* The window starts at the first round the application reports: a resumed peer jumps from
     * 0 to its checkpoint's round, which is no speed. */
    if (!net->round_rate_t_us || (net->round_rate_r == 0 && round > 0 && net->round_rate == 0)) {
        net->round_rate_t_us = now;
        net->round_rate_r = round;
    } else if (now - net->round_rate_t_us >= 500000) {
        double rate =
            (double)(round - net->round_rate_r) * 1e6 / (double)(now - net->round_rate_t_us);
        net->round_rate = net->round_rate > 0 ? 0.5 * net->round_rate + 0.5 * rate : rate;
        net->round_rate_t_us = now;
        net->round_rate_r = round;
    }
    hs__mview *mv = hs__mb_newest(net);
    if (mv && net->self != HS__ID_NONE) {
        for (uint32_t i = 0; i < mv->m.n; i++) {
            hs__peer *p = hs__peer_find(net, mv->m.m[i].id);
            if (!p || !p->dead)
                continue;
            if (net->is_sequencer) {
                add_removal(net, p->id);
                schedule_commit(net);
            } else if (now - p->last_suspect_us > (uint64_t)net->cfg.peer_timeout_ms * 500) {
                send_suspect(net, p);
            }
        }
        for (int i = 0; net->is_sequencer && i < net->n_joins; i++)
            if (net->joins[i].id == HS__ID_NONE && !net->joins[i].acked)
                schedule_commit(net); /* held back while there was no majority */
    }
    connect_needed(net);
    hs__q_update(net);
}
