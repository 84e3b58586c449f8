/* hearsay: a growable, reference-counted byte buffer.
 *
 * One encoded payload for k neighbours is one hs_buf with k+1 references: each pending write
 * holds one and drops it when the write completes. Reference counting is atomic, so a buffer
 * may be released on any thread; the bytes themselves must not be modified once shared. */
#ifndef HEARSAY_BUF_H
#define HEARSAY_BUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_buf {
    uint8_t *data;
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated */
    int refs;   /* atomic; use hs_buf_ref/hs_buf_unref */
} hs_buf;

/* A new empty buffer with room for cap bytes and one reference, returned owned in *out.
 * HS_ENOMEM. */
int hs_buf_new(hs_buf **out, size_t cap);

/* Makes room for at least cap bytes in total, keeping the contents. Only for a buffer with
 * one reference. HS_ENOMEM (buffer unchanged). */
int hs_buf_reserve(hs_buf *b, size_t cap);

/* Appends n bytes; grows geometrically. HS_ENOMEM (buffer unchanged). */
int hs_buf_append(hs_buf *b, const void *p, size_t n);

/* Adds a reference and returns b. */
hs_buf *hs_buf_ref(hs_buf *b);

/* Drops a reference; frees the buffer with the last one. Accepts NULL. */
void hs_buf_unref(hs_buf *b);

#ifdef __cplusplus
}
#endif
#endif
