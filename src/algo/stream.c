/* A neighbour's message taken as it arrives, in pieces (algo_internal.h, hs__algo_recv_pieces):
 * a reader that folds each piece into its vector at once never holds the message whole (a
 * model of several GB is mixed through a few MiB). Training thread. */
#include <string.h>

#include "algo/algo_internal.h"
#include "core/clock.h"
#include "core/error_internal.h"
#include "core/log.h"

int hs__algo_recv_pieces(hs_algo *a, hs_exchange *ex, hs__nbr *n, uint64_t r, int timeout_ms,
                         hs__piece_fn fn, void *ctx, uint64_t *taken) {
    double end = hs__mono_s() + 1e-3 * timeout_ms;
    uint64_t at = 0, total = 1;
    int err = 0, done = 0;
    while (!done) {
        double left = end - hs__mono_s();
        int wait_ms = timeout_ms < 0 ? -1 : left > 0 ? (int)(1e3 * left) : 0;
        hs_piece pc;
        err = ex->ops->recv_piece(ex, n->id, r, at, wait_ms, &pc);
        if (err == HS_ENOENT || err == HS_ETIMEDOUT || err == HS_ECONNRESET) {
            HS_LOGD("round %llu: no message of round %llu from peer %u past byte %llu (%s)",
                    (unsigned long long)r, (unsigned long long)r, n->id, (unsigned long long)at,
                    hs_strerror(err));
            if (err == HS_ENOENT) hs__algo_nbr_lost(a, n);
            if (err == HS_ECONNRESET) hs__algo_nbr_gone(a, n, r);
            err = 0;
            break;
        }
        if (err < 0) break;
        if (n->gone) {
            n->gone = 0; /* back after all, as in catch_up */
            n->want_full = n->rep != NULL;
        }
        a->stats.bytes_recv += pc.len;
        total = pc.total;
        const uint8_t *p = pc.p;
        size_t len = pc.len;
        if (at == 0 && len && (p[0] & HS_PAYLOAD_WANT_FULL)) {
            uint8_t b0 = p[0] & (uint8_t)~HS_PAYLOAD_WANT_FULL;
            n->sent_full = 0;
            err = fn(a, &b0, 1, 0, total, ctx);
            p++, len--, at++;
        }
        if (err == 0 && len) err = fn(a, p, len, at, total, ctx);
        hs_buf_unref(pc.buf);
        if (err < 0) {
            HS_LOGW("round %llu: dropped the message of peer %u at byte %llu of %llu: %s",
                    (unsigned long long)r, n->id, (unsigned long long)at,
                    (unsigned long long)total, hs_error_message());
            hs__algo_nbr_lost(a, n);
            err = 0;
            break;
        }
        at += len;
        done = at == total;
    }
    if (n->next_round <= r) n->next_round = r + 1;
    *taken = at;
    return err < 0 ? err : done;
}

int hs__algo_feed_runs(hs_algo *a, hs__runs *r, const uint8_t *p, size_t len, hs__run_fn take,
                       void *ctx) {
    while (len) {
        size_t k = sizeof(r->blk) - r->have;
        if (k > len) k = len;
        memcpy(r->blk + r->have, p, k);
        r->have += k, p += k, len -= k;
        size_t n = r->have / r->width;
        if (r->have == sizeof(r->blk) || r->k + n == a->d) {
            int err = take(a, r->blk, n, r->k, ctx);
            if (err < 0) return err;
            r->k += n;
            r->have = 0;
        }
    }
    return 0;
}
