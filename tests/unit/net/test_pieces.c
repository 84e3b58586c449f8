/* Unit tests of the part hand-up (net/pieces.h, and the reader's stream mode in reader.c): the
 * decision about each arriving part of a DATA message, fed in order, duplicated by a copy sent
 * again, overlapping, with a gap, out of order, with a total or round that disagrees; which
 * waiting piece a reader takes next; and a reader in stream mode handing each part up on its
 * own (never a buffer of the message's size), refusing a corrupt part before its bytes; and the
 * flow control's slow-peer decision (hs__conn_slow) under HOLD, capped on the sender's side. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/error.h"
#include "net/pieces.h"
#include "net/transport.h"
#include "part_frames.h"

static void test_in_order(void **state) {
    (void)state;
    hs__pstream s = {0};
    uint64_t from = 99;
    assert_int_equal(hs__pstream_accept(&s, 7, 0, 100, 250, 0, &from), HS__PIECE_NEW);
    assert_int_equal(from, 0);
    assert_true(s.active);
    assert_int_equal(hs__pstream_accept(&s, 7, 100, 100, 250, 0, &from), HS__PIECE_MORE);
    assert_int_equal(from, 100);
    assert_int_equal(hs__pstream_accept(&s, 7, 200, 50, 250, 0, &from), HS__PIECE_MORE);
    assert_int_equal(from, 200);
    assert_false(s.active); /* complete */
    /* The next round's message begins. */
    assert_int_equal(hs__pstream_accept(&s, 8, 0, 250, 250, 0, &from), HS__PIECE_NEW);
    assert_false(s.active);
}

/* A connection cut at byte 150: the sender's copy sent again starts over at 0. What arrived
 * is a duplicate; the part that crosses byte 150 gives only its new bytes. */
static void test_resent_copy(void **state) {
    (void)state;
    hs__pstream s = {0};
    uint64_t from = 0;
    assert_int_equal(hs__pstream_accept(&s, 3, 0, 100, 300, 0, &from), HS__PIECE_NEW);
    assert_int_equal(hs__pstream_accept(&s, 3, 100, 50, 300, 0, &from), HS__PIECE_MORE);
    assert_int_equal(hs__pstream_accept(&s, 3, 0, 100, 300, 1, &from), HS__PIECE_DUP);
    assert_int_equal(hs__pstream_accept(&s, 3, 100, 100, 300, 1, &from), HS__PIECE_MORE);
    assert_int_equal(from, 150);
    assert_int_equal(s.end, 200);
    assert_int_equal(hs__pstream_accept(&s, 3, 200, 100, 300, 1, &from), HS__PIECE_MORE);
    assert_int_equal(from, 200);
    assert_false(s.active);
}

static void test_refused(void **state) {
    (void)state;
    hs__pstream s = {0};
    uint64_t from = 0;
    /* Not begun: a part after the first of a message never begun. */
    assert_int_equal(hs__pstream_accept(&s, 1, 100, 10, 300, 0, &from), HS_EPROTO);
    /* Empty, past the total, a zero total. */
    assert_int_equal(hs__pstream_accept(&s, 1, 0, 0, 300, 0, &from), HS_EPROTO);
    assert_int_equal(hs__pstream_accept(&s, 1, 0, 301, 300, 0, &from), HS_EPROTO);
    assert_int_equal(hs__pstream_accept(&s, 1, 0, 1, 0, 0, &from), HS_EPROTO);
    assert_int_equal(hs__pstream_accept(&s, 1, 0, 100, 300, 0, &from), HS__PIECE_NEW);
    /* A gap (out of order: the third part before the second). */
    assert_int_equal(hs__pstream_accept(&s, 1, 200, 100, 300, 0, &from), HS_EPROTO);
    /* A total other than the first part's. */
    assert_int_equal(hs__pstream_accept(&s, 1, 100, 100, 400, 0, &from), HS_EPROTO);
    /* Bytes again without being a copy sent again (a replay on the same connection). */
    assert_int_equal(hs__pstream_accept(&s, 1, 0, 100, 300, 0, &from), HS_EPROTO);
    assert_int_equal(hs__pstream_accept(&s, 1, 50, 100, 300, 0, &from), HS_EPROTO);
    /* None of these moved the stream. */
    assert_int_equal(s.end, 100);
    assert_int_equal(hs__pstream_accept(&s, 1, 100, 200, 300, 0, &from), HS__PIECE_MORE);
    assert_int_equal(from, 100);
}

/* The runtime refuses a message at its first piece (a replayed round): its other parts go. */
static void test_dropped_message(void **state) {
    (void)state;
    hs__pstream s = {0};
    uint64_t from = 0;
    assert_int_equal(hs__pstream_accept(&s, 5, 0, 100, 300, 1, &from), HS__PIECE_NEW);
    hs__pstream_drop(&s);
    assert_int_equal(hs__pstream_accept(&s, 5, 100, 100, 300, 1, &from), HS__PIECE_DUP);
    assert_int_equal(hs__pstream_accept(&s, 5, 200, 100, 300, 1, &from), HS__PIECE_DUP);
    /* A later round starts afresh; one cut midway is left behind for a newer one. */
    assert_int_equal(hs__pstream_accept(&s, 6, 0, 100, 300, 0, &from), HS__PIECE_NEW);
    assert_false(s.dropping);
    assert_int_equal(hs__pstream_accept(&s, 7, 0, 100, 300, 0, &from), HS__PIECE_NEW);
    assert_int_equal(s.round, 7);
}

static void test_fits(void **state) {
    (void)state;
    uint64_t skip = 7;
    assert_int_equal(hs__piece_fits(0, 100, 0, &skip), 1);
    assert_int_equal(skip, 0);
    assert_int_equal(hs__piece_fits(0, 100, 60, &skip), 1); /* a copy's piece: 60 taken */
    assert_int_equal(skip, 60);
    assert_int_equal(hs__piece_fits(0, 100, 100, &skip), -1); /* all of it taken: drop */
    assert_int_equal(hs__piece_fits(100, 100, 50, &skip), 0);  /* after a gap: still to come */
}

/* A PART frame of message `id` (DATA), bytes [off, off + n) of total, filled with (off + i). */
static size_t part(uint8_t *out, uint32_t id, uint64_t total, uint64_t off, size_t n,
                   uint64_t round) {
    size_t at = part_head(out, HS__T_DATA, 0, id, total, off, n, round);
    for (size_t i = 0; i < n; i++) out[at + i] = (uint8_t)(off + i);
    return at + n;
}

static void test_reader_streams(void **state) {
    (void)state;
    hs__reader r;
    hs__reader_init(&r);
    r.max_len[HS__T_PART] = HS__PART_HDR_LEN + HS__PART_SIZE;
    r.max_msg[HS__T_DATA] = 1u << 30; /* a 1 GiB message would be allocated at its first part */
    r.stream = 1;
    static uint8_t buf[HS__HDR_LEN + HS__PART_HDR_LEN + 4096];
    uint64_t total = 1u << 30;
    hs__hdr h;
    hs_buf *p = NULL;
    for (uint64_t off = 0; off < 3 * 4096; off += 4096) {
        size_t n = part(buf, 1, total, off, 4096, 9);
        assert_int_equal(feed_all(&r, buf, n, &h, &p), 1);
        assert_int_equal(h.type, HS__T_PART);
        assert_int_equal(h.round, 9);
        assert_int_equal(p->len, HS__PART_HDR_LEN + 4096); /* this part alone */
        hs__part ph;
        assert_int_equal(hs__wire_part_decode(p->data, &ph), 0);
        assert_int_equal(ph.off, off);
        assert_int_equal(ph.total, total);
        assert_int_equal(p->data[HS__PART_HDR_LEN + 5], (uint8_t)(off + 5));
        hs_buf_unref(p);
    }
    assert_true(r.msg.buf == NULL && r.msg.streamed);
    /* A corrupt part (bytes at the wrong offset) is refused before its bytes are read. */
    size_t n = part(buf, 1, total, 5 * 4096, 4096, 9);
    size_t used = 0;
    assert_int_equal(hs__reader_feed(&r, buf, n, &used, &h, &p), HS_EPROTO);
    assert_true(used <= HS__HDR_LEN + HS__PART_HDR_LEN);
    hs__reader_free(&r);

    /* Without stream mode the same message is reassembled (its buffer allocated whole). */
    hs__reader_init(&r);
    r.max_len[HS__T_PART] = HS__PART_HDR_LEN + HS__PART_SIZE;
    r.max_msg[HS__T_DATA] = 8192;
    n = part(buf, 1, 8192, 0, 4096, 9);
    assert_int_equal(feed_all(&r, buf, n, &h, &p), 0);
    assert_non_null(r.msg.buf);
    n = part(buf, 1, 8192, 4096, 4096, 9);
    assert_int_equal(feed_all(&r, buf, n, &h, &p), 1);
    assert_int_equal(h.type, HS__T_DATA);
    assert_int_equal(p->len, 8192);
    hs_buf_unref(p);
    hs__reader_free(&r);
}

/* HOLD excuses unwritten bytes only for as long as a holder may hold (HS__HOLD_MAX_US): a peer
 * that says HOLD every heartbeat and never reads (buggy or malicious) is judged slow like one
 * that says nothing, instead of pinning the connection and its queue forever. Virtual time. */
static void test_hold_expires(void **state) {
    (void)state;
    const uint64_t peer_to = 10u * 1000000, t0 = 1000u * 1000000;
    hs__conn *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->inflight = 4096;
    c->last_progress_us = t0; /* its last byte written */
    /* No HOLD: slow once peer_to passed. */
    assert_false(hs__conn_slow(c, t0 + peer_to / 2, peer_to));
    assert_true(hs__conn_slow(c, t0 + peer_to + 1, peer_to));
    /* HOLD said every second: a busy application within the cap is not slow. */
    uint64_t now = t0 + peer_to + 1;
    for (; now < t0 + HS__HOLD_MAX_US; now += 1000000) {
        c->held_us = now;
        assert_false(hs__conn_slow(c, now + 1, peer_to));
    }
    /* Still said, but the bytes have waited past the cap and peer_to more: slow. */
    for (; now < t0 + HS__HOLD_MAX_US + 3 * peer_to; now += 1000000) c->held_us = now;
    assert_true(hs__conn_slow(c, now + 1, peer_to));
    /* Bytes written again: a new hold is excused again. */
    c->last_progress_us = now;
    c->held_us = now + peer_to;
    assert_false(hs__conn_slow(c, now + 2 * peer_to, peer_to));
    /* Nothing in flight is never slow. */
    c->inflight = 0;
    c->held_us = 0;
    assert_false(hs__conn_slow(c, now + 10 * HS__HOLD_MAX_US, peer_to));
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_order),       cmocka_unit_test(test_resent_copy),
        cmocka_unit_test(test_refused),        cmocka_unit_test(test_dropped_message),
        cmocka_unit_test(test_fits),           cmocka_unit_test(test_reader_streams),
        cmocka_unit_test(test_hold_expires),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
