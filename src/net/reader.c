/* The incremental frame reader (wire.h): a header checked before its payload is allocated, and
 * messages reassembled from PART frames, each part checked against the message begun before its
 * bytes are read into the message's buffer. Pure: bytes in, frames out; fuzzed with the codecs
 * (tests/fuzz/net/fuzz_wire.c). Thread-safe: no global state. */
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/wire.h"

void hs__reader_init(hs__reader *r) { memset(r, 0, sizeof(*r)); }

void hs__reader_free(hs__reader *r) {
    hs_buf_unref(r->pay);
    hs_buf_unref(r->msg.buf);
    r->pay = NULL;
    r->msg.buf = NULL;
    r->msg.streamed = 0;
    r->in_payload = 0;
    r->in_part = 0;
    r->hb_have = 0;
    r->pay_have = 0;
    r->ph_have = 0;
}

size_t hs__reader_partial(const hs__reader *r) {
    size_t n = r->in_payload ? HS__HDR_LEN + r->pay_have + r->ph_have : r->hb_have;
    return n + (r->msg.buf || r->msg.streamed ? (size_t)r->msg.p.off + 1 : 0);
}

/* The header is complete: check it against the limits and allocate the payload (a PART's part
 * header is read first, into ph). */
static int header_done(hs__reader *r) {
    int err = hs__wire_hdr_decode(r->hb, &r->hdr);
    if (err < 0)
        return err;
    uint32_t max = r->max_len[r->hdr.type];
    if (max > HS__FRAME_CAP)
        max = HS__FRAME_CAP;
    const char *tn = hs__wire_type_name(r->hdr.type);
    if (!max)
        return hs__err(HS_EPROTO, "%s frame not accepted in this state", tn);
    if (r->hdr.len == 0)
        return hs__err(HS_EPROTO, "zero-length %s frame", tn);
    if (r->hdr.len > max)
        return hs__err(HS_EPROTO, "%s frame of %llu bytes, over the limit of %u", tn,
                       (unsigned long long)r->hdr.len, max);
    r->in_payload = 1;
    r->pay_have = 0;
    if (r->hdr.type == HS__T_PART) {
        if (r->hdr.len <= HS__PART_HDR_LEN)
            return hs__err(HS_EPROTO, "PART frame of %llu bytes carries no part of a message",
                           (unsigned long long)r->hdr.len);
        r->in_part = 1;
        r->ph_have = 0;
        return 0;
    }
    return hs_buf_new(&r->pay, r->hdr.len);
}

/* The part header is complete: it must begin the next message or continue the one begun,
 * exactly where its last part ended. */
static int part_header_done(hs__reader *r) {
    hs__part p;
    int err = hs__wire_part_decode(r->ph, &p);
    if (err < 0)
        return err;
    uint64_t n = r->hdr.len - HS__PART_HDR_LEN;
    hs__rmsg *m = &r->msg;
    if (p.off == 0) {
        if (m->buf || m->streamed)
            return hs__err(HS_EPROTO, "PART: message %u begun before message %u was complete",
                           p.id, m->p.id);
        if (p.id != r->last_id + 1)
            return hs__err(HS_EPROTO, "PART: message %u begun after message %u", p.id,
                           r->last_id);
        const char *tn = p.type <= HS__T_MAX ? hs__wire_type_name(p.type) : "?";
        uint64_t max = p.type < HS__T_PART && p.type ? r->max_msg[p.type] : 0;
        if (max > HS__MSG_CAP)
            max = HS__MSG_CAP;
        if (!max)
            return hs__err(HS_EPROTO, "PART: a %s message (type %u) cannot come in parts now",
                           tn, p.type);
        if (p.flags & ~(p.type == HS__T_DATA ? HS__F_RESENT : 0u))
            return hs__err(HS_EPROTO, "PART: %s message with reserved flags 0x%04x set", tn,
                           p.flags);
        if (p.total > max)
            return hs__err(HS_EPROTO, "PART: %s message of %llu bytes, over the limit of %llu",
                           tn, (unsigned long long)p.total, (unsigned long long)max);
        if (n > p.total)
            return hs__err(HS_EPROTO, "PART: %llu bytes of a %s message of %llu",
                           (unsigned long long)n, tn, (unsigned long long)p.total);
        /* Untouched pages cost nothing until the parts fill them. */
        if (r->stream && p.type == HS__T_DATA)
            m->streamed = 1;
        else if ((err = hs_buf_new(&m->buf, (size_t)p.total)) < 0)
            return err;
        r->last_id = p.id;
        m->p = p;
        m->round = r->hdr.round;
    } else {
        if (!m->buf && !m->streamed)
            return hs__err(HS_EPROTO, "PART: part at %llu of message %u, which was not begun",
                           (unsigned long long)p.off, p.id);
        if (p.id != m->p.id || p.type != m->p.type || p.flags != m->p.flags ||
            p.total != m->p.total || r->hdr.round != m->round)
            return hs__err(HS_EPROTO, "PART: a part of message %u disagrees with its first "
                                      "part (id, type, flags, length or round)", m->p.id);
        if (p.off != m->p.off)
            return hs__err(HS_EPROTO, "PART: part of message %u at %llu, expected at %llu",
                           p.id, (unsigned long long)p.off, (unsigned long long)m->p.off);
        if (n > p.total - p.off)
            return hs__err(HS_EPROTO, "PART: %llu bytes at %llu of a message of %llu",
                           (unsigned long long)n, (unsigned long long)p.off,
                           (unsigned long long)p.total);
    }
    m->end = m->p.off + n;
    r->in_part = 2;
    if (!m->streamed)
        return 0;
    /* The part goes up on its own: its header (as checked) and its bytes. */
    if ((err = hs_buf_new(&r->pay, (size_t)r->hdr.len)) < 0)
        return err;
    memcpy(r->pay->data, r->ph, HS__PART_HDR_LEN);
    r->pay_have = HS__PART_HDR_LEN;
    r->in_part = 3;
    return 0;
}

static void frame_reset(hs__reader *r) {
    r->in_payload = 0;
    r->in_part = 0;
    r->hb_have = 0;
    r->pay_have = 0;
    r->ph_have = 0;
}

static int take_frame(hs__reader *r, hs__hdr *hdr, hs_buf **payload) {
    r->pay->len = r->hdr.len;
    *hdr = r->hdr;
    *payload = r->pay;
    r->pay = NULL;
    frame_reset(r);
    return 1;
}

/* A part's bytes are in: the message is complete (1, returned as one frame of its type) or
 * waits for its next part (0). */
static int part_done(hs__reader *r, hs__hdr *hdr, hs_buf **payload) {
    hs__rmsg *m = &r->msg;
    hs__hdr h = r->hdr;
    frame_reset(r);
    if (m->p.off < m->p.total)
        return 0;
    h.type = m->p.type;
    h.flags = m->p.flags;
    h.len = m->p.total;
    h.round = m->round;
    m->buf->len = (size_t)m->p.total;
    *hdr = h;
    *payload = m->buf;
    m->buf = NULL;
    return 1;
}

int hs__reader_feed(hs__reader *r, const uint8_t *p, size_t n, size_t *used, hs__hdr *hdr,
                    hs_buf **payload) {
    size_t i = 0;
    *used = 0;
    while (i < n) {
        size_t k;
        int err;
        if (!r->in_payload) {
            k = HS__HDR_LEN - r->hb_have;
            if (k > n - i)
                k = n - i;
            memcpy(r->hb + r->hb_have, p + i, k);
            r->hb_have += k;
            i += k;
            *used = i;
            if (r->hb_have < HS__HDR_LEN)
                return 0;
            if ((err = header_done(r)) < 0)
                return err;
            continue;
        }
        if (r->in_part == 1) {
            k = HS__PART_HDR_LEN - r->ph_have;
            if (k > n - i)
                k = n - i;
            memcpy(r->ph + r->ph_have, p + i, k);
            r->ph_have += k;
            i += k;
            *used = i;
            if (r->ph_have == HS__PART_HDR_LEN && (err = part_header_done(r)) < 0)
                return err;
            continue;
        }
        uint8_t *dst;
        k = hs__reader_direct(r, &dst);
        if (k > n - i)
            k = n - i;
        memcpy(dst, p + i, k);
        i += k;
        *used = i;
        if (hs__reader_direct_done(r, k, hdr, payload) == 1)
            return 1;
    }
    return 0;
}

size_t hs__reader_direct(hs__reader *r, uint8_t **dst) {
    if (r->in_part == 3) {
        *dst = r->pay->data + r->pay_have;
        return r->hdr.len - r->pay_have;
    }
    if (r->in_part == 2) {
        *dst = r->msg.buf->data + r->msg.p.off;
        return (size_t)(r->msg.end - r->msg.p.off);
    }
    if (!r->in_payload || r->in_part)
        return 0;
    *dst = r->pay->data + r->pay_have;
    return r->hdr.len - r->pay_have;
}

int hs__reader_direct_done(hs__reader *r, size_t n, hs__hdr *hdr, hs_buf **payload) {
    if (r->in_part == 3) {
        r->msg.p.off += n;
        r->pay_have += n;
        if (r->pay_have < r->hdr.len)
            return 0;
        if (r->msg.p.off == r->msg.p.total)
            r->msg.streamed = 0;
        return take_frame(r, hdr, payload);
    }
    if (r->in_part == 2) {
        r->msg.p.off += n;
        return r->msg.p.off == r->msg.end ? part_done(r, hdr, payload) : 0;
    }
    r->pay_have += n;
    if (r->pay_have == r->hdr.len)
        return take_frame(r, hdr, payload);
    return 0;
}
