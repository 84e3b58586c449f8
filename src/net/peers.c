/* The runtime's peers and what it sends them (runtime layer, the bottom of it): a peer is
 * membership's hs__mpeer plus the data path's fields (its queue, link emulation, RESEND store);
 * frames go to a peer's queue or a connection's own; an authenticated connection is attached
 * to its peer here before membership hears of it.
 *
 * Threading: loop thread, except what takes net->mu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "net/runtime.h"

int hs__send_peer(hs_net *net, hs__peer *p, uint8_t type, uint64_t round, hs_buf *payload) {
    hs__frame *f;
    int err = hs__frame_new(&f, net->self, type, round, payload);
    if (err < 0)
        return err;
    if (!hs_net_emulation_none(&p->link.e))
        f->release_us = hs__link_release(&p->link, hs__now_us());
    hs__fq_push(&p->outq, f);
    if (p->m.conn)
        net->tr.ops->pump(p->m.conn);
    return 0;
}

int hs__send_conn(hs__conn *c, uint8_t type, uint64_t round, hs_buf *payload) {
    return c->tr->ops->send(c, type, round, payload);
}

int hs__send_conn_tail(hs__conn *c, uint8_t type, uint64_t round, hs_buf *head, hs_buf *tail) {
    return c->tr->ops->send_tail(c, type, round, head, tail);
}

int hs__send_reason(hs_net *net, hs__peer *p, hs__conn *c, uint8_t type, uint32_t code,
                    const char *text) {
    hs__reason r;
    r.code = code;
    snprintf(r.text, sizeof(r.text), "%s", text);
    hs_buf *b;
    int err = hs_buf_new(&b, 64 + strlen(r.text));
    if (err < 0)
        return err;
    if ((err = hs__wire_reason_encode(b, &r)) == 0)
        err = p ? hs__send_peer(net, p, type, hs__net_round(net), b)
                : hs__send_conn(c, type, hs__net_round(net), b);
    hs_buf_unref(b);
    return err;
}

/* ------------------------------------------------------------------ peers */

hs__peer *hs__peer_find(hs_net *net, uint32_t id) {
    return hs__peer_of(hs__mb_find(&net->mb, id));
}

/* The emulation of the link to p: a per-peer override of the config, else the topology file's
 * spec for this link, else the global one. */
void hs__net_link_init(hs_net *net, hs__peer *p) {
    hs_net_emulation e = net->cfg.emulate;
    int found = 0;
    for (int i = 0; i < net->cfg.n_link_emulate; i++)
        if (net->link_emu[i].to == p->m.id) {
            e = net->link_emu[i].emu;
            found = 1;
        }
    /* In a topology file ranks are peer ids. */
    if (!found && net->topo_file && net->self != HS__ID_NONE &&
        net->self < (uint32_t)hs_topo_n(net->topo_file) &&
        p->m.id < (uint32_t)hs_topo_n(net->topo_file)) {
        const char *spec = hs_topo_link_emulation(net->topo_file, (int)net->self, (int)p->m.id);
        hs_net_emulation f;
        if (spec && hs_net_emulation_parse(spec, &f) == 0)
            e = f;
        else if (spec)
            HS_LOGW("topology %s: link %u -> %u: %s (using the global emulation)", net->s_topo,
                    net->self, p->m.id, hs_error_message());
    }
    hs__link_init(&p->link, &e, net->cfg.seed, net->self, p->m.id);
    uv_mutex_lock(&net->mu);
    p->emu_oneway_ms = e.delay_ms + e.jitter_ms;
    uv_mutex_unlock(&net->mu);
}

hs__peer *hs__peer_get(hs_net *net, uint32_t id, const char *addr) {
    return hs__peer_of(hs__mb_get(&net->mb, id, addr));
}

void hs__net_attach(hs_net *net, hs__conn *c) {
    uv_mutex_lock(&net->mu);
    net->n_open++;
    uv_mutex_unlock(&net->mu);
    hs__peer *p = hs__peer_find(net, c->peer_id);
    if (!p)
        p = hs__peer_get(net, c->peer_id, c->hello.listen);
    if (!p) {
        net->tr.ops->close(c, HS_ENOMEM, 1, HS_LOG_ERROR, "out of memory");
        return;
    }
    if (p->m.dialing == c)
        p->m.dialing = NULL;
    if (p->m.conn && p->m.conn != c) {
        hs__conn *old = p->m.conn;
        p->m.conn = NULL;
        uv_mutex_lock(&net->mu);
        net->n_open--;
        uv_mutex_unlock(&net->mu);
        net->tr.ops->close(old, HS_ECANCELED, 1, HS_LOG_DEBUG, "replaced by a newer connection");
    }
    p->m.conn = c;
    c->peer = p;
    uv_mutex_lock(&net->mu);
    p->rx_open = 1;
    uv_mutex_unlock(&net->mu);
    hs__mb_on_open(&net->mb, &p->m, &c->hello, c->outgoing);
    net->tr.ops->pump(c);
}
