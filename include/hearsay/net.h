/* hearsay: the peer runtime. One hs_net is one peer's network side: a libuv loop thread that
 * listens, dials its neighbours, speaks the framed protocol (docs/PROTOCOL.md) over TLS 1.3
 * (or plain TCP with --insecure), joins a running job through any member, keeps the member
 * list with the others, detects dead neighbours, and emulates WAN links when asked.
 *
 * The training thread uses it through hs_net_exchange() (hearsay/exchange.h): view, send,
 * recv, drain, stats. It meets the loop thread in a mailbox keyed by (round, neighbour); sends
 * are queued and never block; recv waits with a timeout.
 *
 * Sockets are written only on the loop thread, which blocks SIGPIPE: the application need not
 * ignore it.
 *
 * Threading: hs_net_start, hs_net_leave and hs_net_free from one thread (the application's);
 * the exchange ops from one thread (the training thread, which may be the same); the other
 * calls from any thread. Nothing here waits without a timeout. */
#ifndef HEARSAY_NET_H
#define HEARSAY_NET_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/buf.h"
#include "hearsay/exchange.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_net hs_net;

/* ------------------------------------------------------------------ link emulation
 * Applied by the sender to its outgoing frames on a link: each frame leaves after delay +/-
 * jitter (uniform; frames never overtake each other), the bytes are paced at rate, and DATA
 * frames (only those: the stream itself is never corrupted) are dropped with probability loss.
 * Draws come from Philox (seed, HS_RNG_NET, sender id, receiver id). */
typedef struct hs_net_emulation {
    double delay_ms;  /* >= 0 */
    double jitter_ms; /* >= 0 */
    double rate_bps;  /* bits per second; 0 = unlimited */
    double loss;      /* [0, 1] */
} hs_net_emulation;

/* Parses "delay=50ms,jitter=10ms,rate=10mbit,loss=0.01" (any subset, any order). Times take
 * us, ms or s (default ms); rates bit, kbit, mbit, gbit (default bit/s, SI multiples); loss a
 * fraction or a percentage ("1%"). "" and "none" give no emulation. HS_EINVAL naming the key. */
int hs_net_emulation_parse(const char *s, hs_net_emulation *out);
/* Writes the canonical string (as parse reads it) into buf; returns its length or HS_ERANGE. */
int hs_net_emulation_format(const hs_net_emulation *e, char *buf, size_t cap);
/* 1 when e changes nothing. */
int hs_net_emulation_none(const hs_net_emulation *e);

/* ------------------------------------------------------------------ configuration */
typedef enum hs_net_security {
    HS_NET_SECRET = 0,   /* TLS 1.3 external PSK derived from secret_file (default) */
    HS_NET_CERT = 1,     /* TLS 1.3 with ca_file/cert_file/key_file, client certs required */
    HS_NET_INSECURE = 2, /* plain TCP; logs a warning */
} hs_net_security;

/* Per-link emulation override: frames to peer `to` use emu instead of the global one. */
typedef struct hs_net_link_emulation {
    uint32_t to;
    hs_net_emulation emu;
} hs_net_link_emulation;

/* snapshot_timeout_ms when 0: also what a caller's timing of a withdrawn snapshot must use. */
#define HS_NET_SNAPSHOT_TIMEOUT_MS 5000

/* All strings are borrowed for the duration of hs_net_start (copied). */
typedef struct hs_net_config {
    const char *listen;    /* "HOST:PORT" (IP literal; port 0 = any, see hs_net_listen_port) */
    const char *advertise; /* address others dial; NULL: listen's, or if that is a wildcard,
                              the local address of the connection to the bootstrap member */
    const char *bootstrap; /* "HOST:PORT" of any member; NULL for the first peer of a job */

    hs_net_security security;
    const char *secret_file; /* HS_NET_SECRET: the run's shared secret (any bytes, >= 16) */
    const char *ca_file, *cert_file, *key_file; /* HS_NET_CERT: PEM files */

    /* What HELLO carries; peers whose values differ are refused with a reason. */
    const char *run_id;    /* default "hearsay" */
    const char *model_sig; /* architecture, e.g. "mlp:784-256-10" */
    uint64_t n_params;
    const char *algo;  /* e.g. "choco" */
    const char *codec; /* e.g. "topk:0.01" */

    /* The first peer's job description; joiners receive it in WELCOME. */
    const char *topo_spec; /* hs_topo_new spec (default "ring") */
    uint64_t topo_seed;
    const char *app_config; /* opaque JSON text handed to joiners; may be NULL */

    /* Limits. */
    size_t max_frame;         /* largest DATA payload in one frame (default 64 MiB, hard cap
                                 256 MiB); larger ones travel in parts, up to max_message */
    size_t max_buffered;      /* bytes queued towards one peer (send() says HS_EAGAIN beyond)
                                 and held from one peer in the mailbox (beyond, its connection
                                 stops reading until the application takes half: backpressure,
                                 never loss). Default 2 * max_frame + 1 MiB */
    int max_conns;            /* unauthenticated connections (TLS and HELLO not finished) in
                                 total (default 256); authenticated ones never count */
    int max_conns_per_addr;   /* ... from one IP address (default 16) */
    int handshake_timeout_ms; /* TCP + TLS + HELLO must finish within this (default 2000) */
    int peer_timeout_ms;      /* silence (or no progress writing) before a peer is declared
                                 dead (default 1500) */
    int heartbeat_ms;         /* heartbeat on links idle this long (default peer_timeout / 4) */
    int join_timeout_ms;      /* bootstrap: connect retries + waiting for WELCOME (default 30000)
                               */
    int snapshot_timeout_ms;  /* how long a WELCOME waits for a fresh snapshot (default 5000) */
    int change_rounds;        /* membership changes take effect at least this many rounds after
                                 the highest known round (default 4) */
    int change_delay_ms;      /* ... and at least this long, at the observed round rate
                                 (default 300) */
    int hold_members;         /* the application runs no round until the member list has this
                                 many members (hs_net_wait_members), nor does any member: until
                                 a list this peer holds has, changes it commits take effect at
                                 the highest known round itself, so a resumed job goes on from
                                 its round (default 0: none) */
    int sock_buf;             /* SO_SNDBUF/SO_RCVBUF on every connection; 0 = OS default */

    /* Emulation of an outgoing link: a link_emulate entry for the peer if any, else the
     * topology file's spec for the link (hs_topo_link_emulation), else emulate. */
    hs_net_emulation emulate;
    const hs_net_link_emulation *link_emulate; /* per-peer overrides; copied */
    int n_link_emulate;
    uint64_t seed; /* emulation draws and join nonces */
    /* 1 (default): hs_net_start sets glibc's M_MMAP_THRESHOLD to 32 MiB and M_TRIM_THRESHOLD to
     * 512 MiB, process-wide. Received payloads are allocated on the loop thread and freed by
     * the application, every round: without this, each frame above 128 KiB is a fresh mmap
     * whose pages fault in again (40% of the CPU of a 1 MiB stream). 0 leaves malloc alone. */
    int tune_malloc;
    /* Largest message (a DATA payload, or a snapshot in WELCOME), which over 4 MiB travels as
     * 4 MiB parts. Default (0): the larger of max_frame and 24 bytes per parameter (six float
     * vectors of the model); hard cap 64 GiB. */
    uint64_t max_message;
    /* A resumed peer's checkpoint round, sent with its JOIN: a job that holds for its members
     * (hold_members) starts at the highest round of the members that joined through the
     * sequencer, so that a restarted job goes on from the newest checkpoint any of them holds
     * (0: a new peer; ignored by a job that does not hold). */
    uint64_t resume_round;
    /* The highest resume round a joiner's JOIN may name (this peer's checkpoint's end round: a
     * round past the job's end is no checkpoint of this job); one beyond is not counted, and
     * said. 0: no bound. */
    uint64_t resume_round_max;
    /* 1: a DATA payload that travels in parts (over 4 MiB) is handed up part by part as it
     * arrives, for a reader that takes it with the exchange's recv_piece (D-PSGD mixes a large
     * model that way, through a few MiB); recv() still returns payloads whole, drain() does not
     * see them (leave it 0 for a reader that drains). 0 (default): whole payloads only, until
     * recv_piece is first called. */
    int data_in_pieces;
} hs_net_config;

/* Fills the defaults above (listen "127.0.0.1:0", secret mode, ...). */
void hs_net_config_init(hs_net_config *cfg);

/* ------------------------------------------------------------------ members and welcome */
typedef struct hs_net_member {
    uint32_t id;
    char addr[256];
} hs_net_member;

/* What a joiner learns from WELCOME (and what a first peer gets from its own config). */
typedef struct hs_net_welcome {
    uint32_t self;       /* the assigned peer id (0 for the first peer) */
    uint64_t round;      /* the welcoming member's round when it answered */
    uint64_t join_round; /* this peer's first round */
    uint64_t version;    /* membership version that added it */
    int n_members;
    hs_net_member *members; /* owned */
    char *topo_spec;        /* owned */
    uint64_t topo_seed;
    char *app_config; /* owned, NUL-terminated; NULL when none */
    uint64_t snapshot_round;
    hs_buf *snapshot; /* owned reference; NULL when the member had none */
} hs_net_welcome;

/* Frees what a welcome owns and zeroes it; accepts a zeroed one. */
void hs_net_welcome_clear(hs_net_welcome *w);

/* ------------------------------------------------------------------ lifecycle */

/* Starts a peer: loads the TLS credentials, listens, starts the loop thread, and, with a
 * bootstrap address, joins (retrying the connection until join_timeout_ms) and waits for
 * WELCOME. welcome (may be NULL) is filled with what the joiner needs (snapshot included); for
 * the first peer with id 0, round 0 and the config's topology. Errors: HS_EINVAL (config),
 * HS_ETLS (credentials), HS_EMISMATCH / HS_EAUTH (refused, with the peer's reason),
 * HS_ETIMEDOUT, HS_ECONNREFUSED, system errors from listen. */
int hs_net_start(hs_net **out, const hs_net_config *cfg, hs_net_welcome *welcome);

/* The exchange the algorithms use; owned by net, valid until hs_net_free. */
hs_exchange *hs_net_exchange(hs_net *net);

/* The job's first round (0 unless set; the same for every member), from the training thread:
 * a time-varying topology's schedule starts there, W[(r - first) mod P] at round r, so a job
 * mixes with the same matrices however many rounds its members' joins took. */
void hs_net_set_first_round(hs_net *net, uint64_t round);

uint32_t hs_net_self(const hs_net *net);
int hs_net_listen_port(const hs_net *net);

/* Publishes the application's snapshot (model + algorithm state, opaque) at round; a reference
 * is taken on success. WELCOMEs to joiners carry the latest one: once an application has
 * published a snapshot, a WELCOME waits (up to snapshot_timeout_ms) for one at least as new as
 * the round at which the join arrived; an application that never publishes one welcomes
 * joiners at once, without a snapshot. */
int hs_net_publish_snapshot(hs_net *net, uint64_t round, hs_buf *snapshot);
/* As hs_net_publish_snapshot, the snapshot being head's bytes (head may be NULL) then body's:
 * a body published again under a new head (a model unchanged, new terms) is not copied. */
int hs_net_publish_snapshot_parts(hs_net *net, uint64_t round, hs_buf *head, hs_buf *body);
/* As hs_net_publish_snapshot at round, but fallback (one reference taken) is not fresh for
 * any joiner: WELCOMEs wait for a published one (hs_net_snapshot_wanted), and fallback goes only
 * to those that waited past snapshot_timeout_ms. Drops the reference to the snapshot published
 * before (a model's snapshot is as large as the model: kept, it is a standing copy of it). */
int hs_net_withdraw_snapshot(hs_net *net, uint64_t round, hs_buf *fallback);
/* 1 when a joiner waits for a snapshot newer than the last published one: the training thread
 * should publish at its next safe point. */
int hs_net_snapshot_wanted(hs_net *net);
/* Join requests not yet answered (WELCOME or refusal): a snapshot withdrawn now would reach
 * the joiners admitted with the application's wait only after the next publication. */
int hs_net_welcomes_pending(hs_net *net);

/* The newest member list this peer knows (which may take effect at a later round), owned by the
 * caller (free()). *version and *eff_round may be NULL. */
int hs_net_members(hs_net *net, hs_net_member **out, int *n, uint64_t *version,
                   uint64_t *eff_round);
/* Waits until the newest member list has at least n members; HS_ETIMEDOUT. */
int hs_net_wait_members(hs_net *net, int n, int timeout_ms);
/* Whether this peer is in the job (docs/PROTOCOL.md, "One job"): 1 while it is a member in
 * touch with a majority of its newest member list (through the sequencer), 0 while it is cut off
 * from one, after waiting up to wait_ms for it to come back. HS_ECANCELED, with who said so,
 * once the job removed this peer: it can only join again as a new peer (hs_net_start).
 * HS_ECONNRESET, with the reason, once this peer woke from a stop (SIGSTOP, a paused VM) to find
 * the members it could still reach no majority, the others gone or left meanwhile: nobody can
 * let it in again, and it must stop. An application runs a round only while this says 1, so a
 * minority never trains on its own. */
int hs_net_in_job(hs_net *net, int wait_ms);

typedef struct hs_net_stats {
    hs_exchange_stats ex; /* DATA frames: payload plus framing */
    uint64_t frames_sent, frames_recv, bytes_sent, bytes_recv; /* all frames */
    uint64_t dropped_emulated; /* DATA frames dropped by loss emulation (first transmissions) */
    uint64_t dropped_late;     /* DATA dropped from the mailbox (unclaimed, or over a cap) */
    uint64_t conns_accepted, conns_refused, conns_malformed;
    uint64_t peers_dead; /* peers this peer declared dead */
    /* Lost DATA (docs/PROTOCOL.md, "Lost DATA: RESEND"): */
    uint64_t resend_asked;     /* RESEND requests sent for a round recv() waited for */
    uint64_t resend_sent;      /* DATA frames sent again on request */
    uint64_t resend_lost;      /* resends the loss emulation dropped (in neither resend_sent
                                  nor dropped_emulated) */
    uint64_t resend_dup;       /* resent DATA that arrived after its round: dropped */
    uint64_t resend_gone;      /* GONE answers received: recv() gave up at once (HS_ENOENT) */
    uint64_t resend_gone_sent; /* GONE answers sent: a round no longer held was asked for */
    uint64_t recv_timeouts;    /* recv() calls that waited their whole timeout in vain */
    uint64_t version;    /* membership version in force at the newest round */
    int n_members;       /* in the newest member list */
    int n_conns;         /* authenticated connections */
} hs_net_stats;
void hs_net_stats_get(hs_net *net, hs_net_stats *out);

/* Heartbeat ping-pong with a connected peer: the round-trip time in microseconds. */
int hs_net_ping(hs_net *net, uint32_t peer, int timeout_ms, double *rtt_us);

/* Graceful leave: flushes what is queued, sends BYE to every connected peer (the others
 * re-weight at once), closes and stops the loop. Call after finishing the current round.
 * HS_ETIMEDOUT when the queues did not drain in time (the connections are closed anyway). */
int hs_net_leave(hs_net *net, int timeout_ms);
/* The same leave for a peer whose run diverged (hearsay/guard.h): its BYE carries `why`, so
 * that the others neither wait for it nor mistake it for a normal leave. */
int hs_net_leave_diverged(hs_net *net, int timeout_ms, const char *why);
/* 1 when a peer left saying that its run diverged: the first such peer's id and reason (why
 * may be NULL). Callable from any thread. */
int hs_net_nbr_diverged(hs_net *net, uint32_t *peer, char *why, size_t cap);

/* Stops (without BYE if hs_net_leave was not called) and frees. Accepts NULL. */
void hs_net_free(hs_net *net);

/* "secret", "cert" or "insecure". */
const char *hs_net_security_name(hs_net_security s);

#ifdef __cplusplus
}
#endif
#endif
