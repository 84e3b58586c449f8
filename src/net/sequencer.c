/* The sequencer's state (membership layer): who the sequencer is (the live member with the
 * lowest id), the removals and joins waiting for the next version, the round a change takes
 * effect, and the MEMBERS and JOIN_ACK frames it sends. The commit itself is membership.c.
 *
 * Threading: loop thread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/membership.h"

#define JOIN_MEMORY 256

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

void hs__mb_send_join_ack(hs__mb *mb, hs__join_req *j) {
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
uint64_t hs__mb_choose_eff(hs__mb *mb) {
    uint64_t maxr = mb->env->round(mb->ctx);
    hs__mview *mv = hs__mb_newest(mb);
    for (uint32_t i = 0; mv && i < mv->m.n; i++) {
        hs__mpeer *p = hs__mb_find(mb, mv->m.m[i].id);
        if (p && !p->dead && p->known_round > maxr)
            maxr = p->known_round;
    }
    /* The margin lets a list reach every member before they train the round it names; while
     * every member holds before its first round (none has seen hold_members), none can. */
    int held = mb->cfg->hold_members > 1;
    for (int i = 0; held && i < mb->n_sched; i++)
        held = mb->sched[i]->m.n < (uint32_t)mb->cfg->hold_members;
    /* A held job has not trained: it starts where the newest of its resumed joiners left off
     * (every joiner of the hold is in mb->joins; none trains before the list is complete). */
    for (int i = 0; held && i < mb->n_joins; i++)
        if (mb->joins[i].resume_round > maxr)
            maxr = mb->joins[i].resume_round;
    uint64_t margin = held ? 0 : (uint64_t)mb->cfg->change_rounds;
    double by_rate = ceil(mb->round_rate * mb->cfg->change_delay_ms / 1000.0);
    if (!held && by_rate > (double)margin && by_rate < 1e9)
        margin = (uint64_t)by_rate;
    uint64_t eff = maxr + margin;
    if (mv && eff < mv->m.eff_round)
        eff = mv->m.eff_round;
    return eff;
}

void hs__mb_request_join(hs__mb *mb, uint64_t nonce, uint32_t via, const char *addr,
                         uint64_t resume_round) {
    /* The round comes from the joiner's frame: it may move a held job's first round, so one
     * past the job's end (a bug, or a peer of another job) is not trusted. */
    uint64_t bound = mb->cfg->resume_round_max;
    if (bound && resume_round > bound) {
        HS_LOGW("joiner at %s names resume round %llu, past this job's end round %llu: not "
                "counted", addr, (unsigned long long)resume_round, (unsigned long long)bound);
        resume_round = 0;
    }
    for (int i = 0; i < mb->n_joins; i++) {
        hs__join_req *j = &mb->joins[i];
        if (j->nonce != nonce)
            continue;
        j->via = via;
        if (j->id != HS__ID_NONE || j->acked)
            hs__mb_send_join_ack(mb, j); /* a repeated request */
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
    j->resume_round = resume_round;
    snprintf(j->addr, sizeof(j->addr), "%s", addr);
    hs__mb_schedule_commit(mb);
}
