/* Internal state of the peer runtime, shared by its files:
 *   net.c         lifecycle, loop thread, commands, mailbox, the hs_exchange, frame dispatch
 *   conn.c        sockets: listen, accept, dial, TLS + HELLO handshake, framing, writing,
 *                 emulation pacing, limits, heartbeats and liveness of each connection
 *   tls.c         OpenSSL over memory BIOs
 *   membership.c  member lists, views, the sequencer, failure handling, whom to dial
 *   bootstrap.c   joining (JOIN / WELCOME) on both sides, snapshots
 *   resend.c      lost DATA: the store of last payloads, RESEND requests and answers
 *   quorum.c      majority of the member list, in job / cut off / removed
 *
 * Threading: the loop thread owns every connection, timer and queue. Fields marked (mu) are
 * also read or written by the application threads and are only touched under net->mu; the
 * loop thread writes them under mu and may read them without it (it is the only writer).
 * Peers and member-list versions are never freed before hs_net_free, so pointers to them stay
 * valid on both threads. */
#ifndef HS_NET_INTERNAL_H
#define HS_NET_INTERNAL_H

#include <stdint.h>
#include <uv.h>

#include "core/log.h"
#include "hearsay/net.h"
#include "hearsay/topo.h"
#include "net/resend.h"
#include "net/transport.h"

/* ------------------------------------------------------------------ peers */
struct hs__peer {
    uint32_t id;
    char addr[HS__ADDR_MAX + 1];
    /* loop thread */
    hs__conn *conn;         /* the authenticated connection in use */
    hs__conn *dialing;      /* our outgoing connection being set up */
    hs__conn *pending_conn; /* a joiner's connection waiting for its WELCOME */
    hs__fq outq;            /* frames for this peer, written by whichever conn is attached */
    hs__link link;
    int member;         /* in the newest member list */
    int left;           /* it said BYE(leave) rather than died */
    int gone;           /* its port refused us: its process is gone, it votes no more */
    int ever_connected; /* we had an authenticated connection once */
    uint64_t next_dial_us;
    int backoff_ms;
    uint64_t unreachable_since_us; /* needed but not connected since; 0 = not counting */
    uint64_t last_suspect_us;
    uint64_t known_round;      /* highest round in its frames */
    uint64_t members_sent_ver; /* anti-entropy: newest version we pushed to it */
    uint32_t members_sent_iss;
    uint64_t ping_token, ping_sent_ns;
    int told_quorum; /* 1 + the QUORUM status last sent on its connection; 0 none yet */
    int says_quorum; /* its last QUORUM status: it is the sequencer and reaches a majority */
    uint64_t told_agreed;      /* the agreed version named in the last QUORUM sent to it */
    uint64_t has_ver;          /* the newest member-list version it said it holds (its ack) */
    uint32_t has_iss;
    /* (mu) */
    int dead; /* recv from it fails at once */
    int have_data_round;
    uint64_t last_data_round; /* newest DATA round received (replays are refused) */
    uint64_t gap_mask;        /* rounds below it that never came (hs__rs_gap_*) */
    int have_sent_round;
    uint64_t last_sent_round; /* newest DATA round sent */
    size_t queued_bytes;      /* DATA bytes accepted by send() and not yet written */
    size_t mailbox_bytes;     /* bytes from it waiting in the mailbox */
    int rx_paused;            /* (mu) over max_buffered: its connection stops reading */
    hs__rstore rs;            /* (loop) payloads last sent to it, for RESEND */
    int have_gone;            /* (mu) it answered GONE: rounds up to gone_round never come */
    uint64_t gone_round;
    double emu_oneway_ms;     /* (mu) the link's emulated delay + jitter, for RESEND timing */
    double rtt_us;            /* last ping */
    int pong;                 /* a pong arrived for ping_token */
};

/* ------------------------------------------------------------------ member-list versions */
typedef struct hs__mview {
    hs__members m;
    hs_topo *topo;   /* NULL when it could not be built (logged) */
    int rank_self;   /* -1 when this peer is not in it */
    uint32_t *needs; /* peer ids this peer exchanges with under it (any round of the period) */
    int n_needs;
} hs__mview;

/* ------------------------------------------------------------------ commands and mailbox */
enum {
    HS__CMD_SEND,
    HS__CMD_PING,
    HS__CMD_LEAVE,
    HS__CMD_STOP,
    HS__CMD_JOIN,
    HS__CMD_KICK,
    HS__CMD_RESEND /* ask `to` for DATA `round` again */
};
typedef struct hs__cmd {
    struct hs__cmd *next;
    int type;
    uint32_t to;
    uint64_t round;
    hs_buf *buf;
} hs__cmd;

typedef struct hs__mail {
    uint32_t from;
    uint64_t round;
    hs_buf *buf;
} hs__mail;

/* A joiner this member talks to (bootstrap.c). */
typedef struct hs__pending_join {
    hs__conn *conn; /* NULL once gone */
    uint64_t nonce;
    char addr[HS__ADDR_MAX + 1];
    uint32_t id; /* HS__ID_NONE until JOIN_ACK */
    uint64_t mver;
    uint64_t t_request_us, t_forward_us;
    uint64_t round_at_request;
    int done;
} hs__pending_join;

/* A join the sequencer has seen (membership.c): repeated nonces get the same answer. */
typedef struct hs__join_req {
    uint64_t nonce;
    uint32_t via;
    char addr[HS__ADDR_MAX + 1];
    uint32_t id; /* HS__ID_NONE until committed */
    uint64_t mver;
    int acked;
} hs__join_req;

enum { HS__JOIN_IDLE, HS__JOIN_DIALING, HS__JOIN_WAITING, HS__JOIN_DONE, HS__JOIN_FAILED };

struct hs_net {
    /* configuration (strings owned) */
    hs_net_config cfg;
    char *s_listen, *s_advertise, *s_bootstrap, *s_secret, *s_ca, *s_cert, *s_key, *s_run, *s_sig,
        *s_algo, *s_codec, *s_topo, *s_app_config;
    hs_net_link_emulation *link_emu;
    int topo_file_n;    /* > 0 when the topology is a file with this many peers */
    hs_topo *topo_file; /* that file, as loaded (ranks = peer ids) */

    uint32_t self; /* (mu) HS__ID_NONE until joined */
    char advertise[HS__ADDR_MAX + 1];

    uv_loop_t loop;
    uv_thread_t thread;
    int thread_started;
    int loop_init;
    uv_async_t async;
    uv_timer_t tick;
    uv_timer_t change_timer;
    int handles_closing;
    hs__transport tr;
    int n_open;

    hs__peer **peers; /* (mu) for the array; see hs__peer for fields */
    int n_peers, cap_peers;

    hs__mview **sched; /* (mu) member-list versions, ascending */
    int n_sched;
    uint32_t sequencer;
    int is_sequencer;
    hs__mview *agreed; /* the newest list known to be held by a majority of the one before */

    /* sequencer */
    hs__join_req *joins;
    int n_joins, cap_joins;
    uint32_t *removals;
    int n_removals, cap_removals;
    int change_pending;
    uint64_t round_rate_t_us, round_rate_r;
    double round_rate; /* rounds per second, smoothed */

    /* member side of joins */
    hs__pending_join *pjoins;
    int n_pjoins, cap_pjoins;

    /* joiner side */
    int join_state;      /* (mu) */
    int join_err;        /* (mu) */
    char join_msg[1024]; /* (mu) */
    uint64_t join_nonce, join_deadline_us, join_next_dial_us;
    int join_backoff_ms;
    int join_handshake_fails; /* closed by the other side before HELLO_ACK */
    hs__conn *join_conn;
    struct sockaddr_storage bootstrap_sa;
    hs_net_welcome *welcome; /* (mu) filled by the loop for hs_net_start */

    /* shared with the application threads */
    uv_mutex_t mu;
    uv_cond_t cv;
    hs__cmd *cmd_head, *cmd_tail; /* (mu) */
    hs__mail *mail;               /* (mu) */
    int recv_waiting;             /* (mu) recv() sleeps, for (recv_from, recv_round) */
    uint32_t recv_from;
    uint64_t recv_round;
    int n_mail, cap_mail;
    uint64_t cur_round;  /* (mu) the training thread's newest round */
    hs_buf *snap;        /* (mu) */
    uint64_t snap_round; /* (mu) */
    int snap_wanted;     /* (mu) */
    int snap_ever;       /* (mu) the application publishes snapshots */
    hs_net_stats st;     /* (mu) */
    int leaving;         /* (mu) */
    int left;            /* (mu) leave finished */
    int removed;         /* (mu) this peer was removed from the run */
    int in_job;          /* (mu) in touch with a majority (quorum.c) */
    char removed_why[HS__REASON_MAX + 1]; /* (mu) who said this peer was removed */
    int stopping;        /* (mu) */
    uint64_t leave_deadline_us;
    int leave_closing; /* leave: connections are closing (1 flushed, -1 not) */
    int leave_started; /* the LEAVE command ran (loop) */
    uint32_t bye_code;                   /* (mu) what this peer's BYE says: leave or diverged */
    char bye_why[HS__REASON_MAX + 1];    /* (mu) */
    int nbr_diverged;                    /* (mu) a peer left saying its run diverged: */
    uint32_t nbr_diverged_id;            /* (mu) the first one, */
    char nbr_diverged_why[HS__REASON_MAX + 1]; /* (mu) and its reason */

    /* the exchange */
    hs_exchange ex;
    hs_nbr *view_in, *view_out;
    int view_cap;
};

/* ------------------------------------------------------------------ helpers (net.c) */
hs__peer *hs__peer_find(hs_net *net, uint32_t id);
/* Finds or creates (under mu). NULL on ENOMEM. */
hs__peer *hs__peer_get(hs_net *net, uint32_t id, const char *addr);
void hs__net_wake(hs_net *net); /* cv broadcast (caller holds mu) */
/* (Re)loads a topology file spec (net->topo_file, topo_file_n); 0 for a generator spec. */
int hs__net_topo_file(hs_net *net);
/* Sets up the emulation of the link to p (config override, topology file, global). */
void hs__net_link_init(hs_net *net, hs__peer *p);
uint64_t hs__net_round(hs_net *net); /* the training thread's round, as the loop knows it */

/* Queues a frame for a peer (its outq) or on a connection (ctlq), and starts writing. Take a
 * reference to payload on success. */
int hs__send_peer(hs_net *net, hs__peer *p, uint8_t type, uint64_t round, hs_buf *payload);
int hs__send_conn(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload);
/* Encodes and queues a small control message built by encode(buf, arg). */
int hs__send_reason(hs_net *net, hs__peer *p, hs__conn *c, uint8_t type, uint32_t code,
                    const char *text);

/* The transport's events for this runtime (net.c). */
extern const hs__transport_events hs__net_events;

/* ------------------------------------------------------------------ membership.c */
int hs__mb_init_first(hs_net *net);
/* Accepts a member list if newer than ours; from names the source for the log. */
int hs__mb_accept(hs_net *net, const hs__members *m, const char *from);
hs__mview *hs__mb_newest(hs_net *net);
hs__mview *hs__mb_at(hs_net *net, uint64_t round); /* in force at round, or NULL */
int hs__mb_is_member(hs__mview *mv, uint32_t id);
int hs__mb_cmp(uint64_t v1, uint32_t i1, uint64_t v2, uint32_t i2);
#define HS__LEFT "left the run" /* the reason that marks a graceful leave */
void hs__mb_peer_dead(hs_net *net, hs__peer *p, const char *fmt, ...) HS__PRINTF(3, 4);
void hs__mb_conn_lost(hs_net *net, hs__peer *p, hs__conn *c, int err, int dial_failed,
                      int attached);
void hs__mb_on_members(hs_net *net, hs__conn *c, const hs__members *m);
void hs__mb_on_suspect(hs_net *net, hs__conn *c, const hs__reason *r);
void hs__mb_on_heartbeat(hs_net *net, hs__conn *c, const hs__heartbeat *hb);
void hs__mb_on_open(hs_net *net, hs__conn *c);
/* The sequencer: a join request (from a JOIN here or a JOIN_FWD). */
void hs__mb_request_join(hs_net *net, uint64_t nonce, uint32_t via, const char *addr);
void hs__mb_commit(hs_net *net);
void hs__mb_tick(hs_net *net, uint64_t now_us);
void hs__mb_send_members(hs_net *net, hs__peer *p);

/* ------------------------------------------------------------------ quorum.c */
/* 1 when this peer reaches a majority of the newest member list (itself included, members that
 * left with BYE not counted); meaningful at the sequencer, which connects to every member. */
int hs__q_majority(hs_net *net);
/* Recomputes in job / cut off, logs a change, tells connected peers this peer's status. */
void hs__q_update(hs_net *net);
void hs__q_on_status(hs_net *net, hs__conn *c, const hs__heartbeat *hb);
void hs__q_on_open(hs__peer *p);
/* p holds member list (ver, iss): it said so in HELLO, a heartbeat or MEMBERS. */
void hs__q_ack(hs_net *net, hs__peer *p, uint64_t ver, uint32_t iss);
/* Tells p which member list this peer holds (a heartbeat): the sequencer counts acks. */
void hs__q_tell(hs_net *net, hs__peer *p);
/* Cut off: dials a member it has no connection to, whatever the ids (1 when it did). */
int hs__q_redial(hs_net *net, hs__peer *p, uint64_t now_us);
void hs__q_removed(hs_net *net, const char *fmt, ...) HS__PRINTF(2, 3);

/* ------------------------------------------------------------------ bootstrap.c */
void hs__bs_on_join(hs_net *net, hs__conn *c, const hs__join *j);
void hs__bs_on_join_fwd(hs_net *net, hs__conn *c, const hs__join *j);
void hs__bs_on_join_ack(hs_net *net, const hs__join *j);
int hs__bs_on_welcome(hs_net *net, hs__conn *c, const uint8_t *p, size_t n);
void hs__bs_join_tick(hs_net *net, uint64_t now_us);
void hs__bs_join_start(hs_net *net);
void hs__bs_join_conn_failed(hs_net *net, hs__conn *c, int err, const char *why);
void hs__bs_on_refused(hs_net *net, hs__conn *c, uint32_t code, const char *text);
void hs__bs_conn_gone(hs_net *net, hs__conn *c);
void hs__bs_try_welcomes(hs_net *net);
void hs__bs_fail(hs_net *net, int err, const char *fmt, ...) HS__PRINTF(3, 4);

#endif
