/* libFuzzer target: the frame reader over an arbitrary byte stream, fed in chunks whose sizes
 * come from the first input byte, with every completed frame handed to the decoder of its
 * type (as a connection does); DATA and WELCOME may also come as messages in PART frames.
 * Nothing may crash, leak or read out of bounds, and a frame or message must never exceed its
 * type's limit. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "net/wire.h"

static void decode(const hs__hdr *h, const hs_buf *p) {
    union {
        hs__hello hello;
        hs__reason reason;
        hs__join join;
        hs__heartbeat hb;
        hs__resend rs;
    } u;
    hs__members m;
    hs__welcome w;
    switch (h->type) {
    case HS__T_HELLO:
    case HS__T_HELLO_ACK:
        hs__wire_hello_decode(p->data, p->len, &u.hello);
        break;
    case HS__T_REFUSE:
    case HS__T_BYE:
    case HS__T_SUSPECT:
        hs__wire_reason_decode(p->data, p->len, &u.reason);
        break;
    case HS__T_JOIN:
    case HS__T_JOIN_FWD:
    case HS__T_JOIN_ACK:
        hs__wire_join_decode(p->data, p->len, &u.join);
        break;
    case HS__T_HEARTBEAT:
        hs__wire_heartbeat_decode(p->data, p->len, &u.hb);
        break;
    case HS__T_RESEND:
        hs__wire_resend_decode(p->data, p->len, &u.rs);
        break;
    case HS__T_MEMBERS:
        if (hs__wire_members_decode(p->data, p->len, &m) == 0)
            hs__members_clear(&m);
        break;
    case HS__T_WELCOME:
        if (hs__wire_welcome_decode(p->data, p->len, &w) == 0)
            hs__members_clear(&w.members);
        break;
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    hs__reader r;
    hs__reader_init(&r);
    for (int t = 1; t <= HS__T_MAX; t++)
        r.max_len[t] = (mode & 0x80) ? 64 : 1u << 16;
    if (mode & 0x40)
        r.max_len[HS__T_DATA] = 0; /* a type not accepted now */
    /* Messages in parts, up to 1 MiB (a corpus-sized stand-in for max_message). */
    r.max_msg[HS__T_DATA] = 1u << 20;
    r.max_msg[HS__T_WELCOME] = (mode & 0x80) ? 0 : 1u << 20;
    size_t chunk = (size_t)(mode & 0x3f) + 1;
    size_t off = 0;
    while (off < size) {
        size_t n = size - off < chunk ? size - off : chunk;
        size_t used = 0;
        hs__hdr h;
        hs_buf *p = NULL;
        uint8_t *dst;
        size_t want = hs__reader_direct(&r, &dst);
        int ret;
        if (want && (mode & 0x20)) {
            if (n > want)
                n = want;
            memcpy(dst, data + off, n);
            used = n;
            ret = hs__reader_direct_done(&r, n, &h, &p);
        } else {
            ret = hs__reader_feed(&r, data + off, n, &used, &h, &p);
        }
        if (ret < 0)
            break;
        if (used > n)
            __builtin_trap();
        off += used;
        if (ret == 1) {
            uint64_t max = r.max_len[h.type] > r.max_msg[h.type] ? r.max_len[h.type]
                                                                 : r.max_msg[h.type];
            if (p->len != h.len || h.len == 0 || h.len > max || h.type == HS__T_PART)
                __builtin_trap();
            decode(&h, p);
            hs_buf_unref(p);
        }
    }
    hs__reader_free(&r);
    return 0;
}
