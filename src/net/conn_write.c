/* Connections, the writing and closing side: frames from the connection's own queue and then its
 * peer's queue go down through the connection's layer (layer_plain.c, layer_tls.c), within the
 * layer's in-flight cap and, for a costly layer, a budget per call, after the emulation's
 * release time and at its pace; the frame counters; and the closing sequence that flushes a
 * last REFUSE or BYE, then frees.
 *
 * Threading: loop thread only. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/transport.h"

#define PACE_CHUNK (16u * 1024)
#define PACE_AHEAD_US 1000u
#define PUMP_BUDGET (2u << 20) /* frame bytes through a costly layer per pump call */
#define CLOSE_FLUSH_MS 1000

const char *hs__conn_name(hs__conn *c, char *buf, size_t cap) {
    uint32_t id = c->peer_id != HS__ID_NONE ? c->peer_id : c->expect_id;
    if (id != HS__ID_NONE)
        snprintf(buf, cap, "peer %u (%s)", id, c->remote);
    else
        snprintf(buf, cap, "%s", c->remote);
    return buf;
}

/* Per-frame counters are atomics (relaxed): every frame passes here, the mutex need not. */
void hs__conn_count(hs__transport *tr, int sent, size_t frame_bytes, int type) {
    hs_net_stats *st = tr->st;
    if (sent) {
        __atomic_fetch_add(&st->frames_sent, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&st->bytes_sent, frame_bytes, __ATOMIC_RELAXED);
        if (type == HS__T_DATA) {
            __atomic_fetch_add(&st->ex.msgs_sent, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&st->ex.bytes_sent, frame_bytes, __ATOMIC_RELAXED);
        }
    } else {
        __atomic_fetch_add(&st->frames_recv, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&st->bytes_recv, frame_bytes, __ATOMIC_RELAXED);
        if (type == HS__T_DATA) {
            __atomic_fetch_add(&st->ex.msgs_recv, 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&st->ex.bytes_recv, frame_bytes, __ATOMIC_RELAXED);
        }
    }
}

void hs__conn_on_write(uv_write_t *req, int status) {
    hs__wreq *w = req->data;
    hs__conn *c = w->c;
    c->inflight -= w->bytes;
    c->nwrites--;
    hs_buf_unref(w->payload);
    hs_buf_unref(w->tail);
    free(w->cipher);
    free(w);
    if (status == 0)
        c->last_progress_us = hs__now_us();
    if (c->state == HS__C_CLOSING) {
        hs__conn_maybe_finish_close(c);
        return;
    }
    if (status < 0) {
        hs__conn_close(c, status, 0, HS_LOG_INFO, "write failed: %s", uv_strerror(status));
        return;
    }
    hs__conn_pump(c);
}

void hs__conn_on_timer(uv_timer_t *t) {
    hs__conn *c = t->data;
    c->timer_armed = 0;
    if (c->state == HS__C_CLOSING) {
        hs__conn_final_close(c); /* the flush took too long */
        return;
    }
    hs__conn_pump(c);
}

static void arm(hs__conn *c, uint64_t us) {
    if (c->timer_armed)
        return;
    c->timer_armed = 1;
    uv_timer_start(&c->timer, hs__conn_on_timer, (us + 999) / 1000, 0);
}

static void frame_sent(hs__conn *c, hs__fq *q, hs__frame *f) {
    hs__transport *tr = c->tr;
    size_t total = f->wire;
    if (c->wopen == f)
        c->wopen = NULL;
    if (q != &c->ctlq) {
        hs__frame_drop_bufs(f); /* its memory free (but for a write still holding it) first */
        tr->ev->peer_frame_done(tr->owner, c, f, 1);
    }
    hs__conn_count(tr, 1, total, f->type);
    hs__frame_free(f);
}

int hs__conn_send(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload) {
    return hs__conn_send_tail(c, type, round, payload, NULL);
}

int hs__conn_send_tail(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload, hs_buf *tail) {
    hs__frame *f;
    int err = hs__frame_new(&f, *c->tr->self, type, round, payload);
    if (err < 0)
        return err;
    if (tail)
        hs__frame_set_tail(f, tail);
    hs__frame_queue(&c->ctlq, c->tr->ev->peer_link(c), f);
    hs__conn_pump(c);
    return 0;
}

void hs__conn_pump(hs__conn *c) {
    if (c->state == HS__C_CONNECTING || c->state == HS__C_TLS)
        return;
    if (c->io.final)
        return;
    uint64_t now = hs__now_us();
    /* Bytes handed to libuv but not yet written count against the same cap as the queue, so
     * a peer that does not read holds at most about 2 * max_buffered of our memory. */
    const hs__layer *ly = c->layer;
    size_t cap = ly->inflight_cap, budget = PUMP_BUDGET;
    if (cap > c->tr->cfg->max_buffered)
        cap = c->tr->cfg->max_buffered;
    while (c->inflight < cap) {
        /* Encrypting is work: after a budget, let the loop read and serve others first. */
        if (!budget) {
            arm(c, 0);
            break;
        }
        hs__fq *q = &c->ctlq;
        hs__fq *pq = c->state == HS__C_OPEN ? c->tr->ev->peer_queue(c) : NULL;
        if (c->wopen && c->wopen != q->head && (!pq || c->wopen != pq->head)) {
            /* Its queue dropped it (a peer declared dead): the other side holds a part of it,
             * and nothing can follow on this stream. */
            hs__conn_close(c, HS_ECONNRESET, 0, HS_LOG_INFO, "a message in parts was dropped "
                                                             "before its end");
            return;
        }
        /* A peer frame that went out in part is finished first: a control frame (a pong, a
         * RESEND request) in the middle of it would corrupt the stream. Between the PART
         * frames of a large message, control frames go first; a second large message waits
         * for the one begun (the receiver reassembles one at a time). */
        if (!q->head || (pq && pq->head && hs__frame_mid(pq->head)) ||
            (c->wopen && q->head->parts && q->head != c->wopen)) {
            q = pq;
            if (!q || !q->head)
                break;
            if (c->wopen && q->head->parts && q->head != c->wopen)
                break; /* (cannot happen: the begun one heads one of the two queues) */
        }
        hs__frame *f = q->head;
        if (f->release_us > now) {
            arm(c, f->release_us - now);
            break;
        }
        size_t total = f->wire, chunk = hs__frame_piece_end(f) - f->off;
        /* (once: a paced link may stop here before its first byte, and come back) */
        if (f->parts && f->off == 0 && c->wopen != f) {
            f->msg_id = ++c->wmsg_id;
            f->phdr_at = 0;
            c->wopen = f;
        }
        if (chunk > ly->chunk_max)
            chunk = ly->chunk_max;
        hs__link *l = c->tr->ev->peer_link(c);
        if (l && l->e.rate_bps > 0) {
            /* The timer ticks in milliseconds: the link may run up to one tick ahead of its
             * schedule, and sends a tick's worth of bytes at a time, or a fast link would
             * be held to 16 KiB per tick (131 Mbit/s) whatever its rate. */
            if (l->paced_until_us > now + PACE_AHEAD_US) {
                arm(c, l->paced_until_us - now - PACE_AHEAD_US);
                break;
            }
            size_t tick = (size_t)(l->e.rate_bps / 8e6 * PACE_AHEAD_US);
            if (chunk > (tick > PACE_CHUNK ? tick : PACE_CHUNK))
                chunk = tick > PACE_CHUNK ? tick : PACE_CHUNK;
            hs__link_pace(l, now, chunk);
        }
        int err = ly->write(c, f, chunk);
        if (err < 0) {
            hs__conn_close(c, err, 0, HS_LOG_WARN, "%s", hs_error_message());
            return;
        }
        q->bytes -= chunk;
        budget = ly->costly ? (budget > chunk ? budget - chunk : 0) : budget;
        if (f->off == total) {
            hs__fq_pop(q);
            frame_sent(c, q, f);
        }
    }
    if (c->state == HS__C_CLOSING)
        hs__conn_maybe_finish_close(c);
}

int hs__conn_flushed(hs__conn *c) {
    hs__fq *pq = c->tr->ev->peer_queue(c);
    return !c->ctlq.head && c->nwrites == 0 && (!pq || !pq->head);
}

/* ------------------------------------------------------------------ closing */

static void on_shutdown(uv_shutdown_t *req, int status) {
    hs__conn *c = req->data;
    if (status < 0)
        hs__conn_final_close(c);
    /* otherwise wait for the peer's EOF (reads continue, discarded) or the timer */
}

void hs__conn_maybe_finish_close(hs__conn *c) {
    hs__conn_io *x = &c->io;
    if (x->final || c->ctlq.head || c->nwrites)
        return;
    if (x->eof) { /* its end of stream is in: nothing more to wait for */
        hs__conn_final_close(c);
        return;
    }
    if (x->shutdown)
        return;
    x->shutdown = 1;
    x->shut.data = c;
    if (uv_shutdown(&x->shut, (uv_stream_t *)&c->tcp, on_shutdown) < 0)
        hs__conn_final_close(c);
}

void hs__conn_close(hs__conn *c, int err, int bye, hs_log_level level, const char *fmt, ...) {
    if (c->state == HS__C_CLOSING)
        return;
    hs__transport *tr = c->tr;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof(c->why), fmt, ap);
    va_end(ap);
    char nm[128];
    hs__log(level, "%s: connection closed: %s", hs__conn_name(c, nm, sizeof(nm)), c->why);
    int was = c->state;
    c->state_before_close = was;
    if (bye && was == HS__C_OPEN && c->got_bye == 0) {
        hs__reason r = {HS__BYE_CLOSE, ""};
        snprintf(r.text, sizeof(r.text), "%s", c->why);
        hs_buf *b;
        if (hs_buf_new(&b, 64) == 0) {
            if (hs__wire_reason_encode(b, &r) == 0)
                hs__conn_send(c, HS__T_BYE, 0, b);
            hs_buf_unref(b);
        }
    }
    c->state = HS__C_CLOSING;
    /* A frame of the peer's queue that went out in part cannot continue on another
     * connection: drop it. */
    hs__fq *pq = tr->ev->peer_queue(c);
    c->wopen = NULL;
    if (pq && pq->head && pq->head->off) {
        hs__frame *f = hs__fq_pop(pq);
        hs__frame_drop_bufs(f);
        tr->ev->peer_frame_done(tr->owner, c, f, 0);
        hs__frame_free(f);
    }
    if (!c->io.notified) {
        c->io.notified = 1;
        tr->ev->on_closed(tr->owner, c, err, was == HS__C_CONNECTING);
    }
    c->peer = NULL;
    if (was == HS__C_CONNECTING) {
        hs__conn_final_close(c);
        return;
    }
    c->timer_armed = 1;
    uv_timer_start(&c->timer, hs__conn_on_timer, CLOSE_FLUSH_MS, 0);
    hs__conn_pump(c);
    hs__conn_maybe_finish_close(c);
}

/* ------------------------------------------------------------------ freeing */

static void on_handle_closed(uv_handle_t *h) {
    hs__conn *c = h->data;
    if (--c->handles_open > 0)
        return;
    hs__transport *tr = c->tr;
    if (c->prev)
        c->prev->next = c->next;
    else
        tr->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    tr->n_conns--;
    hs__reader_free(&c->rd);
    if (c->layer)
        c->layer->free(c);
    hs__fq_clear(&c->ctlq);
    free(c->rx);
    free(c);
}

void hs__conn_final_close(hs__conn *c) {
    hs__conn_io *x = &c->io;
    if (x->final)
        return;
    x->final = 1;
    uv_timer_stop(&c->timer);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

void hs__conn_abort(hs__conn *c) { hs__conn_final_close(c); }

int hs__conn_closed(hs__conn *c) { return c->io.final; }
