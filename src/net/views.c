/* Membership's data (membership layer, the bottom of it): the peer table, the member-list
 * versions and the views they give through the topology (who this peer exchanges with under
 * each). Nothing here decides anything; membership.c, sequencer.c, failure.c and quorum.c do.
 *
 * Threading: loop thread. Versions and the peer array are appended under the env's lock (the
 * training thread reads them in view()); a version is never changed or freed once published. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/membership.h"

#define NEEDS_PERIOD_MAX 64

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


int hs__mb_add_version(hs__mb *mb, const hs__members *m, const char *from, int *removed_out) {
    *removed_out = 0;
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
    *removed_out = removed;
    return 1;
}
