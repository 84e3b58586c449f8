/* Compression of vectors held by a compute backend (hearsay/tensor.h): the results are exactly
 * those of hs_compress_encode, hs_compress_decode_add and hs_compress_decode_add2 on a host copy
 * of the vector (same bytes, same floats, same errors), so peers on a device and on the host
 * share one wire. A backend with device gossip (hs_backend_ops.gossip, CUDA) does the bulk work
 * on the device and moves only the message across; others, and ef: encoders (whose residual
 * lives on the host), go through a host copy. With a backend whose memory is host memory these
 * are the plain functions. Threading: as the plain functions, and be is used by one thread at a
 * time. HS_ECUDA (or another backend error) if the backend fails. */
#ifndef HS_COMPRESS_DEVICE_H
#define HS_COMPRESS_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/tensor.h"

/* hs_compress_encode of the d floats at x in be's memory. */
int hs__compress_encode_be(hs_compressor *c, hs_backend *be, const float *x, size_t d,
                           uint32_t peer, uint64_t round, hs_buf *out);

/* hs_compress_decode_add into the d floats at acc in be's memory. The message (host memory) is
 * checked completely on the host first; on any error acc is unchanged. */
int hs__compress_decode_add_be(const hs_compressor *c, hs_backend *be, const uint8_t *p,
                               size_t len, uint32_t peer, uint64_t round, float *acc, size_t d,
                               float alpha);

/* hs_compress_decode_add2 into acc and acc2 in be's memory (acc += alpha C, acc2 += alpha2 C):
 * the same floats, since each accumulator gets the same single add of the same product. The
 * message is checked before either changes. */
int hs__compress_decode_add2_be(const hs_compressor *c, hs_backend *be, const uint8_t *p,
                                size_t len, uint32_t peer, uint64_t round, float *acc,
                                float alpha, float *acc2, float alpha2, size_t d);

#endif
