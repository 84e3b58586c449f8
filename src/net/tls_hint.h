/* The likely cause of a failed TLS handshake, in words a user can act on: which side runs
 * which security mode, a wrong secret, a certificate from another CA. Pure string rules over
 * OpenSSL's error and alert texts, apart from tls.c so that the rules stay readable. */
#ifndef HS_NET_TLS_HINT_H
#define HS_NET_TLS_HINT_H

#include "hearsay/net.h"

/* The hint of a refusal for a wrong secret (a key under this run's identity that differs). */
#define HS__TLS_HINT_WRONG_SECRET " (wrong secret?)"

/* mode: this peer's; server: 1 on the accepting side; err: OpenSSL's first error text; alert:
 * "sent alert '...'" or "received alert '...'" or ""; verify_failed: the other side's
 * certificate did not verify. Returns " (hint)" or "" (static text). */
const char *hs__tls_hint(hs_net_security mode, int server, const char *err, const char *alert,
                         int verify_failed);

#endif
