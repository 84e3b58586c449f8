/* Membership: the peer table, the versions of the member list, the views they give through the
 * topology, and the sequencer that orders changes (failure handling is failure.c, quorum
 * quorum.c; all act only through the env, membership.h).
 *
 * Protocol (docs/PROTOCOL.md): the live member with the lowest id is the sequencer. Joins and
 * suspicions go to it; it folds them into the next version (ids assigned from next_id, so
 * concurrent joins never collide), picks the round at which it takes effect (the highest round
 * it knows plus a margin) and sends it to every member. Versions are ordered by (version,
 * issuer); peers that meet compare theirs in HELLO and heartbeats and the one ahead pushes its
 * list (anti-entropy), so a version reaches everybody even when its issuer died halfway.
 *
 * Threading: loop thread. Versions are appended under the env's lock (the training thread
 * reads them in view()); a version is never changed or freed once published. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/membership.h"

#define NEEDS_PERIOD_MAX 64
#define JOIN_MEMORY 256

hs__mpeer *hs__mb_find(hs__mb *mb, uint32_t id) {
    for (int i = 0; i < mb->n_peers; i++)
        if (mb->peers[i]->id == id)
            return mb->peers[i];
    return NULL;
}

hs__mpeer *hs__mb_get(hs__mb *mb, uint32_t id, const char *addr) {
    hs__mpeer *p = hs__mb_find(mb, id);
    if (p) {
        if (addr && strcmp(p->addr, addr))
            snprintf(p->addr, sizeof(p->addr), "%s", addr);
        return p;
    }
    /* Room first: a peer the owner made is never left out of the list. */
    if (mb->n_peers == mb->cap_peers) {
        int cap = mb->cap_peers ? 2 * mb->cap_peers : 16;
        mb->env->lock(mb->ctx);
        hs__mpeer **np = realloc(mb->peers, (size_t)cap * sizeof(*np));
        if (np) {
            mb->peers = np;
            mb->cap_peers = cap;
        }
        mb->env->unlock(mb->ctx);
        if (!np)
            return NULL;
    }
    if (!(p = mb->env->peer_new(mb->ctx, id, addr)))
        return NULL;
    p->backoff_ms = 50;
    mb->env->lock(mb->ctx);
    mb->peers[mb->n_peers++] = p;
    mb->env->unlock(mb->ctx);
    return p;
}

static void view_free(hs__mview *mv) {
    hs__members_clear(&mv->m);
    hs_topo_free(mv->topo);
    free(mv->needs);
    free(mv);
}

void hs__mb_free(hs__mb *mb) {
    for (int i = 0; i < mb->n_sched; i++)
        view_free(mb->sched[i]);
    free(mb->sched);
    free(mb->peers);
    free(mb->joins);
    free(mb->removals);
    memset(mb, 0, sizeof(*mb));
}

int hs__mb_cmp(uint64_t v1, uint32_t i1, uint64_t v2, uint32_t i2) {
    if (v1 != v2)
        return v1 < v2 ? -1 : 1;
    if (i1 != i2)
        return i1 < i2 ? -1 : 1;
    return 0;
}

hs__mview *hs__mb_newest(const hs__mb *mb) {
    return mb->n_sched ? mb->sched[mb->n_sched - 1] : NULL;
}

hs__mview *hs__mb_at(const hs__mb *mb, uint64_t round) {
    for (int i = mb->n_sched - 1; i >= 0; i--)
        if (mb->sched[i]->m.eff_round <= round)
            return mb->sched[i];
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

int hs__mb_is_member(const hs__mview *mv, uint32_t id) { return member_index(&mv->m, id) >= 0; }

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
static void build_topo(hs__mb *mb, hs__mview *mv, hs__mview *prev) {
    const char *spec = mb->topo_spec;
    hs_topo *t = NULL;
    int err;
    if (mb->topo_file_n > 0) {
        hs_topo *base;
        if ((err = hs_topo_new(&base, spec, 0, mb->cfg->topo_seed)) < 0) {
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
    if ((err = hs_topo_new(&t, spec, (int)mv->m.n, mb->cfg->topo_seed)) == 0) {
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

void hs__mb_schedule_commit(hs__mb *mb) {
    if (mb->change_pending)
        return;
    mb->change_pending = 1;
    mb->env->schedule(mb->ctx, HS__MB_COALESCE_MS);
}

static void add_removal(hs__mb *mb, uint32_t id) {
    for (int i = 0; i < mb->n_removals; i++)
        if (mb->removals[i] == id)
            return;
    if (mb->n_removals == mb->cap_removals) {
        int cap = mb->cap_removals ? 2 * mb->cap_removals : 8;
        uint32_t *r = realloc(mb->removals, (size_t)cap * sizeof(*r));
        if (!r)
            return;
        mb->removals = r;
        mb->cap_removals = cap;
    }
    mb->removals[mb->n_removals++] = id;
}

void hs__mb_remove(hs__mb *mb, uint32_t id) {
    add_removal(mb, id);
    hs__mb_schedule_commit(mb);
}

void hs__mb_update_sequencer(hs__mb *mb) {
    hs__mview *mv = hs__mb_newest(mb);
    if (!mv || *mb->self == HS__ID_NONE)
        return;
    uint32_t seq = HS__ID_NONE;
    for (uint32_t i = 0; i < mv->m.n; i++) {
        uint32_t id = mv->m.m[i].id;
        hs__mpeer *p = id == *mb->self ? NULL : hs__mb_find(mb, id);
        if (id == *mb->self || (p && !p->dead)) {
            seq = id;
            break;
        }
    }
    int was = mb->is_sequencer;
    mb->sequencer = seq;
    mb->is_sequencer = seq == *mb->self;
    if (mb->is_sequencer && !was && mb->n_sched > 1) {
        HS_LOGI("peer %u is the sequencer now", *mb->self);
        for (uint32_t i = 0; i < mv->m.n; i++) {
            hs__mpeer *p = hs__mb_find(mb, mv->m.m[i].id);
            if (p && p->dead)
                add_removal(mb, p->id);
        }
        if (mb->n_removals)
            hs__mb_schedule_commit(mb);
    }
}

void hs__mb_send_members(hs__mb *mb, hs__mpeer *p) {
    hs__mview *mv = hs__mb_newest(mb);
    hs_buf *b;
    if (!mv || hs_buf_new(&b, 64 + mv->m.n * 32u) < 0)
        return;
    if (hs__wire_members_encode(b, &mv->m) == 0 &&
        mb->env->send(mb->ctx, p, 0, HS__T_MEMBERS, mb->env->round(mb->ctx), b) == 0) {
        p->members_sent_ver = mv->m.version;
        p->members_sent_iss = mv->m.issuer;
    }
    hs_buf_unref(b);
}

static void send_join_ack(hs__mb *mb, hs__join_req *j) {
    hs__join ack;
    memset(&ack, 0, sizeof(ack));
    ack.nonce = j->nonce;
    ack.via = j->via;
    ack.id = j->id;
    ack.mver = j->mver;
    if (j->id == HS__ID_NONE)
        snprintf(ack.addr, sizeof(ack.addr), "%s", j->addr);
    if (j->via == *mb->self) {
        mb->env->join_ack(mb->ctx, &ack);
        return;
    }
    hs__mpeer *p = hs__mb_find(mb, j->via);
    hs_buf *b;
    if (!p || hs_buf_new(&b, 64) < 0)
        return;
    if (hs__wire_join_encode(b, &ack) == 0)
        mb->env->send(mb->ctx, p, 0, HS__T_JOIN_ACK, mb->env->round(mb->ctx), b);
    hs_buf_unref(b);
}

/* The round a change takes effect: the highest round known plus a margin of at least
 * change_rounds rounds and change_delay_ms at the observed round rate, so the new list reaches
 * everybody before anybody gets there. */
static uint64_t choose_eff(hs__mb *mb) {
    uint64_t maxr = mb->env->round(mb->ctx);
    hs__mview *mv = hs__mb_newest(mb);
    for (uint32_t i = 0; mv && i < mv->m.n; i++) {
        hs__mpeer *p = hs__mb_find(mb, mv->m.m[i].id);
        if (p && !p->dead && p->known_round > maxr)
            maxr = p->known_round;
    }
    uint64_t margin = (uint64_t)mb->cfg->change_rounds;
    double by_rate = ceil(mb->round_rate * mb->cfg->change_delay_ms / 1000.0);
    if (by_rate > (double)margin && by_rate < 1e9)
        margin = (uint64_t)by_rate;
    uint64_t eff = maxr + margin;
    if (mv && eff < mv->m.eff_round)
        eff = mv->m.eff_round;
    return eff;
}

void hs__mb_request_join(hs__mb *mb, uint64_t nonce, uint32_t via, const char *addr) {
    for (int i = 0; i < mb->n_joins; i++) {
        hs__join_req *j = &mb->joins[i];
        if (j->nonce != nonce)
            continue;
        j->via = via;
        if (j->id != HS__ID_NONE || j->acked)
            send_join_ack(mb, j); /* a repeated request */
        return;
    }
    if (mb->n_joins == JOIN_MEMORY) {
        memmove(mb->joins, mb->joins + 1, (JOIN_MEMORY - 1) * sizeof(*mb->joins));
        mb->n_joins--;
    }
    if (mb->n_joins == mb->cap_joins) {
        int cap = mb->cap_joins ? 2 * mb->cap_joins : 16;
        hs__join_req *r = realloc(mb->joins, (size_t)cap * sizeof(*r));
        if (!r)
            return;
        mb->joins = r;
        mb->cap_joins = cap;
    }
    hs__join_req *j = &mb->joins[mb->n_joins++];
    memset(j, 0, sizeof(*j));
    j->nonce = nonce;
    j->via = via;
    j->id = HS__ID_NONE;
    snprintf(j->addr, sizeof(j->addr), "%s", addr);
    hs__mb_schedule_commit(mb);
}

void hs__mb_commit(hs__mb *mb) {
    mb->change_pending = 0;
    /* Without a majority of the newest list this side may be the minority of a partition: its
     * change would fork the job. Joins and removals wait (mb_tick tries again). */
    if (!mb->is_sequencer || !hs__q_majority(mb))
        return;
    if (mb->env->quiet(mb->ctx))
        return;
    hs__mview *mv = hs__mb_newest(mb);
    hs__members nm;
    memset(&nm, 0, sizeof(nm));
    int changed = 0;
    uint32_t next_id = mv->m.next_id;
    int n_new = 0;
    for (int i = 0; i < mb->n_joins; i++)
        n_new += mb->joins[i].id == HS__ID_NONE && !mb->joins[i].acked;
    nm.m = calloc(mv->m.n + (size_t)n_new, sizeof(*nm.m));
    if (!nm.m) {
        HS_LOGE("membership change: out of memory");
        return;
    }
    for (uint32_t i = 0; i < mv->m.n; i++) {
        uint32_t id = mv->m.m[i].id;
        int gone = 0;
        hs__mpeer *p = hs__mb_find(mb, id);
        for (int k = 0; k < mb->n_removals; k++) /* not one that came back meanwhile */
            gone |= mb->removals[k] == id && id != *mb->self && (!p || p->dead);
        if (gone) {
            changed = 1;
            continue;
        }
        nm.m[nm.n] = mv->m.m[i];
        if (id == *mb->self && strcmp(nm.m[nm.n].addr, mb->advertise)) {
            snprintf(nm.m[nm.n].addr, sizeof(nm.m[nm.n].addr), "%s", mb->advertise);
            changed = 1;
        }
        nm.n++;
    }
    mb->n_removals = 0;
    for (int i = 0; i < mb->n_joins; i++) {
        hs__join_req *j = &mb->joins[i];
        if (j->id != HS__ID_NONE || j->acked)
            continue;
        if (mb->topo_file_n > 0 && next_id >= (uint32_t)mb->topo_file_n) {
            snprintf(j->addr, sizeof(j->addr),
                     "topology %s has %d peers and all their ids are "
                     "taken",
                     mb->topo_spec, mb->topo_file_n);
            j->acked = 1;
            send_join_ack(mb, j);
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
    nm.issuer = *mb->self;
    nm.next_id = next_id;
    nm.eff_round = choose_eff(mb);
    /* Acks for joins through this peer first, so it knows whose connection the joiner's is
     * before the new list makes it want to dial it. */
    for (int i = 0; i < mb->n_joins; i++) {
        hs__join_req *j = &mb->joins[i];
        if (j->id != HS__ID_NONE && !j->acked) {
            j->mver = nm.version;
            if (j->via == *mb->self) {
                j->acked = 1;
                send_join_ack(mb, j);
            }
        }
    }
    hs__mb_accept(mb, &nm, "this sequencer");
    free(nm.m);
    mv = hs__mb_newest(mb);
    for (int i = 0; i < mb->n_joins; i++) {
        hs__join_req *j = &mb->joins[i];
        if (j->id != HS__ID_NONE && !j->acked) {
            j->acked = 1;
            send_join_ack(mb, j);
        }
    }
    for (uint32_t i = 0; i < mv->m.n; i++) {
        if (mv->m.m[i].id == *mb->self)
            continue;
        hs__mpeer *p = hs__mb_find(mb, mv->m.m[i].id);
        if (p)
            hs__mb_send_members(mb, p);
    }
}

/* ------------------------------------------------------------------ accepting a version */

int hs__mb_init_first(hs__mb *mb) {
    hs__member self;
    memset(&self, 0, sizeof(self));
    self.id = 0;
    snprintf(self.addr, sizeof(self.addr), "%s", mb->advertise);
    hs__members m = {1, 0, 0, 1, 1, &self};
    return hs__mb_accept(mb, &m, "the first peer");
}

int hs__mb_accept(hs__mb *mb, const hs__members *m, const char *from) {
    hs__mview *prev = hs__mb_newest(mb);
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
    mv->rank_self = member_index(&mv->m, *mb->self);
    build_topo(mb, mv, prev);
    build_needs(mv);
    /* Peers exist (and removed ones are dead) before the version is visible to view() and
     * send() on the training thread. */
    for (uint32_t i = 0; i < m->n; i++) {
        if (m->m[i].id == *mb->self)
            continue;
        hs__mpeer *p = hs__mb_get(mb, m->m[i].id, m->m[i].addr);
        if (p)
            p->member = 1;
    }
    for (int i = 0; i < mb->n_peers; i++) {
        hs__mpeer *p = mb->peers[i];
        if (!p->member || member_index(&mv->m, p->id) >= 0)
            continue;
        p->member = 0;
        HS_LOGI("peer %u (%s) is no longer a member", p->id, p->addr);
        if (!p->dead) {
            mb->env->lock(mb->ctx);
            p->dead = 1;
            mb->env->wake(mb->ctx);
            mb->env->unlock(mb->ctx);
        }
    }
    uint64_t round = mb->env->round(mb->ctx);
    mb->env->lock(mb->ctx);
    hs__mview **s = realloc(mb->sched, (size_t)(mb->n_sched + 1) * sizeof(*s));
    if (!s) {
        mb->env->unlock(mb->ctx);
        view_free(mv);
        return hs__err(HS_ENOMEM, "member list: out of memory");
    }
    mb->sched = s;
    mb->sched[mb->n_sched++] = mv;
    int removed = prev && prev->rank_self >= 0 && mv->rank_self < 0;
    mb->env->wake(mb->ctx);
    mb->env->unlock(mb->ctx);

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
        hs__q_removed(mb, "members v%llu from %s leave it out", (unsigned long long)m->version,
                      from);

    hs__mb_update_sequencer(mb);
    hs__mb_connect_needed(mb);
    mb->env->accepted(mb->ctx);
    hs__q_update(mb);
    return 0;
}

void hs__mb_on_members(hs__mb *mb, hs__mpeer *p, uint32_t from_id, const hs__members *m) {
    hs__mview *mv = hs__mb_newest(mb);
    char from[64];
    snprintf(from, sizeof(from), "peer %u", from_id);
    if (mv && hs__mb_cmp(m->version, m->issuer, mv->m.version, mv->m.issuer) < 0) {
        if (p)
            hs__mb_send_members(mb, p); /* it is behind: push ours */
        return;
    }
    hs__mb_accept(mb, m, from);
    if (p) { /* both hold it now: the sequencer counts this ack */
        hs__q_tell(mb, p);
        hs__q_ack(mb, p, m->version, m->issuer);
    }
}

void hs__mb_on_heartbeat(hs__mb *mb, hs__mpeer *p, const hs__heartbeat *hb) {
    hs__mview *mv = hs__mb_newest(mb);
    if (!p || !mv)
        return;
    if (hb->round > p->known_round)
        p->known_round = hb->round;
    hs__q_ack(mb, p, hb->mver, hb->missuer);
    if (hs__mb_cmp(hb->mver, hb->missuer, mv->m.version, mv->m.issuer) < 0 &&
        hs__mb_cmp(p->members_sent_ver, p->members_sent_iss, mv->m.version, mv->m.issuer) < 0)
        hs__mb_send_members(mb, p);
}
