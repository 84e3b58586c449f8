/* The TLS layer of a connection's stack (transport layer): between the frames and TCP, it
 * drives the handshake, decrypts what the socket reads (ciphertext straight into the session's
 * ring) and hands the plaintext up to the frame reader (straight into a payload when one is
 * being filled), and encrypts frames' bytes on their way down, sending the ciphertext from the
 * session's ring when the socket takes it at once. The OpenSSL work itself is tls.c.
 *
 * Threading: loop thread only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/transport.h"

#define PLAIN_CAP (64u * 1024)
#define DIRECT_MIN (16u * 1024) /* decrypt straight into a payload when this much is missing */
#define SMALL_FRAME (16u * 1024)

/* Writes all TLS output waiting in the session, which accounts for plain plaintext bytes. The
 * ciphertext goes to the socket straight from the session's ring when the socket takes it now;
 * what it does not take is copied out and queued, so the ring is always empty afterwards. */
static int flush(hs__conn *c, size_t plain) {
    const uint8_t *p;
    size_t n;
    hs__wreq *last = NULL;
    while ((n = hs__tls_out_peek(c->tls, &p)) > 0) {
        size_t done = 0;
        if (!c->nwrites) {
            uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
            int r = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
            if (r > 0) {
                done = (size_t)r;
                c->last_progress_us = c->last_send_us = hs__now_us();
            } else if (r != UV_EAGAIN && r != UV_ENOSYS) {
                return hs__err(r, "write: %s", uv_strerror(r));
            }
        }
        if (done < n) {
            hs__wreq *w = calloc(1, sizeof(*w));
            uint8_t *buf = malloc(n - done);
            if (!w || !buf) {
                free(w);
                free(buf);
                return hs__err(HS_ENOMEM, "TLS output of %zu bytes: out of memory", n - done);
            }
            memcpy(buf, p + done, n - done);
            w->c = c;
            w->cipher = buf;
            w->req.data = w;
            uv_buf_t b = uv_buf_init((char *)buf, (unsigned)(n - done));
            int r = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, hs__conn_on_write);
            if (r < 0) {
                free(buf);
                free(w);
                return hs__err(r, "write: %s", uv_strerror(r));
            }
            c->nwrites++;
            c->last_send_us = hs__now_us();
            last = w;
        }
        hs__tls_out_consume(c->tls, n);
    }
    /* The plaintext counts as in flight until the last write that carries part of it is done. */
    if (last) {
        last->bytes = plain;
        c->inflight += plain;
    }
    return 0;
}

/* A refused handshake: the server counts and logs it, the client reports it as a refusal. */
static void failed(hs__conn *c, int err) {
    hs__transport *tr = c->tr;
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", hs_error_message());
    if (!c->outgoing) {
        uv_mutex_lock(tr->mu);
        tr->st->conns_refused++;
        uv_mutex_unlock(tr->mu);
        hs__conn_close(c, err, 0, HS_LOG_WARN, "refused: %s; %llu application bytes processed", msg,
                       (unsigned long long)c->app_bytes);
    } else {
        tr->ev->on_refused(tr->owner, c, HS__REFUSE_PROTO, msg);
        hs__conn_close(c, err, 0, HS_LOG_WARN, "%s", msg);
    }
}

static int tls_start(hs__conn *c) {
    int err;
    if ((err = hs__tls_new(&c->tls, c->tr->tls, !c->outgoing)) < 0)
        return err;
    if (!(c->plain = malloc(PLAIN_CAP)))
        return hs__err(HS_ENOMEM, "TLS buffer");
    c->state = HS__C_TLS;
    hs__conn_set_limits(c);
    if (c->outgoing) {
        if ((err = hs__tls_handshake(c->tls)) < 0)
            return err;
        return flush(c, 0);
    }
    return 0;
}

static void tls_alloc(hs__conn *c, uv_buf_t *buf) {
    uint8_t *dst;
    size_t want;
    if (c->state != HS__C_CLOSING && (want = hs__tls_in_space(c->tls, &dst)) >= 4096) {
        c->io.direct = 1; /* ciphertext straight into the session's ring */
        buf->base = (char *)dst;
        buf->len = want > (1u << 30) ? (1u << 30) : want;
        return;
    }
    c->io.direct = 0;
    buf->base = (char *)c->rx;
    buf->len = c->rx_cap;
}

/* Ciphertext arrived (p NULL: n bytes in the ring, where tls_alloc pointed). */
static void tls_read(hs__conn *c, const uint8_t *p, size_t n) {
    int err = 0;
    if (p)
        err = hs__tls_feed(c->tls, p, n);
    else
        hs__tls_in_commit(c->tls, n);
    if (err < 0) {
        hs__conn_close(c, err, 0, HS_LOG_WARN, "%s", hs_error_message());
        return;
    }
    if (c->state == HS__C_TLS) {
        int r = hs__tls_handshake(c->tls);
        if (flush(c, 0) < 0) {
            hs__conn_close(c, HS_ENOMEM, 0, HS_LOG_WARN, "%s", hs_error_message());
            return;
        }
        if (r < 0) {
            failed(c, r);
            return;
        }
        if (r == 0)
            return;
        if ((err = hs__conn_secured(c)) < 0) {
            hs__conn_close(c, err, 0, HS_LOG_WARN, "HELLO: %s", hs_error_message());
            return;
        }
    }
    while (c->state != HS__C_CLOSING) {
        uint8_t *dst;
        size_t want = hs__reader_direct(&c->rd, &dst);
        int got;
        if (want >= DIRECT_MIN) {
            got = hs__tls_read(c->tls, dst, want);
            if (got > 0) {
                hs__conn_direct_done(c, (size_t)got);
                continue;
            }
        } else {
            got = hs__tls_read(c->tls, c->plain, PLAIN_CAP);
            if (got > 0) {
                hs__conn_feed(c, c->plain, (size_t)got);
                continue;
            }
        }
        if (got == 0)
            break;
        if (got == HS_EAUTH) {
            failed(c, got);
            return;
        }
        hs__conn_close(c, got, 0, got == HS_ECONNRESET ? HS_LOG_INFO : HS_LOG_WARN, "%s",
                       hs_error_message());
        return;
    }
    if (c->state != HS__C_CLOSING && flush(c, 0) < 0)
        hs__conn_close(c, HS_ENOMEM, 0, HS_LOG_WARN, "%s", hs_error_message());
}

/* End of stream during the handshake: a server refuses the client (it may speak plain TCP). */
static int tls_eof(hs__conn *c) {
    if (c->state != HS__C_TLS || c->outgoing)
        return 0;
    failed(c, hs__err(HS_EAUTH, "TLS handshake failed: end of stream during the handshake"));
    return 1;
}

static int tls_write(hs__conn *c, hs__frame *f, size_t chunk) {
    const uint8_t *sp[4];
    size_t sn[4];
    int sh[4];
    size_t end = f->off + chunk;
    int ns = hs__frame_spans(f, end, sp, sn, sh), err = 0;
    if (f->off == 0 && chunk == f->wire && f->wire <= SMALL_FRAME) {
        /* One record for a small frame. */
        uint8_t tmp[SMALL_FRAME];
        size_t k = 0;
        for (int i = 0; i < ns; i++) {
            memcpy(tmp + k, sp[i], sn[i]);
            k += sn[i];
        }
        err = hs__tls_write(c->tls, tmp, k);
    } else {
        for (int i = 0; i < ns && err == 0; i++)
            err = hs__tls_write(c->tls, sp[i], sn[i]);
    }
    if (err < 0)
        return err;
    f->off = end;
    return flush(c, chunk);
}

static const char *tls_describe(hs__conn *c, char *buf, size_t cap) {
    return hs__tls_describe(c->tls, buf, cap);
}

static void tls_free(hs__conn *c) {
    hs__tls_free(c->tls);
    free(c->plain);
}

const hs__layer hs__layer_tls = {
    .name = "tls",
    .inflight_cap = 4u << 20,
    .chunk_max = HS__TLS_WRITE_MAX - HS__HDR_LEN,
    .costly = 1,
    .start = tls_start,
    .alloc = tls_alloc,
    .read = tls_read,
    .eof = tls_eof,
    .write = tls_write,
    .describe = tls_describe,
    .free = tls_free,
};
