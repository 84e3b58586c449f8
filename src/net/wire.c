/* The hearsay wire format: frame header, incremental reader, control-message codecs. Pure code
 * over (pointer, end) cursors; all integers little-endian. See wire.h and docs/PROTOCOL.md.
 * Thread-safe: no global state. */
#include "net/wire.h"

#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"

const char *hs__wire_type_name(int type) {
    static const char *names[] = {"?",       "HELLO",    "HELLO_ACK", "REFUSE",    "JOIN",
                                  "WELCOME", "MEMBERS",  "DATA",      "HEARTBEAT", "BYE",
                                  "SUSPECT", "JOIN_FWD", "JOIN_ACK",  "RESEND",    "PART"};
    if (type < 1 || type > HS__T_MAX)
        return "?";
    return names[type];
}

/* ------------------------------------------------------------------ little-endian helpers */

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get64(const uint8_t *p) {
    return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32);
}

/* A read cursor. Every getter fails (returns -1) without moving when fewer bytes remain. */
typedef struct rcur {
    const uint8_t *p, *end;
    const char *msg; /* message name for errors */
} rcur;

static size_t left(const rcur *c) { return (size_t)(c->end - c->p); }

static int trunc_err(const rcur *c, const char *field) {
    return hs__err(HS_EPROTO, "%s: truncated in field '%s' (%zu bytes left)", c->msg, field,
                   left(c));
}

static int rd8(rcur *c, uint8_t *v, const char *field) {
    if (left(c) < 1)
        return trunc_err(c, field);
    *v = c->p[0];
    c->p += 1;
    return 0;
}
static int rd16(rcur *c, uint16_t *v, const char *field) {
    if (left(c) < 2)
        return trunc_err(c, field);
    *v = get16(c->p);
    c->p += 2;
    return 0;
}
static int rd32(rcur *c, uint32_t *v, const char *field) {
    if (left(c) < 4)
        return trunc_err(c, field);
    *v = get32(c->p);
    c->p += 4;
    return 0;
}
static int rd64(rcur *c, uint64_t *v, const char *field) {
    if (left(c) < 8)
        return trunc_err(c, field);
    *v = get64(c->p);
    c->p += 8;
    return 0;
}

/* A string: u16 length, then that many printable ASCII bytes (no NUL). Printable only, so a
 * peer's strings can go into log lines and error messages as they are. dst has max+1 bytes. */
static int rdstr(rcur *c, char *dst, size_t max, const char *field) {
    uint16_t n = 0;
    int err = rd16(c, &n, field);
    if (err < 0)
        return err;
    if (n > max)
        return hs__err(HS_EPROTO, "%s: field '%s' is %u bytes, over the limit of %zu", c->msg,
                       field, n, max);
    if (left(c) < n)
        return trunc_err(c, field);
    for (size_t i = 0; i < n; i++) {
        uint8_t ch = c->p[i];
        if (ch < 0x20 || ch > 0x7e)
            return hs__err(HS_EPROTO, "%s: field '%s' has a non-printable byte 0x%02x at %zu",
                           c->msg, field, ch, i);
        dst[i] = (char)ch;
    }
    dst[n] = '\0';
    c->p += n;
    return 0;
}

/* A blob: u32 length, bytes borrowed from the input. */
static int rdblob(rcur *c, const uint8_t **dst, uint32_t *len, uint32_t max, const char *field) {
    uint32_t n = 0;
    int err = rd32(c, &n, field);
    if (err < 0)
        return err;
    if (n > max)
        return hs__err(HS_EPROTO, "%s: field '%s' is %u bytes, over the limit of %u", c->msg, field,
                       n, max);
    if (left(c) < n)
        return trunc_err(c, field);
    *dst = n ? c->p : NULL;
    *len = n;
    c->p += n;
    return 0;
}

static int rdend(const rcur *c) {
    if (left(c))
        return hs__err(HS_EPROTO, "%s: %zu bytes after the last field (length disagrees)", c->msg,
                       left(c));
    return 0;
}

/* Writers append to an hs_buf; they fail only with HS_ENOMEM or an over-long string. */
static int w8(hs_buf *b, uint8_t v) { return hs_buf_append(b, &v, 1); }
static int w16(hs_buf *b, uint16_t v) {
    uint8_t t[2];
    put16(t, v);
    return hs_buf_append(b, t, 2);
}
static int w32(hs_buf *b, uint32_t v) {
    uint8_t t[4];
    put32(t, v);
    return hs_buf_append(b, t, 4);
}
static int w64(hs_buf *b, uint64_t v) {
    uint8_t t[8];
    put64(t, v);
    return hs_buf_append(b, t, 8);
}
static int wstr(hs_buf *b, const char *s, size_t max, const char *field) {
    size_t n = strlen(s);
    if (n > max)
        return hs__err(HS_EINVAL, "field '%s' is %zu bytes, over the limit of %zu", field, n, max);
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] < 0x20 || (uint8_t)s[i] > 0x7e)
            return hs__err(HS_EINVAL, "field '%s' has a non-printable byte at %zu", field, i);
    int err = w16(b, (uint16_t)n);
    return err < 0 ? err : hs_buf_append(b, s, n);
}
static int wblob(hs_buf *b, const uint8_t *p, uint32_t n) {
    int err = w32(b, n);
    return err < 0 ? err : hs_buf_append(b, p, n);
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int e_ = (x);                                                                              \
        if (e_ < 0)                                                                                \
            return e_;                                                                             \
    } while (0)

/* ------------------------------------------------------------------ header */

void hs__wire_hdr_encode(uint8_t out[HS__HDR_LEN], const hs__hdr *h) {
    out[0] = HS__WIRE_MAGIC0;
    out[1] = HS__WIRE_MAGIC1;
    out[2] = HS__WIRE_MAGIC2;
    out[3] = HS__WIRE_MAGIC3;
    out[4] = h->version;
    out[5] = h->type;
    put16(out + 6, h->flags);
    put32(out + 8, h->sender);
    put32(out + 12, (uint32_t)h->len);
    put64(out + 16, h->round);
}

int hs__wire_hdr_decode(const uint8_t in[HS__HDR_LEN], hs__hdr *out) {
    if (in[0] != HS__WIRE_MAGIC0 || in[1] != HS__WIRE_MAGIC1 || in[2] != HS__WIRE_MAGIC2 ||
        in[3] != HS__WIRE_MAGIC3)
        return hs__err(HS_EPROTO, "bad magic %02x %02x %02x %02x (%s)", in[0], in[1], in[2], in[3],
                       in[0] >= 0x14 && in[0] <= 0x17 && in[1] == 3
                           ? "a TLS record: the other side uses TLS"
                           : "not a hearsay frame");
    out->version = in[4];
    out->type = in[5];
    out->flags = get16(in + 6);
    out->sender = get32(in + 8);
    out->len = get32(in + 12);
    out->round = get64(in + 16);
    if (out->version != HS__WIRE_VERSION)
        return hs__err(HS_EPROTO, "protocol version %u, this peer speaks %u", out->version,
                       HS__WIRE_VERSION);
    if (out->type < 1 || out->type > HS__T_MAX)
        return hs__err(HS_EPROTO, "unknown frame type %u", out->type);
    if (out->flags & ~(out->type == HS__T_DATA ? HS__F_RESENT : 0u))
        return hs__err(HS_EPROTO, "%s frame with reserved flags 0x%04x set",
                       hs__wire_type_name(out->type), out->flags);
    return 0;
}

/* ------------------------------------------------------------------ PART header */

void hs__wire_part_encode(uint8_t out[HS__PART_HDR_LEN], const hs__part *p) {
    out[0] = p->type;
    out[1] = 0;
    put16(out + 2, p->flags);
    put32(out + 4, p->id);
    put64(out + 8, p->total);
    put64(out + 16, p->off);
}

int hs__wire_part_decode(const uint8_t in[HS__PART_HDR_LEN], hs__part *out) {
    out->type = in[0];
    out->flags = get16(in + 2);
    out->id = get32(in + 4);
    out->total = get64(in + 8);
    out->off = get64(in + 16);
    if (in[1])
        return hs__err(HS_EPROTO, "PART: reserved byte is 0x%02x", in[1]);
    return 0;
}

/* ------------------------------------------------------------------ HELLO */

int hs__wire_hello_encode(hs_buf *out, const hs__hello *h) {
    TRY(w16(out, h->proto));
    TRY(w32(out, h->peer_id));
    TRY(wstr(out, h->run_id, HS__RUNID_MAX, "run id"));
    TRY(wstr(out, h->listen, HS__ADDR_MAX, "listen address"));
    TRY(wstr(out, h->model_sig, HS__SIG_MAX, "model signature"));
    TRY(w64(out, h->n_params));
    TRY(wstr(out, h->algo, HS__NAME_MAX, "algorithm"));
    TRY(wstr(out, h->codec, HS__NAME_MAX, "codec"));
    TRY(w64(out, h->mver));
    TRY(w32(out, h->missuer));
    return w64(out, h->round);
}

int hs__wire_hello_decode(const uint8_t *p, size_t n, hs__hello *out) {
    rcur c = {p, p + n, "HELLO"};
    memset(out, 0, sizeof(*out));
    TRY(rd16(&c, &out->proto, "protocol"));
    TRY(rd32(&c, &out->peer_id, "peer id"));
    TRY(rdstr(&c, out->run_id, HS__RUNID_MAX, "run id"));
    TRY(rdstr(&c, out->listen, HS__ADDR_MAX, "listen address"));
    TRY(rdstr(&c, out->model_sig, HS__SIG_MAX, "model signature"));
    TRY(rd64(&c, &out->n_params, "parameter count"));
    TRY(rdstr(&c, out->algo, HS__NAME_MAX, "algorithm"));
    TRY(rdstr(&c, out->codec, HS__NAME_MAX, "codec"));
    TRY(rd64(&c, &out->mver, "membership version"));
    TRY(rd32(&c, &out->missuer, "membership issuer"));
    TRY(rd64(&c, &out->round, "round"));
    return rdend(&c);
}

/* ------------------------------------------------------------------ REFUSE / BYE / SUSPECT */

int hs__wire_reason_encode(hs_buf *out, const hs__reason *r) {
    TRY(w32(out, r->code));
    return wstr(out, r->text, HS__REASON_MAX, "reason");
}

int hs__wire_reason_decode(const uint8_t *p, size_t n, hs__reason *out) {
    rcur c = {p, p + n, "REFUSE/BYE/SUSPECT"};
    memset(out, 0, sizeof(*out));
    TRY(rd32(&c, &out->code, "code"));
    TRY(rdstr(&c, out->text, HS__REASON_MAX, "reason"));
    return rdend(&c);
}

/* ------------------------------------------------------------------ JOIN family */

int hs__wire_join_encode(hs_buf *out, const hs__join *j) {
    TRY(w64(out, j->nonce));
    TRY(w32(out, j->via));
    TRY(w32(out, j->id));
    TRY(w64(out, j->mver));
    TRY(w8(out, j->ttl));
    return wstr(out, j->addr, HS__ADDR_MAX, "address");
}

int hs__wire_join_decode(const uint8_t *p, size_t n, hs__join *out) {
    rcur c = {p, p + n, "JOIN"};
    memset(out, 0, sizeof(*out));
    TRY(rd64(&c, &out->nonce, "nonce"));
    TRY(rd32(&c, &out->via, "via"));
    TRY(rd32(&c, &out->id, "id"));
    TRY(rd64(&c, &out->mver, "membership version"));
    TRY(rd8(&c, &out->ttl, "ttl"));
    TRY(rdstr(&c, out->addr, HS__ADDR_MAX, "address"));
    return rdend(&c);
}

/* ------------------------------------------------------------------ MEMBERS */

void hs__members_clear(hs__members *m) {
    free(m->m);
    memset(m, 0, sizeof(*m));
}

int hs__members_copy(hs__members *dst, const hs__members *src) {
    hs__members t = *src;
    t.m = NULL;
    if (src->n) {
        if (!(t.m = malloc(src->n * sizeof(*t.m))))
            return hs__err(HS_ENOMEM, "member list of %u: out of memory", src->n);
        memcpy(t.m, src->m, src->n * sizeof(*t.m));
    }
    *dst = t;
    return 0;
}

int hs__wire_members_encode(hs_buf *out, const hs__members *m) {
    TRY(w64(out, m->version));
    TRY(w32(out, m->issuer));
    TRY(w64(out, m->eff_round));
    TRY(w32(out, m->next_id));
    TRY(w32(out, m->n));
    for (uint32_t i = 0; i < m->n; i++) {
        TRY(w32(out, m->m[i].id));
        TRY(wstr(out, m->m[i].addr, HS__ADDR_MAX, "member address"));
    }
    return 0;
}

static int members_decode(rcur *c, hs__members *out) {
    memset(out, 0, sizeof(*out));
    TRY(rd64(c, &out->version, "version"));
    TRY(rd32(c, &out->issuer, "issuer"));
    TRY(rd64(c, &out->eff_round, "effective round"));
    TRY(rd32(c, &out->next_id, "next id"));
    uint32_t n = 0;
    TRY(rd32(c, &n, "member count"));
    if (n == 0)
        return hs__err(HS_EPROTO, "%s: empty member list", c->msg);
    if (n > HS__MEMBERS_MAX)
        return hs__err(HS_EPROTO, "%s: %u members, over the limit of %u", c->msg, n,
                       HS__MEMBERS_MAX);
    /* Each member takes at least 6 bytes (id, address length): check before allocating. */
    if ((uint64_t)n * 6 > left(c))
        return hs__err(HS_EPROTO, "%s: %u members cannot fit in %zu bytes", c->msg, n, left(c));
    if (!(out->m = calloc(n, sizeof(*out->m))))
        return hs__err(HS_ENOMEM, "%s: %u members: out of memory", c->msg, n);
    out->n = n;
    for (uint32_t i = 0; i < n; i++) {
        int err;
        if ((err = rd32(c, &out->m[i].id, "member id")) < 0 ||
            (err = rdstr(c, out->m[i].addr, HS__ADDR_MAX, "member address")) < 0)
            goto fail;
        if (out->m[i].id == HS__ID_NONE || out->m[i].id >= out->next_id) {
            err = hs__err(HS_EPROTO, "%s: member id %u not below next id %u", c->msg, out->m[i].id,
                          out->next_id);
            goto fail;
        }
        if (i && out->m[i].id <= out->m[i - 1].id) {
            err = hs__err(HS_EPROTO, "%s: member ids not strictly increasing (%u after %u)", c->msg,
                          out->m[i].id, out->m[i - 1].id);
            goto fail;
        }
        continue;
    fail:
        hs__members_clear(out);
        return err;
    }
    return 0;
}

int hs__wire_members_decode(const uint8_t *p, size_t n, hs__members *out) {
    rcur c = {p, p + n, "MEMBERS"};
    int err = members_decode(&c, out);
    if (err < 0)
        return err;
    if ((err = rdend(&c)) < 0)
        hs__members_clear(out);
    return err;
}

/* ------------------------------------------------------------------ WELCOME */

int hs__wire_welcome_encode_head(hs_buf *out, const hs__welcome *w) {
    TRY(w32(out, w->id));
    TRY(w64(out, w->round));
    TRY(w64(out, w->join_round));
    TRY(wstr(out, w->topo_spec, HS__SPEC_MAX, "topology"));
    TRY(w64(out, w->topo_seed));
    /* The member list is length-prefixed so that its decoder checks its own end. */
    size_t at = out->len;
    TRY(w32(out, 0));
    TRY(hs__wire_members_encode(out, &w->members));
    put32(out->data + at, (uint32_t)(out->len - at - 4));
    TRY(wblob(out, w->config, w->config_len));
    TRY(w64(out, w->snap_round));
    return w64(out, w->snap_len);
}

int hs__wire_welcome_encode(hs_buf *out, const hs__welcome *w) {
    TRY(hs__wire_welcome_encode_head(out, w));
    return w->snap_len ? hs_buf_append(out, w->snap, w->snap_len) : 0;
}

int hs__wire_welcome_decode(const uint8_t *p, size_t n, hs__welcome *out) {
    rcur c = {p, p + n, "WELCOME"};
    memset(out, 0, sizeof(*out));
    TRY(rd32(&c, &out->id, "id"));
    TRY(rd64(&c, &out->round, "round"));
    TRY(rd64(&c, &out->join_round, "join round"));
    TRY(rdstr(&c, out->topo_spec, HS__SPEC_MAX, "topology"));
    TRY(rd64(&c, &out->topo_seed, "topology seed"));
    const uint8_t *mp = NULL;
    uint32_t mlen = 0;
    TRY(rdblob(&c, &mp, &mlen, HS__CTL_MAX, "member list"));
    rcur mc = {mp, mp + mlen, "WELCOME member list"};
    TRY(members_decode(&mc, &out->members));
    int err;
    if ((err = rdend(&mc)) < 0 ||
        (err = rdblob(&c, &out->config, &out->config_len, HS__FRAME_CAP, "config")) < 0 ||
        (err = rd64(&c, &out->snap_round, "snapshot round")) < 0 ||
        (err = rd64(&c, &out->snap_len, "snapshot")) < 0)
        goto fail;
    /* The snapshot runs to the end: its length must be exactly what is left. */
    if (out->snap_len != left(&c)) {
        err = hs__err(HS_EPROTO, "WELCOME: snapshot of %llu bytes, %zu left",
                      (unsigned long long)out->snap_len, left(&c));
        goto fail;
    }
    out->snap = out->snap_len ? c.p : NULL;
    if (out->join_round != out->members.eff_round) {
        err = hs__err(HS_EPROTO, "WELCOME: join round %llu differs from the member list's %llu",
                      (unsigned long long)out->join_round,
                      (unsigned long long)out->members.eff_round);
        goto fail;
    }
    for (uint32_t i = 0; i < out->members.n; i++)
        if (out->members.m[i].id == out->id)
            return 0;
    err = hs__err(HS_EPROTO, "WELCOME: assigned id %u is not in its member list", out->id);
fail:
    hs__members_clear(&out->members);
    return err;
}

/* ------------------------------------------------------------------ HEARTBEAT */

int hs__wire_heartbeat_encode(hs_buf *out, const hs__heartbeat *h) {
    TRY(w8(out, h->kind));
    TRY(w64(out, h->token));
    TRY(w64(out, h->round));
    TRY(w64(out, h->mver));
    return w32(out, h->missuer);
}

int hs__wire_heartbeat_decode(const uint8_t *p, size_t n, hs__heartbeat *out) {
    rcur c = {p, p + n, "HEARTBEAT"};
    memset(out, 0, sizeof(*out));
    TRY(rd8(&c, &out->kind, "kind"));
    if (out->kind > HS__HB_HOLD)
        return hs__err(HS_EPROTO, "HEARTBEAT: unknown kind %u", out->kind);
    TRY(rd64(&c, &out->token, "token"));
    TRY(rd64(&c, &out->round, "round"));
    TRY(rd64(&c, &out->mver, "membership version"));
    TRY(rd32(&c, &out->missuer, "membership issuer"));
    return rdend(&c);
}

/* ------------------------------------------------------------------ RESEND */

int hs__wire_resend_encode(hs_buf *out, const hs__resend *r) {
    if (r->kind != HS__RS_REQUEST && r->kind != HS__RS_GONE)
        return hs__err(HS_EINVAL, "RESEND: unknown kind %u", r->kind);
    TRY(w8(out, r->kind));
    return w64(out, r->round);
}

int hs__wire_resend_decode(const uint8_t *p, size_t n, hs__resend *out) {
    rcur c = {p, p + n, "RESEND"};
    memset(out, 0, sizeof(*out));
    TRY(rd8(&c, &out->kind, "kind"));
    if (out->kind != HS__RS_REQUEST && out->kind != HS__RS_GONE)
        return hs__err(HS_EPROTO, "RESEND: unknown kind %u", out->kind);
    TRY(rd64(&c, &out->round, "round"));
    /* Rounds are counts of steps: a round at or above 2^63 is no round any peer could reach. */
    if (out->round >> 63)
        return hs__err(HS_EPROTO, "RESEND: round %llu is out of range",
                       (unsigned long long)out->round);
    return rdend(&c);
}

/* ------------------------------------------------------------------ addresses */

int hs__wire_addr_split(const char *addr, char *host, size_t host_cap, int *port) {
    if (!addr || !*addr)
        return hs__err(HS_EINVAL, "empty address (want HOST:PORT)");
    const char *colon;
    const char *h = addr;
    size_t hl;
    if (addr[0] == '[') {
        const char *rb = strchr(addr, ']');
        if (!rb || rb[1] != ':')
            return hs__err(HS_EINVAL, "address '%s': want [IPV6]:PORT", addr);
        h = addr + 1;
        hl = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon)
            return hs__err(HS_EINVAL, "address '%s': no port (want HOST:PORT)", addr);
        hl = (size_t)(colon - addr);
        if (memchr(addr, ':', hl))
            return hs__err(HS_EINVAL, "address '%s': IPv6 hosts go in brackets", addr);
    }
    if (hl == 0 || hl >= host_cap)
        return hs__err(HS_EINVAL, "address '%s': host empty or too long", addr);
    char *e;
    long p = strtol(colon + 1, &e, 10);
    if (!colon[1] || *e || p < 0 || p > 65535)
        return hs__err(HS_EINVAL, "address '%s': port is not a number in 0..65535", addr);
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}
