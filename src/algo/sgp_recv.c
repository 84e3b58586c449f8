/* SGP's receipt of shares (sgp.c's pull): a share taken whole, or, uncompressed on the network
 * runtime, in pieces as it arrives. A share carries one weight a block of values (sgp_state.h),
 * and a block in pieces is added, values and weight, once its last byte came: until then its
 * bytes wait in a buffer of one block, so a peer holds a constant, not a second model, of the
 * shares it takes, and z_b = x_b / w_b stays exact for every block, whatever part of a share
 * came by this round's pull. A share whose blocks all come in one pull adds what the whole
 * share adds, to the bit. A compressed share (its blocks are not apart in its message) or a
 * device's is gathered from its pieces and added whole, as before blocks. */
#include <stdlib.h>
#include <string.h>

#include "algo/sgp_share.h"
#include "algo/sgp_state.h"
#include "compress/codec.h"
#include "compress/device.h"
#include "hearsay/compress.h"
#include "core/error_internal.h"
#include "core/log.h"

sender *hs__sgp_sender(sgp_state *s, uint32_t id, uint64_t first_round) {
    for (int i = 0; i < s->n_snd; i++)
        if (s->snd[i].id == id) return &s->snd[i];
    if (s->n_snd == s->cap_snd) {
        int cap = s->cap_snd ? s->cap_snd * 2 : 8;
        sender *n = realloc(s->snd, sizeof(*n) * (size_t)cap);
        if (!n) return NULL;
        s->snd = n;
        s->cap_snd = cap;
    }
    sender *n = &s->snd[s->n_snd++];
    n->id = id;
    n->next_round = first_round;
    n->lagging = 0;
    n->late = 0;
    n->wait_s = -1;
    return n;
}

void hs__sgp_share_done(hs_algo *a, uint64_t r, uint32_t from, uint64_t round, int *nshares) {
    sgp_state *s = a->priv;
    (*nshares)++;
    int st = round <= r ? (int)(r - round) : 0;
    if (st > a->stats.staleness_max) a->stats.staleness_max = st;
    a->stats.staleness_mean += st;
    sender *sn = hs__sgp_sender(s, from, round);
    if (sn && round >= sn->next_round) sn->next_round = round + 1;
    /* A lagging sender is waited for again only once its shares are back within the staleness
     * bound: clearing the mark on any newer share would make every share of a straggler cost
     * its out-neighbours one more receive timeout. */
    if (sn && sn->lagging && round + (uint64_t)a->cfg.staleness >= r) sn->lagging = 0;
}

/* The weights of a share's head (p: its first byte, the type), each checked: the index of the
 * first out of range, or nb when all are in. */
static size_t bad_weight(const sgp_state *s, const uint8_t *p, double *wj) {
    for (size_t b = 0; b < s->nb; b++) {
        *wj = hs__sgp_weight(p, b);
        if (!(*wj > 0.0 && *wj <= SGP_MAX_WEIGHT)) return b;
    }
    return s->nb;
}

/* add_whole's decode and sum on the device: res = 0 + C(share), x = x + res (1 res is res),
 * the host's floats. *d2 = sum (res zj - x zi)^2 from three dot products (with block 0's
 * weights: a statistic). 1: the share is dropped (a malformed message; x untouched); a
 * device error is the caller's. */
static int add_share_dev(hs_algo *a, float *x, uint32_t from, uint64_t round, const uint8_t *p,
                         size_t len, double zi, double zj, double *d2) {
    sgp_state *s = a->priv;
    hs_backend *be = a->be;
    size_t d = a->d;
    int err = be->ops->fill(be, s->dres, d, 0.0f);
    if (err == 0)
        err = hs__compress_decode_add_be(a->comp, be, p, len, from, hs__algo_key(a, round),
                                         s->dres, d, 1.0f);
    if (err < 0 && err != HS_ECUDA) {
        HS_LOGW("sgp: dropped a share from peer %u of round %llu: %s", from,
                (unsigned long long)round, hs_error_message());
        return 1;
    }
    double rr, rx, xx;
    if (err < 0 || (err = hs_be_dot(be, s->dres, s->dres, d, &rr)) < 0 ||
        (err = hs_be_dot(be, s->dres, x, d, &rx)) < 0 ||
        (err = hs_be_dot(be, x, x, d, &xx)) < 0 ||
        (err = hs_be_axpy(be, x, s->dres, d, 1.0f)) < 0)
        return err;
    double e = zj * zj * rr - 2 * zj * zi * rx + zi * zi * xx;
    *d2 = e > 0 ? e : 0;
    return 0;
}

int hs__sgp_add_whole(hs_algo *a, float *x, uint64_t r, uint32_t from, uint64_t round,
                      const uint8_t *p, size_t len, double *dis, int *nshares) {
    sgp_state *s = a->priv;
    size_t hl = hs__sgp_head_len(s);
    double wj;
    if (len < hl || p[0] != HS_PAYLOAD_PUSH) {
        HS_LOGW("sgp: dropped a share from peer %u of round %llu: not a push-sum payload of %zu "
                "weights",
                from, (unsigned long long)round, s->nb);
        return 0;
    }
    size_t bad = bad_weight(s, p, &wj);
    if (bad < s->nb) {
        HS_LOGW("sgp: dropped a share from peer %u of round %llu: weight %g of block %zu out of "
                "range",
                from, (unsigned long long)round, wj, bad);
        return 0;
    }
    /* Decode into scratch first so a bad share leaves x untouched, and to measure how far the
     * sender's z is from ours. */
    const uint8_t *msg = p + hl;
    size_t mlen = len - hl;
    double d2 = 0;
    int err;
    if (a->be) {
        err = add_share_dev(a, x, from, round, msg, mlen, 1.0 / s->w[0], 1.0 / hs__sgp_weight(p, 0),
                            &d2);
        if (err < 0) return err;
        if (err > 0) return 0;
    } else if (s->lossless) {
        if ((err = hs__sgp_add_share(a, x, msg, mlen, s->w, p, &d2)) < 0) {
            HS_LOGW("sgp: dropped a share from peer %u of round %llu: %s", from,
                    (unsigned long long)round, hs_error_message());
            return 0;
        }
    } else {
        memset(s->res, 0, sizeof(float) * a->d);
        err = hs_compress_decode_add(a->comp, msg, mlen, from, hs__algo_key(a, round), s->res,
                                     a->d, 1.0f);
        if (err < 0) {
            HS_LOGW("sgp: dropped a share from peer %u of round %llu: %s", from,
                    (unsigned long long)round, hs_error_message());
            return 0;
        }
        for (size_t bk = 0, k = 0; bk < s->nb; bk++) {
            double zi_scale = 1.0 / s->w[bk], zj_scale = 1.0 / hs__sgp_weight(p, bk);
            for (size_t end = k + hs__sgp_block_len(a->d, bk); k < end; k++) {
                double dz = s->res[k] * zj_scale - x[k] * zi_scale;
                d2 += dz * dz;
                x[k] = x[k] + s->res[k];
            }
        }
    }
    *dis += d2;
    for (size_t bk = 0; bk < s->nb; bk++) s->w[bk] += hs__sgp_weight(p, bk);
    hs__sgp_share_done(a, r, from, round, nshares);
    return 0;
}

/* ------------------------------------------------------------------ shares in pieces */

static sgp_rx *rx_of(sgp_state *s, uint32_t from) {
    for (int i = 0; i < s->n_rx; i++)
        if (s->rx[i].from == from) return &s->rx[i];
    sgp_rx *n = realloc(s->rx, sizeof(*n) * (size_t)(s->n_rx + 1));
    if (!n) return NULL;
    s->rx = n;
    n = &s->rx[s->n_rx++];
    memset(n, 0, sizeof(*n));
    n->from = from;
    return n;
}

uint64_t hs__sgp_piece_at(const sgp_state *s, uint32_t from, uint64_t round) {
    for (int i = 0; i < s->n_rx; i++)
        if (s->rx[i].from == from && s->rx[i].active && s->rx[i].round == round)
            return s->rx[i].at;
    return 0;
}

/* A share taken in full, dropped or abandoned: its buffers go with it (a block's 1 MiB), so
 * what shares in pieces hold is bounded by the shares in progress, not by every sender this
 * peer ever heard from (under churn, peers that left). */
static void rx_end(sgp_rx *rx) {
    rx->active = 0;
    free(rx->head);
    free(rx->blk);
    rx->head = NULL;
    rx->blk = NULL;
}

void hs__sgp_rx_free(sgp_state *s) {
    for (int i = 0; i < s->n_rx; i++) {
        rx_end(&s->rx[i]);
        hs_buf_unref(s->rx[i].gather);
    }
    free(s->rx);
}

/* The head complete: the type, the message's length for d values, every weight in range, the
 * codec header. */
static int check_head(const hs_algo *a, const sgp_rx *rx) {
    const sgp_state *s = a->priv;
    size_t hl = hs__sgp_head_len(s);
    uint64_t want = hl + HS__CHDR + sizeof(float) * (uint64_t)a->d;
    if (rx->head[0] != HS_PAYLOAD_PUSH)
        return hs__err(HS_EPROTO, "a payload of type %d, not a push-sum share", rx->head[0]);
    if (rx->total != want)
        return hs__err(HS_EPROTO, "a share of %llu bytes, expected %llu for %zu values",
                       (unsigned long long)rx->total, (unsigned long long)want, a->d);
    double wj;
    size_t bad = bad_weight(s, rx->head, &wj);
    if (bad < s->nb) return hs__err(HS_ERANGE, "weight %g of block %zu out of range", wj, bad);
    return hs__compress_f32_head(a->comp, rx->head + hl, (size_t)(rx->total - hl));
}

/* Block rx->b, whole in rx->blk: checked finite, then added with its weight, as
 * hs__sgp_add_share adds it. */
static int add_block(hs_algo *a, float *x, sgp_rx *rx, double *dis) {
    sgp_state *s = a->priv;
    size_t b = rx->b, first = b * HS__SGP_BLOCK, n = hs__sgp_block_len(a->d, b);
    int err = hs__compress_f32_check(a->comp, rx->blk, n, first);
    if (err < 0) return err;
    double wj = hs__sgp_weight(rx->head, b), e = 0;
    hs__sgp_add_run(x + first, rx->blk, n, 1.0 / s->w[b], 1.0 / wj, &e);
    *dis += e;
    s->w[b] += wj;
    s->blocks_fed++;
    rx->b++;
    rx->blk_have = 0;
    return 0;
}

/* Bytes p[0..len) at rx->at: into the head, then the block buffer, each block added as it
 * fills. 1 when the share is complete. */
static int feed(hs_algo *a, float *x, sgp_rx *rx, const uint8_t *p, size_t len, double *dis) {
    sgp_state *s = a->priv;
    size_t hl = hs__sgp_head_len(s) + HS__CHDR;
    while (len) {
        int err = 0;
        if (rx->head_have < hl) {
            size_t k = hl - rx->head_have < len ? hl - rx->head_have : len;
            memcpy(rx->head + rx->head_have, p, k);
            rx->head_have += k, rx->at += k, p += k, len -= k;
            if (rx->head[0] != HS_PAYLOAD_PUSH)
                err = hs__err(HS_EPROTO, "a payload of type %d, not a push-sum share",
                              rx->head[0]);
            else if (rx->head_have == hl)
                err = check_head(a, rx);
        } else {
            size_t want = sizeof(float) * hs__sgp_block_len(a->d, rx->b) - rx->blk_have;
            size_t k = want < len ? want : len;
            memcpy(rx->blk + rx->blk_have, p, k);
            rx->blk_have += k, rx->at += k, p += k, len -= k;
            if (k == want) err = add_block(a, x, rx, dis);
        }
        if (err < 0) return err;
    }
    if (rx->at == rx->total && rx->head_have < hl)
        return hs__err(HS_EPROTO, "a message of %llu bytes, shorter than a share's head",
                       (unsigned long long)rx->total);
    return rx->at == rx->total;
}

/* A share that is added whole (compressed, or on the device: its blocks are not apart in the
 * message, or not on the host) gathered as it comes, then added. */
static int gather_piece(hs_algo *a, float *x, uint64_t r, sgp_rx *rx, const uint8_t *p,
                        size_t len, double *dis, int *nshares) {
    memcpy(rx->gather->data + rx->at, p, len);
    rx->at += len;
    if (rx->at < rx->total) return 0;
    rx->active = 0;
    rx->gather->len = (size_t)rx->total;
    int err = hs__sgp_add_whole(a, x, r, rx->from, rx->round, rx->gather->data, rx->gather->len,
                                dis, nshares);
    hs_buf_unref(rx->gather);
    rx->gather = NULL;
    return err < 0 ? err : 1;
}

int hs__sgp_add_piece(hs_algo *a, float *x, uint64_t r, uint32_t from, uint64_t round,
                      const hs_piece *pc, double *dis, int *nshares) {
    sgp_state *s = a->priv;
    a->stats.bytes_recv += pc->len;
    sgp_rx *rx = rx_of(s, from);
    if (!rx) return hs__err(HS_ENOMEM, "sgp: out of memory");
    const uint8_t *p = pc->p;
    size_t len = pc->len;
    int gather = !s->lossless || a->be != NULL;
    if (pc->off == 0) {
        if (rx->active)
            HS_LOGW("sgp: the share of round %llu from peer %u stopped after %llu of %llu bytes "
                    "(round %llu's began): the mass of its %zu blocks not come is lost",
                    (unsigned long long)rx->round, from, (unsigned long long)rx->at,
                    (unsigned long long)rx->total, (unsigned long long)round, s->nb - rx->b);
        if (!gather && !rx->head && !(rx->head = malloc(hs__sgp_head_len(s) + HS__CHDR)))
            return hs__err(HS_ENOMEM, "sgp: out of memory");
        if (!gather && !rx->blk &&
            !(rx->blk = malloc(sizeof(float) * (a->d < HS__SGP_BLOCK ? a->d : HS__SGP_BLOCK))))
            return hs__err(HS_ENOMEM, "sgp: out of memory for a block of a share");
        hs_buf_unref(rx->gather);
        *rx = (sgp_rx){from, round, 1, 0, pc->total, rx->head, 0, rx->blk, 0, 0, NULL};
        uint64_t most = hs__sgp_head_len(s) + hs_compress_max_bytes(a->comp, a->d);
        if (gather && pc->total > most) {
            HS_LOGW("sgp: dropped the share of round %llu from peer %u: %llu bytes, more than "
                    "a share's %llu",
                    (unsigned long long)round, from, (unsigned long long)pc->total,
                    (unsigned long long)most);
            rx_end(rx);
            return 0;
        }
        if (gather && hs_buf_new(&rx->gather, (size_t)pc->total) < 0)
            return hs__err(HS_ENOMEM, "sgp: out of memory for a share of %llu bytes",
                           (unsigned long long)pc->total);
    } else if (!rx->active || rx->round != round) {
        return 0; /* the rest of a share dropped (or abandoned) at an earlier piece */
    }
    if (pc->off < rx->at) { /* bytes a copy sent again repeats */
        uint64_t skip = rx->at - pc->off;
        if (skip >= len) return 0;
        p += skip, len -= (size_t)skip;
    }
    int err = 0;
    if (pc->total != rx->total || pc->off + pc->len > rx->total)
        err = hs__err(HS_EPROTO, "bytes %llu..%llu of a message of %llu, begun as one of %llu",
                      (unsigned long long)pc->off, (unsigned long long)(pc->off + pc->len),
                      (unsigned long long)pc->total, (unsigned long long)rx->total);
    else if (pc->off > rx->at)
        err = hs__err(HS_EPROTO, "bytes at %llu, %llu of them taken", (unsigned long long)pc->off,
                      (unsigned long long)rx->at);
    else if (gather)
        return gather_piece(a, x, r, rx, p, len, dis, nshares);
    else
        err = feed(a, x, rx, p, len, dis);
    if (err < 0) {
        HS_LOGW("sgp: dropped the share of round %llu from peer %u at byte %llu of %llu (%zu of "
                "its %zu blocks were added): %s",
                (unsigned long long)round, from, (unsigned long long)rx->at,
                (unsigned long long)rx->total, rx->b, s->nb, hs_error_message());
        rx_end(rx);
        return 0;
    }
    if (err == 1) {
        rx_end(rx);
        hs__sgp_share_done(a, r, from, round, nshares);
    }
    return err;
}
