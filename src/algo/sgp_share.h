/* SGP's uncompressed shares, written and added without vectors of their own (sgp_share.c). */
#ifndef HS_ALGO_SGP_SHARE_H
#define HS_ALGO_SGP_SHARE_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/buf.h"

/* Appends the message of the share p x (a's d floats; a's compressor is none) to msg, as
 * hs_compress_encode of that share would write it: HS_ERANGE, naming the element, when a value
 * is not finite (msg's length then unchanged). */
int hs__sgp_put_share(const hs_algo *a, const float *x, float p, hs_buf *msg);
/* Checks the compressor message p[0..len) whole (header, length, every value finite; an error,
 * x untouched, otherwise), then x += its share, as the decode into a zeroed vector and the sum
 * did; *d2 = sum_k (share_k zj - x_k zi)^2 before the sum (a statistic), zi = 1 / wi[b] and
 * zj = 1 / (weight b of the share whose head is at `head`) for the push-sum block b of k. */
int hs__sgp_add_share(const hs_algo *a, float *x, const uint8_t *p, size_t len, const double *wi,
                      const uint8_t *head, double *d2);
/* x[k] += the k-th of n checked little-endian fp32 values at v, k < n, as the decode into a
 * zeroed vector and the sum did; *e += (value zj - x[k] zi)^2 before the sum, in order. */
void hs__sgp_add_run(float *x, const uint8_t *v, size_t n, double zi, double zj, double *e);

#endif
