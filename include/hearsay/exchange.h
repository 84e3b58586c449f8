/* hearsay: the exchange interface between an algorithm and a transport.
 *
 * Algorithms (src/algo) never see sockets: they ask an exchange who their neighbours are at a
 * round, hand it payloads for neighbours, and take the payloads neighbours sent them. The
 * network runtime (src/net) and the in-process simulator (src/sim) are two implementations.
 *
 * Threading: an exchange is called from the training thread only (one caller). Payloads are
 * refcounted hs_bufs: send() takes its own reference; buffers returned by recv() and drain()
 * are owned by the caller (hs_buf_unref when done). */
#ifndef HEARSAY_EXCHANGE_H
#define HEARSAY_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/buf.h"
#include "hearsay/topo.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_exchange hs_exchange;

/* A peer's neighbourhood at a round, in peer ids: the topology's view of this peer's rank in
 * the member list in effect at that round. `epoch` changes whenever membership (and so the
 * neighbours or any weight) changes; both ends of every edge see the same epoch at the same
 * round. */
typedef struct hs_nbr {
    uint32_t id;
    double w;
} hs_nbr;

typedef struct hs_peer_view {
    uint64_t epoch;
    uint32_t self;    /* this peer's id */
    int n_members;
    double self_w;
    int n_in, n_out;
    hs_nbr *in;  /* owned by the exchange; valid until the next view() call */
    hs_nbr *out;
} hs_peer_view;

/* A message taken from the exchange. */
typedef struct hs_msg {
    uint32_t from;
    uint64_t round;
    hs_buf *payload; /* owned by the receiver of the hs_msg */
} hs_msg;

/* Bytes of a payload as the transport hands them up (recv_piece): p[0..len) are the payload's
 * bytes [off, off + len) of total; buf holds them (owned by the receiver of the hs_piece). */
typedef struct hs_piece {
    hs_buf *buf;
    const uint8_t *p;
    size_t len;
    uint64_t off, total;
} hs_piece;

/* A piece taken by drain_pieces: of the payload of `round` from `from`. */
typedef struct hs_msg_piece {
    uint32_t from;
    uint64_t round;
    hs_piece pc;
} hs_msg_piece;

typedef struct hs_exchange_stats {
    uint64_t bytes_sent, bytes_recv; /* payload bytes plus framing */
    uint64_t msgs_sent, msgs_recv;
} hs_exchange_stats;

typedef struct hs_exchange_ops {
    /* The view in effect at `round`. */
    int (*view)(hs_exchange *ex, uint64_t round, hs_peer_view *out);
    /* Queues payload for peer `to`, tagged with round. Never blocks: HS_ECONNRESET when `to`
     * is gone, HS_EAGAIN when too much is queued towards it already (a slow link); the
     * message is then not sent. */
    int (*send)(hs_exchange *ex, uint32_t to, uint64_t round, hs_buf *payload);
    /* Waits for the payload of `round` from `from`, up to timeout_ms (< 0: no limit, only for
     * the simulator). HS_ETIMEDOUT when it did not come in time; HS_ENOENT when it will never
     * come (it was lost, which a later round of that sender shows, and the network runtime
     * could not get it sent again; with timeout 0, as soon as a later round is in);
     * HS_ECONNRESET when `from` left or was declared dead. */
    int (*recv)(hs_exchange *ex, uint32_t from, uint64_t round, int timeout_ms, hs_buf **out);
    /* Takes every message that has arrived, of any round, without waiting (asynchronous
     * algorithms). Returns the number written to out (at most max). */
    int (*drain)(hs_exchange *ex, hs_msg *out, int max);
    void (*stats)(hs_exchange *ex, hs_exchange_stats *out);
    /* Optional (NULL: the exchange has only recv). The payload of `round` from `from` as it
     * arrives, without waiting for the rest: the piece that holds byte `at` (a reader that has
     * taken bytes [0, at) asks for at), *out->off == at. Waits and fails as recv does. Every
     * older payload of that sender still waiting is dropped (a piece reader keeps nothing
     * across rounds: D-PSGD). Once called, large payloads of this exchange arrive in pieces
     * of a few MiB (recv still returns them whole, gathered; drain is not for such an
     * exchange); a small one, or one begun before, is one piece. A reader that stops before
     * the total leaves the rest to be dropped by its next call. */
    int (*recv_piece)(hs_exchange *ex, uint32_t from, uint64_t round, uint64_t at,
                      int timeout_ms, hs_piece *out);

    /* Seconds on the exchange's clock, which recv's timeouts run on (the simulator's virtual
     * time); NULL: the host's monotonic clock. For algorithms that weigh a wait against their
     * own pace (SGP). */
    double (*now)(hs_exchange *ex);

    /* Optional (NULL: send never refuses for lack of room, as in the simulator). Waits until
     * send() of a payload of `bytes` bytes to `to` would not be refused for what is still
     * queued towards `to`, up to timeout_ms: 0 then, HS_ETIMEDOUT when it still would be,
     * HS_ECONNRESET when `to` is gone, HS_ECANCELED when this peer stops. A synchronous
     * algorithm asks before it builds a round's message: the previous round's message may
     * still be on a slow link; built at once, it would be a second copy of the model in
     * memory, refused by send() anyway, and a round lost to the neighbour. */
    int (*wait_room)(hs_exchange *ex, uint32_t to, size_t bytes, int timeout_ms);

    /* Optional (NULL: drain only). drain() in pieces, for an asynchronous reader that adds a
     * large payload as it arrives (SGP): takes every payload and every piece of one that has
     * arrived, of any round, without waiting, a sender's in the order of their bytes (a piece
     * starts where the last of its payload ended; a payload whose rest never comes is followed
     * by the next one's first piece, at 0). Returns the number written to out (at most max).
     * Once called, large payloads arrive in pieces, as with recv_piece. */
    int (*drain_pieces)(hs_exchange *ex, hs_msg_piece *out, int max);
} hs_exchange_ops;

struct hs_exchange {
    const hs_exchange_ops *ops;
    void *impl;
};

#ifdef __cplusplus
}
#endif
#endif
