/* SGP's uncompressed shares (--compress none) without vectors of their own: a share p x is
 * written into its message a block at a time as it is computed, and a received share is added to
 * x from the message's bytes where they lie, once every byte of it has been checked. With them a
 * push-sum peer holds its x, the messages in flight and a few KiB, where it held a kept part, a
 * share and a decoded share besides (three vectors: 12 GB at 1B parameters). The operations are
 * those of the compressor's encode and decode through the scratch vectors, to the bit. */
#include <string.h>

#include "algo/algo_internal.h"
#include "algo/sgp_share.h"
#include "algo/sgp_state.h"
#include "compress/codec.h"
#include "compress/compress_ew.h"
#include "core/error_internal.h"

/* Values per block: a block of floats on the stack (HS__SGP_BLOCK is a multiple). */
#define SHARE_BLOCK 1024

int hs__sgp_put_share(const hs_algo *a, const float *x, float p, hs_buf *msg) {
    size_t d = a->d, at = msg->len;
    int err = hs_buf_reserve(msg, at + HS__CHDR + sizeof(float) * d);
    if (err < 0) return err;
    uint8_t *dst = msg->data + at;
    hs__chdr_put(dst, HS_CODEC_NONE, 0, 0, (uint32_t)d, (uint32_t)d);
    dst += HS__CHDR;
    float t[SHARE_BLOCK];
    for (size_t k = 0; k < d; k += SHARE_BLOCK) {
        size_t n = d - k < SHARE_BLOCK ? d - k : SHARE_BLOCK;
        for (size_t i = 0; i < n; i++) t[i] = p * x[k + i];
        /* The encoder's check: a value that is not finite is never sent. */
        if (hs__cf32_put(t, n, dst + sizeof(float) * k) >= HS_CW_KEY_INF) {
            size_t i = 0;
            while (i < n && hs_cw_key(t[i]) < HS_CW_KEY_INF) i++;
            return hs__err(HS_ERANGE, "compressor %s: element %zu is not finite (%g)",
                           hs_compressor_name(a->comp), k + i, (double)t[i]);
        }
    }
    msg->len = at + HS__CHDR + sizeof(float) * d;
    return 0;
}

void hs__sgp_add_run(float *x, const uint8_t *v, size_t n, double zi, double zj, double *e) {
    float t[SHARE_BLOCK];
    for (size_t k = 0; k < n; k += SHARE_BLOCK) {
        size_t m = n - k < SHARE_BLOCK ? n - k : SHARE_BLOCK;
        hs__cf32_get(v + sizeof(float) * k, m, t);
        for (size_t i = 0; i < m; i++) {
            /* 0 + v: the decode into a zeroed vector it replaces (a -0 share adds +0). */
            float s = 0.0f + t[i];
            double dz = s * zj - x[k + i] * zi;
            *e += dz * dz;
            x[k + i] = x[k + i] + s;
        }
    }
}

int hs__sgp_add_share(const hs_algo *a, float *x, const uint8_t *p, size_t len, const double *wi,
                      const uint8_t *head, double *d2) {
    const uint8_t *v;
    /* Header, length and every value checked before x is touched: a bad share changes
     * nothing. */
    int err = hs__compress_f32_values(a->comp, p, len, &v);
    if (err < 0) return err;
    double e = 0;
    for (size_t k = 0, b = 0; k < a->d; k += HS__SGP_BLOCK, b++)
        hs__sgp_add_run(x + k, v + sizeof(float) * k, hs__sgp_block_len(a->d, b), 1.0 / wi[b],
                        1.0 / hs__sgp_weight(head, b), &e);
    *d2 = e;
    return 0;
}
