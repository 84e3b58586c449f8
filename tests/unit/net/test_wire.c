/* Unit tests of src/net/wire.c: the frame header, the incremental reader and its limits, and
 * the control-message codecs (round trips and every kind of malformed input). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/error.h"
#include "net/wire.h"

static void frame(uint8_t *out, uint8_t type, uint32_t sender, uint32_t len, uint64_t round) {
    hs__hdr h = {HS__WIRE_VERSION, type, 0, sender, len, round};
    hs__wire_hdr_encode(out, &h);
}

static void test_header_roundtrip(void **state) {
    (void)state;
    uint8_t b[HS__HDR_LEN];
    frame(b, HS__T_DATA, 7, 123456, 0x0102030405060708ull);
    assert_memory_equal(b, "HSAY", 4);
    hs__hdr h;
    assert_int_equal(hs__wire_hdr_decode(b, &h), 0);
    assert_int_equal(h.type, HS__T_DATA);
    assert_int_equal(h.sender, 7);
    assert_int_equal(h.len, 123456);
    assert_true(h.round == 0x0102030405060708ull);
    /* little-endian on the wire */
    assert_int_equal(b[8], 7);
    assert_int_equal(b[16], 0x08);
}

static void test_header_errors(void **state) {
    (void)state;
    uint8_t b[HS__HDR_LEN];
    hs__hdr h;
    frame(b, HS__T_DATA, 1, 10, 0);
    b[0] = 'X';
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "bad magic"));
    frame(b, HS__T_DATA, 1, 10, 0);
    b[4] = 1; /* the version before PART frames */
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "protocol version 1, this peer speaks 3"));
    frame(b, HS__T_DATA, 1, 10, 0);
    b[4] = 2; /* the version before SGP's weights a block */
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "protocol version 2, this peer speaks 3"));
    frame(b, 99, 1, 10, 0);
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "unknown frame type 99"));
    frame(b, 0, 1, 10, 0);
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
    frame(b, HS__T_DATA, 1, 10, 0);
    b[6] = 2;
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "reserved flags"));
    frame(b, HS__T_DATA, 1, 10, 0);
    b[7] = 0x80;
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
    /* RESENT is a DATA flag: on any other type it is a reserved one. */
    frame(b, HS__T_DATA, 1, 10, 0);
    b[6] = HS__F_RESENT;
    assert_int_equal(hs__wire_hdr_decode(b, &h), 0);
    assert_int_equal(h.flags, HS__F_RESENT);
    frame(b, HS__T_RESEND, 1, HS__RESEND_LEN, 0);
    b[6] = HS__F_RESENT;
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "reserved flags"));
    frame(b, HS__T_HEARTBEAT, 1, HS__HB_LEN, 0);
    b[6] = HS__F_RESENT;
    assert_int_equal(hs__wire_hdr_decode(b, &h), HS_EPROTO);
}

/* RESEND: 9 bytes exactly, a known kind, a round below 2^63; anything else is refused. */
static void test_resend(void **state) {
    (void)state;
    hs_buf *buf;
    hs__resend r = {HS__RS_REQUEST, 0x0102030405060708ull}, r2;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_resend_encode(buf, &r), 0);
    assert_int_equal(buf->len, HS__RESEND_LEN);
    assert_int_equal(buf->data[0], HS__RS_REQUEST);
    assert_int_equal(buf->data[1], 0x08); /* little-endian */
    assert_int_equal(hs__wire_resend_decode(buf->data, buf->len, &r2), 0);
    assert_int_equal(r2.kind, HS__RS_REQUEST);
    assert_true(r2.round == r.round);
    buf->data[0] = HS__RS_GONE;
    assert_int_equal(hs__wire_resend_decode(buf->data, buf->len, &r2), 0);
    assert_int_equal(r2.kind, HS__RS_GONE);
    /* unknown kinds */
    uint8_t kinds[] = {0, 3, 0xff};
    for (size_t i = 0; i < sizeof(kinds); i++) {
        buf->data[0] = kinds[i];
        assert_int_equal(hs__wire_resend_decode(buf->data, buf->len, &r2), HS_EPROTO);
        assert_non_null(strstr(hs_error_message(), "unknown kind"));
    }
    buf->data[0] = HS__RS_REQUEST;
    /* every truncation */
    for (size_t n = 0; n < HS__RESEND_LEN; n++) {
        assert_int_equal(hs__wire_resend_decode(buf->data, n, &r2), HS_EPROTO);
        assert_non_null(strstr(hs_error_message(), "truncated"));
    }
    /* a byte after the last field */
    uint8_t longer[HS__RESEND_LEN + 1];
    memcpy(longer, buf->data, HS__RESEND_LEN);
    longer[HS__RESEND_LEN] = 0;
    assert_int_equal(hs__wire_resend_decode(longer, sizeof(longer), &r2), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "length disagrees"));
    /* a round no peer can reach */
    buf->data[8] = 0x80;
    assert_int_equal(hs__wire_resend_decode(buf->data, buf->len, &r2), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "out of range"));
    /* the encoder refuses what the decoder would */
    hs__resend bad = {7, 1};
    buf->len = 0;
    assert_int_equal(hs__wire_resend_encode(buf, &bad), HS_EINVAL);
    hs_buf_unref(buf);
    /* The reader refuses a RESEND over its limit before allocating. */
    hs__reader rd;
    hs__reader_init(&rd);
    rd.max_len[HS__T_RESEND] = HS__RESEND_LEN;
    uint8_t hdr[HS__HDR_LEN];
    frame(hdr, HS__T_RESEND, 1, HS__RESEND_LEN + 1, 0);
    size_t used;
    hs__hdr h;
    hs_buf *p = NULL;
    assert_int_equal(hs__reader_feed(&rd, hdr, sizeof(hdr), &used, &h, &p), HS_EPROTO);
    assert_null(p);
    hs__reader_free(&rd);
}

static void reader_allow_all(hs__reader *r, uint32_t max) {
    hs__reader_init(r);
    for (int t = 1; t <= HS__T_MAX; t++)
        r->max_len[t] = max;
}

static void test_reader_bytewise(void **state) {
    (void)state;
    /* Two frames fed one byte at a time come out whole and in order. */
    uint8_t s[2 * HS__HDR_LEN + 5 + 3];
    frame(s, HS__T_DATA, 3, 5, 11);
    memcpy(s + HS__HDR_LEN, "hello", 5);
    frame(s + HS__HDR_LEN + 5, HS__T_BYE, 3, 3, 12);
    memcpy(s + 2 * HS__HDR_LEN + 5, "abc", 3);
    hs__reader r;
    reader_allow_all(&r, 100);
    int frames = 0;
    for (size_t i = 0; i < sizeof(s); i++) {
        size_t used;
        hs__hdr h;
        hs_buf *p = NULL;
        int ret = hs__reader_feed(&r, s + i, 1, &used, &h, &p);
        assert_true(ret >= 0);
        assert_int_equal(used, 1);
        if (ret == 1) {
            frames++;
            if (frames == 1) {
                assert_int_equal(h.type, HS__T_DATA);
                assert_int_equal(p->len, 5);
                assert_memory_equal(p->data, "hello", 5);
                assert_true(h.round == 11);
            } else {
                assert_int_equal(h.type, HS__T_BYE);
                assert_memory_equal(p->data, "abc", 3);
            }
            hs_buf_unref(p);
        }
    }
    assert_int_equal(frames, 2);
    assert_int_equal(hs__reader_partial(&r), 0);
    hs__reader_free(&r);
}

static void test_reader_stops_at_boundary(void **state) {
    (void)state;
    uint8_t s[2 * (HS__HDR_LEN + 2)];
    frame(s, HS__T_DATA, 1, 2, 1);
    s[HS__HDR_LEN] = 1;
    s[HS__HDR_LEN + 1] = 2;
    frame(s + HS__HDR_LEN + 2, HS__T_DATA, 1, 2, 2);
    s[2 * HS__HDR_LEN + 2] = 3;
    s[2 * HS__HDR_LEN + 3] = 4;
    hs__reader r;
    reader_allow_all(&r, 100);
    size_t used;
    hs__hdr h;
    hs_buf *p;
    assert_int_equal(hs__reader_feed(&r, s, sizeof(s), &used, &h, &p), 1);
    assert_int_equal(used, HS__HDR_LEN + 2);
    hs_buf_unref(p);
    assert_int_equal(hs__reader_feed(&r, s + used, sizeof(s) - used, &used, &h, &p), 1);
    assert_true(h.round == 2);
    hs_buf_unref(p);
    hs__reader_free(&r);
}

static void test_reader_direct(void **state) {
    (void)state;
    uint8_t hb[HS__HDR_LEN];
    frame(hb, HS__T_DATA, 1, 1000, 5);
    hs__reader r;
    reader_allow_all(&r, 2000);
    size_t used;
    hs__hdr h;
    hs_buf *p = NULL;
    uint8_t *dst;
    assert_int_equal(hs__reader_direct(&r, &dst), 0);
    assert_int_equal(hs__reader_feed(&r, hb, sizeof(hb), &used, &h, &p), 0);
    assert_int_equal(hs__reader_direct(&r, &dst), 1000);
    memset(dst, 7, 600);
    assert_int_equal(hs__reader_direct_done(&r, 600, &h, &p), 0);
    assert_int_equal(hs__reader_partial(&r), HS__HDR_LEN + 600);
    assert_int_equal(hs__reader_direct(&r, &dst), 400);
    memset(dst, 8, 400);
    assert_int_equal(hs__reader_direct_done(&r, 400, &h, &p), 1);
    assert_int_equal(p->len, 1000);
    assert_int_equal(p->data[599], 7);
    assert_int_equal(p->data[600], 8);
    hs_buf_unref(p);
    hs__reader_free(&r);
}

/* Each malformed header is refused before any payload is allocated. */
static void test_reader_limits(void **state) {
    (void)state;
    hs__reader r;
    uint8_t hb[HS__HDR_LEN];
    size_t used;
    hs__hdr h;
    hs_buf *p = NULL;

    reader_allow_all(&r, 100);
    frame(hb, HS__T_DATA, 1, 0, 1);
    assert_int_equal(hs__reader_feed(&r, hb, sizeof(hb), &used, &h, &p), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "zero-length DATA"));
    assert_null(r.pay);
    hs__reader_free(&r);

    reader_allow_all(&r, 100);
    frame(hb, HS__T_DATA, 1, 101, 1);
    assert_int_equal(hs__reader_feed(&r, hb, sizeof(hb), &used, &h, &p), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "over the limit of 100"));
    assert_null(r.pay);
    hs__reader_free(&r);

    /* A 4 GiB claim never reaches the allocator, whatever the limit says. */
    reader_allow_all(&r, UINT32_MAX);
    frame(hb, HS__T_DATA, 1, UINT32_MAX, 1);
    assert_int_equal(hs__reader_feed(&r, hb, sizeof(hb), &used, &h, &p), HS_EPROTO);
    hs__reader_free(&r);

    hs__reader_init(&r);
    r.max_len[HS__T_HELLO] = 100;
    frame(hb, HS__T_DATA, 1, 10, 1);
    assert_int_equal(hs__reader_feed(&r, hb, sizeof(hb), &used, &h, &p), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "not accepted in this state"));
    hs__reader_free(&r);

    /* A partial frame is reported as such (the caller turns EOF then into an error). */
    reader_allow_all(&r, 100);
    frame(hb, HS__T_DATA, 1, 50, 1);
    assert_int_equal(hs__reader_feed(&r, hb, sizeof(hb), &used, &h, &p), 0);
    assert_int_equal(hs__reader_feed(&r, (const uint8_t *)"xyz", 3, &used, &h, &p), 0);
    assert_int_equal(hs__reader_partial(&r), HS__HDR_LEN + 3);
    hs__reader_free(&r);
}

static void test_hello_roundtrip(void **state) {
    (void)state;
    hs__hello a, b;
    memset(&a, 0, sizeof(a));
    a.proto = HS__WIRE_VERSION;
    a.peer_id = HS__ID_NONE;
    strcpy(a.run_id, "run-42");
    strcpy(a.listen, "127.0.0.1:7070");
    strcpy(a.model_sig, "mlp:784-256-10");
    a.n_params = 235146;
    strcpy(a.algo, "choco");
    strcpy(a.codec, "topk:0.01");
    a.mver = 9;
    a.missuer = 2;
    a.round = 1234;
    hs_buf *buf;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_hello_encode(buf, &a), 0);
    assert_int_equal(hs__wire_hello_decode(buf->data, buf->len, &b), 0);
    assert_memory_equal(&a, &b, sizeof(a));
    /* every truncation fails, and so does a trailing byte */
    for (size_t n = 0; n < buf->len; n++)
        assert_int_equal(hs__wire_hello_decode(buf->data, n, &b), HS_EPROTO);
    hs_buf_append(buf, "!", 1);
    assert_int_equal(hs__wire_hello_decode(buf->data, buf->len, &b), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "length disagrees"));
    /* a non-printable byte in a string */
    buf->len--;
    size_t at = 2 + 4 + 2; /* proto, peer id, run id length */
    buf->data[at] = 0x07;
    assert_int_equal(hs__wire_hello_decode(buf->data, buf->len, &b), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "non-printable"));
    hs_buf_unref(buf);
    /* encoding refuses over-long and non-printable strings */
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    memset(a.algo, 'a', sizeof(a.algo) - 1);
    a.algo[sizeof(a.algo) - 1] = '\0';
    assert_int_equal(hs__wire_hello_encode(buf, &a), 0); /* exactly at the limit */
    hs_buf_unref(buf);
}

static void test_members(void **state) {
    (void)state;
    hs__member mm[3] = {{0, "127.0.0.1:1"}, {4, "127.0.0.1:2"}, {9, "[::1]:3"}};
    hs__members a = {5, 0, 77, 10, 3, mm}, b;
    hs_buf *buf;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_members_encode(buf, &a), 0);
    assert_int_equal(hs__wire_members_decode(buf->data, buf->len, &b), 0);
    assert_int_equal(b.n, 3);
    assert_int_equal(b.m[2].id, 9);
    assert_string_equal(b.m[2].addr, "[::1]:3");
    assert_true(b.eff_round == 77);
    hs__members_clear(&b);
    for (size_t n = 0; n < buf->len; n++)
        assert_int_equal(hs__wire_members_decode(buf->data, n, &b), HS_EPROTO);
    hs_buf_unref(buf);
    /* ids out of order, an id at next_id, an empty list, a huge count */
    hs__member bad[2] = {{4, "a:1"}, {4, "b:1"}};
    hs__members m2 = {1, 0, 0, 10, 2, bad};
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_members_encode(buf, &m2), 0);
    assert_int_equal(hs__wire_members_decode(buf->data, buf->len, &b), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "strictly increasing"));
    hs_buf_unref(buf);
    bad[1].id = 10;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_members_encode(buf, &m2), 0);
    assert_int_equal(hs__wire_members_decode(buf->data, buf->len, &b), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "next id"));
    hs_buf_unref(buf);
    m2.n = 0;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_members_encode(buf, &m2), 0);
    assert_int_equal(hs__wire_members_decode(buf->data, buf->len, &b), HS_EPROTO);
    /* patch the count to a million: refused before allocating */
    buf->data[24] = 0x40;
    buf->data[25] = 0x42;
    buf->data[26] = 0x0f;
    assert_int_equal(hs__wire_members_decode(buf->data, buf->len, &b), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "over the limit"));
    hs_buf_unref(buf);
}

static void test_welcome(void **state) {
    (void)state;
    hs__member mm[2] = {{0, "127.0.0.1:1"}, {3, "127.0.0.1:2"}};
    hs__welcome a, b;
    memset(&a, 0, sizeof(a));
    a.id = 3;
    a.round = 50;
    a.join_round = 60;
    strcpy(a.topo_spec, "ring");
    a.topo_seed = 9;
    a.members = (hs__members){4, 0, 60, 4, 2, mm};
    a.config = (const uint8_t *)"{\"lr\":0.1}";
    a.config_len = 10;
    uint8_t snap[100];
    for (int i = 0; i < 100; i++)
        snap[i] = (uint8_t)i;
    a.snap = snap;
    a.snap_len = 100;
    a.snap_round = 48;
    hs_buf *buf;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_welcome_encode(buf, &a), 0);
    assert_int_equal(hs__wire_welcome_decode(buf->data, buf->len, &b), 0);
    assert_int_equal(b.id, 3);
    assert_true(b.join_round == 60);
    assert_string_equal(b.topo_spec, "ring");
    assert_int_equal(b.members.n, 2);
    assert_int_equal(b.config_len, 10);
    assert_memory_equal(b.config, a.config, 10);
    assert_int_equal(b.snap_len, 100);
    assert_memory_equal(b.snap, snap, 100);
    hs__members_clear(&b.members);
    for (size_t n = 0; n < buf->len; n++)
        assert_int_equal(hs__wire_welcome_decode(buf->data, n, &b), HS_EPROTO);
    hs_buf_unref(buf);
    /* an id that is not in its own member list */
    a.id = 2;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_welcome_encode(buf, &a), 0);
    assert_int_equal(hs__wire_welcome_decode(buf->data, buf->len, &b), HS_EPROTO);
    assert_non_null(strstr(hs_error_message(), "not in its member list"));
    hs_buf_unref(buf);
}

static void test_small_messages(void **state) {
    (void)state;
    hs_buf *buf;
    hs__heartbeat hb = {HS__HB_PING, 77, 5, 6, 7}, hb2;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_heartbeat_encode(buf, &hb), 0);
    assert_int_equal(buf->len, HS__HB_LEN);
    assert_int_equal(hs__wire_heartbeat_decode(buf->data, buf->len, &hb2), 0);
    assert_true(hb2.token == 77 && hb2.mver == 6 && hb2.missuer == 7);
    buf->data[0] = 9;
    assert_int_equal(hs__wire_heartbeat_decode(buf->data, buf->len, &hb2), HS_EPROTO);
    hs_buf_unref(buf);

    hs__join j = {0x1234, 5, HS__ID_NONE, 3, 4, "127.0.0.1:9"}, j2;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_join_encode(buf, &j), 0);
    assert_int_equal(hs__wire_join_decode(buf->data, buf->len, &j2), 0);
    assert_true(j2.nonce == 0x1234 && j2.via == 5 && j2.ttl == 4);
    assert_string_equal(j2.addr, "127.0.0.1:9");
    hs_buf_unref(buf);

    hs__reason r = {HS__BYE_LEAVE, "bye now"}, r2;
    assert_int_equal(hs_buf_new(&buf, 16), 0);
    assert_int_equal(hs__wire_reason_encode(buf, &r), 0);
    assert_int_equal(hs__wire_reason_decode(buf->data, buf->len, &r2), 0);
    assert_string_equal(r2.text, "bye now");
    buf->data[4] = 200; /* length over the limit */
    buf->data[5] = 200;
    assert_int_equal(hs__wire_reason_decode(buf->data, buf->len, &r2), HS_EPROTO);
    hs_buf_unref(buf);
}

static void test_addr_split(void **state) {
    (void)state;
    char host[64];
    int port;
    assert_int_equal(hs__wire_addr_split("127.0.0.1:7070", host, sizeof(host), &port), 0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 7070);
    assert_int_equal(hs__wire_addr_split("[::1]:80", host, sizeof(host), &port), 0);
    assert_string_equal(host, "::1");
    assert_int_equal(hs__wire_addr_split("example.org:1", host, sizeof(host), &port), 0);
    assert_int_equal(hs__wire_addr_split("::1:80", host, sizeof(host), &port), HS_EINVAL);
    assert_int_equal(hs__wire_addr_split("host", host, sizeof(host), &port), HS_EINVAL);
    assert_int_equal(hs__wire_addr_split("host:70000", host, sizeof(host), &port), HS_EINVAL);
    assert_int_equal(hs__wire_addr_split("host:", host, sizeof(host), &port), HS_EINVAL);
    assert_int_equal(hs__wire_addr_split(":80", host, sizeof(host), &port), HS_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_roundtrip), cmocka_unit_test(test_header_errors),
        cmocka_unit_test(test_reader_bytewise),  cmocka_unit_test(test_reader_stops_at_boundary),
        cmocka_unit_test(test_reader_direct),    cmocka_unit_test(test_reader_limits),
        cmocka_unit_test(test_hello_roundtrip),  cmocka_unit_test(test_members),
        cmocka_unit_test(test_welcome),          cmocka_unit_test(test_small_messages),
        cmocka_unit_test(test_resend),           cmocka_unit_test(test_addr_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
