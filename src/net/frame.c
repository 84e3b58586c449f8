/* Outgoing frames and their queues (transport layer), and the emulation shim on the way in:
 * a frame queued for an emulated link is stamped with the time it may leave.
 *
 * Threading: loop thread. */
#include <stdlib.h>

#include "core/error_internal.h"
#include "net/transport.h"

uint64_t hs__now_us(void) { return uv_hrtime() / 1000; }

static size_t frame_left(const hs__frame *f) { return HS__HDR_LEN + (size_t)f->len - f->off; }

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

void hs__frame_free(hs__frame *f) {
    if (!f)
        return;
    hs_buf_unref(f->payload);
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
    hs__hdr h = {HS__WIRE_VERSION, type, 0, sender, (uint32_t)payload->len, round};
    hs__wire_hdr_encode(f->hdr, &h);
    f->type = type;
    f->len = (uint32_t)payload->len;
    f->round = round;
    f->payload = hs_buf_ref(payload);
    *out = f;
    return 0;
}

void hs__frame_queue(hs__fq *q, hs__link *l, hs__frame *f) {
    if (l && !hs_net_emulation_none(&l->e))
        f->release_us = hs__link_release(l, hs__now_us());
    hs__fq_push(q, f);
}
