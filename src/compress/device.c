/* Compression of vectors held by a compute backend: hs__compress_encode_be and
 * hs__compress_decode_add_be (compress/device.h).
 *
 * Encoding: the backend's compression primitives (hs_gossip_ops, src/tensor/gossip_ops.h)
 * compute each operator's intermediate form on the device (top-k indices and values, random-k
 * values, QSGD norms and packed fields, sign scales and bits, 16-bit casts) and return only
 * that; the host writes the header and packs with the codecs' own helpers, so the bytes are
 * hs_compress_encode's. Every number the device computes is a compress_ew.h definition,
 * reductions included (32-lane order). A device result that shows an input the message cannot
 * carry (a non-finite value, a norm above 2^127, an fp16 overflow) sends the vector through the
 * host path instead, which reports it in the CPU's words. Operators without primitives, and
 * ef: encoders (their residual is host memory), copy the vector to the host.
 *
 * Decoding: the message is checked on the host, completely, before the device touches acc.
 * Dense codecs upload their values and the device adds them; top-k uploads its k pairs
 * (hs__topk_unpack), QSGD and sign their message body, and the device adds them, in the
 * operations of the host decoders. Random-k is decoded by the host codec itself into a vector
 * of -0.0 (so it holds exactly alpha * v_i where element i is carried, and -0.0, which adds
 * nothing, elsewhere); the device then adds that vector, or its non-(-0.0) entries:
 * acc + (-0.0 + alpha * v) equals acc + alpha * v in every case, so the floats are
 * hs_compress_decode_add's.
 *
 * What crosses goes through the backend's staging memory (hs_backend.stage: page-locked on
 * CUDA, so the copies are DMA straight from and to it, without the driver's bounce buffer):
 * the primitives write their output there and the host packs it from there; a message's body,
 * or its unpacked pairs, are put there before the device reads them.
 *
 * Threading as hearsay/compress.h; the backend is used by one thread at a time. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"
#include "compress/device.h"
#include "tensor/gossip_ops.h"

/* A device result the message cannot carry: redo on the host, which reports it. */
#define HOST_PATH 1

/* -0.0f: the additive identity of IEEE addition (x + -0.0 == x for every x). */
#define NEG_ZERO_BITS 0x80000000u

static size_t div_up(size_t a, size_t b) { return (a + b - 1) / b; }

/* A backend call's status, its message prefixed with what it was doing. */
static int be_status(const hs_compressor *c, const hs_backend *be, int err) {
    return err < 0 ? hs__err_prefix(err, "compressor %s on %s", c->name, be->ops->name) : err;
}

/* The staging area holds two arrays: the second starts at this alignment past the first. */
static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* At least `bytes` of be's staging memory (see the top). Grown to twice what it was, so the
 * sizes a compressor asks for settle after a round or two; never shrunk. */
static int stage(const hs_compressor *c, hs_backend *be, size_t bytes, void **out) {
    if (bytes > be->stage_bytes) {
        size_t want = bytes > 2 * be->stage_bytes ? bytes : 2 * be->stage_bytes;
        const hs_backend_ops *o = be->ops;
        if (o->host_alloc) o->host_free(be, be->stage);
        else free(be->stage);
        be->stage = NULL;
        be->stage_bytes = 0;
        void *p = NULL;
        int err = 0;
        if (o->host_alloc) err = be_status(c, be, o->host_alloc(be, want, &p));
        else if (!(p = malloc(want)))
            err = hs__err(HS_ENOMEM, "compressor %s: %zu bytes of staging: out of memory",
                          c->name, want);
        if (err < 0) return err;
        be->stage = p;
        be->stage_bytes = want;
    }
    *out = be->stage;
    return 0;
}

/* ---------------------------------------------------------------- encode */

/* hs_compress_encode on a host copy of x. */
static int host_encode(hs_compressor *c, hs_backend *be, const float *x, uint32_t peer,
                       uint64_t round, hs_buf *out) {
    size_t d = c->d;
    float *xh;
    int err = stage(c, be, d * sizeof(float), (void **)&xh);
    if (err >= 0) err = be_status(c, be, be->ops->download(be, xh, x, d * sizeof(float)));
    return err < 0 ? err : hs_compress_encode(c, xh, d, peer, round, out);
}

static int has_device_encode(const hs_compressor *c, const hs_gossip_ops *o) {
    if (c->ef || !o) return 0;
    switch (c->ops->id) {
    case HS_CODEC_NONE:
        return HS__LE; /* the message body is x's bytes */
    case HS_CODEC_FP16:
    case HS_CODEC_BF16:
        return o->half != NULL;
    case HS_CODEC_TOPK:
        return o->topk != NULL;
    case HS_CODEC_RANDK:
        return o->randk != NULL;
    case HS_CODEC_QSGD:
        return o->qsgd != NULL;
    case HS_CODEC_SIGN:
        return o->sign != NULL;
    }
    return 0;
}

static int enc_dense(hs_compressor *c, hs_backend *be, const float *x, uint8_t *dst, size_t *n) {
    const hs_backend_ops *o = be->ops;
    const hs_gossip_ops *go = o->gossip;
    size_t d = c->d;
    size_t w = c->ops->id == HS_CODEC_NONE ? 4 : 2;
    uint8_t *v;
    int err = stage(c, be, w * d, (void **)&v);
    if (err < 0) return err;
    if (w == 4) {
        if ((err = be_status(c, be, o->download(be, v, x, d * 4))) < 0) return err;
        if (hs__cf32_max_key(v, d) >= HS_CW_KEY_INF) return HOST_PATH;
    } else {
        int bf16 = c->ops->id == HS_CODEC_BF16;
        if ((err = be_status(c, be, go->half(be, x, d, bf16, v))) < 0) return err;
        /* A half is infinite or NaN exactly when x_i is at or above the format's overflow
         * limit or not finite: the inputs dense.c refuses. */
        if (hs__c16_max_mag(v, d) >= (bf16 ? 0x7F80u : 0x7C00u)) return HOST_PATH;
    }
    memcpy(dst + HS__CHDR, v, w * d);
    *n = HS__CHDR + w * d;
    hs__chdr_put(dst, c->ops->id, 0, 0, (uint32_t)d, (uint32_t)d);
    return 0;
}

static int enc_sparse(hs_compressor *c, hs_backend *be, const float *x, uint32_t peer,
                      uint64_t round, uint8_t *dst, size_t *n) {
    const hs_gossip_ops *o = be->ops->gossip;
    size_t d = c->d, k = c->k;
    uint8_t *st;
    int err = stage(c, be, align256(k * sizeof(uint32_t)) + k * sizeof(float), (void **)&st);
    if (err < 0) return err;
    uint32_t *idx = (uint32_t *)(void *)st;
    float *val = (float *)(void *)(st + align256(k * sizeof(uint32_t)));
    if (c->ops->id == HS_CODEC_TOPK) {
        uint32_t max_key = 0;
        err = be_status(c, be, o->topk(be, x, d, k, idx, val, &max_key));
        if (err == 0) {
            /* hs__topk_select refuses any non-finite x_i, selected or not. */
            err = max_key >= HS_CW_KEY_INF ? HOST_PATH : hs__topk_pack(c, idx, val, 0, dst, n);
        }
    } else {
        err = be_status(c, be, o->randk(be, x, d, k, c->seed, peer, round, idx, val));
        if (err == 0) err = hs__randk_pack(c, peer, round, idx, val, 0, dst, n);
    }
    return err;
}

static int enc_qsgd(hs_compressor *c, hs_backend *be, const float *x, uint32_t peer,
                    uint64_t round, uint8_t *dst, size_t *n) {
    size_t d = c->d, nb = div_up(d, c->bucket);
    size_t fbytes = div_up(d * hs_cw_qsgd_bits(c->s), 8);
    uint8_t *norms;
    int err = stage(c, be, 4 * nb + fbytes, (void **)&norms);
    if (err < 0) return err;
    err = be_status(c, be, be->ops->gossip->qsgd(be, x, d, c->bucket, c->s, c->seed, peer,
                                                  round, norms, norms + 4 * nb));
    if (err < 0) return err;
    /* qsgd.c's bucket_norm test: also catches NaN and Inf, which any non-finite x_i gives. */
    for (size_t j = 0; j < nb; j++)
        if (!(hs__ldf(norms + 4 * j) <= HS_CW_QSGD_MAX_NORM)) return HOST_PATH;
    memcpy(dst + HS__CHDR, norms, 4 * nb + fbytes);
    hs__chdr_put(dst, HS_CODEC_QSGD, 0, c->s, (uint32_t)d, c->bucket);
    *n = HS__CHDR + 4 * nb + fbytes;
    return 0;
}

static int enc_sign(hs_compressor *c, hs_backend *be, const float *x, uint8_t *dst, size_t *n) {
    size_t d = c->d, bl = c->bucket == 0 || c->bucket > d ? d : c->bucket, nb = div_up(d, bl);
    uint8_t *scales;
    int err = stage(c, be, 4 * nb + div_up(d, 8), (void **)&scales);
    if (err < 0) return err;
    err = be_status(c, be, be->ops->gossip->sign(be, x, d, bl, scales, scales + 4 * nb));
    if (err < 0) return err;
    /* sign.c refuses a bucket whose double sum of |x_i| is not finite; the double sum of n <
     * 2^32 finite floats is within a few double roundings of at most n FLT_MAX, so divided by n
     * it rounds to a finite float: that is exactly a non-finite scale. */
    for (size_t j = 0; j < nb; j++)
        if (hs__ld32(scales + 4 * j) >= HS_CW_KEY_INF) return HOST_PATH;
    memcpy(dst + HS__CHDR, scales, 4 * nb + div_up(d, 8));
    hs__chdr_put(dst, HS_CODEC_SIGN, 0, 0, (uint32_t)d, c->bucket);
    *n = HS__CHDR + 4 * nb + div_up(d, 8);
    return 0;
}

static int device_encode(hs_compressor *c, hs_backend *be, const float *x, uint32_t peer,
                         uint64_t round, uint8_t *dst, size_t *n) {
    switch (c->ops->id) {
    case HS_CODEC_NONE:
    case HS_CODEC_FP16:
    case HS_CODEC_BF16:
        return enc_dense(c, be, x, dst, n);
    case HS_CODEC_TOPK:
    case HS_CODEC_RANDK:
        return enc_sparse(c, be, x, peer, round, dst, n);
    case HS_CODEC_QSGD:
        return enc_qsgd(c, be, x, peer, round, dst, n);
    case HS_CODEC_SIGN:
        return enc_sign(c, be, x, dst, n);
    }
    return HOST_PATH;
}

int hs__compress_encode_be(hs_compressor *c, hs_backend *be, const float *x, size_t d,
                          uint32_t peer, uint64_t round, hs_buf *out) {
    if (d != c->d)
        return hs__err(HS_EINVAL, "compressor %s: encode of %zu floats, configured for %zu",
                       c->name, d, c->d);
    if (be->host_memory) return hs_compress_encode(c, x, d, peer, round, out);
    if (has_device_encode(c, be->ops->gossip)) {
        size_t len0 = out->len, n = 0;
        int err = hs_buf_reserve(out, len0 + c->ops->max_bytes(c));
        if (err < 0) return err;
        err = device_encode(c, be, x, peer, round, out->data + len0, &n);
        if (err < 0) return err;
        if (err == 0) {
            out->len = len0 + n;
            return n > INT_MAX ? INT_MAX : (int)n;
        }
    }
    return host_encode(c, be, x, peer, round, out);
}

/* ---------------------------------------------------------------- decode */

/* dense.c's checks of a dense message (header, length, finite values), in its words. */
static int dense_check(const hs_compressor *c, const uint8_t *p, size_t len, size_t w) {
    uint32_t d = (uint32_t)c->d, flags;
    hs__chdr_want want = {0, 0, 0, 0, 0, d, d, d, "parameter", "count"};
    int err = hs__chdr_check(c, p, len, &want, &flags);
    if (err < 0) return err;
    if ((err = hs__clen_check(c, len, HS__CHDR + c->d * w, "header and values")) < 0) return err;
    const uint8_t *v = p + HS__CHDR;
    uint16_t inf_mag = c->ops->id == HS_CODEC_FP16 ? 0x7C00 : 0x7F80;
    int bad = w == 4 ? hs__cf32_max_key(v, c->d) >= HS_CW_KEY_INF
                     : hs__c16_max_mag(v, c->d) >= inf_mag;
    for (size_t i = 0; bad && i < c->d; i++) {
        int fin = w == 4 ? hs_cw_key(hs__ldf(v + 4 * i)) < HS_CW_KEY_INF
                         : (hs__ld16(v + 2 * i) & 0x7FFFu) < inf_mag;
        if (!fin)
            return hs__err(HS_EFORMAT, "%s message: value %zu is not finite", c->ops->name, i);
    }
    return 0;
}

/* The host codec decodes into -0.0's, the device adds the result (see the top). */
static int staged_decode(const hs_compressor *c, hs_backend *be, const uint8_t *p, size_t len,
                         uint32_t peer, uint64_t round, float *acc, float alpha) {
    const hs_gossip_ops *o = be->ops->gossip;
    size_t d = c->d, nnz = 0;
    uint8_t *st;
    int err = stage(c, be, align256(d * sizeof(float)) + d * sizeof(uint32_t), (void **)&st);
    if (err < 0) return err;
    float *t = (float *)(void *)st;
    uint32_t *ix = (uint32_t *)(void *)(st + align256(d * sizeof(float)));
    float nz = hs_cw_float(NEG_ZERO_BITS);
    for (size_t i = 0; i < d; i++) t[i] = nz;
    if ((err = hs_compress_decode_add(c, p, len, peer, round, t, d, alpha)) < 0) return err;
    for (size_t i = 0; i < d; i++) nnz += hs_cw_bits(t[i]) != NEG_ZERO_BITS;
    if (nnz == 0) return 0;
    if (nnz <= d / 2 || !HS__LE) {
        /* 8 bytes an entry beat 4 an element. Compacting in place reads ahead of writing. */
        size_t j = 0;
        for (size_t i = 0; i < d; i++) {
            if (hs_cw_bits(t[i]) == NEG_ZERO_BITS) continue;
            ix[j] = (uint32_t)i;
            t[j++] = t[i];
        }
        err = be_status(c, be, o->add_sparse(be, acc, ix, t, nnz));
    } else {
        /* 1.0f * t_i == t_i exactly. */
        err = be_status(c, be, o->add_dense(be, acc, t, d, 0, 1.0f));
    }
    return err;
}

/* Top-k: the message's k (index, alpha * value) pairs, checked on the host by the codec, are
 * added on the device; nothing of size d crosses. */
static int sparse_decode(const hs_compressor *c, hs_backend *be, const uint8_t *p, size_t len,
                         float *acc, float alpha) {
    size_t k = c->k;
    int err = hs__ccheck_codec(c, p, len);
    if (err < 0) return err;
    uint8_t *st;
    if ((err = stage(c, be, align256(k * sizeof(uint32_t)) + k * sizeof(float), (void **)&st)) < 0)
        return err;
    uint32_t *ix = (uint32_t *)(void *)st;
    float *v = (float *)(void *)(st + align256(k * sizeof(uint32_t)));
    if ((err = hs__topk_unpack(c, p, len, alpha, ix, v)) < 0) return err;
    return be_status(c, be, be->ops->gossip->add_sparse(be, acc, ix, v, k));
}

/* QSGD and sign: the message is checked on the host by its codec, then its body (norms or
 * scales, fields or bits: a few bits an element) crosses and the device adds its values. */
static int body_decode(const hs_compressor *c, hs_backend *be, const uint8_t *p, size_t len,
                       float *acc, float alpha) {
    const hs_gossip_ops *o = be->ops->gossip;
    size_t d = c->d;
    int qsgd = c->ops->id == HS_CODEC_QSGD;
    int err = hs__ccheck_codec(c, p, len);
    if (err == 0) err = qsgd ? hs__qsgd_check(c, p, len) : hs__sign_check(c, p, len);
    uint8_t *body;
    /* The checks fixed len: the header, then exactly the body. */
    if (err < 0 || (err = stage(c, be, len - HS__CHDR, (void **)&body)) < 0) return err;
    memcpy(body, p + HS__CHDR, len - HS__CHDR);
    if (qsgd) return be_status(c, be, o->qsgd_add(be, acc, body, d, c->bucket, c->s, alpha));
    size_t bl = c->bucket == 0 || c->bucket > d ? d : c->bucket;
    return be_status(c, be, o->sign_add(be, acc, body, d, bl, alpha));
}

/* hs_compress_decode_add on a host copy of acc. */
static int host_decode(const hs_compressor *c, hs_backend *be, const uint8_t *p, size_t len,
                       uint32_t peer, uint64_t round, float *acc, float alpha) {
    size_t d = c->d;
    float *ah;
    int err = stage(c, be, d * sizeof(float), (void **)&ah);
    if (err >= 0) err = be_status(c, be, be->ops->download(be, ah, acc, d * sizeof(float)));
    if (err >= 0) err = hs_compress_decode_add(c, p, len, peer, round, ah, d, alpha);
    return err < 0 ? err : be_status(c, be, be->ops->upload(be, acc, ah, d * sizeof(float)));
}

int hs__compress_decode_add_be(const hs_compressor *c, hs_backend *be, const uint8_t *p,
                              size_t len, uint32_t peer, uint64_t round, float *acc, size_t d,
                              float alpha) {
    if (be->host_memory) return hs_compress_decode_add(c, p, len, peer, round, acc, d, alpha);
    /* hs_compress_decode_add's own argument checks, before anything is staged. */
    int aerr = hs__cdecode_args(c, d, alpha);
    if (aerr < 0) return aerr;
    const hs_gossip_ops *o = be->ops->gossip;
    hs_codec_id id = c->ops->id;
    if (o && o->add_dense &&
        (id == HS_CODEC_NONE || id == HS_CODEC_FP16 || id == HS_CODEC_BF16)) {
        size_t w = id == HS_CODEC_NONE ? 4 : 2;
        int err = hs__ccheck_codec(c, p, len);
        if (err == 0) err = dense_check(c, p, len, w);
        if (err < 0) return err;
        int fmt = id == HS_CODEC_NONE ? 0 : id == HS_CODEC_FP16 ? 1 : 2;
        void *v;
        if ((err = stage(c, be, w * d, &v)) < 0) return err;
        memcpy(v, p + HS__CHDR, w * d);
        return be_status(c, be, o->add_dense(be, acc, v, d, fmt, alpha));
    }
    if (o && o->add_sparse && id == HS_CODEC_TOPK)
        return sparse_decode(c, be, p, len, acc, alpha);
    if (o && ((o->qsgd_add && id == HS_CODEC_QSGD) || (o->sign_add && id == HS_CODEC_SIGN)))
        return body_decode(c, be, p, len, acc, alpha);
    if (o && o->add_dense && o->add_sparse)
        return staged_decode(c, be, p, len, peer, round, acc, alpha);
    return host_decode(c, be, p, len, peer, round, acc, alpha);
}

int hs__compress_decode_add2_be(const hs_compressor *c, hs_backend *be, const uint8_t *p,
                                size_t len, uint32_t peer, uint64_t round, float *acc,
                                float alpha, float *acc2, float alpha2, size_t d) {
    if (be->host_memory)
        return hs_compress_decode_add2(c, p, len, peer, round, acc, alpha, acc2, alpha2, d);
    /* hs_compress_decode_add2's argument checks, in its order. */
    int err = hs__cdecode_args(c, d, alpha2);
    if (err < 0) return err;
    err = hs__compress_decode_add_be(c, be, p, len, peer, round, acc, d, alpha);
    /* The first decode validated the message: the second cannot fail on its bytes. */
    return err < 0 ? err : hs__compress_decode_add_be(c, be, p, len, peer, round, acc2, d, alpha2);
}
