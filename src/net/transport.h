/* The transport layer, the bottom of the runtime's stack: frames and their queues, and
 * connections (plain TCP or TLS over memory BIOs, with the link emulation as a shim in the
 * write path: release times stamped when a frame is queued, pacing when it is written).
 *
 * The layers above use it only through hs__transport_ops (listen, dial, send, close...), and it
 * reports upward only through the hs__transport_events its owner installs (connection open,
 * refused, closed, a frame arrived, HELLO contents and checks): it knows neither membership
 * nor bootstrap, and treats c->peer as an opaque pointer of the layer above.
 *
 * Threading: loop thread only, except the hs_net_stats counters (atomics, or under *mu). */
#ifndef HS_NET_TRANSPORT_H
#define HS_NET_TRANSPORT_H

#include <stdint.h>
#include <uv.h>

#include "core/log.h"
#include "hearsay/net.h"
#include "net/emulate.h"
#include "net/tls.h"
#include "net/wire.h"

typedef struct hs__conn hs__conn;
typedef struct hs__peer hs__peer; /* the layer above's: never dereferenced here */

uint64_t hs__now_us(void);

/* ------------------------------------------------------------------ outgoing frames */
/* One message. Up to HS__PART_SIZE bytes it is one frame; above, a run of PART frames of
 * HS__PART_SIZE bytes of it each (pieces), their headers made as they go out, the bytes sent
 * from the message's own buffers. */
typedef struct hs__frame {
    struct hs__frame *next;
    uint8_t hdr[HS__HDR_LEN];
    uint8_t type;
    uint16_t flags;
    uint64_t len; /* the message's bytes: payload, then tail */
    uint64_t round;
    hs_buf *payload;     /* one reference */
    hs_buf *tail;        /* NULL, or one reference: the message goes on in it */
    uint64_t release_us; /* emulation: not before */
    size_t off;          /* bytes of wire handed to the transport */
    size_t wire;         /* bytes on the wire: every header and the message */
    int parts;           /* 1: in PART frames */
    uint32_t msg_id;     /* parts: its number on the connection that sends it */
    uint64_t phdr_at;    /* parts: which piece phdr holds the headers of (+1; 0: none) */
    uint8_t phdr[HS__HDR_LEN + HS__PART_HDR_LEN];
} hs__frame;

typedef struct hs__fq {
    hs__frame *head, *tail;
    size_t bytes; /* header + payload bytes not yet handed to the transport */
    size_t n;
} hs__fq;

void hs__fq_push(hs__fq *q, hs__frame *f);
void hs__fq_push_front(hs__fq *q, hs__frame *f);
hs__frame *hs__fq_pop(hs__fq *q);
void hs__fq_clear(hs__fq *q);
void hs__frame_free(hs__frame *f);
/* Lets go of the frame's message (its header fields stay), before the frame is freed. */
void hs__frame_drop_bufs(hs__frame *f);
/* A frame from peer `sender`: takes a reference to payload on success. */
int hs__frame_new(hs__frame **out, uint32_t sender, uint8_t type, uint64_t round, hs_buf *payload);
/* Before it is queued: the message goes on in tail (a reference is taken), or has flags. */
void hs__frame_set_tail(hs__frame *f, hs_buf *tail);
void hs__frame_set_flags(hs__frame *f, uint16_t flags);
/* Where the piece (a whole frame, or one PART frame) that f->off is in ends on the wire; 1 when
 * f->off is inside a piece (then nothing else may go out on its connection before the rest). */
size_t hs__frame_piece_end(const hs__frame *f);
int hs__frame_mid(const hs__frame *f);
/* The bytes at wire offset off, contiguous, up to end: *p points at them (a header, made here,
 * or the message's buffers); *hdr tells which. Returns how many. */
size_t hs__frame_span(hs__frame *f, size_t off, size_t end, const uint8_t **p, int *hdr);
/* The emulation shim: stamps when f may leave over link l (none: at once) and queues it. */
void hs__frame_queue(hs__fq *q, hs__link *l, hs__frame *f);

/* The spans of wire bytes [f->off, end) (end within the piece f->off is in): at most a header
 * and two spans of the message. Returns how many (<= 4). */
int hs__frame_spans(hs__frame *f, size_t end, const uint8_t **sp, size_t *sn, int *sh);

/* ------------------------------------------------------------------ connections */
enum { HS__C_CONNECTING, HS__C_TLS, HS__C_HELLO, HS__C_OPEN, HS__C_CLOSING };
#define HS__JOINER_ASKED 2 /* c->joiner once its JOIN arrived */

typedef struct hs__transport hs__transport;

/* A connection's byte stream is a stack: TCP at the bottom, a layer that carries the frames
 * over it (plain, or TLS: layer_plain.c, layer_tls.c), the frames on top; the link emulation
 * shapes what goes down (release times and pacing in hs__conn_pump). The layer is all that
 * knows how bytes look on the socket, so a test can put another one in its place. */
typedef struct hs__layer {
    const char *name;
    size_t inflight_cap; /* frame bytes handed down and not yet on the socket, at most */
    size_t chunk_max;    /* frame bytes per write */
    int costly;          /* writing costs CPU (encryption): a budget per pump call applies */
    /* TCP is up: begin (a handshake of its own, then hs__conn_secured; or that at once). */
    int (*start)(hs__conn *c);
    /* Where the socket's next bytes go: its own buffer (c->io.direct = 1) or c->rx. */
    void (*alloc)(hs__conn *c, uv_buf_t *buf);
    /* n bytes arrived: at p (c->rx), or (p NULL) where alloc pointed. Plaintext goes up through
     * hs__conn_feed / hs__conn_direct_done. */
    void (*read)(hs__conn *c, const uint8_t *p, size_t n);
    /* The other side's end of stream before any frame: 1 when the layer handled it. */
    int (*eof)(hs__conn *c);
    /* Hands chunk bytes of f from f->off down (f->off advances). */
    int (*write)(hs__conn *c, hs__frame *f, size_t chunk);
    const char *(*describe)(hs__conn *c, char *buf, size_t cap);
    void (*free)(hs__conn *c);
} hs__layer;

extern const hs__layer hs__layer_plain, hs__layer_tls;

/* A write request of a layer: what it holds until libuv is done with it. */
typedef struct hs__wreq {
    uv_write_t req;
    hs__conn *c;
    size_t bytes;    /* frame bytes this write accounts for */
    hs_buf *payload; /* a reference, or NULL */
    hs_buf *tail;    /* a reference to the frame's tail, or NULL */
    uint8_t *cipher; /* owned bytes (TLS ciphertext), or NULL */
    uint8_t hdr[HS__HDR_LEN + HS__PART_HDR_LEN];
} hs__wreq;

/* The transport's own bookkeeping of a connection's closing and reading. */
typedef struct hs__conn_io {
    uv_shutdown_t shut;
    int direct;      /* the current read goes straight into the payload */
    int final;       /* uv_close called */
    int shutdown;    /* uv_shutdown called */
    int notified;    /* on_closed reported */
    size_t last_len; /* payload length of the last frame read */
    int eof;         /* the other side's end of stream (or an error) was read */
} hs__conn_io;

struct hs__conn {
    hs__transport *tr;
    uv_tcp_t tcp;
    uv_timer_t timer; /* emulation release and pacing; close flush limit */
    uv_connect_t connect_req;
    int handles_open; /* handles not yet closed */
    int state;
    int outgoing;    /* we dialed */
    int bootstrap;   /* our connection to the bootstrap address (joining) */
    char remote[80]; /* "ip:port" of the socket */
    char remote_ip[64];
    uint32_t expect_id; /* outgoing: the member we dialed, or HS__ID_NONE */
    uint32_t peer_id;   /* after HELLO; HS__ID_NONE for a joiner */
    uint32_t joiner_id; /* id given to a joiner on this connection (frames may use it) */
    hs__peer *peer;     /* the layer above's peer attached to it (opaque here) */
    hs__hello hello;    /* the other side's HELLO or HELLO_ACK */
    const hs__layer *layer; /* set when TCP is up */
    hs__tls *tls;           /* the TLS layer's session */
    hs__reader rd;
    uint8_t *rx; /* read staging */
    size_t rx_cap;
    uint8_t *plain;  /* TLS plaintext staging */
    hs__fq ctlq;     /* this connection's own frames; go before the peer's */
    hs__frame *wopen; /* the message in parts begun and not finished (one at a time) */
    uint32_t wmsg_id; /* the number of the last message in parts begun */
    size_t inflight; /* bytes handed to libuv, not yet written */
    int nwrites;
    uint64_t t_start_us, last_recv_us, last_send_us, last_progress_us;
    uint64_t app_bytes; /* plaintext bytes taken after the handshake */
    int joiner;         /* accepted from a peer without an id: it may only join (2: it did) */
    int got_bye;        /* BYE received: 1 close, 2 leave */
    int timer_armed;
    int connected;                /* TCP established */
    int reading_paused;           /* mailbox backpressure (read_pause): 1, or 2 for pieces */
    uint64_t paused_us;    /* when reading_paused began */
    uint64_t held_us;      /* when the other side last said it holds its reads (HEARTBEAT HOLD) */
    uint64_t hold_sent_us; /* when this side last said so */
    int state_before_close;       /* the state close found */
    int refused_retry;            /* the other side said REFUSE with "try again" */
    char why[HS__REASON_MAX + 1]; /* why it is closing */
    hs__conn_io io;
    hs__conn *next, *prev;
};

/* How long a connection held for pieces (read_pause 2) says HOLD, and is not itself judged
 * slow for its stalled writes: an application's local update between two rounds may take
 * this long while a neighbour's large message waits in the socket; past it, the usual rules. */
#define HS__HOLD_MAX_US (300ull * 1000000)
static inline int hs__conn_holding(const struct hs__conn *c, uint64_t now) {
    return c->reading_paused == 2 && now - c->paused_us < HS__HOLD_MAX_US;
}
/* Whether bytes in flight on c, unwritten for longer than peer_to, make the other side a slow
 * peer (hs__conn_tick closes it): not while this side holds its own reads of it, nor while the
 * other side says HOLD, but that only until the bytes have waited HS__HOLD_MAX_US and peer_to
 * more: the cap is kept here too, or a peer that says HOLD forever (buggy, malicious) and never
 * reads would pin the connection and its queue, and never be judged. */
static inline int hs__conn_slow(const struct hs__conn *c, uint64_t now, uint64_t peer_to) {
    uint64_t stalled = now - c->last_progress_us;
    int held = now - c->held_us <= peer_to && stalled <= HS__HOLD_MAX_US + peer_to;
    return c->inflight > 0 && !hs__conn_holding(c, now) && stalled > peer_to && !held;
}

/* What the transport tells the layer above (owner is hs__transport.owner). */
typedef struct hs__transport_events {
    /* HELLO and its check: 0, or a REFUSE code with the reason written to why. */
    void (*make_hello)(void *owner, hs__hello *h);
    int (*check_hello)(void *owner, hs__conn *c, const hs__hello *h, int server, char *why,
                       size_t cap);
    /* A heartbeat's fields (round, member-list version) for an idle connection. */
    void (*make_heartbeat)(void *owner, hs__heartbeat *hb);
    /* 1 while the owner takes no new connections (leaving or stopping). */
    int (*closing)(void *owner);
    void (*on_open)(void *owner, hs__conn *c);
    void (*on_refused)(void *owner, hs__conn *c, uint32_t code, const char *text);
    void (*on_closed)(void *owner, hs__conn *c, int err, int dial_failed);
    /* A frame on an open connection; the payload reference is the callee's. < 0 closes the
     * connection as malformed (message set). */
    int (*on_frame)(void *owner, hs__conn *c, const hs__hdr *h, hs_buf *payload);
    /* The queue of c's peer when c is the connection in use for it (else NULL), and the
     * emulated link to it (NULL: none). */
    hs__fq *(*peer_queue)(hs__conn *c);
    hs__link *(*peer_link)(hs__conn *c);
    /* A frame of the peer queue left it: written whole (1) or cut when c closed (0). */
    void (*peer_frame_done)(void *owner, hs__conn *c, const hs__frame *f, int written);
} hs__transport_events;

typedef struct hs__transport_ops hs__transport_ops;

struct hs__transport {
    const hs__transport_ops *ops;
    const hs__transport_events *ev;
    void *owner;
    uv_loop_t *loop;
    const hs_net_config *cfg;
    hs_net_stats *st; /* counters: atomics, or under *mu */
    uv_mutex_t *mu;
    const uint32_t *self; /* this peer's id, for frame headers */
    hs__tls_ctx *tls;     /* NULL: plain TCP */
    /* A layer that new connections use instead (a test's adversary), or NULL: TLS when tls is
     * set, else plain. Read with __atomic_load_n: a test may set it from its own thread. */
    const hs__layer *layer;
    const char *listen_addr;
    uv_tcp_t listener;
    int listening;
    int listen_port;
    int listen_wildcard;
    hs__conn *conns;
    int n_conns;
    uint64_t refuse_log_us; /* when a refusal was last logged */
    uint64_t refuse_quiet;  /* refusals not logged since */
    uint64_t last_tick_us;  /* the previous hs__conn_tick: a long gap means this process slept */
    /* Set by the owner (__atomic_store_n, any thread): DATA messages in parts go up part by
     * part (hs__reader.stream), from the next message begun. */
    int stream_data;
};

/* The transport's operations: what the layers above call. */
struct hs__transport_ops {
    int (*listen)(hs__transport *tr);
    void (*close_listener)(hs__transport *tr);
    int (*dial)(hs__transport *tr, const char *addr, uint32_t expect_id, hs__conn **out);
    int (*dial_sa)(hs__transport *tr, const struct sockaddr *sa, uint32_t expect_id,
                   hs__conn **out);
    /* Queues a frame on c's own queue (before its peer's) and starts writing. */
    int (*send)(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload);
    /* The same, for a message that goes on in tail (sent from where it is). */
    int (*send_tail)(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload, hs_buf *tail);
    /* Writes what the connection's queues allow now. */
    void (*pump)(hs__conn *c);
    /* Closes: logs why (level), sends BYE(CLOSE, why) first when bye is set and the connection
     * is open, reports on_closed and frees it once libuv is done. */
    void (*close)(hs__conn *c, int err, int bye, hs_log_level level, const char *fmt, ...)
        HS__PRINTF(5, 6);
    /* Closes at once, without flushing (stopping). */
    void (*abort)(hs__conn *c);
    /* 1 once only its close callbacks remain. */
    int (*closed)(hs__conn *c);
    int (*flushed)(hs__conn *c);
    /* Stops (1) or resumes (0) reading: backpressure. Resuming forgives the silence. 2 stops
     * for pieces of a message the application takes as they come: the other side is told
     * HOLD (for at most HS__HOLD_MAX_US), so that it waits instead of judging this side slow. */
    void (*read_pause)(hs__conn *c, int pause);
    /* Sets which frame types (and sizes) the reader accepts, from the state and role. */
    void (*set_limits)(hs__conn *c);
    /* Heartbeats, handshake deadlines, silence and write-progress checks. */
    void (*tick)(hs__transport *tr, uint64_t now_us);
    /* The local IP of a connection ("127.0.0.1"), for an advertise address. */
    int (*local_ip)(hs__conn *c, char *buf, size_t cap);
    int (*resolve)(const char *addr, struct sockaddr_storage *out);
};

/* TCP, with TLS when tr->tls is set. */
extern const hs__transport_ops hs__tcp;

/* ------------------------------------------------------------------ between the transport files */
int hs__conn_listen(hs__transport *tr);
void hs__conn_close_listener(hs__transport *tr);
int hs__conn_dial(hs__transport *tr, const char *addr, uint32_t expect_id, hs__conn **out);
int hs__conn_dial_sa(hs__transport *tr, const struct sockaddr *sa, uint32_t expect_id,
                     hs__conn **out);
int hs__conn_send(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload);
int hs__conn_send_tail(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload, hs_buf *tail);
void hs__conn_pump(hs__conn *c);
void hs__conn_close(hs__conn *c, int err, int bye, hs_log_level level, const char *fmt, ...)
    HS__PRINTF(5, 6);
void hs__conn_abort(hs__conn *c);
int hs__conn_closed(hs__conn *c);
int hs__conn_flushed(hs__conn *c);
void hs__conn_read_pause(hs__conn *c, int pause);
void hs__conn_set_limits(hs__conn *c);
void hs__conn_tick(hs__transport *tr, uint64_t now_us);
int hs__conn_local_ip(hs__conn *c, char *buf, size_t cap);
int hs__conn_resolve(const char *addr, struct sockaddr_storage *out);
/* conn.c: a new connection in the transport's list, its handshake once TCP is up;
 * conn_write.c: the final close, the frame counters. */
hs__conn *hs__conn_new(hs__transport *tr, int outgoing);
int hs__conn_start(hs__conn *c);
void hs__conn_final_close(hs__conn *c);
void hs__conn_mark_closed(hs__conn *c); /* never reported: closed before it was started */
void hs__conn_sa_format(const struct sockaddr *sa, char *ip, size_t ipcap, char *full,
                        size_t fullcap);
void hs__conn_count(hs__transport *tr, int sent, size_t frame_bytes, int type);
/* "peer 3 (127.0.0.1:7003)", or the address alone, for logs. */
const char *hs__conn_name(hs__conn *c, char *buf, size_t cap);
/* conn_write.c: a layer's write request is done; the end of a close once flushed; the
 * connection's timer (emulation release, pacing, close flush limit). */
void hs__conn_on_write(uv_write_t *req, int status);
void hs__conn_maybe_finish_close(hs__conn *c);
/* conn.c, for the layers: the layer is up (HELLO next); plaintext for the frame reader, at p or
 * (direct_done) n bytes where hs__reader_direct pointed. */
int hs__conn_secured(hs__conn *c);
void hs__conn_feed(hs__conn *c, const uint8_t *p, size_t n);
void hs__conn_direct_done(hs__conn *c, size_t n);
void hs__conn_on_timer(uv_timer_t *t);

#endif
