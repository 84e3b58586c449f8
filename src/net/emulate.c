/* Link emulation: the option string parser and per-link delay, pacing and loss. The kernel
 * here has no netem, so the sender shapes its own frames; see emulate.h. Pure. */
#include "net/emulate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error_internal.h"
#include "core/philox.h"

int hs_net_emulation_none(const hs_net_emulation *e) {
    return e->delay_ms == 0 && e->jitter_ms == 0 && e->rate_bps == 0 && e->loss == 0;
}

/* A number followed by a unit from units (factor to the base unit); "" is the default unit. */
typedef struct unit {
    const char *name;
    double factor;
} unit;

static int parse_value(const char *key, const char *v, size_t n, const unit *units, double *out) {
    char tmp[64];
    if (n == 0 || n >= sizeof(tmp))
        return hs__err(HS_EINVAL, "emulation: %s: empty or too long value", key);
    memcpy(tmp, v, n);
    tmp[n] = '\0';
    char *end;
    double x = strtod(tmp, &end);
    if (end == tmp || !isfinite(x) || x < 0)
        return hs__err(HS_EINVAL, "emulation: %s=%s: not a non-negative number", key, tmp);
    for (const unit *u = units; u->name; u++)
        if (!strcasecmp(end, u->name)) {
            double val = x * u->factor;
            if (!isfinite(val))
                return hs__err(HS_EINVAL, "emulation: %s=%s: out of range", key, tmp);
            *out = val == 0 ? 0 : val; /* no negative zero */
            return 0;
        }
    return hs__err(HS_EINVAL, "emulation: %s=%s: unknown unit '%s'", key, tmp, end);
}

int hs_net_emulation_parse(const char *s, hs_net_emulation *out) {
    static const unit time_units[] = {{"", 1}, {"ms", 1}, {"us", 1e-3}, {"s", 1e3}, {NULL, 0}};
    static const unit rate_units[] = {{"", 1},       {"bit", 1}, {"kbit", 1e3}, {"mbit", 1e6},
                                      {"gbit", 1e9}, {"bps", 1}, {"kbps", 1e3}, {"mbps", 1e6},
                                      {"gbps", 1e9}, {NULL, 0}};
    static const unit loss_units[] = {{"", 1}, {"%", 0.01}, {NULL, 0}};
    hs_net_emulation e = {0, 0, 0, 0};
    if (!s)
        s = "";
    if (!strcasecmp(s, "none"))
        s = "";
    const char *p = s;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (!eq)
            return hs__err(HS_EINVAL, "emulation '%s': '%.*s' is not KEY=VALUE", s, (int)len, p);
        size_t kl = (size_t)(eq - p);
        const char *v = eq + 1;
        size_t vl = len - kl - 1;
        int err;
        if (kl == 5 && !strncmp(p, "delay", 5))
            err = parse_value("delay", v, vl, time_units, &e.delay_ms);
        else if (kl == 6 && !strncmp(p, "jitter", 6))
            err = parse_value("jitter", v, vl, time_units, &e.jitter_ms);
        else if (kl == 4 && !strncmp(p, "rate", 4))
            err = parse_value("rate", v, vl, rate_units, &e.rate_bps);
        else if (kl == 4 && !strncmp(p, "loss", 4))
            err = parse_value("loss", v, vl, loss_units, &e.loss);
        else
            return hs__err(HS_EINVAL,
                           "emulation '%s': unknown key '%.*s' (delay, jitter, rate, loss)", s,
                           (int)kl, p);
        if (err < 0)
            return err;
        p += len;
        if (*p == ',') {
            p++;
            if (!*p)
                return hs__err(HS_EINVAL, "emulation '%s': trailing comma", s);
        }
    }
    if (e.loss > 1)
        return hs__err(HS_EINVAL, "emulation '%s': loss %g is over 1", s, e.loss);
    if (e.delay_ms > 3.6e6 || e.jitter_ms > 3.6e6)
        return hs__err(HS_EINVAL, "emulation '%s': delay or jitter over an hour", s);
    if (e.rate_bps != 0 && e.rate_bps < 1000)
        return hs__err(HS_EINVAL, "emulation '%s': rate under 1 kbit/s", s);
    *out = e;
    return 0;
}

int hs_net_emulation_format(const hs_net_emulation *e, char *buf, size_t cap) {
    int n;
    if (hs_net_emulation_none(e))
        n = snprintf(buf, cap, "none");
    else
        n = snprintf(buf, cap, "delay=%.17gms,jitter=%.17gms,rate=%.17gbit,loss=%.17g", e->delay_ms,
                     e->jitter_ms, e->rate_bps, e->loss);
    if (n < 0 || (size_t)n >= cap)
        return hs__err(HS_ERANGE, "emulation string over %zu bytes", cap);
    return n;
}

void hs__link_init(hs__link *l, const hs_net_emulation *e, uint64_t seed, uint32_t self,
                   uint32_t peer) {
    memset(l, 0, sizeof(*l));
    l->e = *e;
    hs__rng_init(&l->rng, seed, HS_RNG_NET, self, peer);
}

int hs__link_lose(hs__link *l) {
    if (l->e.loss <= 0)
        return 0;
    return hs__rng_double(&l->rng) < l->e.loss;
}

uint64_t hs__link_release(hs__link *l, uint64_t now_us) {
    double d = l->e.delay_ms * 1e3;
    if (l->e.jitter_ms > 0)
        d += (2 * hs__rng_double(&l->rng) - 1) * l->e.jitter_ms * 1e3;
    uint64_t t = now_us + (d > 0 ? (uint64_t)d : 0);
    if (t < l->last_release_us)
        t = l->last_release_us;
    l->last_release_us = t;
    return t;
}

uint64_t hs__link_pace(hs__link *l, uint64_t now_us, size_t bytes) {
    if (l->e.rate_bps <= 0)
        return now_us;
    uint64_t start = l->paced_until_us > now_us ? l->paced_until_us : now_us;
    l->paced_until_us = start + (uint64_t)((double)bytes * 8e6 / l->e.rate_bps);
    return start;
}
