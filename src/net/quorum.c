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
 * the stale ones stop voting before the first of them is declared dead; a joiner's connection
 * that waits for its WELCOME (it asked to join on it just now) counts too, or the sequencer of
 * a job that admits several peers at once would be cut off until the last WELCOME went out.
 * Members that left with BYE do not vote (they agreed to go), nor do members whose port refused
 * a connection (their process is gone: it trains in no group), unless this peer slept (SIGSTOP,
 * a paused VM) long enough to be removed and found the departure on waking, before it saw that
 * member alive again: the departure may be from a job that had removed this peer and trained on
 * without it, so it keeps its vote (a leave at about this peer's round, the job's end reached
 * together, does not). The sequencer names the agreed list in its QUORUM heartbeats, so that a
 * peer that takes over as sequencer starts from a recent one.
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
 *   STRANDED this peer slept and woke to find so many members gone or left meanwhile that the
 *            others it could still reach are no majority: nobody is left to readmit it or to
 *            tell it whether it was removed. Final: the application stops with the reason
 *            (a run alone would be a second job; issue 21).
 *
 * IN JOB <-> CUT OFF as connections come and go (hs__q_update after every event that can
 * change it, and on every tick); either -> REMOVED or STRANDED.
 *
 * Handover. A sequencer that says BYE (it finished, as every peer does at the end of a job)
 * leaves its successor, the next live id, without connections to the members it does not
 * exchange with, and the members without its word: by the rules above, every one of them would
 * be cut off until the successor reaches a majority and says so. A peer in the job when its
 * sequencer says BYE stays in it on the predecessor's word for 3/4 of the peer timeout (the
 * time a stale link keeps its vote, so a partition is caught no later than before), until the
 * successor says it reaches a majority (the others) or the time is up (the successor itself,
 * which dials every member meanwhile, while the others may be finishing their own leave).
 * Meanwhile it tells nobody it is out. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/membership.h"

#define REDIAL_US 1000000

static hs__mview *agreed(hs__mb *mb) {
    if (!mb->agreed && mb->n_sched)
        mb->agreed = mb->sched[0]; /* the first list this peer got: the job's, or WELCOME's */
    return mb->agreed;
}

/* Whether member i of list base votes, with *pp its peer (NULL for this one): not a member that
 * left with BYE or whose port refused, unless it did so while this peer slept (lost asleep). */
static int votes(hs__mb *mb, const hs__mview *base, uint32_t i, hs__mpeer **pp) {
    uint32_t id = base->m.m[i].id;
    hs__mpeer *p = id == *mb->self ? NULL : hs__mb_find(mb, id);
    *pp = p;
    return !(p && (p->left || p->gone) && !hs__q_lost_asleep(mb, p));
}

/* Voting members of the agreed list, and those reached (live) or holding mv (acked): 1 when
 * they are a majority. */
static int count(hs__mb *mb, const hs__mview *mv, uint32_t *got, uint32_t *voters) {
    hs__mview *base = agreed(mb);
    uint64_t now = mb->env->now_us(mb->ctx), fresh = (uint64_t)mb->cfg->peer_timeout_ms * 750;
    *got = *voters = 0;
    if (!base)
        return 0;
    for (uint32_t i = 0; i < base->m.n; i++) {
        uint32_t id = base->m.m[i].id;
        hs__mpeer *p;
        if (!votes(mb, base, i, &p))
            continue;
        (*voters)++;
        if (id == *mb->self)
            *got += !mv || hs__mb_is_member(hs__mb_newest(mb), id);
        else if (!mv) /* a joiner's connection counts while its WELCOME goes out on it */
            *got += p && !p->dead &&
                    ((p->conn && now - mb->env->heard_us(mb->ctx, p) < fresh) || p->pending_conn);
        else
            *got += p && hs__mb_cmp(p->has_ver, p->has_iss, mv->m.version, mv->m.issuer) >= 0;
    }
    return 2 * *got > *voters;
}

static int majority(hs__mb *mb, uint32_t *reached, uint32_t *voters) {
    return count(mb, NULL, reached, voters);
}

/* The sequencer: the newest list a majority of the agreed one holds becomes the agreed one. */
static void advance_agreed(hs__mb *mb) {
    hs__mview *base = agreed(mb);
    uint32_t got, voters;
    for (int i = mb->n_sched - 1; i >= 0 && mb->sched[i] != base; i--) {
        if (count(mb, mb->sched[i], &got, &voters)) {
            mb->agreed = mb->sched[i];
            HS_LOGD("members v%llu agreed (%u of %u hold it)",
                    (unsigned long long)mb->agreed->m.version, got, voters);
            return;
        }
    }
}

void hs__q_ack(hs__mb *mb, hs__mpeer *p, uint64_t ver, uint32_t iss) {
    if (hs__mb_cmp(ver, iss, p->has_ver, p->has_iss) <= 0)
        return;
    p->has_ver = ver;
    p->has_iss = iss;
    hs__q_update(mb);
}

void hs__q_tell(hs__mb *mb, hs__mpeer *p) {
    hs__heartbeat hb = {HS__HB_BEAT, 0, mb->env->round(mb->ctx), 0, 0};
    hs__mview *mv = hs__mb_newest(mb);
    hs_buf *b;
    if (!mv || !p->conn || hs_buf_new(&b, HS__HB_LEN) < 0)
        return;
    hb.mver = mv->m.version;
    hb.missuer = mv->m.issuer;
    if (hs__wire_heartbeat_encode(b, &hb) == 0)
        mb->env->send(mb->ctx, p, 1, HS__T_HEARTBEAT, hb.round, b);
    hs_buf_unref(b);
}

int hs__q_majority(hs__mb *mb) {
    uint32_t reached, voters;
    return majority(mb, &reached, &voters);
}

/* QUORUM: ok, and (in the membership fields) the agreed list. */
static void send_status(hs__mb *mb, hs__mpeer *p, int ok) {
    hs__heartbeat hb = {HS__HB_QUORUM, (uint64_t)ok, mb->env->round(mb->ctx), 0, 0};
    hs__mview *mv = agreed(mb);
    if (mv) {
        hb.mver = mv->m.version;
        hb.missuer = mv->m.issuer;
    }
    hs_buf *b;
    if (hs_buf_new(&b, HS__HB_LEN) < 0)
        return;
    if (hs__wire_heartbeat_encode(b, &hb) == 0 &&
        mb->env->send(mb->ctx, p, 1, HS__T_HEARTBEAT, hb.round, b) == 0) {
        p->told_quorum = ok + 1;
        p->told_agreed = hb.mver;
    }
    hs_buf_unref(b);
}

int hs__q_lost_asleep(hs__mb *mb, const hs__mpeer *p) {
    if (!p->unseen || !(p->left || p->gone))
        return 0;
    /* A member that said BYE named its round: at about this peer's, the job's end reached
     * together, whatever its port says after. */
    return p->left ? p->known_round > mb->env->round(mb->ctx) + 1 : p->gone;
}

/* The job vouches for this peer again after a sleep: the departures it finds from now on are
 * witnessed as usual. Without this the marks of members it has no connection to (in a ring of
 * 6 or more, all but its neighbours and the sequencer) would last the whole run, and a departure
 * found long after a pause too short to be removed (a loaded machine) would strand it. */
static void end_sleep(hs__mb *mb, const char *how) {
    for (int k = 0; k < mb->n_peers; k++)
        mb->peers[k]->unseen = 0;
    mb->woke_us = 0;
    HS_LOGD("back in the job after a stop of %llu ms: %s", (unsigned long long)mb->slept_ms, how);
}

/* Evidence that the job goes on with this peer, heard a quarter of a peer timeout after waking
 * (seen_again clears a member's mark only then): as a member, the sequencer heard and saying it
 * reaches a majority (a job that had removed this peer would have said so first, on the same
 * connection); as the sequencer, a majority of the voters so heard. */
static void vouched(hs__mb *mb, int seq_ok) {
    if (!mb->woke_us)
        return;
    if (!mb->is_sequencer) {
        hs__mpeer *s = hs__mb_find(mb, mb->sequencer);
        if (s && s->conn && !s->dead && s->says_quorum && !s->unseen)
            end_sleep(mb, "the sequencer says it reaches a majority");
        return;
    }
    hs__mview *base = agreed(mb);
    uint32_t voters = 0, fresh = 0;
    for (uint32_t i = 0; seq_ok && base && i < base->m.n; i++) {
        hs__mpeer *p;
        if (!votes(mb, base, i, &p))
            continue;
        voters++;
        fresh += base->m.m[i].id == *mb->self || (p && p->conn && !p->dead && !p->unseen);
    }
    if (2 * fresh > voters)
        end_sleep(mb, "a majority of its members heard since");
}

/* STRANDED: the agreed list's voters, less those lost while this peer slept, are no majority
 * even all reached (1 then, logged once, with the reason hs_net_in_job gives). */
static int stranded(hs__mb *mb) {
    hs__mview *base = agreed(mb);
    uint32_t voters = 0, lost = 0;
    char who[HS__REASON_MAX / 2] = "";
    size_t len = 0;
    for (uint32_t i = 0; base && i < base->m.n; i++) {
        hs__mpeer *p;
        if (!votes(mb, base, i, &p))
            continue;
        int lost_p = p && hs__q_lost_asleep(mb, p);
        voters++;
        if (!lost_p)
            continue;
        lost++;
        int w = p->gone ? snprintf(who + len, sizeof(who) - len, "%speer %u gone", len ? ", " : "",
                                   p->id)
                        : snprintf(who + len, sizeof(who) - len, "%speer %u left at round %llu",
                                   len ? ", " : "", p->id, (unsigned long long)p->known_round);
        len = w > 0 && len + (size_t)w < sizeof(who) ? len + (size_t)w : len;
    }
    if (!lost || 2 * (voters - lost) > voters)
        return 0;
    char what[64], why[HS__REASON_MAX + 1];
    if (lost + 1 == voters)
        snprintf(what, sizeof(what), "every other member of the job");
    else
        snprintf(what, sizeof(what), "%u of the job's %u members", lost, voters);
    snprintf(why, sizeof(why),
             "this peer was stopped (or starved) for %llu ms, and woke at round %llu to find %s "
             "gone meanwhile (%s)%s: it cannot get back into the job, and stops rather than train "
             "alone",
             (unsigned long long)mb->slept_ms, (unsigned long long)mb->woke_round, what,
             who, lost + 1 == voters ? "" : ", and those left are no majority");
    mb->env->lock(mb->ctx);
    mb->stranded = 1;
    mb->in_job = 0;
    snprintf(mb->stranded_why, sizeof(mb->stranded_why), "%s", why);
    mb->env->wake(mb->ctx);
    mb->env->unlock(mb->ctx);
    HS_LOGE("%s", why);
    return 1;
}

void hs__q_update(hs__mb *mb) {
    int quiet = mb->env->quiet(mb->ctx);
    mb->env->lock(mb->ctx);
    int skip = quiet || *mb->self == HS__ID_NONE || mb->stranded;
    int removed = mb->removed, was = mb->in_job;
    mb->env->unlock(mb->ctx);
    if (skip || (!removed && mb->woke_us && stranded(mb)))
        return;
    if (!removed && mb->is_sequencer)
        advance_agreed(mb);
    uint32_t reached = 0, voters = 0;
    int seq_ok = !removed && mb->is_sequencer && majority(mb, &reached, &voters);
    int in = seq_ok;
    if (!removed && !mb->is_sequencer) {
        hs__mpeer *s = hs__mb_find(mb, mb->sequencer);
        in = s && s->conn && !s->dead && s->says_quorum;
    }
    /* A member's handover ends with the successor's word; the successor's own lasts its time,
     * while it dials the members it did not exchange with (and the others finish leaving). */
    int handover = !removed && mb->env->now_us(mb->ctx) < mb->handover_until_us &&
                   !(in && !mb->is_sequencer);
    if (!handover)
        mb->handover_until_us = 0;
    in |= handover;
    if (!removed && !handover)
        vouched(mb, seq_ok);
    if (in != was) {
        mb->env->lock(mb->ctx);
        mb->in_job = in;
        mb->env->wake(mb->ctx);
        mb->env->unlock(mb->ctx);
        if (in)
            HS_LOGI("in touch with the job (a majority of members v%llu)%s",
                    (unsigned long long)agreed(mb)->m.version,
                    mb->is_sequencer ? ", as its sequencer" : "");
        else if (!removed && mb->is_sequencer)
            HS_LOGW(
                "cut off from the job: this sequencer reaches %u of %u members, not a majority; "
                "no training and no membership change until it does",
                reached, voters);
        else if (!removed)
            HS_LOGW("cut off from the job: the sequencer (peer %u) is not reachable or reaches no "
                    "majority; no training until it does",
                    mb->sequencer);
    }
    for (int i = 0; i < mb->n_peers; i++) {
        hs__mpeer *p = mb->peers[i];
        if (p->conn && (seq_ok || !handover) &&
            (p->told_quorum != seq_ok + 1 || (seq_ok && p->told_agreed != mb->agreed->m.version)))
            send_status(mb, p, seq_ok);
    }
}

void hs__q_handover(hs__mb *mb) {
    if (!mb->in_job || mb->removed)
        return;
    mb->handover_until_us = mb->env->now_us(mb->ctx) + (uint64_t)mb->cfg->peer_timeout_ms * 750;
    HS_LOGD("the sequencer left: in the job on its word while peer %u takes over",
            mb->sequencer);
}

void hs__q_on_status(hs__mb *mb, hs__mpeer *p, uint32_t from, const hs__heartbeat *hb) {
    if (!p)
        return;
    p->says_quorum = hb->token != 0;
    /* The sequencer's agreed list, if this peer holds it: the base should it take over. */
    hs__mview *base = agreed(mb);
    for (int i = mb->n_sched - 1; hb->token && from == mb->sequencer && i >= 0; i--) {
        hs__mview *mv = mb->sched[i];
        if (mv == base)
            break;
        if (mv->m.version == hb->mver && mv->m.issuer == hb->missuer) {
            mb->agreed = mv;
            break;
        }
    }
    hs__q_update(mb);
}

void hs__q_on_open(hs__mpeer *p) {
    p->told_quorum = 0;
    p->says_quorum = 0;
}

int hs__q_redial(hs__mb *mb, hs__mpeer *p, uint64_t now) {
    if (mb->in_job || !p->member || p->gone || p->dialing || p->conn || now < p->next_dial_us)
        return 0;
    /* A live one the lower id dials as usual unless that takes long (crossing dials would
     * replace each other's connections). */
    uint64_t late = (uint64_t)mb->cfg->peer_timeout_ms * 500;
    if (!p->dead && (!p->unreachable_since_us || now - p->unreachable_since_us < late))
        return 0;
    p->next_dial_us = now + REDIAL_US;
    hs__conn *c;
    if (mb->env->dial(mb->ctx, p, &c) == 0)
        p->dialing = c;
    return 1;
}

void hs__q_removed(hs__mb *mb, const char *fmt, ...) {
    char why[sizeof(mb->removed_why)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    mb->env->lock(mb->ctx);
    int was = mb->removed;
    mb->removed = 1;
    mb->in_job = 0;
    if (!was)
        snprintf(mb->removed_why, sizeof(mb->removed_why), "%s", why);
    mb->env->wake(mb->ctx);
    mb->env->unlock(mb->ctx);
    if (!was)
        HS_LOGE("this peer (id %u) was removed from the job: %s", *mb->self, why);
}
