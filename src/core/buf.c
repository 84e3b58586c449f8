/* Reference-counted byte buffer. The count is updated with GCC atomic builtins (the field stays
 * a plain int so the header also compiles as C++/CUDA), so the loop thread and the training
 * thread may each drop their references. */
#include "hearsay/buf.h"

#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"

int hs_buf_new(hs_buf **out, size_t cap) {
    hs_buf *b = calloc(1, sizeof(*b));
    if (!b) return hs__err(HS_ENOMEM, "buffer header: out of memory");
    if (cap && !(b->data = malloc(cap))) {
        free(b);
        return hs__err(HS_ENOMEM, "buffer of %zu bytes: out of memory", cap);
    }
    b->cap = cap;
    b->refs = 1;
    *out = b;
    return 0;
}

int hs_buf_reserve(hs_buf *b, size_t cap) {
    if (cap <= b->cap) return 0;
    uint8_t *p = realloc(b->data, cap);
    if (!p) return hs__err(HS_ENOMEM, "buffer of %zu bytes: out of memory", cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

int hs_buf_append(hs_buf *b, const void *p, size_t n) {
    if (n > SIZE_MAX - b->len) return hs__err(HS_EOVERFLOW, "buffer: size overflow");
    if (b->len + n > b->cap) {
        size_t want = b->cap ? b->cap : 64;
        while (want < b->len + n) want = want > SIZE_MAX / 2 ? b->len + n : want * 2;
        int err = hs_buf_reserve(b, want);
        if (err < 0) return err;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

hs_buf *hs_buf_ref(hs_buf *b) {
    __atomic_fetch_add(&b->refs, 1, __ATOMIC_RELAXED);
    return b;
}

void hs_buf_unref(hs_buf *b) {
    if (!b) return;
    if (__atomic_fetch_sub(&b->refs, 1, __ATOMIC_ACQ_REL) == 1) {
        free(b->data);
        free(b);
    }
}
