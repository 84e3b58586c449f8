/* The part hand-up (runtime layer): a DATA message in PART frames goes up to the application
 * part by part as it arrives (hs_exchange's recv_piece), instead of being reassembled into one
 * buffer of the message's size. Here are the decisions about each arriving part, per sender:
 * a new message, more of the one in progress, or a duplicate (bytes a resent copy carries
 * again after a connection was cut midway), and the errors. Pure: no I/O, no locks (the caller
 * holds the runtime's mutex); tests/unit/net/test_pieces.c feeds it parts out of order,
 * duplicated and corrupt. */
#ifndef HS_NET_PIECES_H
#define HS_NET_PIECES_H

#include <stdint.h>

/* One sender's message in parts: the newest begun, and how much of it has arrived (from its
 * first byte, without a gap). */
typedef struct hs__pstream {
    uint64_t round;
    uint64_t total; /* the message's length */
    uint64_t end;   /* bytes [0, end) have arrived */
    int active;     /* begun and not complete */
    int dropping;   /* its parts are dropped (the runtime refused its first part as a replay) */
} hs__pstream;

enum {
    HS__PIECE_NEW = 1,  /* the first part of a message: the runtime checks its round as it checks
                           a whole message's (hs__pstream_drop when it drops it) */
    HS__PIECE_MORE = 2, /* new bytes of the message in progress, from *from */
    HS__PIECE_DUP = 3,  /* nothing new: drop it */
};

/* Bytes [off, off + n) of the message of `round`, of total bytes, arrived (resent: on a copy the
 * sender sent again). Returns HS__PIECE_* (for NEW and MORE, *from is where its new bytes
 * begin, >= off, and s has moved past them) or HS_EPROTO naming what was wrong: an empty part,
 * one past its total, a total other than its message's, a gap after the bytes that arrived, a
 * part after the first of a message that was not begun. */
int hs__pstream_accept(hs__pstream *s, uint64_t round, uint64_t off, uint64_t n, uint64_t total,
                       int resent, uint64_t *from);

/* The message begun is dropped as a whole: its later parts are duplicates. */
void hs__pstream_drop(hs__pstream *s);

/* Of the pieces of one message waiting (bytes [off, off + len) each), which one a reader that
 * has taken bytes [0, at) reads next: the one that holds byte `at` (its bytes before `at` are
 * skipped). Returns 1 and *skip (bytes of it to pass over), 0 when it does not hold byte `at`
 * and ends after it (still to come), or -1 when it ends at or before `at` (a duplicate: drop). */
int hs__piece_fits(uint64_t off, uint64_t len, uint64_t at, uint64_t *skip);

#endif
