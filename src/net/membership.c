/* Membership's entry points for a new version (membership layer, the top of it): accepting a
 * member list (the first one, from the sequencer, MEMBERS, WELCOME) and the sequencer folding
 * what waits into the next one. The rest of the layer, bottom up: views.c (peers, versions,
 * views), quorum.c, sequencer.c, failure.c; all of it acts only through the env (membership.h).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/membership.h"

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
            hs__mb_send_join_ack(mb, j);
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
    nm.eff_round = hs__mb_choose_eff(mb);
    /* Acks for joins through this peer first, so it knows whose connection the joiner's is
     * before the new list makes it want to dial it. */
    for (int i = 0; i < mb->n_joins; i++) {
        hs__join_req *j = &mb->joins[i];
        if (j->id != HS__ID_NONE && !j->acked) {
            j->mver = nm.version;
            if (j->via == *mb->self) {
                j->acked = 1;
                hs__mb_send_join_ack(mb, j);
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
            hs__mb_send_join_ack(mb, j);
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
    int removed, err = hs__mb_add_version(mb, m, from, &removed);
    if (err <= 0)
        return err;
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
