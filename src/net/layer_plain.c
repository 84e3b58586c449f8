/* The plain layer of a connection's stack (transport layer, --insecure): frames' bytes go to
 * TCP as they are, header and payload from where they lie (the write holds a reference to the
 * payload), and a payload being read is read into straight from the socket.
 *
 * Threading: loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/transport.h"

#define DIRECT_MIN (16u * 1024) /* read straight into a payload when this much is missing */
#define BIG_FRAME (64u * 1024)

static int plain_start(hs__conn *c) { return hs__conn_secured(c); }

static void plain_alloc(hs__conn *c, uv_buf_t *buf) {
    uint8_t *dst;
    size_t want;
    if (c->state != HS__C_CLOSING && (want = hs__reader_direct(&c->rd, &dst)) >= DIRECT_MIN) {
        c->io.direct = 1;
        buf->base = (char *)dst;
        buf->len = want > (1u << 30) ? (1u << 30) : want;
        return;
    }
    c->io.direct = 0;
    buf->base = (char *)c->rx;
    buf->len = c->rx_cap;
    /* After a large frame, or inside a message in parts, read the next header alone: its
     * payload then goes straight into its buffer instead of through the staging copy (one
     * small read against a big memcpy). */
    if (c->io.last_len >= BIG_FRAME || c->rd.msg.buf) {
        if (!c->rd.in_payload)
            buf->len = HS__HDR_LEN - c->rd.hb_have;
        else if (c->rd.in_part == 1) /* the same for the part header of a PART frame */
            buf->len = HS__PART_HDR_LEN - c->rd.ph_have;
    }
}

static void plain_read(hs__conn *c, const uint8_t *p, size_t n) {
    if (p)
        hs__conn_feed(c, p, n);
    else
        hs__conn_direct_done(c, n);
}

static int plain_eof(hs__conn *c) {
    (void)c;
    return 0;
}

/* Straight to the socket when nothing is queued before them: no request, no callback, which is
 * what a small frame's latency is made of; what it does not take goes in a write request. */
static int plain_write(hs__conn *c, hs__frame *f, size_t chunk) {
    const uint8_t *sp[4];
    size_t sn[4];
    int sh[4];
    size_t off = f->off, end = off + chunk;
    int ns = hs__frame_spans(f, end, sp, sn, sh), first = 0;
    uv_buf_t b[4];
    for (int i = 0; i < ns; i++)
        b[i] = uv_buf_init((char *)sp[i], (unsigned)sn[i]);
    if (!c->nwrites) {
        int r = uv_try_write((uv_stream_t *)&c->tcp, b, (unsigned)ns);
        if (r < 0 && r != UV_EAGAIN && r != UV_ENOSYS)
            return hs__err(r, "write: %s", uv_strerror(r));
        if (r > 0) {
            off += (size_t)r;
            f->off = off;
            c->last_send_us = c->last_progress_us = hs__now_us();
            if (off == end)
                return 0;
            /* Skip what went: whole buffers, then into the one it stopped in. */
            size_t k = (size_t)r;
            while (k >= b[first].len) {
                k -= b[first].len;
                first++;
            }
            b[first].base += k;
            b[first].len -= (unsigned)k;
        }
    }
    hs__wreq *w = calloc(1, sizeof(*w));
    if (!w)
        return hs__err(HS_ENOMEM, "write request: out of memory");
    /* A header is made in the frame, which may go before the write is done: the write keeps a
     * copy of it (only the first span can be one). */
    if (sh[first] && first == 0) {
        memcpy(w->hdr, b[0].base, b[0].len);
        b[0].base = (char *)w->hdr;
    }
    for (int i = first; i < ns; i++)
        if (!sh[i]) {
            w->payload = hs_buf_ref(f->payload);
            if (f->tail)
                w->tail = hs_buf_ref(f->tail);
            break;
        }
    w->c = c;
    w->bytes = end - off;
    w->req.data = w;
    int r = uv_write(&w->req, (uv_stream_t *)&c->tcp, b + first, (unsigned)(ns - first),
                     hs__conn_on_write);
    if (r < 0) {
        hs_buf_unref(w->payload);
        hs_buf_unref(w->tail);
        free(w);
        return hs__err(r, "write: %s", uv_strerror(r));
    }
    c->inflight += end - off;
    f->off = end;
    c->nwrites++;
    c->last_send_us = hs__now_us();
    return 0;
}

static const char *plain_describe(hs__conn *c, char *buf, size_t cap) {
    (void)c;
    snprintf(buf, cap, "plain TCP");
    return buf;
}

static void plain_free(hs__conn *c) { (void)c; }

const hs__layer hs__layer_plain = {
    .name = "plain",
    .inflight_cap = 8u << 20,
    .chunk_max = (size_t)-1,
    .costly = 0,
    .start = plain_start,
    .alloc = plain_alloc,
    .read = plain_read,
    .eof = plain_eof,
    .write = plain_write,
    .describe = plain_describe,
    .free = plain_free,
};
