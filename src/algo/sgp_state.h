/* SGP's state, shared by its rounds (sgp.c) and its receipt of shares (sgp_recv.c). */
#ifndef HS_ALGO_SGP_STATE_H
#define HS_ALGO_SGP_STATE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "algo/algo_internal.h"

/* Values per push-sum block: each block of x has its own weight, so that a share taken in pieces
 * as it arrives adds each block whole with its weight (x_b, w_b stay a push-sum pair, z_b =
 * x_b / w_b exact), never values without their weight. 1 MiB of floats: a received block waits
 * in a buffer of that size until its last byte came; a model of 1B values has 3815 weights
 * (30 KB). A model of at most this many values has one weight, as before blocks. */
#define HS__SGP_BLOCK ((size_t)1 << 18)

/* The largest push-sum weight a share may carry: weights sum to the number of peers. */
#define SGP_MAX_WEIGHT 1e9

typedef struct sender {
    uint32_t id;
    uint64_t next_round; /* rounds below this one have all been received */
    int lagging;
    int late;      /* its last awaited share came later than the budget */
    double wait_s; /* mean seconds its shares kept this peer waiting; < 0: never needed */
} sender;

/* A share of one sender being taken in pieces: its head (type, the block weights, the codec
 * header) as it comes, then its values a block at a time. */
typedef struct sgp_rx {
    uint32_t from;
    uint64_t round;
    int active;
    uint64_t at, total; /* bytes taken, of the message's total */
    uint8_t *head;      /* 1 + 8 nb + HS__CHDR bytes */
    size_t head_have;
    uint8_t *blk; /* the block in progress's bytes (HS__SGP_BLOCK floats at most); head and blk
                   * are freed when the share ends */
    size_t blk_have, b;
    hs_buf *gather; /* a share added whole (compressed, or on the device), as it comes */
} sgp_rx;

typedef struct sgp_state {
    double *w;            /* the push-sum weights w_i, one a block of x */
    double *wk;           /* the kept weights, while a push sums them */
    size_t nb;            /* blocks: ceil(d / HS__SGP_BLOCK) */
    uint64_t first_round; /* the first round this peer ran; no view exists before it */
    int started;
    float *z;     /* x / w, the evaluation point (hs_algo_eval_point's; the node uses none) */
    float *res;   /* decoded share, for the compression residual and the disagreement (a lossy
                     compressor's; NULL for none, whose shares are read where they lie) */
    sender *snd;
    int n_snd, cap_snd;
    hs_msg *msgs;
    int cap_msgs;
    hs_msg_piece *pcs; /* cap_msgs of them: what drain_pieces hands up */
    sgp_rx *rx;        /* shares in pieces, one a sender at most */
    int n_rx;
    uint64_t blocks_fed; /* blocks added a block at a time from pieces: the path shares took */
    int lossless; /* the compressor reproduces its input exactly */
    /* Device mode (a->be): the kept part, a share and a decoded share in the backend's
     * memory; z and res stay the host's: eval_point and from_eval_point take a host x, their
     * _be forms a device one. */
    float *dkeep, *dshare, *dres;
    double t_pull;  /* the exchange's clock when the last pull ended; 0: no pull yet */
    double round_s; /* mean seconds of this peer's rounds outside the pull; 0: none yet */
} sgp_state;

/* Values in block b of d. */
static inline size_t hs__sgp_block_len(size_t d, size_t b) {
    size_t k = b * HS__SGP_BLOCK;
    return d - k < HS__SGP_BLOCK ? d - k : HS__SGP_BLOCK;
}

sender *hs__sgp_sender(sgp_state *s, uint32_t id, uint64_t first_round);
/* Bytes before a share's compressor message: the type and one fp64 weight a block. */
static inline size_t hs__sgp_head_len(const sgp_state *s) { return 1 + 8 * s->nb; }
/* Weight b of the share whose head (its type byte first) is at p: fp64, unaligned. */
static inline double hs__sgp_weight(const uint8_t *p, size_t b) {
    double w;
    memcpy(&w, p + 1 + 8 * b, 8);
    return w;
}

/* Adds one whole arrived share p[0..len) to (x, w): *dis += its disagreement, ++*nshares. A
 * malformed share is dropped with a warning (0): its mass is lost, but no state is touched by
 * half. < 0: a device's failure. */
int hs__sgp_add_whole(hs_algo *a, float *x, uint64_t r, uint32_t from, uint64_t round,
                      const uint8_t *p, size_t len, double *dis, int *nshares);
/* Bytes [pc->off, pc->off + pc->len) of the share of `round` from `from`: uncompressed on the
 * host, each block that completes is added with its weight (a malformed share's remaining
 * blocks are dropped with a warning; those added stay, each its own push-sum pair); otherwise
 * the share is gathered and added whole once complete. 1 when the share is complete, else 0. */
int hs__sgp_add_piece(hs_algo *a, float *x, uint64_t r, uint32_t from, uint64_t round,
                      const hs_piece *pc, double *dis, int *nshares);
/* Where the share of `round` from `from` in pieces stands: the next byte to take (0: none
 * begun). */
uint64_t hs__sgp_piece_at(const sgp_state *s, uint32_t from, uint64_t round);
/* After a whole share of `round` from `from` was added: the staleness statistics and the
 * sender's progress. */
void hs__sgp_share_done(hs_algo *a, uint64_t r, uint32_t from, uint64_t round, int *nshares);
void hs__sgp_rx_free(sgp_state *s);

#endif
