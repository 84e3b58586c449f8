/* The runtime layer of net/, the top of the stack (docs/HACKING.md, "net/ in layers"):
 *   transport.h   frames, connections (TCP, TLS, the emulation shim), ops and events
 *   membership.h  member lists, views, the sequencer, failures, quorum: a state machine
 *   bootstrap.c   joining (JOIN / WELCOME) on both sides, snapshots, on membership
 *   this header   struct hs_net and what the runtime's own files share:
 *     net.c       lifecycle, loop thread, commands, leaving, public API
 *     config.c    configuration copy and topology file
 *     mailbox.c   the mailbox and the hs_exchange
 *     dispatch.c  peers, HELLO, transport events, frame dispatch, membership's env
 *     resend.c    lost DATA: the store of last payloads, RESEND requests and answers
 *
 * Threading: the loop thread owns every connection, timer and queue. Fields marked (mu) are
 * also read or written by the application threads and are only touched under net->mu; the
 * loop thread writes them under mu and may read them without it (it is the only writer).
 * Peers and member-list versions are never freed before hs_net_free, so pointers to them stay
 * valid on both threads. */
#ifndef HS_NET_RUNTIME_H
#define HS_NET_RUNTIME_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/log.h"
#include "hearsay/net.h"
#include "hearsay/topo.h"
#include "net/bootstrap.h"
#include "net/membership.h"
#include "net/pieces.h"
#include "net/resend.h"
#include "net/transport.h"

/* ------------------------------------------------------------------ peers */
struct hs__peer {
    hs__mpeer m; /* membership's part (first: hs__peer_of) */
    /* loop thread */
    hs__fq outq; /* frames for this peer, written by whichever conn is attached */
    hs__link link;
    uint64_t ping_token, ping_sent_ns;
    /* (mu) */
    int have_data_round;
    uint64_t last_data_round; /* newest DATA round received (replays are refused) */
    uint64_t gap_mask;        /* rounds below it that never came (hs__rs_gap_*) */
    int have_sent_round;
    uint64_t last_sent_round; /* newest DATA round sent */
    size_t queued_bytes;      /* DATA bytes accepted by send() and not yet written */
    size_t mailbox_bytes;     /* bytes from it waiting in the mailbox */
    int rx_paused;            /* (mu) over rx_cap: its connection stops reading */
    /* (mu) a connection of its is attached: what it sent before its BYE may still come, even
     * once it is dead here (a member list dropped it on another peer's word) */
    int rx_open;
    size_t rx_cap;            /* (mu) what paused it: max_buffered, or HS__PIECES_CAP (pieces) */
    hs__pstream pstream;      /* (mu) its DATA message arriving in pieces (net/pieces.h) */
    hs__rstore rs;            /* (loop) payloads last sent to it, for RESEND */
    int have_gone;            /* (mu) it answered GONE: rounds up to gone_round never come */
    uint64_t gone_round;
    double emu_oneway_ms; /* (mu) the link's emulated delay + jitter, for RESEND timing */
    double rtt_us;        /* last ping */
    int pong;             /* a pong arrived for ping_token */
};

static inline hs__peer *hs__peer_of(hs__mpeer *m) {
    return m ? (hs__peer *)((char *)m - offsetof(hs__peer, m)) : NULL;
}

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

/* A DATA payload, or a piece of one (net/pieces.h): bytes [off, off + buf->len - skip) of a
 * payload of total bytes, from buf->data + skip (a PART frame's payload: its part header, and
 * bytes that a copy sent again repeated, are skipped). */
typedef struct hs__mail {
    uint32_t from;
    uint64_t round;
    hs_buf *buf;
    uint64_t off, total;
    size_t skip;
} hs__mail;

/* Pieces of a sender's message waiting in the mailbox, in bytes, beyond which its connection
 * stops reading until the application takes them: a message of several GB arrives through
 * this much memory (the sender's writes wait meanwhile). */
#define HS__PIECES_CAP(net) ((net)->cfg.max_buffered / 4)


struct hs_net {
    /* configuration (strings owned) */
    hs_net_config cfg;
    char *s_listen, *s_advertise, *s_bootstrap, *s_secret, *s_ca, *s_cert, *s_key, *s_run, *s_sig,
        *s_algo, *s_codec, *s_topo, *s_app_config;
    hs_net_link_emulation *link_emu;
    hs_topo *topo_file; /* a topology file, as loaded (ranks = peer ids; mb.topo_file_n) */

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

    hs__mb mb; /* membership: peers, member lists, the sequencer, quorum */

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
    /* A connection refused for a wrong secret (our key's identity, another key): while this
     * peer waits for its first members, a misconfigured peer of the job, not a delay. */
    uint64_t wrong_secret_us;         /* (mu) when the last one was refused; 0 none */
    char wrong_secret_msg[600];       /* (mu) its refusal */
    int wrong_secret_n;               /* (mu) members then */
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
    hs_buf *snap_head;   /* (mu) bytes sent before snap (or NULL): one body, several heads */
    int welcomes_open;   /* (atomic; loop thread writes) join requests not yet answered */
    uint64_t snap_round; /* (mu) */
    int snap_wanted;     /* (mu) */
    int snap_ever;       /* (mu) the application publishes snapshots */
    int snap_stale;      /* (mu) snap is a withdrawn one's fallback: never fresh */
    hs_net_stats st;     /* (mu) */
    int leaving;         /* (mu) */
    int left;            /* (mu) leave finished */
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
    uint64_t first_round; /* (mu) the job's (hs_net_set_first_round): a schedule's start */
};

/* ------------------------------------------------------------------ inline helpers */
/* cv broadcast (caller holds mu) */
static inline void hs__net_wake(hs_net *net) { uv_cond_broadcast(&net->cv); }
/* The training thread's round, as the loop knows it. */
static inline uint64_t hs__net_round(hs_net *net) {
    return __atomic_load_n(&net->cur_round, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------------ config.c */
/* Copies and checks the configuration into net. */
int hs__net_copy_config(hs_net *net, const hs_net_config *in);
/* (Re)loads a topology file spec (net->topo_file, mb.topo_file_n); 0 for a generator spec. */
int hs__net_topo_file(hs_net *net);

/* ------------------------------------------------------------------ peers.c */
hs__peer *hs__peer_find(hs_net *net, uint32_t id);
/* Finds or creates (under mu). NULL on ENOMEM. */
hs__peer *hs__peer_get(hs_net *net, uint32_t id, const char *addr);
/* Sets up the emulation of the link to p (config override, topology file, global). */
void hs__net_link_init(hs_net *net, hs__peer *p);
/* Queues a frame for a peer (its outq) or on a connection (ctlq), and starts writing. Take a
 * reference to payload on success. */
int hs__send_peer(hs_net *net, hs__peer *p, uint8_t type, uint64_t round, hs_buf *payload);
int hs__send_conn(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload);
/* A message whose bytes go on in tail (a snapshot after WELCOME's fields): sent from both. */
int hs__send_conn_tail(hs__conn *c, uint8_t type, uint64_t round, hs_buf *head, hs_buf *tail);
/* Encodes and queues a small control message (a reason: SUSPECT, BYE, REFUSE). */
int hs__send_reason(hs_net *net, hs__peer *p, hs__conn *c, uint8_t type, uint32_t code,
                    const char *text);
/* Attaches an authenticated connection to its peer (a newer one replaces the old) and tells
 * membership. */
void hs__net_attach(hs_net *net, hs__conn *c);

/* ------------------------------------------------------------------ mailbox.c */
/* Queues a command for the loop (takes a reference to buf on success); locked: mu is held. */
int hs__net_post(hs_net *net, int type, uint32_t to, uint64_t round, hs_buf *buf, int locked);
/* Stores a DATA payload (reference taken over); mu held. */
int hs__net_mail_put(hs_net *net, hs__peer *p, uint64_t round, hs_buf *buf, int resent);
/* Whether a DATA of `round` from p is a copy sent again of one that came (dropped); mu held. */
int hs__net_mail_dup(hs__peer *p, uint64_t round, int resent);
/* Stores a piece of a DATA message (a PART frame handed up by the reader, reference taken
 * over when it returns 1; 0: a duplicate, dropped, the caller keeps its reference); mu held. */
int hs__net_mail_put_piece(hs_net *net, hs__peer *p, uint64_t round, hs_buf *buf);
extern const hs_exchange_ops hs__net_exchange_ops;

/* ------------------------------------------------------------------ dispatch.c */
/* The transport's events and membership's env for this runtime. */
extern const hs__transport_events hs__net_events;
extern const hs__mb_env hs__net_mb_env;

#endif
