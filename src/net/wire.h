/* The hearsay wire format: the frame header, an incremental frame reader, and the codecs of
 * the control messages (docs/PROTOCOL.md has the byte layout). Pure: bytes in, structs out; no
 * I/O, no libuv, no OpenSSL, so it is fuzzed on its own (tests/fuzz/net). Every length read
 * from the network is checked against an explicit limit before anything is allocated or
 * indexed. Decoders set the thread's error message (HS_EPROTO) naming the field that was wrong.
 * Thread-safe: no global state. */
#ifndef HS_NET_WIRE_H
#define HS_NET_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/buf.h"

#define HS__WIRE_MAGIC0 'H'
#define HS__WIRE_MAGIC1 'S'
#define HS__WIRE_MAGIC2 'A'
#define HS__WIRE_MAGIC3 'Y'
/* 2: PART frames, 64-bit snapshot length in WELCOME; 3: SGP's PUSH carries one weight a block of
 * 2^18 values (a version-2 peer would drop every share of a larger model). */
#define HS__WIRE_VERSION 3
#define HS__HDR_LEN 24
#define HS__FRAME_CAP (256u << 20) /* hard cap of any payload */
#define HS__CTL_MAX (4u << 20)     /* cap of control payloads (MEMBERS of many peers) */
#define HS__PREAUTH_MAX 4096       /* cap of payloads before authentication */
#define HS__ID_NONE 0xFFFFFFFFu    /* sender id of a peer that has not joined yet */
/* Messages larger than one part travel as PART frames (docs/PROTOCOL.md, "Large messages"):
 * each carries a 24-byte part header and up to HS__PART_SIZE bytes of the message. */
#define HS__PART_HDR_LEN 24
#define HS__PART_SIZE (4u << 20)
#define HS__MSG_CAP ((uint64_t)1 << 36) /* hard cap of a reassembled message (64 GiB) */

/* String field limits (bytes, without the terminating NUL the decoders add). */
#define HS__RUNID_MAX 128
#define HS__SIG_MAX 256
#define HS__NAME_MAX 64 /* algorithm and codec names */
#define HS__ADDR_MAX 255
#define HS__REASON_MAX 512
#define HS__SPEC_MAX 1024
#define HS__MEMBERS_MAX 65535

typedef enum hs__ftype {
    HS__T_HELLO = 1,
    HS__T_HELLO_ACK = 2,
    HS__T_REFUSE = 3,
    HS__T_JOIN = 4,
    HS__T_WELCOME = 5,
    HS__T_MEMBERS = 6,
    HS__T_DATA = 7,
    HS__T_HEARTBEAT = 8,
    HS__T_BYE = 9,
    HS__T_SUSPECT = 10,
    HS__T_JOIN_FWD = 11,
    HS__T_JOIN_ACK = 12,
    HS__T_RESEND = 13,
    HS__T_PART = 14,
    HS__T_MAX = 14,
} hs__ftype;

/* Header flags. RESENT is the only one, and only on DATA: the frame answers a RESEND request, so
 * a copy that arrives after its round (the original was only late) is dropped, not a replay. */
#define HS__F_RESENT 0x0001u

/* "HELLO", "DATA", ...; "type 42" style names for unknown values are not returned: "?". */
const char *hs__wire_type_name(int type);

typedef struct hs__hdr {
    uint8_t version, type;
    uint16_t flags;
    uint32_t sender;
    uint64_t len; /* payload bytes after the header (on the wire: u32; a message reassembled
                     from PART frames: its whole length) */
    uint64_t round;
} hs__hdr;

void hs__wire_hdr_encode(uint8_t out[HS__HDR_LEN], const hs__hdr *h);

/* Decodes and checks a header: magic, version, known type, no flag but RESENT on DATA. Does not
 * check the length (the reader does, against its per-type limits). HS_EPROTO naming what was wrong.
 */
int hs__wire_hdr_decode(const uint8_t in[HS__HDR_LEN], hs__hdr *out);

/* ------------------------------------------------------------------ PART frames
 * The part header that opens a PART frame's payload: which message the bytes after it belong
 * to, and where they go in it. */
typedef struct hs__part {
    uint8_t type;   /* the message's frame type */
    uint16_t flags; /* the message's header flags */
    uint32_t id;    /* messages on a connection are numbered 1, 2, ... in the order begun */
    uint64_t total; /* the message's length */
    uint64_t off;   /* where this part's bytes go */
} hs__part;

void hs__wire_part_encode(uint8_t out[HS__PART_HDR_LEN], const hs__part *p);
/* Checks the reserved byte only; the reader checks the rest against its state and limits. */
int hs__wire_part_decode(const uint8_t in[HS__PART_HDR_LEN], hs__part *out);

/* ------------------------------------------------------------------ incremental frame reader
 * (reader.c) Bytes go in as they come off the stream; complete frames come out. The header is
 * checked as soon as its 24 bytes are in, and the payload buffer is allocated only after its
 * length passed max_len[type], so a peer cannot make us allocate more than it is allowed to
 * send. A message in PART frames is reassembled in place: its buffer is allocated at its first
 * part, once its total passed max_msg[type], and each part's bytes are checked (the message's
 * id, type, flags, round and total unchanged, the offset where the last part ended, nothing
 * past the total) before they are read into it. Other frames may come between parts; one
 * message at a time is reassembled. With `stream` set when its first part comes, a DATA
 * message is not reassembled: each part, checked the same way, comes out on its own as a PART
 * frame whose payload is its part header and its bytes (the receiver's runtime hands them up
 * as they come, net/pieces.h), so no buffer of the message's size is ever allocated. */
typedef struct hs__rmsg {
    hs_buf *buf; /* owned; NULL: no message reassembled */
    int streamed; /* a DATA message in progress whose parts go out one by one */
    hs__part p;  /* its first part's header (off: where the next part must start) */
    uint64_t round;
    uint64_t end; /* where the part being read ends */
} hs__rmsg;

typedef struct hs__reader {
    uint32_t max_len[HS__T_MAX + 1]; /* per type; 0 = the type is not accepted now */
    uint64_t max_msg[HS__T_MAX + 1]; /* per type: largest message in PART frames; 0 = none */
    uint8_t hb[HS__HDR_LEN];
    size_t hb_have;
    hs__hdr hdr;
    hs_buf *pay; /* payload being filled, owned */
    size_t pay_have;
    int in_payload; /* in a frame's payload (or a PART's part header or bytes) */
    int in_part;    /* 1: reading a part header, 2: a part's bytes into the message, 3: a
                       streamed part's bytes into pay (after its part header) */
    int stream;     /* set by the owner: DATA messages in parts go out part by part */
    uint8_t ph[HS__PART_HDR_LEN];
    size_t ph_have;
    hs__rmsg msg;
    uint32_t last_id; /* the id of the last message begun */
} hs__reader;

void hs__reader_init(hs__reader *r); /* accepts nothing, allows nothing until max_len is set */
void hs__reader_free(hs__reader *r); /* drops a partial payload */

/* Consumes bytes of p[0..n) up to the end of the next complete frame. Returns 1 when a frame
 * completed (*hdr filled, *payload returned owned), 0 when all n bytes were consumed without
 * completing one, or a negative HS_E* (HS_EPROTO for a malformed frame, HS_ENOMEM). *used tells
 * how many bytes were consumed in every case. */
int hs__reader_feed(hs__reader *r, const uint8_t *p, size_t n, size_t *used, hs__hdr *hdr,
                    hs_buf **payload);

/* While a payload is being filled, the caller may read straight into it: returns the number of
 * payload bytes still missing and points *dst at where they go; 0 when not in a payload. */
size_t hs__reader_direct(hs__reader *r, uint8_t **dst);

/* Accounts n bytes written at the pointer given by hs__reader_direct (n <= what it returned).
 * Returns 1 when that completed the frame (outputs as for feed), else 0. */
int hs__reader_direct_done(hs__reader *r, size_t n, hs__hdr *hdr, hs_buf **payload);

/* Bytes of a frame received so far (header and payload, and of a message in parts), 0 at a
 * frame boundary with no message in progress. */
size_t hs__reader_partial(const hs__reader *r);

/* ------------------------------------------------------------------ control messages */

/* HELLO (client -> server) and HELLO_ACK (server -> client) carry the same fields. */
typedef struct hs__hello {
    uint16_t proto;
    uint32_t peer_id; /* HS__ID_NONE for a joiner */
    char run_id[HS__RUNID_MAX + 1];
    char listen[HS__ADDR_MAX + 1];
    char model_sig[HS__SIG_MAX + 1];
    uint64_t n_params;
    char algo[HS__NAME_MAX + 1];
    char codec[HS__NAME_MAX + 1];
    uint64_t mver;    /* membership version known to the sender */
    uint32_t missuer; /* who issued it */
    uint64_t round;   /* the sender's current round */
} hs__hello;

int hs__wire_hello_encode(hs_buf *out, const hs__hello *h);
int hs__wire_hello_decode(const uint8_t *p, size_t n, hs__hello *out);

/* REFUSE codes: why a handshake was refused; RETRY means "not now, try again later". */
enum {
    HS__REFUSE_MISMATCH = 1,
    HS__REFUSE_NOT_MEMBER = 2,
    HS__REFUSE_RETRY = 3,
    HS__REFUSE_LIMIT = 4,
    HS__REFUSE_PROTO = 5
};
/* BYE codes: LEAVE = the sender leaves the run; CLOSE = only this connection closes. */
/* BYE codes: DIVERGED is a leave whose reason is the convergence guard's verdict. */
enum { HS__BYE_LEAVE = 1, HS__BYE_CLOSE = 2, HS__BYE_DIVERGED = 3 };

/* REFUSE, BYE and SUSPECT: a code (or peer id) and a reason. */
typedef struct hs__reason {
    uint32_t code; /* REFUSE/BYE code, or the suspected peer id for SUSPECT */
    char text[HS__REASON_MAX + 1];
} hs__reason;

int hs__wire_reason_encode(hs_buf *out, const hs__reason *r);
int hs__wire_reason_decode(const uint8_t *p, size_t n, hs__reason *out);

/* JOIN (joiner -> any member), JOIN_FWD (member -> sequencer), JOIN_ACK (sequencer -> member).
 */
typedef struct hs__join {
    uint64_t nonce; /* the joiner's random tag; a repeated JOIN gets the same id */
    uint32_t via;   /* JOIN_FWD/JOIN_ACK: the member that holds the joiner's connection */
    uint32_t id;    /* JOIN_ACK: the assigned id (HS__ID_NONE: refused, see text) */
    uint64_t mver;  /* JOIN_ACK: the membership version that adds it */
    uint8_t ttl;    /* JOIN_FWD: forwards left */
    char addr[HS__ADDR_MAX + 1]; /* JOIN/JOIN_FWD: the joiner's listen address; ACK: reason */
} hs__join;

int hs__wire_join_encode(hs_buf *out, const hs__join *j);
int hs__wire_join_decode(const uint8_t *p, size_t n, hs__join *out);

/* MEMBERS: a membership version. Members sorted by id, ids unique. */
typedef struct hs__member {
    uint32_t id;
    char addr[HS__ADDR_MAX + 1];
} hs__member;

typedef struct hs__members {
    uint64_t version;
    uint32_t issuer;    /* the sequencer that issued it */
    uint64_t eff_round; /* every member switches to this list at this round */
    uint32_t next_id;   /* the next id to assign: above every id ever given */
    uint32_t n;
    hs__member *m; /* owned (decode allocates; hs__members_clear frees) */
} hs__members;

void hs__members_clear(hs__members *m);
int hs__members_copy(hs__members *dst, const hs__members *src);
int hs__wire_members_encode(hs_buf *out, const hs__members *m);
/* Checks: n <= HS__MEMBERS_MAX and fits the payload before allocating, ids strictly
 * increasing, all ids below next_id, addresses printable. */
int hs__wire_members_decode(const uint8_t *p, size_t n, hs__members *out);

/* WELCOME: everything a joiner needs. config and snap point into the decoded payload. */
typedef struct hs__welcome {
    uint32_t id;
    uint64_t round;      /* the welcoming member's current round */
    uint64_t join_round; /* the joiner's first round (members.eff_round) */
    char topo_spec[HS__SPEC_MAX + 1];
    uint64_t topo_seed;
    hs__members members;
    const uint8_t *config;
    uint32_t config_len;
    uint64_t snap_round;
    const uint8_t *snap;
    uint64_t snap_len;
} hs__welcome;

int hs__wire_welcome_encode(hs_buf *out, const hs__welcome *w);
/* Everything but the snapshot's bytes, which follow it on the wire (sent from their own
 * buffer, not copied). */
int hs__wire_welcome_encode_head(hs_buf *out, const hs__welcome *w);
/* out->members is allocated (hs__members_clear); config/snap borrow from p. Checks that the
 * assigned id is in the member list. */
int hs__wire_welcome_decode(const uint8_t *p, size_t n, hs__welcome *out);

/* HEARTBEAT: liveness, round and membership version (anti-entropy), ping/pong, and QUORUM
 * (token 1: the sender is the sequencer and reaches a majority; 0: not). */
/* HOLD: a BEAT from a side that does not read this connection for now (its application has not
 * taken what arrived: backpressure), so that the other side does not take its unwritten bytes
 * for a peer that stopped reading. */
enum { HS__HB_BEAT = 0, HS__HB_PING = 1, HS__HB_PONG = 2, HS__HB_QUORUM = 3, HS__HB_HOLD = 4 };
#define HS__HB_LEN 29
typedef struct hs__heartbeat {
    uint8_t kind;
    uint64_t token; /* PING: any; PONG: the PING's token */
    uint64_t round;
    uint64_t mver;
    uint32_t missuer;
} hs__heartbeat;

int hs__wire_heartbeat_encode(hs_buf *out, const hs__heartbeat *h);
int hs__wire_heartbeat_decode(const uint8_t *p, size_t n, hs__heartbeat *out);

/* RESEND: a receiver asks the sender of a DATA round it misses for it again (REQUEST); a sender
 * that no longer holds that round says so (GONE), so that the receiver stops waiting at once. */
enum { HS__RS_REQUEST = 1, HS__RS_GONE = 2 };
#define HS__RESEND_LEN 9
typedef struct hs__resend {
    uint8_t kind;   /* HS__RS_REQUEST or HS__RS_GONE */
    uint64_t round; /* the DATA round asked for, or the one that is gone */
} hs__resend;

int hs__wire_resend_encode(hs_buf *out, const hs__resend *r);
/* Exactly HS__RESEND_LEN bytes, a known kind, round below 2^63. */
int hs__wire_resend_decode(const uint8_t *p, size_t n, hs__resend *out);

/* Address "HOST:PORT" or "[V6]:PORT" split into host and port; host may be a name. */
int hs__wire_addr_split(const char *addr, char *host, size_t host_cap, int *port);

#endif
