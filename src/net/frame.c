/* Outgoing frames and their queues (transport layer), and the emulation shim on the way in:
 * a frame queued for an emulated link is stamped with the time it may leave. A message over
 * HS__PART_SIZE goes out as PART frames cut from its own buffers (docs/PROTOCOL.md, "Large
 * messages"): here is the arithmetic of where each piece's headers and bytes are.
 *
 * Threading: loop thread. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error_internal.h"
#include "net/transport.h"

/* The boot-time clock where there is one: it goes on while the machine is suspended (a laptop's
 * lid), which the monotonic clock does not, so that a suspend shows as the late tick of a
 * process that slept (failure.c) and not as no time at all. */
uint64_t hs__now_us(void) {
#ifdef CLOCK_BOOTTIME
    struct timespec ts;
    if (clock_gettime(CLOCK_BOOTTIME, &ts) == 0)
        return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
#endif
    return uv_hrtime() / 1000;
}

static size_t frame_left(const hs__frame *f) { return f->wire - f->off; }

#define PIECE_WIRE ((size_t)HS__HDR_LEN + HS__PART_HDR_LEN + HS__PART_SIZE)

/* The message's length decides its pieces. */
static void frame_shape(hs__frame *f) {
    f->parts = f->len > HS__PART_SIZE;
    if (!f->parts) {
        f->wire = HS__HDR_LEN + (size_t)f->len;
        hs__hdr h = {HS__WIRE_VERSION, f->type, f->flags, 0, f->len, f->round};
        uint8_t sender[4];
        memcpy(sender, f->hdr + 8, 4);
        hs__wire_hdr_encode(f->hdr, &h);
        memcpy(f->hdr + 8, sender, 4);
        return;
    }
    size_t n = (size_t)((f->len + HS__PART_SIZE - 1) / HS__PART_SIZE);
    f->wire = (size_t)f->len + n * (HS__HDR_LEN + HS__PART_HDR_LEN);
}

void hs__frame_set_tail(hs__frame *f, hs_buf *tail) {
    f->tail = hs_buf_ref(tail);
    f->len += tail->len;
    frame_shape(f);
}

void hs__frame_set_flags(hs__frame *f, uint16_t flags) {
    f->flags = flags;
    frame_shape(f);
}

size_t hs__frame_piece_end(const hs__frame *f) {
    if (!f->parts)
        return f->wire;
    size_t end = (f->off / PIECE_WIRE + 1) * PIECE_WIRE;
    return end < f->wire ? end : f->wire;
}

int hs__frame_mid(const hs__frame *f) {
    return f->off > 0 && f->off < f->wire && (!f->parts || f->off % PIECE_WIRE != 0);
}

/* The message's bytes at pos, contiguous (payload, then tail). */
static size_t msg_span(const hs__frame *f, uint64_t pos, const uint8_t **p) {
    if (pos < f->payload->len) {
        *p = f->payload->data + pos;
        return f->payload->len - (size_t)pos;
    }
    pos -= f->payload->len;
    *p = f->tail->data + pos;
    return f->tail->len - (size_t)pos;
}

size_t hs__frame_span(hs__frame *f, size_t off, size_t end, const uint8_t **p, int *hdr) {
    size_t n;
    if (!f->parts) {
        *hdr = off < HS__HDR_LEN;
        if (*hdr) {
            *p = f->hdr + off;
            n = HS__HDR_LEN - off;
        } else {
            n = msg_span(f, off - HS__HDR_LEN, p);
        }
        return n < end - off ? n : end - off;
    }
    size_t i = off / PIECE_WIRE, in = off % PIECE_WIRE;
    uint64_t at = (uint64_t)i * HS__PART_SIZE, left = f->len - at;
    size_t bytes = left < HS__PART_SIZE ? (size_t)left : HS__PART_SIZE;
    *hdr = in < HS__HDR_LEN + HS__PART_HDR_LEN;
    if (*hdr) {
        if (f->phdr_at != i + 1) {
            hs__hdr h = {HS__WIRE_VERSION, HS__T_PART, 0, 0, HS__PART_HDR_LEN + bytes, f->round};
            hs__wire_hdr_encode(f->phdr, &h);
            memcpy(f->phdr + 8, f->hdr + 8, 4); /* the sender, as in the message's header */
            hs__part ph = {f->type, f->flags, f->msg_id, f->len, at};
            hs__wire_part_encode(f->phdr + HS__HDR_LEN, &ph);
            f->phdr_at = i + 1;
        }
        *p = f->phdr + in;
        n = HS__HDR_LEN + HS__PART_HDR_LEN - in;
    } else {
        size_t k = in - HS__HDR_LEN - HS__PART_HDR_LEN;
        n = msg_span(f, at + k, p);
        if (n > bytes - k)
            n = bytes - k;
    }
    return n < end - off ? n : end - off;
}

void hs__fq_push(hs__fq *q, hs__frame *f) {
    f->next = NULL;
    if (q->tail)
        q->tail->next = f;
    else
        q->head = f;
    q->tail = f;
    q->bytes += frame_left(f);
    q->n++;
}

void hs__fq_push_front(hs__fq *q, hs__frame *f) {
    f->next = q->head;
    q->head = f;
    if (!q->tail)
        q->tail = f;
    q->bytes += frame_left(f);
    q->n++;
}

hs__frame *hs__fq_pop(hs__fq *q) {
    hs__frame *f = q->head;
    if (!f)
        return NULL;
    q->head = f->next;
    if (!q->head)
        q->tail = NULL;
    q->bytes -= frame_left(f);
    q->n--;
    f->next = NULL;
    return f;
}

void hs__frame_drop_bufs(hs__frame *f) {
    hs_buf_unref(f->payload);
    hs_buf_unref(f->tail);
    f->payload = f->tail = NULL;
}

void hs__frame_free(hs__frame *f) {
    if (!f)
        return;
    hs__frame_drop_bufs(f);
    free(f);
}

void hs__fq_clear(hs__fq *q) {
    hs__frame *f;
    while ((f = hs__fq_pop(q)))
        hs__frame_free(f);
}

int hs__frame_new(hs__frame **out, uint32_t sender, uint8_t type, uint64_t round, hs_buf *payload) {
    hs__frame *f = calloc(1, sizeof(*f));
    if (!f)
        return hs__err(HS_ENOMEM, "frame: out of memory");
    hs__hdr h = {HS__WIRE_VERSION, type, 0, sender, payload->len, round};
    hs__wire_hdr_encode(f->hdr, &h);
    f->type = type;
    f->len = payload->len;
    f->round = round;
    f->payload = hs_buf_ref(payload);
    frame_shape(f);
    *out = f;
    return 0;
}

void hs__frame_queue(hs__fq *q, hs__link *l, hs__frame *f) {
    if (l && !hs_net_emulation_none(&l->e))
        f->release_us = hs__link_release(l, hs__now_us());
    hs__fq_push(q, f);
}

int hs__frame_spans(hs__frame *f, size_t end, const uint8_t **sp, size_t *sn, int *sh) {
    int ns = 0;
    for (size_t at = f->off; at < end && ns < 4; ns++) {
        sn[ns] = hs__frame_span(f, at, end, &sp[ns], &sh[ns]);
        at += sn[ns];
    }
    return ns;
}
