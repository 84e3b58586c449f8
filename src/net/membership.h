/* The membership layer: member-list versions and the views they give, the sequencer that orders
 * changes, failure detection, quorum (in job / cut off / removed) and whom to keep connections
 * to. A state machine of its own (struct hs__mb) that sits on the transport without calling it:
 * events come in as calls (a frame from peer X, a connection opened or lost, a tick at time t)
 * and every effect goes out through hs__mb_env (send this frame to X, dial X, close X, a version
 * was accepted, start the commit timer). Time and the training round come from the env too, so
 * a unit test drives it with fake peers and a fake clock (tests/unit/net/test_membership.c).
 *
 * Threading: loop thread. Fields marked (mu) are also read by the application threads under
 * the env's lock; this layer writes them under it. Peers and versions are never freed before
 * hs__mb_free / the owner's end, so pointers to them stay valid on both threads. */
#ifndef HS_NET_MEMBERSHIP_H
#define HS_NET_MEMBERSHIP_H

#include <stdint.h>

#include "core/log.h"
#include "hearsay/net.h"
#include "hearsay/topo.h"
#include "net/wire.h"

typedef struct hs__conn hs__conn; /* the transport's; only compared with NULL here */

/* One peer as membership sees it. The owner embeds it first in its own peer struct. */
typedef struct hs__mpeer {
    uint32_t id;
    char addr[HS__ADDR_MAX + 1];
    hs__conn *conn;         /* the authenticated connection in use */
    hs__conn *dialing;      /* our outgoing connection being set up */
    hs__conn *pending_conn; /* a joiner's connection waiting for its WELCOME */
    int member;             /* in the newest member list */
    int left;               /* it said BYE(leave) rather than died */
    int gone;               /* its port refused us: its process is gone, it votes no more */
    int ever_connected;     /* we had an authenticated connection once */
    uint64_t next_dial_us;
    int backoff_ms;
    uint64_t unreachable_since_us; /* needed but not connected since; 0 = not counting */
    uint64_t last_suspect_us;
    uint64_t known_round;      /* highest round in its frames */
    uint64_t members_sent_ver; /* anti-entropy: newest version we pushed to it */
    uint32_t members_sent_iss;
    int told_quorum;      /* 1 + the QUORUM status last sent on its connection; 0 none yet */
    int says_quorum;      /* its last QUORUM status: it is the sequencer and reaches a majority */
    uint64_t told_agreed; /* the agreed version named in the last QUORUM sent to it */
    uint64_t has_ver;     /* the newest member-list version it said it holds (its ack) */
    uint32_t has_iss;
    uint64_t departed_us; /* when it was found left or gone */
    int unseen; /* this peer slept and has not seen it alive since (quorum.c: its departure then) */
    int dead; /* (mu) recv from it fails at once */
} hs__mpeer;

/* One member-list version. */
typedef struct hs__mview {
    hs__members m;
    hs_topo *topo;   /* NULL when it could not be built (logged) */
    int rank_self;   /* -1 when this peer is not in it */
    uint32_t *needs; /* peer ids this peer exchanges with under it (any round of the period) */
    int n_needs;
} hs__mview;

/* A join the sequencer has seen: repeated nonces get the same answer. */
typedef struct hs__join_req {
    uint64_t nonce;
    uint32_t via;
    char addr[HS__ADDR_MAX + 1];
    uint32_t id; /* HS__ID_NONE until committed */
    uint64_t mver;
    int acked;
    uint64_t resume_round; /* the joiner's checkpoint round (0: none, or not known here) */
} hs__join_req;

/* What membership needs from its owner: the clock, the training round, the lock the
 * application threads share, peers' storage, and the actions it decides. */
typedef struct hs__mb_env {
    uint64_t (*now_us)(void *ctx);
    uint64_t (*round)(void *ctx); /* the training thread's newest round */
    void (*lock)(void *ctx);
    void (*unlock)(void *ctx);
    void (*wake)(void *ctx); /* lock held: (mu) fields changed */
    /* 1 while this peer leaves or stops: no changes, no dials, no status. */
    int (*quiet)(void *ctx);
    /* A new peer of the owner's, zeroed but for id and addr; NULL on ENOMEM. */
    hs__mpeer *(*peer_new)(void *ctx, uint32_t id, const char *addr);
    /* When something last arrived on p->conn. */
    uint64_t (*heard_us)(void *ctx, const hs__mpeer *p);
    /* Queues a frame for p: behind its data, or (on_conn) on its connection ahead of it. Takes
     * a reference to payload on success. */
    int (*send)(void *ctx, hs__mpeer *p, int on_conn, uint8_t type, uint64_t round,
                hs_buf *payload);
    int (*dial)(void *ctx, hs__mpeer *p, hs__conn **out);
    void (*close)(void *ctx, hs__conn *c, int err, int bye, hs_log_level level, const char *why);
    /* p was declared dead: under the lock (locked = 1), the data path's share of it (counters,
     * queued bytes); after it (locked = 0), its queued frames and stored payloads go. */
    void (*dead)(void *ctx, hs__mpeer *p, int left, int locked);
    /* The sequencer's answer to a join that came through this peer (bootstrap's). */
    void (*join_ack)(void *ctx, const hs__join *ack);
    /* A newer version was accepted (joins waiting for it may go on). */
    void (*accepted)(void *ctx);
    /* Calls hs__mb_commit after ms, once (coalescing changes). */
    void (*schedule)(void *ctx, int ms);
} hs__mb_env;

typedef struct hs__mb {
    const hs__mb_env *env;
    void *ctx;
    const hs_net_config *cfg;
    const uint32_t *self;  /* this peer's id, HS__ID_NONE until joined (owner's, (mu)) */
    const char *advertise; /* this peer's address, as the sequencer writes it in lists */
    const char *topo_spec;
    int topo_file_n; /* > 0 when the topology is a file with this many peers */

    hs__mpeer **peers; /* (mu) for the array */
    int n_peers, cap_peers;

    hs__mview **sched; /* (mu) versions, ascending */
    int n_sched;
    uint32_t sequencer;
    int is_sequencer;
    hs__mview *agreed; /* the newest list known to be held by a majority of the one before */
    uint64_t handover_until_us; /* the sequencer left with BYE: in the job on its word till then */

    /* sequencer */
    hs__join_req *joins;
    int n_joins, cap_joins;
    uint32_t *removals;
    int n_removals, cap_removals;
    int change_pending;
    uint64_t round_rate_t_us, round_rate_r;
    double round_rate; /* rounds per second, smoothed */
    uint64_t last_tick_us; /* the previous hs__mb_tick: a long gap means this process slept */
    /* The last such sleep: when it ended (0: none, or the job vouched for this peer since:
     * quorum.c), how long it lasted, the round it ended at. */
    uint64_t woke_us, slept_ms, woke_round;

    int in_job;                           /* (mu) in touch with a majority */
    int removed;                          /* (mu) this peer was removed from the run */
    char removed_why[HS__REASON_MAX + 1]; /* (mu) who said so */
    int stranded; /* (mu) woke from a sleep to find no majority it could reach again: final */
    char stranded_why[HS__REASON_MAX + 1]; /* (mu) the members it found gone */
} hs__mb;

#define HS__LEFT "left the run" /* the reason that marks a graceful leave */
#define HS__MB_COALESCE_MS 5    /* changes within this window go into one version */

/* ------------------------------------------------------------------ views.c */
void hs__mb_free(hs__mb *mb); /* versions and the sequencer's lists; peers are the owner's */
hs__mpeer *hs__mb_find(hs__mb *mb, uint32_t id);
/* Finds or creates (the array under the lock); updates the address. NULL on ENOMEM. */
hs__mpeer *hs__mb_get(hs__mb *mb, uint32_t id, const char *addr);
hs__mview *hs__mb_newest(const hs__mb *mb);
hs__mview *hs__mb_at(const hs__mb *mb, uint64_t round); /* in force at round, or NULL */
int hs__mb_is_member(const hs__mview *mv, uint32_t id);
int hs__mb_cmp(uint64_t v1, uint32_t i1, uint64_t v2, uint32_t i2);
/* Publishes m if newer than the newest (1; 0 when not), with its topology and views, its
 * members as peers and the others dead; logs it. *removed: it leaves this peer out. */
int hs__mb_add_version(hs__mb *mb, const hs__members *m, const char *from, int *removed);

/* ------------------------------------------------------------------ sequencer.c */
/* The sequencer is the live member with the lowest id (failure.c calls it as peers die). */
void hs__mb_update_sequencer(hs__mb *mb);
/* The sequencer: id's removal goes into the next version. */
void hs__mb_remove(hs__mb *mb, uint32_t id);
/* The sequencer: a commit soon (once per coalescing window). */
void hs__mb_schedule_commit(hs__mb *mb);
/* The sequencer: a join request (from a JOIN here or a JOIN_FWD). */
void hs__mb_request_join(hs__mb *mb, uint64_t nonce, uint32_t via, const char *addr,
                         uint64_t resume_round);
void hs__mb_send_join_ack(hs__mb *mb, hs__join_req *j);
void hs__mb_send_members(hs__mb *mb, hs__mpeer *p);
/* The round a change takes effect: the highest round known plus a margin. */
uint64_t hs__mb_choose_eff(hs__mb *mb);

/* ------------------------------------------------------------------ membership.c */
/* The first peer's list: itself alone, id 0 (*self must be 0 already). */
int hs__mb_init_first(hs__mb *mb);
/* Accepts a member list if newer than ours; from names the source for the log. */
int hs__mb_accept(hs__mb *mb, const hs__members *m, const char *from);
/* MEMBERS from peer `from` (p: its peer, NULL on a joiner's connection). */
void hs__mb_on_members(hs__mb *mb, hs__mpeer *p, uint32_t from, const hs__members *m);
void hs__mb_on_heartbeat(hs__mb *mb, hs__mpeer *p, const hs__heartbeat *hb);
/* The sequencer folds waiting joins and removals into the next version (the env's timer). */
void hs__mb_commit(hs__mb *mb);

/* ------------------------------------------------------------------ failure.c */
void hs__mb_peer_dead(hs__mb *mb, hs__mpeer *p, const char *fmt, ...) HS__PRINTF(3, 4);
/* The owner attached a new authenticated connection to p (p->conn); hello is its HELLO. */
void hs__mb_on_open(hs__mb *mb, hs__mpeer *p, const hs__hello *hello, int outgoing);
/* A connection of p's closed: err, whether it was a dial that failed, whether it was p's
 * connection in use, what BYE said (0 none, 1 close, 2 leave) and why it closed. */
void hs__mb_conn_lost(hs__mb *mb, hs__mpeer *p, int err, int dial_failed, int attached, int got_bye,
                      const char *why);
/* SUSPECT from peer `from` (at the sequencer). */
void hs__mb_on_suspect(hs__mb *mb, uint32_t from, const hs__reason *r);
/* Dials what is needed; declares dead what stayed unreachable past the timeout. */
void hs__mb_connect_needed(hs__mb *mb);
void hs__mb_tick(hs__mb *mb, uint64_t now_us);

/* ------------------------------------------------------------------ quorum.c */
/* 1 when this peer reaches a majority of the agreed member list (itself included, members that
 * left with BYE not counted); meaningful at the sequencer, which connects to every member. */
int hs__q_majority(hs__mb *mb);
/* Recomputes in job / cut off, logs a change, tells connected peers this peer's status. */
void hs__q_update(hs__mb *mb);
/* The sequencer said BYE (failure.c, after electing its successor): a handover, not a loss. */
void hs__q_handover(hs__mb *mb);
/* A QUORUM heartbeat from p (peer `from`). */
void hs__q_on_status(hs__mb *mb, hs__mpeer *p, uint32_t from, const hs__heartbeat *hb);
void hs__q_on_open(hs__mpeer *p);
/* p holds member list (ver, iss): it said so in HELLO, a heartbeat or MEMBERS. */
void hs__q_ack(hs__mb *mb, hs__mpeer *p, uint64_t ver, uint32_t iss);
/* Tells p which member list this peer holds (a heartbeat): the sequencer counts acks. */
void hs__q_tell(hs__mb *mb, hs__mpeer *p);
/* 1 when p left or its process is gone, and this peer slept since it last saw p alive: the
 * departure may be that of a job which had removed this peer, so p keeps its vote. */
int hs__q_lost_asleep(hs__mb *mb, const hs__mpeer *p);
/* Cut off: dials a member it has no connection to, whatever the ids (1 when it did). */
int hs__q_redial(hs__mb *mb, hs__mpeer *p, uint64_t now_us);
void hs__q_removed(hs__mb *mb, const char *fmt, ...) HS__PRINTF(2, 3);

#endif
