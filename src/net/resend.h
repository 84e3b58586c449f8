/* Recovery of lost DATA frames (docs/PROTOCOL.md, "Lost DATA: RESEND"): a sender keeps its last
 * HS__RS_DEPTH payloads per neighbour; a receiver that waits for a round longer than a short
 * interval derived from the link's round trip asks for it again with RESEND(REQUEST); the
 * sender sends it again (through the link's emulation, as any DATA), or answers RESEND(GONE)
 * when it no longer holds it, and the receiver's recv() then gives up at once (HS_ENOENT).
 *
 * Threading: the store and the frame handlers run on the loop thread; hs__rs_interval_us is
 * pure (the training thread calls it from recv()). */
#ifndef HS_NET_RESEND_H
#define HS_NET_RESEND_H

#include <stdint.h>

#include "hearsay/buf.h"
#include "net/wire.h"

typedef struct hs_net hs_net;
typedef struct hs__peer hs__peer;
typedef struct hs__conn hs__conn;

/* Two rounds: a synchronous receiver waits for the sender's current round or the one before;
 * a deeper store would hold more of the algorithms' pooled payload buffers, which then could
 * not be reused. */
#define HS__RS_DEPTH 2
/* Payloads over this (one PART's worth) are not kept: see hs__rs_keep. */
#define HS__RS_KEEP_MAX HS__PART_SIZE
/* First request not before 20 ms; back-off ceiling between requests (a frame lost while the
 * receiver waited for a slow sender costs at most this); each connected peer's round trip is
 * measured this often. */
#define HS__RS_MIN_US 20000u
#define HS__RS_MAX_US 250000u
#define HS__RS_PING_US 2000000u

/* The payloads last sent to one neighbour (loop thread). */
typedef struct hs__rstore {
    uint64_t round[HS__RS_DEPTH];
    /* Where its last copy went: written whole on this connection (identified by its address
     * and start time, as a freed connection's address may be reused), or nowhere (NULL: lost
     * by the emulation, cut when a connection closed, or still queued). */
    const void *wconn[HS__RS_DEPTH];
    uint64_t wconn_t[HS__RS_DEPTH];
    hs_buf *buf[HS__RS_DEPTH]; /* one reference each; NULL when the slot is free */
    int have_top;
    uint64_t top; /* the newest round handed to this link (sent, or lost by emulation) */
    int have_asked;
    uint64_t asked_top; /* the newest round this peer asked the neighbour for (a GONE beyond
                           it answers no question: a protocol error) */
    uint64_t ping_us;   /* when this peer's round trip was last measured */
} hs__rstore;

/* Keeps payload of round (a reference), dropping the oldest one. */
void hs__rs_keep(hs__rstore *s, uint64_t round, hs_buf *payload);
/* Drops the payloads (a dead peer's, or at the end). What was sent stays known, so that a peer
 * that comes back and asks for one of those rounds is answered GONE rather than left waiting. */
void hs__rs_clear(hs__rstore *s);
/* The DATA frame of round was handed whole to the transport of connection c (reported by the
 * transport through peer_frame_done). */
void hs__rs_written(hs__rstore *s, uint64_t round, const hs__conn *c);

/* How long a receiver waits before its (attempt+1)-th request: 1.5 round trips of the link
 * (the ping's, or twice the emulated one-way delay plus jitter, whichever is larger), at least
 * HS__RS_MIN_US, doubling with each attempt up to HS__RS_MAX_US. */
uint64_t hs__rs_interval_us(double rtt_us, double emu_oneway_ms, int attempt);

/* Gaps on a link. Rounds on a link only go up and the stream is ordered, so a round skipped by
 * a newer one was lost for sure: ask for it at once. *mask has bit i set when round
 * last - 1 - i was skipped and has not come since (64 rounds are tracked). */
/* A newer round than last arrived (have_last: some round did before). */
void hs__rs_gap_note(uint64_t *mask, int have_last, uint64_t last, uint64_t round);
/* 1 when round is a tracked gap. */
int hs__rs_gap_has(uint64_t mask, uint64_t last, uint64_t round);
/* The gap round came after all (resent): clears it. */
void hs__rs_gap_fill(uint64_t *mask, uint64_t last, uint64_t round);

/* Pings every connected peer once every HS__RS_PING_US (HEARTBEAT ping; the pong sets its
 * rtt_us), so that both ends of a link know its round trip (loop thread). */
void hs__rs_tick(hs_net *net, uint64_t now_us);
/* Sends RESEND(REQUEST, round) to p, if it is connected (loop thread). */
void hs__rs_ask(hs_net *net, hs__peer *p, uint64_t round);
/* DATA of round came from p: requests for it (or older rounds) still waiting in the
 * connection's queue, e.g. behind a big frame of ours, are withdrawn; they would only get a copy
 * (loop thread). */
void hs__rs_withdraw(hs__peer *p, uint64_t round);
/* A RESEND frame from c's peer: answers a REQUEST, records a GONE. The payload stays the
 * caller's. < 0 closes the connection (malformed). */
int hs__rs_on_frame(hs_net *net, hs__conn *c, const hs__hdr *h, const hs_buf *pay);

#endif
