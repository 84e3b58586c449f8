/* Helpers shared by the compression unit tests that use cmocka (include <cmocka.h> first). */
#ifndef HS_TEST_COMPRESS_CMOCKA_H
#define HS_TEST_COMPRESS_CMOCKA_H

#include <stdio.h>

#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"

static inline hs_compressor *mk(const char *spec, size_t d, uint64_t seed) {
    hs_compressor *c = NULL;
    int err = hs_compressor_new(&c, spec, d, seed);
    if (err < 0) fprintf(stderr, "%s (d=%zu): %s\n", spec, d, hs_error_message());
    assert_int_equal(err, 0);
    return c;
}

static inline hs_buf *newbuf(void) {
    hs_buf *b = NULL;
    assert_int_equal(hs_buf_new(&b, 0), 0);
    return b;
}

#endif
