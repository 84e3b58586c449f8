/* What the reader tests of large messages share (test_part.c, test_pieces.c): a PART frame's
 * headers, and feeding bytes to a reader until a frame or an error. */
#ifndef HS_TEST_NET_PART_FRAMES_H
#define HS_TEST_NET_PART_FRAMES_H

#include <stddef.h>
#include <stdint.h>

#include "net/transport.h"

/* The headers of a PART frame carrying bytes [off, off + n) of message id (of `type`) of total
 * bytes; the n bytes go at the returned offset. */
static inline size_t part_head(uint8_t *out, uint8_t type, uint16_t flags, uint32_t id,
                               uint64_t total, uint64_t off, size_t n, uint64_t round) {
    hs__hdr h = {HS__WIRE_VERSION, HS__T_PART, 0, 1, HS__PART_HDR_LEN + n, round};
    hs__wire_hdr_encode(out, &h);
    hs__part p = {type, flags, id, total, off};
    hs__wire_part_encode(out + HS__HDR_LEN, &p);
    return HS__HDR_LEN + HS__PART_HDR_LEN;
}

/* Feeds n bytes; returns the last feed's result (a frame: *p set). */
static inline int feed_all(hs__reader *r, const uint8_t *b, size_t n, hs__hdr *h, hs_buf **p) {
    size_t used;
    int ret = 0;
    while (n) {
        ret = hs__reader_feed(r, b, n, &used, h, p);
        if (ret != 0 || used == n)
            return ret;
        b += used;
        n -= used;
    }
    return ret;
}

#endif
