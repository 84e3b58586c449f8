/* A neighbour's replica message taken in pieces as it arrives (hs__algo_recv_pieces): a dense
 * delta (none, fp16, bf16) goes into the replica and the running mix a run of values at a time,
 * a full replica into the replica, so a large model's message (a CHOCO round at 100M with fp16
 * is 200 MB) is never held whole. Training thread. */
#include <string.h>

#include "algo/algo_internal.h"
#include "compress/compress_ew.h"
#include "compress/codec.h"
#include "core/error_internal.h"
#include "core/log.h"

/* Below this a message comes in one piece anyway (or a few), and one taken whole keeps
 * catch_up's handling of a late message (applied when it comes, not a full replica asked for). */
#define STREAM_MIN_BYTES ((size_t)16 << 20)

typedef struct rep_stream {
    hs__nbr *n;
    float *acc; /* the running mix, or NULL */
    uint8_t head[1 + HS__CHDR];
    size_t head_have, head_len;
    hs__runs runs; /* width: 4 for a full replica, the cast's for a delta */
} rep_stream;

static int take_run(hs_algo *a, const uint8_t *v, size_t n, size_t first, void *ctx) {
    rep_stream *s = ctx;
    float *rep = s->n->rep + first;
    if (s->head[0] != HS_PAYLOAD_FULL)
        return hs__compress_dense_add(a->comp, v, n, first, rep, 1.0f,
                                      s->acc ? s->acc + first : NULL, s->n->w_in);
    if (hs__cf32_max_key(v, n) >= HS_CW_KEY_INF)
        return hs__err(HS_EFORMAT, "full replica from peer %u: a value of %zu..%zu is not finite",
                       s->n->id, first, first + n - 1);
    hs__cf32_get(v, n, rep);
    return 0;
}

/* The head (the payload's type, then a delta's codec header) is checked against the message's
 * total before any value is taken; the values in runs of up to 4 KiB, each checked before it
 * is applied. */
static int rep_piece(hs_algo *a, const uint8_t *p, size_t len, uint64_t off, uint64_t total,
                     void *ctx) {
    rep_stream *s = ctx;
    while (len && s->head_have < s->head_len) {
        s->head[s->head_have++] = *p++;
        len--;
        if (s->head_have == 1 && s->head[0] == HS_PAYLOAD_FULL) {
            if (total != 1 + sizeof(float) * a->d)
                return hs__err(HS_EFORMAT, "full replica from peer %u: %llu bytes, expected %zu",
                               s->n->id, (unsigned long long)total, 1 + sizeof(float) * a->d);
            s->head_len = 1;
            s->runs.width = 4;
            s->n->synced = 0; /* overwritten as it comes: whole again once all of it came */
            a->reps_dirty = 1;
        } else if (s->head_have == 1 && s->head[0] != HS_PAYLOAD_DELTA) {
            return hs__err(HS_EPROTO, "peer %u sent a payload of type %d", s->n->id, s->head[0]);
        } else if (s->head_have == s->head_len) {
            int err = hs__compress_dense_head(a->comp, s->head + 1, (size_t)(total - 1));
            if (err < 0) return err;
        }
    }
    if (s->head_have < s->head_len && off + len >= total)
        return hs__err(HS_EPROTO, "peer %u: a message of %llu bytes, shorter than its head",
                       s->n->id, (unsigned long long)total);
    return hs__algo_feed_runs(a, &s->runs, p, len, take_run, s);
}

int hs__algo_replica_streams(const hs_algo *a, const hs_exchange *ex, const hs__nbr *n,
                             uint64_t r) {
    size_t w = hs__compress_dense_width(a->comp);
    return w && !a->be && ex->ops->recv_piece && a->dpub == a->d && n->synced && n->rep &&
           n->next_round == r && w * a->d >= STREAM_MIN_BYTES;
}

int hs__algo_recv_replica_pieces(hs_algo *a, hs_exchange *ex, hs__nbr *n, uint64_t r,
                                 float *acc) {
    rep_stream s = {n, !a->reps_dirty && n->is_in ? acc : NULL, {0}, 0, 1 + HS__CHDR,
                    {{0}, 0, 0, hs__compress_dense_width(a->comp)}};
    uint64_t taken = 0;
    int got = hs__algo_recv_pieces(a, ex, n, r, a->cfg.recv_timeout_ms, rep_piece, &s, &taken);
    if (got < 0) return got;
    if (got && s.head[0] == HS_PAYLOAD_FULL) {
        n->synced = 1;
        n->want_full = 0;
    }
    /* Not all of it: the replica missed a delta (or part of one: the runs taken are in the mix
     * and the replica alike), and the rest of it is dropped by the next round's read. */
    if (!got && (n->synced || taken)) {
        if (taken)
            HS_LOGW("round %llu: the message of peer %u stopped after %llu bytes: its replica is "
                    "asked for in full",
                    (unsigned long long)r, n->id, (unsigned long long)taken);
        hs__algo_nbr_lost(a, n);
    }
    return got;
}
