/* Failure detection (membership layer): peers declared dead (silence, an end of stream without
 * BYE, refused dials, unreachable past the timeout, suspicions reported to the sequencer),
 * connections that open and close as membership sees them, whom this peer dials, and the
 * periodic tick that retries what waits.
 *
 * Threading: loop thread; (mu) fields under the env's lock (membership.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/membership.h"

#define REDIAL_DEAD_US 1000000

static void send_suspect(hs__mb *mb, hs__mpeer *dead) {
    hs__mpeer *seq = hs__mb_find(mb, mb->sequencer);
    dead->last_suspect_us = mb->env->now_us(mb->ctx);
    if (!seq || seq == dead || seq->dead)
        return;
    char why[400];
    if (dead->left)
        snprintf(why, sizeof(why), "%s", HS__LEFT);
    else
        snprintf(why, sizeof(why), "peer %u (%s) is unreachable from peer %u", dead->id, dead->addr,
                 *mb->self);
    hs__reason r;
    r.code = dead->id;
    snprintf(r.text, sizeof(r.text), "%s", why);
    hs_buf *b;
    if (hs_buf_new(&b, 64 + strlen(r.text)) < 0)
        return;
    if (hs__wire_reason_encode(b, &r) == 0)
        mb->env->send(mb->ctx, seq, 0, HS__T_SUSPECT, mb->env->round(mb->ctx), b);
    hs_buf_unref(b);
}

void hs__mb_peer_dead(hs__mb *mb, hs__mpeer *p, const char *fmt, ...) {
    if (p->dead || p->id == *mb->self)
        return;
    char why[HS__REASON_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    int left = !strcmp(why, HS__LEFT);
    p->left = left;
    if (left)
        p->departed_us = mb->env->now_us(mb->ctx);
    mb->env->lock(mb->ctx);
    p->dead = 1;
    mb->env->dead(mb->ctx, p, left, 1);
    mb->env->wake(mb->ctx);
    mb->env->unlock(mb->ctx);
    /* a cut-off peer tries it again, not at once */
    p->next_dial_us = mb->env->now_us(mb->ctx) + 1000000;
    mb->env->dead(mb->ctx, p, left, 0);
    if (left)
        HS_LOGI("peer %u (%s) left the run", p->id, p->addr);
    else
        HS_LOGW("peer %u (%s) declared dead: %s", p->id, p->addr, why);
    /* A leaver closes its connections itself, after its BYE: this one may still carry what it
     * sent before (it said BYE to another peer first, whose report this is). */
    if (p->conn && !left)
        mb->env->close(mb->ctx, p->conn, HS_ECONNRESET, 0, HS_LOG_DEBUG, "peer declared dead");
    if (p->dialing)
        mb->env->close(mb->ctx, p->dialing, HS_ECANCELED, 0, HS_LOG_DEBUG, "peer declared dead");
    if (!p->member)
        return;
    uint32_t was_sequencer = mb->sequencer;
    hs__mb_update_sequencer(mb);
    if (left && p->id == was_sequencer)
        hs__q_handover(mb);
    if (mb->is_sequencer) {
        hs__mb_remove(mb, p->id);
    } else {
        send_suspect(mb, p);
    }
    hs__q_update(mb);
}

void hs__mb_conn_lost(hs__mb *mb, hs__mpeer *p, int err, int dial_failed, int attached,
                      int got_bye, const char *why) {
    uint64_t now = mb->env->now_us(mb->ctx);
    /* Its host answers and nothing listens: it trains in no group of a partition. */
    int gone = dial_failed && err == HS_ECONNREFUSED && p->member;
    if (gone && !p->gone)
        p->departed_us = now;
    if (gone && p->dead && !p->gone) {
        p->gone = 1;
        hs__q_update(mb);
    }
    if (!p->member || p->dead)
        return;
    if (got_bye == 2) {
        hs__mb_peer_dead(mb, p, HS__LEFT);
        return;
    }
    if (dial_failed || !attached) {
        if (gone) {
            p->gone = 1;
            hs__mb_peer_dead(mb, p, "connection refused at %s (its process is gone)", p->addr);
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
        hs__mb_peer_dead(mb, p, "%s", why);
    } else if (err == HS_ECONNRESET && !got_bye) {
        hs__mb_peer_dead(mb, p, "connection lost without BYE (%s)", why);
    } else {
        p->next_dial_us = now; /* redial (if ours to dial) */
        p->unreachable_since_us = now;
    }
}

void hs__mb_on_suspect(hs__mb *mb, uint32_t from, const hs__reason *r) {
    hs__mpeer *p = hs__mb_find(mb, r->code);
    if (!mb->is_sequencer || !p || !p->member || p->id == *mb->self)
        return;
    if (p->dead) {
        hs__mb_remove(mb, p->id);
        return;
    }
    uint64_t now = mb->env->now_us(mb->ctx);
    if (p->conn &&
        now - mb->env->heard_us(mb->ctx, p) < (uint64_t)mb->cfg->peer_timeout_ms * 500) {
        HS_LOGI("peer %u suspects peer %u (%s), but it is alive here", from, p->id, r->text);
        return;
    }
    if (!strcmp(r->text, HS__LEFT)) /* it said BYE to the reporter, not (yet) to us */
        hs__mb_peer_dead(mb, p, HS__LEFT);
    else
        hs__mb_peer_dead(mb, p, "reported by peer %u: %s", from, r->text);
}

/* ------------------------------------------------------------------ connections and ticks */

void hs__mb_on_open(hs__mb *mb, hs__mpeer *p, const hs__hello *hello, int outgoing) {
    p->ever_connected = 1;
    p->gone = 0;
    p->unreachable_since_us = 0;
    p->backoff_ms = 50;
    if (p->dead && p->member) {
        mb->env->lock(mb->ctx);
        p->dead = 0;
        mb->env->unlock(mb->ctx);
        HS_LOGI("peer %u (%s) is reachable again", p->id, p->addr);
        hs__mb_update_sequencer(mb);
    }
    hs__q_on_open(p);
    HS_LOGD("peer %u (%s) connected (%s)", p->id, p->addr, outgoing ? "dialed" : "accepted");
    hs__mview *mv = hs__mb_newest(mb);
    if (mv && hs__mb_cmp(hello->mver, hello->missuer, mv->m.version, mv->m.issuer) < 0)
        hs__mb_send_members(mb, p);
    if (hello->round > p->known_round)
        p->known_round = hello->round;
    hs__q_ack(mb, p, hello->mver, hello->missuer);
    hs__q_update(mb);
}

/* Dials the peers this one exchanges with, under the version in force now and every later
 * one, plus the sequencer (which itself keeps a connection to everybody). The lower id dials;
 * the higher waits, and a needed peer that stays unreachable past the timeout is dead. */
void hs__mb_connect_needed(hs__mb *mb) {
    int quiet = mb->env->quiet(mb->ctx);
    mb->env->lock(mb->ctx);
    int skip = quiet || mb->removed || *mb->self == HS__ID_NONE;
    mb->env->unlock(mb->ctx);
    uint64_t round = mb->env->round(mb->ctx);
    if (skip || !mb->n_sched)
        return;
    uint64_t now = mb->env->now_us(mb->ctx);
    int first = 0;
    for (int i = mb->n_sched - 1; i >= 0; i--)
        if (mb->sched[i]->m.eff_round <= round) {
            first = i;
            break;
        }
    hs__mview *newest = hs__mb_newest(mb);
    for (int k = 0; k < mb->n_peers; k++) {
        hs__mpeer *p = mb->peers[k];
        if (p->id == *mb->self)
            continue;
        int needed = 0;
        if (hs__q_redial(mb, p, now))
            continue;
        /* A member dead here but kept by the sequencer (it hears from it: "alive here") was
         * wrongly declared dead, by a stall or a lost link: redialled, needed or not (it still
         * counts in whom this peer takes for the sequencer), once a second, until a
         * connection revives it (hs__mb_on_open) or a list drops it. */
        if (p->member && !p->left && !p->gone) {
            needed = mb->is_sequencer || p->id == mb->sequencer || p->dead;
            for (int i = first; i < mb->n_sched && !needed; i++) {
                hs__mview *mv = mb->sched[i];
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
        if (!p->dialing && !p->pending_conn && *mb->self < p->id && now >= p->next_dial_us) {
            hs__conn *c;
            if (mb->env->dial(mb->ctx, p, &c) == 0) {
                p->dialing = c;
                if (p->dead) /* its failures are not counted (hs__mb_conn_lost): pace it here */
                    p->next_dial_us = now + REDIAL_DEAD_US;
            } else {
                HS_LOGW("dial peer %u: %s", p->id, hs_error_message());
                p->next_dial_us = now + 1000000;
            }
        }
        uint64_t limit = (uint64_t)mb->cfg->peer_timeout_ms;
        if (!p->ever_connected)
            limit +=
                (uint64_t)mb->cfg->snapshot_timeout_ms + (uint64_t)mb->cfg->handshake_timeout_ms;
        if (!p->dead && now - p->unreachable_since_us > limit * 1000)
            hs__mb_peer_dead(mb, p, "unreachable for %llu ms",
                             (unsigned long long)((now - p->unreachable_since_us) / 1000));
    }
    (void)newest;
}

/* This process slept for gap_us, from `before` (its last tick) to now. Long enough for the
 * others to have declared it dead and removed it: a member that left or whose process is gone
 * when it looks again may have done so after a job that went on without it, so until it hears
 * from each member well after waking (seen_again), such a departure counts as not witnessed
 * (quorum.c). Departures found since `before` were found on waking: the loop may have read the
 * sockets before this tick ran. */
static void woke(hs__mb *mb, uint64_t now, uint64_t gap, uint64_t before) {
    mb->woke_us = now;
    mb->slept_ms = gap / 1000;
    mb->woke_round = mb->env->round(mb->ctx);
    for (int k = 0; k < mb->n_peers; k++) {
        hs__mpeer *p = mb->peers[k];
        if (p->id != *mb->self && (!(p->left || p->gone) || p->departed_us > before))
            p->unseen = 1;
    }
}

/* A member whose connection brings frames a quarter of a peer timeout after the wake is alive:
 * what waited in the sockets during the sleep is read at once. A connection that opens on
 * waking proves nothing by itself: a member's dial and HELLO (--insecure) wait in the listen
 * queue of a stopped process, which completes them on waking, long after that member ended. */
static void seen_again(hs__mb *mb) {
    uint64_t after = mb->woke_us + (uint64_t)mb->cfg->peer_timeout_ms * 250;
    for (int k = 0; k < mb->n_peers; k++) {
        hs__mpeer *p = mb->peers[k];
        if (p->unseen && p->conn && !p->dead && mb->env->heard_us(mb->ctx, p) > after)
            p->unseen = 0;
    }
}

void hs__mb_tick(hs__mb *mb, uint64_t now) {
    uint64_t round = mb->env->round(mb->ctx);
    /* A tick that comes half a peer timeout late: this process slept (SIGSTOP, a paused VM).
     * That time counts against no peer's reachability; the transport does the same for
     * silence (hs__conn_tick). */
    uint64_t gap = mb->last_tick_us && now > mb->last_tick_us ? now - mb->last_tick_us : 0;
    uint64_t before = mb->last_tick_us;
    mb->last_tick_us = now;
    if (gap > (uint64_t)mb->cfg->peer_timeout_ms * 500) {
        for (int k = 0; k < mb->n_peers; k++) {
            hs__mpeer *p = mb->peers[k];
            if (p->unreachable_since_us)
                p->unreachable_since_us =
                    p->unreachable_since_us + gap > now ? now : p->unreachable_since_us + gap;
        }
        woke(mb, now, gap, before);
    }
    if (mb->woke_us)
        seen_again(mb);
    /* The window starts at the first round the application reports: a resumed peer jumps from
     * 0 to its checkpoint's round, which is no speed. */
    if (!mb->round_rate_t_us || (mb->round_rate_r == 0 && round > 0 && mb->round_rate == 0)) {
        mb->round_rate_t_us = now;
        mb->round_rate_r = round;
    } else if (now - mb->round_rate_t_us >= 500000) {
        double rate =
            (double)(round - mb->round_rate_r) * 1e6 / (double)(now - mb->round_rate_t_us);
        mb->round_rate = mb->round_rate > 0 ? 0.5 * mb->round_rate + 0.5 * rate : rate;
        mb->round_rate_t_us = now;
        mb->round_rate_r = round;
    }
    hs__mview *mv = hs__mb_newest(mb);
    if (mv && *mb->self != HS__ID_NONE) {
        for (uint32_t i = 0; i < mv->m.n; i++) {
            hs__mpeer *p = hs__mb_find(mb, mv->m.m[i].id);
            if (!p || !p->dead)
                continue;
            if (mb->is_sequencer)
                hs__mb_remove(mb, p->id);
            else if (now - p->last_suspect_us > (uint64_t)mb->cfg->peer_timeout_ms * 500)
                send_suspect(mb, p);
        }
        for (int i = 0; mb->is_sequencer && i < mb->n_joins; i++)
            if (mb->joins[i].id == HS__ID_NONE && !mb->joins[i].acked)
                hs__mb_schedule_commit(mb); /* held back while there was no majority */
    }
    hs__mb_connect_needed(mb);
    hs__q_update(mb);
}
