/* The membership state machine on its own: no sockets, no loop, no threads. A fake env records
 * what it decides (frames to send, dials, commit timers, join answers) and gives it a clock and
 * a training round the test sets, so timeouts are exact: a failure is declared only after the
 * peer timeout, the sequencer commits no change without a majority, and a committed version
 * takes effect at the round it names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/error.h"
#include "net/membership.h"

/* Connections are the transport's; membership only compares them with NULL. */
struct hs__conn {
    int unused;
};

#define MAXP 16
#define MAXSENT 256

typedef struct fpeer {
    hs__mpeer m;
    uint64_t heard_us;
} fpeer;

typedef struct fake {
    uint64_t now_us, round;
    uint32_t self;
    fpeer peers[MAXP];
    int n_peers;
    struct hs__conn conns[MAXP];
    int n_conns;
    struct {
        uint32_t to;
        uint8_t type;
        int on_conn;
    } sent[MAXSENT];
    int n_sent;
    int dials, scheduled, accepted, closed, dead;
    hs__join ack;
    int n_acks;
} fake;

static uint64_t f_now(void *ctx) { return ((fake *)ctx)->now_us; }
static uint64_t f_round(void *ctx) { return ((fake *)ctx)->round; }
static void f_nop(void *ctx) { (void)ctx; }
static int f_quiet(void *ctx) {
    (void)ctx;
    return 0;
}

static hs__mpeer *f_peer_new(void *ctx, uint32_t id, const char *addr) {
    fake *f = ctx;
    assert_true(f->n_peers < MAXP);
    fpeer *p = &f->peers[f->n_peers++];
    memset(p, 0, sizeof(*p));
    p->m.id = id;
    if (addr)
        strncpy(p->m.addr, addr, sizeof(p->m.addr) - 1);
    return &p->m;
}

static uint64_t f_heard(void *ctx, const hs__mpeer *p) {
    (void)ctx;
    return ((const fpeer *)p)->heard_us;
}

static int f_send(void *ctx, hs__mpeer *p, int on_conn, uint8_t type, uint64_t round,
                  hs_buf *payload) {
    fake *f = ctx;
    (void)round;
    (void)payload;
    assert_true(f->n_sent < MAXSENT);
    f->sent[f->n_sent].to = p->id;
    f->sent[f->n_sent].type = type;
    f->sent[f->n_sent].on_conn = on_conn;
    f->n_sent++;
    return 0;
}

static hs__conn *new_conn(fake *f) {
    assert_true(f->n_conns < MAXP);
    return &f->conns[f->n_conns++];
}

static int f_dial(void *ctx, hs__mpeer *p, hs__conn **out) {
    fake *f = ctx;
    (void)p;
    f->dials++;
    *out = new_conn(f);
    return 0;
}

static void f_close(void *ctx, hs__conn *c, int err, int bye, hs_log_level level, const char *why) {
    (void)c, (void)err, (void)bye, (void)level, (void)why;
    ((fake *)ctx)->closed++;
}

static void f_dead(void *ctx, hs__mpeer *p, int left, int locked) {
    (void)p, (void)left;
    ((fake *)ctx)->dead += locked;
}

static void f_join_ack(void *ctx, const hs__join *ack) {
    fake *f = ctx;
    f->ack = *ack;
    f->n_acks++;
}

static void f_accepted(void *ctx) { ((fake *)ctx)->accepted++; }

static void f_schedule(void *ctx, int ms) {
    (void)ms;
    ((fake *)ctx)->scheduled++;
}

static const hs__mb_env fenv = {
    .now_us = f_now,
    .round = f_round,
    .lock = f_nop,
    .unlock = f_nop,
    .wake = f_nop,
    .quiet = f_quiet,
    .peer_new = f_peer_new,
    .heard_us = f_heard,
    .send = f_send,
    .dial = f_dial,
    .close = f_close,
    .dead = f_dead,
    .join_ack = f_join_ack,
    .accepted = f_accepted,
    .schedule = f_schedule,
};

static hs_net_config cfg;
static const char *topo = "complete"; /* the topology start_as gives the run */

/* Peer self with members 0..n-1 in force from round 0 (peer 0 is the sequencer). */
static void start_as(hs__mb *mb, fake *f, int n, uint32_t self) {
    memset(f, 0, sizeof(*f));
    memset(mb, 0, sizeof(*mb));
    hs_net_config_init(&cfg);
    f->now_us = 1000000;
    f->self = self;
    mb->env = &fenv;
    mb->ctx = f;
    mb->cfg = &cfg;
    mb->self = &f->self;
    mb->advertise = "127.0.0.1:7000";
    mb->topo_spec = topo;
    hs__member mm[MAXP];
    memset(mm, 0, sizeof(mm));
    for (int i = 0; i < n; i++) {
        mm[i].id = (uint32_t)i;
        snprintf(mm[i].addr, sizeof(mm[i].addr), "127.0.0.1:%d", 7000 + i);
    }
    hs__members m = {1, 0, 0, (uint32_t)n, (uint32_t)n, mm};
    assert_int_equal(hs__mb_accept(mb, &m, "the test"), 0);
    assert_int_equal(mb->n_sched, 1);
    assert_int_equal(mb->is_sequencer, self == 0);
}

/* Peer 0 (the sequencer: the lowest id) with members 0..n-1 in force from round 0. */
static void start(hs__mb *mb, fake *f, int n) { start_as(mb, f, n, 0); }

static fpeer *peer(hs__mb *mb, uint32_t id) {
    hs__mpeer *p = hs__mb_find(mb, id);
    assert_non_null(p);
    return (fpeer *)p;
}

/* The owner attaches a connection, then tells membership (as net.c does). */
static void connect(hs__mb *mb, fake *f, uint32_t id, uint64_t round) {
    fpeer *p = peer(mb, id);
    hs__hello h;
    memset(&h, 0, sizeof(h));
    h.peer_id = id;
    h.round = round;
    h.mver = hs__mb_newest(mb)->m.version;
    h.missuer = hs__mb_newest(mb)->m.issuer;
    p->m.dialing = NULL;
    p->m.conn = new_conn(f);
    p->heard_us = f->now_us;
    hs__mb_on_open(mb, &p->m, &h, 1);
}

static void disconnect(hs__mb *mb, uint32_t id, int err, int got_bye) {
    fpeer *p = peer(mb, id);
    p->m.conn = NULL;
    hs__mb_conn_lost(mb, &p->m, err, 0, 1, got_bye, "test");
}

/* The sequencer (peer 0) says it reaches a majority: this member is in the job. */
static void sequencer_ok(hs__mb *mb) {
    hs__heartbeat hb = {HS__HB_QUORUM, 1, 0, hs__mb_newest(mb)->m.version,
                        hs__mb_newest(mb)->m.issuer};
    hs__q_on_status(mb, &peer(mb, 0)->m, 0, &hb);
    assert_true(mb->in_job);
}

/* n ticks of 100 ms in which peer a (and b, unless HS__ID_NONE) is heard from. */
static void ticks(hs__mb *mb, fake *f, int n, uint32_t a, uint32_t b) {
    for (int i = 0; i < n; i++) {
        f->now_us += 100000;
        peer(mb, a)->heard_us = f->now_us;
        if (b != HS__ID_NONE)
            peer(mb, b)->heard_us = f->now_us;
        hs__mb_tick(mb, f->now_us);
    }
}

static int sent_to(const fake *f, uint32_t to, uint8_t type) {
    int n = 0;
    for (int i = 0; i < f->n_sent; i++)
        n += f->sent[i].to == to && f->sent[i].type == type;
    return n;
}

/* A needed peer whose connection went (without a verdict) is declared dead only once it has
 * been unreachable for longer than the peer timeout; then the sequencer removes it. */
static void test_failure_after_timeout(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    start(&mb, &f, 3);
    assert_int_equal(f.dials, 2); /* the lower id dials both */
    connect(&mb, &f, 1, 0);
    connect(&mb, &f, 2, 0);
    /* BYE(close) and an end of stream: no verdict, redial. */
    disconnect(&mb, 2, HS_ECONNRESET, 1);
    assert_false(peer(&mb, 2)->m.dead);
    uint64_t t0 = f.now_us, to = (uint64_t)cfg.peer_timeout_ms * 1000;
    for (uint64_t t = t0; t <= t0 + to; t += 100000) {
        f.now_us = t;
        peer(&mb, 1)->heard_us = t;
        hs__mb_tick(&mb, t);
        assert_false(peer(&mb, 2)->m.dead);
    }
    assert_int_equal(f.scheduled, 0);
    f.now_us = t0 + to + 1000;
    hs__mb_tick(&mb, f.now_us);
    assert_true(peer(&mb, 2)->m.dead);
    assert_int_equal(f.dead, 1);
    assert_int_equal(f.scheduled, 1); /* its removal waits for the commit timer */
    assert_int_equal(mb.n_sched, 1);
    peer(&mb, 1)->heard_us = f.now_us;
    hs__mb_commit(&mb);
    assert_int_equal(mb.n_sched, 2);
    hs__mview *mv = hs__mb_newest(&mb);
    assert_int_equal(mv->m.n, 2);
    assert_true(hs__mb_is_member(mv, 1));
    assert_false(hs__mb_is_member(mv, 2));
    assert_int_equal(sent_to(&f, 1, HS__T_MEMBERS), 1);
    /* Agreed once a majority of the previous agreed list (3 voters) holds it. */
    assert_ptr_equal(mb.agreed, mb.sched[0]);
    hs__q_ack(&mb, &peer(&mb, 1)->m, mv->m.version, mv->m.issuer);
    assert_ptr_equal(mb.agreed, mv);
    hs__mb_free(&mb);
}

/* Silence on an open connection (the transport's timeout) is a verdict at once. */
static void test_failure_on_silence(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    start(&mb, &f, 3);
    connect(&mb, &f, 1, 0);
    connect(&mb, &f, 2, 0);
    disconnect(&mb, 1, HS_ETIMEDOUT, 0);
    assert_true(peer(&mb, 1)->m.dead);
    assert_false(peer(&mb, 2)->m.dead);
    assert_int_equal(f.scheduled, 1);
    hs__mb_free(&mb);
}

/* The sequencer reaching 2 of 5 members commits nothing (it may be a partition's minority);
 * with a third it commits the waiting join, with the next id. */
static void test_no_change_without_majority(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    start(&mb, &f, 5);
    connect(&mb, &f, 1, 0);
    assert_false(hs__q_majority(&mb));
    assert_false(mb.in_job);
    hs__mb_request_join(&mb, 42, 0, "127.0.0.1:7100", 0);
    assert_int_equal(f.scheduled, 1);
    hs__mb_commit(&mb);
    assert_int_equal(mb.n_sched, 1);
    assert_int_equal(f.n_acks, 0);
    /* A heard-from peer that has gone quiet for 3/4 of the timeout votes no more. */
    connect(&mb, &f, 2, 0);
    assert_true(hs__q_majority(&mb));
    assert_true(mb.in_job);
    f.now_us += (uint64_t)cfg.peer_timeout_ms * 750 + 1000;
    peer(&mb, 1)->heard_us = f.now_us;
    assert_false(hs__q_majority(&mb));
    peer(&mb, 2)->heard_us = f.now_us;
    hs__mb_tick(&mb, f.now_us); /* the held-back join is tried again */
    assert_int_equal(f.scheduled, 2);
    hs__mb_commit(&mb);
    assert_int_equal(mb.n_sched, 2);
    hs__mview *mv = hs__mb_newest(&mb);
    assert_int_equal(mv->m.n, 6);
    assert_true(hs__mb_is_member(mv, 5));
    assert_int_equal(mv->m.next_id, 6);
    assert_int_equal(f.n_acks, 1);
    assert_int_equal(f.ack.nonce, 42);
    assert_int_equal(f.ack.id, 5);
    assert_int_equal(f.ack.mver, mv->m.version);
    /* The same nonce again gets the same answer, and no new version. */
    hs__mb_request_join(&mb, 42, 0, "127.0.0.1:7100", 0);
    assert_int_equal(f.n_acks, 2);
    assert_int_equal(f.ack.id, 5);
    hs__mb_commit(&mb);
    assert_int_equal(mb.n_sched, 2);
    hs__mb_free(&mb);
}

/* A change takes effect at the highest round known plus change_rounds; until then the old
 * version is in force. */
static void test_view_at_agreed_round(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    start(&mb, &f, 3);
    f.round = 7;
    connect(&mb, &f, 1, 10); /* peer 1 is ahead: round 10 */
    connect(&mb, &f, 2, 3);
    hs__mb_request_join(&mb, 9, 0, "127.0.0.1:7200", 0);
    hs__mb_commit(&mb);
    assert_int_equal(mb.n_sched, 2);
    uint64_t eff = 10 + (uint64_t)cfg.change_rounds;
    assert_int_equal(hs__mb_newest(&mb)->m.eff_round, eff);
    assert_ptr_equal(hs__mb_at(&mb, eff - 1), mb.sched[0]);
    assert_ptr_equal(hs__mb_at(&mb, eff), mb.sched[1]);
    assert_int_equal(sent_to(&f, 1, HS__T_MEMBERS), 1);
    assert_int_equal(sent_to(&f, 2, HS__T_MEMBERS), 1);
    hs__mb_free(&mb);
}

/* Versions are ordered by (version, issuer): an older list is answered with ours, a newer one
 * is accepted, and a list that leaves this peer out removes it. */
static void test_members_ordering(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    start(&mb, &f, 3);
    connect(&mb, &f, 1, 0);
    hs__member mm[2] = {{0, "127.0.0.1:7000"}, {1, "127.0.0.1:7001"}};
    hs__members old = {0, 0, 0, 3, 2, mm};
    int before = sent_to(&f, 1, HS__T_MEMBERS);
    hs__mb_on_members(&mb, &peer(&mb, 1)->m, 1, &old);
    assert_int_equal(mb.n_sched, 1);
    assert_int_equal(sent_to(&f, 1, HS__T_MEMBERS), before + 1);
    hs__member others[2] = {{1, "127.0.0.1:7001"}, {2, "127.0.0.1:7002"}};
    hs__members without = {2, 1, 5, 3, 2, others};
    hs__mb_on_members(&mb, &peer(&mb, 1)->m, 1, &without);
    assert_int_equal(mb.n_sched, 2);
    assert_true(mb.removed);
    assert_false(mb.in_job);
    hs__mb_free(&mb);
}

/* A member declared dead here that the sequencer keeps ("alive here": a stall or a lost link
 * fooled only this peer) is redialled, once a second, by the lower id, and the connection
 * revives it; its suspicions stop. */
static void test_wrongly_dead_redialled(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    start_as(&mb, &f, 3, 1);
    assert_int_equal(f.dials, 1); /* peer 2: the lower id dials; peer 0 dials us */
    connect(&mb, &f, 0, 0);
    sequencer_ok(&mb);
    connect(&mb, &f, 2, 0);
    disconnect(&mb, 2, HS_ETIMEDOUT, 0);
    assert_true(mb.in_job); /* in the job: not a cut-off peer's redials (hs__q_redial) */
    assert_true(peer(&mb, 2)->m.dead);
    assert_int_equal(sent_to(&f, 0, HS__T_SUSPECT), 1);
    /* The sequencer sends no list without it. Not at once (a cut-off peer waits a second)... */
    int dials = f.dials;
    ticks(&mb, &f, 5, 0, HS__ID_NONE);
    assert_int_equal(f.dials, dials);
    /* ...but within the next second, and not again while that dial is under way. */
    ticks(&mb, &f, 10, 0, HS__ID_NONE);
    assert_int_equal(f.dials, dials + 1);
    assert_non_null(peer(&mb, 2)->m.dialing);
    /* The dial fails (the other side was still frozen): once a second again, not every tick. */
    peer(&mb, 2)->m.dialing = NULL;
    hs__mb_conn_lost(&mb, &peer(&mb, 2)->m, HS_ETIMEDOUT, 1, 0, 0, "test");
    /* the dial went at +1.0 s; now +1.5 s, up to +1.9 s */
    ticks(&mb, &f, 4, 0, HS__ID_NONE);
    assert_int_equal(f.dials, dials + 1);
    ticks(&mb, &f, 2, 0, HS__ID_NONE);
    assert_int_equal(f.dials, dials + 2);
    connect(&mb, &f, 2, 0);
    assert_false(peer(&mb, 2)->m.dead);
    int suspects = sent_to(&f, 0, HS__T_SUSPECT);
    ticks(&mb, &f, 30, 0, 2);
    assert_int_equal(sent_to(&f, 0, HS__T_SUSPECT), suspects);
    assert_false(peer(&mb, 2)->m.dead);
    /* The higher id waits for the lower one's dial. */
    hs__mb_free(&mb);
    start_as(&mb, &f, 3, 2);
    connect(&mb, &f, 0, 0);
    sequencer_ok(&mb);
    connect(&mb, &f, 1, 0);
    disconnect(&mb, 1, HS_ETIMEDOUT, 0);
    dials = f.dials;
    ticks(&mb, &f, 30, 0, HS__ID_NONE);
    assert_int_equal(f.dials, dials);
    connect(&mb, &f, 1, 0);
    assert_false(peer(&mb, 1)->m.dead);
    hs__mb_free(&mb);
}

/* Not a neighbour either (a connection left from an earlier view, or the sequencer's
 * reports): a member dead here is redialled all the same, since it still counts in whom this
 * peer takes for the sequencer and its suspicions would go on for ever. */
static void test_wrongly_dead_redialled_not_needed(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    topo = "ring"; /* 0-1-2-3-4-0: peer 1 exchanges with 0 and 2 */
    start_as(&mb, &f, 5, 1);
    topo = "complete";
    connect(&mb, &f, 0, 0);
    sequencer_ok(&mb);
    connect(&mb, &f, 2, 0);
    connect(&mb, &f, 3, 0);
    disconnect(&mb, 3, HS_ETIMEDOUT, 0);
    assert_true(peer(&mb, 3)->m.dead);
    int dials = f.dials;
    ticks(&mb, &f, 15, 0, 2);
    assert_int_equal(f.dials, dials + 1);
    assert_non_null(peer(&mb, 3)->m.dialing);
    connect(&mb, &f, 3, 0);
    assert_false(peer(&mb, 3)->m.dead);
    hs__mb_free(&mb);
}

/* A tick half a peer timeout late means this process slept (SIGSTOP, a paused VM): that time
 * counts against no peer. A needed peer still unreachable is declared dead only after a full
 * timeout of ticks that came on time. */
static void test_own_sleep_not_counted(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    start(&mb, &f, 3);
    connect(&mb, &f, 1, 0);
    connect(&mb, &f, 2, 0);
    disconnect(&mb, 2, HS_ECONNRESET, 1); /* no verdict: unreachable from now */
    hs__mb_tick(&mb, f.now_us);
    uint64_t to = (uint64_t)cfg.peer_timeout_ms * 1000;
    f.now_us += to / 2;
    peer(&mb, 1)->heard_us = f.now_us;
    hs__mb_tick(&mb, f.now_us);
    f.now_us += 7000000; /* stopped for 7 s */
    peer(&mb, 1)->heard_us = f.now_us;
    hs__mb_tick(&mb, f.now_us);
    assert_false(peer(&mb, 2)->m.dead);
    for (uint64_t t = 0; t + 100000 < to / 2; t += 100000) {
        f.now_us += 100000;
        peer(&mb, 1)->heard_us = f.now_us;
        hs__mb_tick(&mb, f.now_us);
        assert_false(peer(&mb, 2)->m.dead);
    }
    for (int i = 0; i < 20 && !peer(&mb, 2)->m.dead; i++) {
        f.now_us += 100000;
        peer(&mb, 1)->heard_us = f.now_us;
        hs__mb_tick(&mb, f.now_us);
    }
    assert_true(peer(&mb, 2)->m.dead);
    hs__mb_free(&mb);
}

/* Peer 3 of 4, in the job, its connections to 0, 1 and 2 open; stopped for 5 s when `stop`. */
static void woken(hs__mb *mb, fake *f, int stop) {
    start_as(mb, f, 4, 3);
    for (uint32_t i = 0; i < 3; i++)
        connect(mb, f, i, 10);
    sequencer_ok(mb);
    f->round = 10;
    hs__mb_tick(mb, f->now_us);
    f->now_us += stop ? 5000000 : 100000;
    hs__mb_tick(mb, f->now_us);
}

/* Member id is found gone: its connection breaks, and its port refuses the dial. */
static void gone(hs__mb *mb, uint32_t id) {
    fpeer *p = peer(mb, id);
    p->m.conn = NULL;
    hs__mb_conn_lost(mb, &p->m, HS_EPIPE, 0, 1, 0, "write: broken pipe");
    hs__mb_conn_lost(mb, &p->m, HS_ECONNREFUSED, 1, 0, 0, "refused");
    assert_true(p->m.gone);
}

/* Member id says BYE (leaving) at round r. */
static void leaves(hs__mb *mb, uint32_t id, uint64_t r) {
    peer(mb, id)->m.known_round = r;
    disconnect(mb, id, HS_ECONNRESET, 2);
    assert_true(peer(mb, id)->m.left);
}

/* A peer that slept long enough to be removed and woke to find the others gone (their ports
 * refuse, or they left with BYE at a round past its own) cannot tell a job that removed it and
 * ended from members that crashed: it is stranded (final, never in the job) as soon as those it
 * could still reach are no majority. One that did not sleep, or that saw a member alive after
 * waking, or whose members left at its own round (the job's end), keeps the usual rule. */
static void test_woke_to_a_job_gone(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    /* Stopped: two of the three found gone leave it no majority to reach. */
    woken(&mb, &f, 1);
    gone(&mb, 0);
    assert_false(mb.stranded);
    gone(&mb, 1);
    assert_true(mb.stranded);
    assert_false(mb.in_job);
    assert_non_null(strstr(mb.stranded_why, "stopped (or starved) for 5000 ms"));
    assert_non_null(strstr(mb.stranded_why, "peer 0 gone, peer 1 gone"));
    gone(&mb, 2);
    assert_false(mb.in_job);
    hs__mb_free(&mb);
    /* Not stopped: members that crash vote no more, and the survivor trains on. */
    woken(&mb, &f, 0);
    for (uint32_t i = 0; i < 3; i++)
        gone(&mb, i);
    assert_false(mb.stranded);
    assert_true(mb.in_job);
    hs__mb_free(&mb);
    /* Stopped; the others said BYE at round 60, past its 10: a job it did not train. */
    woken(&mb, &f, 1);
    for (uint32_t i = 0; i < 3; i++)
        leaves(&mb, i, 60);
    assert_true(mb.stranded);
    assert_non_null(strstr(mb.stranded_why, "peer 0 left at round 60"));
    hs__mb_free(&mb);
    /* Stopped; the others left at its own round (the job's end, reached together). */
    woken(&mb, &f, 1);
    for (uint32_t i = 0; i < 3; i++)
        leaves(&mb, i, 11);
    assert_false(mb.stranded);
    hs__mb_free(&mb);
    /* Stopped; a connection from peer 0 that opens on waking (its dial and HELLO waited in the
     * listen queue) proves nothing; frames a quarter of a peer timeout after waking do: peers 0
     * and 1 heard then crash witnessed, peer 2 not heard keeps its vote (1 of 2 is no majority).
     */
    woken(&mb, &f, 1);
    peer(&mb, 0)->m.conn = NULL;
    connect(&mb, &f, 0, 10);
    assert_true(peer(&mb, 0)->m.unseen);
    ticks(&mb, &f, cfg.peer_timeout_ms / 400 + 1, 0, 1);
    assert_false(peer(&mb, 0)->m.unseen);
    assert_false(peer(&mb, 1)->m.unseen);
    assert_true(peer(&mb, 2)->m.unseen);
    gone(&mb, 0);
    gone(&mb, 1);
    assert_false(mb.stranded);
    gone(&mb, 2);
    assert_true(mb.stranded);
    assert_non_null(strstr(mb.stranded_why, "every other member of the job gone meanwhile (peer 2"));
    hs__mb_free(&mb);
    /* Stopped; the sequencer heard a quarter of a peer timeout after waking, still saying it
     * reaches a majority: the job vouches for this peer, every mark goes (peer 2's too, never
     * heard), and members that crash later vote no more, as without the stop. */
    woken(&mb, &f, 1);
    ticks(&mb, &f, cfg.peer_timeout_ms / 400 + 1, 0, HS__ID_NONE);
    assert_int_equal(mb.woke_us, 0);
    assert_false(peer(&mb, 2)->m.unseen);
    for (uint32_t i = 0; i < 3; i++)
        gone(&mb, i);
    assert_false(mb.stranded);
    assert_true(mb.in_job);
    hs__mb_free(&mb);
}

/* The sequencer's BYE at the end of a job is a handover, not a loss: its successor (the next
 * id) is not connected to the members it does not exchange with yet, yet neither it nor they
 * are cut off while it takes over, for up to 3/4 of the peer timeout; a successor that never
 * confirms leaves them cut off after that, as a lost sequencer does. */
static void test_sequencer_bye_is_a_handover(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    uint64_t fresh = (uint64_t)cfg.peer_timeout_ms * 750;
    topo = "ring"; /* 0-1-2-3-0: peer 3 exchanges with 0 and 2, peer 1 with 0 and 2 */
    /* A member: the successor (peer 1) confirms. */
    start_as(&mb, &f, 4, 3);
    connect(&mb, &f, 0, 0);
    connect(&mb, &f, 2, 0);
    sequencer_ok(&mb);
    disconnect(&mb, 0, HS_ECONNRESET, 2);
    assert_true(peer(&mb, 0)->m.left);
    assert_int_equal(mb.sequencer, 1);
    assert_true(mb.in_job);
    ticks(&mb, &f, 3, 2, HS__ID_NONE);
    assert_true(mb.in_job);
    connect(&mb, &f, 1, 0);
    assert_true(mb.in_job);
    hs__heartbeat hb = {HS__HB_QUORUM, 1, 0, 1, 0};
    hs__q_on_status(&mb, &peer(&mb, 1)->m, 1, &hb);
    assert_true(mb.in_job);
    assert_int_equal(mb.handover_until_us, 0);
    hs__mb_free(&mb);
    /* A member: the successor never answers. */
    start_as(&mb, &f, 4, 3);
    connect(&mb, &f, 0, 0);
    connect(&mb, &f, 2, 0);
    sequencer_ok(&mb);
    uint64_t t0 = f.now_us;
    disconnect(&mb, 0, HS_ECONNRESET, 2);
    while (f.now_us + 100000 < t0 + fresh) {
        ticks(&mb, &f, 1, 2, HS__ID_NONE);
        assert_true(mb.in_job);
    }
    ticks(&mb, &f, 2, 2, HS__ID_NONE);
    assert_false(mb.in_job);
    hs__mb_free(&mb);
    /* The successor: peers 0 and 2 said BYE; it is in the job before it reaches peer 3, and
     * says so to peer 3 once connected. */
    start_as(&mb, &f, 4, 1);
    connect(&mb, &f, 0, 0);
    connect(&mb, &f, 2, 0);
    sequencer_ok(&mb);
    disconnect(&mb, 0, HS_ECONNRESET, 2);
    assert_true(mb.is_sequencer);
    disconnect(&mb, 2, HS_ECONNRESET, 2);
    assert_true(mb.in_job);
    int quorums = sent_to(&f, 3, HS__T_HEARTBEAT);
    connect(&mb, &f, 3, 0);
    assert_true(hs__q_majority(&mb));
    assert_true(mb.in_job);
    assert_true(sent_to(&f, 3, HS__T_HEARTBEAT) > quorums);
    ticks(&mb, &f, (int)(fresh / 100000) + 2, 3, HS__ID_NONE);
    assert_true(mb.in_job);
    assert_int_equal(mb.handover_until_us, 0);
    hs__mb_free(&mb);
    topo = "complete";
}

/* Joiners admitted together count as reached while their WELCOMEs go out one by one: the
 * sequencer of a job starting with 4 peers is never cut off on the way. */
static void test_joiners_being_welcomed_are_reached(void **state) {
    (void)state;
    hs__mb mb;
    fake f;
    start(&mb, &f, 1);
    for (uint64_t k = 0; k < 3; k++)
        hs__mb_request_join(&mb, 100 + k, 0, "127.0.0.1:7100", 0);
    hs__mb_commit(&mb);
    assert_int_equal(hs__mb_newest(&mb)->m.n, 4);
    peer(&mb, 2)->m.pending_conn = new_conn(&f);
    peer(&mb, 3)->m.pending_conn = new_conn(&f);
    connect(&mb, &f, 1, 0); /* the first WELCOME went out */
    assert_ptr_equal(mb.agreed, hs__mb_newest(&mb));
    assert_true(mb.in_job);
    /* A joiner whose connection closed before its WELCOME does not count. */
    peer(&mb, 2)->m.pending_conn = NULL;
    peer(&mb, 3)->m.pending_conn = NULL;
    hs__q_update(&mb);
    assert_false(mb.in_job);
    hs__mb_free(&mb);
}

/* Joiner `nonce` (at 127.0.0.1:710<nonce>, resuming from round `resume`, 0: none) asks the
 * sequencer in, which commits the list that admits it: that list. */
static hs__mview *admit(hs__mb *mb, uint64_t nonce, uint64_t resume) {
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%llu", 7100 + (unsigned long long)nonce);
    hs__mb_request_join(mb, nonce, 0, addr, resume);
    hs__mb_commit(mb);
    return hs__mb_newest(mb);
}

/* A job restarted at round 10 whose peers wait for 3 members before their first round: the
 * lists that admit them take effect at round 10 itself (nobody can be past it), and once a
 * list of 3 was held, changes keep their margin (members train). Without the hold, 14. */
static void test_held_start_needs_no_margin(void **state) {
    (void)state;
    hs__mb mb;
    hs__mview *v;
    fake f;
    for (int hold = 0; hold <= 3; hold += 3) {
        start(&mb, &f, 1);
        cfg.hold_members = hold;
        f.round = 10;
        v = admit(&mb, 1, 0);
        assert_int_equal(v->m.eff_round, hold ? 10 : 14);
        connect(&mb, &f, 1, 10);
        v = admit(&mb, 2, 0);
        assert_int_equal(v->m.n, 3);
        assert_int_equal(v->m.eff_round, hold ? 10 : 14);
        connect(&mb, &f, 2, 10);
        v = admit(&mb, 3, 0);
        assert_int_equal(v->m.n, 4);
        assert_int_equal(v->m.eff_round, 14);
        hs__mb_free(&mb);
    }
}

/* A restarted job (the sequencer at its checkpoint's round 10, holding for 3 members) whose
 * joiners resume from rounds 30 and 20: the list that admits each takes effect at the newest
 * round among them so far, 30 once the first came (issue 21: the job goes on from the newest
 * checkpoint any member holds). Without the hold a joiner's round is not counted: a peer
 * rejoining a running job never moves it. */
static void test_held_start_at_newest_resume_round(void **state) {
    (void)state;
    hs__mb mb;
    hs__mview *v;
    fake f;
    for (int hold = 0; hold <= 3; hold += 3) {
        start(&mb, &f, 1);
        cfg.hold_members = hold;
        f.round = 10;
        v = admit(&mb, 1, 30);
        assert_int_equal(v->m.eff_round, hold ? 30 : 14);
        connect(&mb, &f, 1, 10);
        v = admit(&mb, 2, 20);
        assert_int_equal(v->m.n, 3);
        assert_int_equal(v->m.eff_round, hold ? 30 : 14);
        hs__mb_free(&mb);
    }
}

/* The same held restart whose job ends at round 100 (the sequencer's checkpoint): a joiner
 * naming round 5000 is not counted (the job would start past its end), one naming 30 is. */
static void test_held_start_bounds_resume_round(void **state) {
    (void)state;
    hs__mb mb;
    hs__mview *v;
    fake f;
    start(&mb, &f, 1);
    cfg.hold_members = 3;
    cfg.resume_round_max = 100;
    f.round = 10;
    v = admit(&mb, 1, 5000);
    assert_int_equal(v->m.eff_round, 10);
    connect(&mb, &f, 1, 10);
    v = admit(&mb, 2, 30);
    assert_int_equal(v->m.n, 3);
    assert_int_equal(v->m.eff_round, 30);
    cfg.resume_round_max = 0;
    hs__mb_free(&mb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failure_after_timeout),
        cmocka_unit_test(test_failure_on_silence),
        cmocka_unit_test(test_no_change_without_majority),
        cmocka_unit_test(test_view_at_agreed_round),
        cmocka_unit_test(test_members_ordering),
        cmocka_unit_test(test_wrongly_dead_redialled),
        cmocka_unit_test(test_wrongly_dead_redialled_not_needed),
        cmocka_unit_test(test_own_sleep_not_counted),
        cmocka_unit_test(test_woke_to_a_job_gone),
        cmocka_unit_test(test_sequencer_bye_is_a_handover),
        cmocka_unit_test(test_joiners_being_welcomed_are_reached),
        cmocka_unit_test(test_held_start_needs_no_margin),
        cmocka_unit_test(test_held_start_at_newest_resume_round),
        cmocka_unit_test(test_held_start_bounds_resume_round),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
