/* Hints for failed TLS handshakes (see tls_hint.h). The pairs that meet: a secret against a
 * certificate peer and back, a wrong secret, TLS against plain TCP, certificates of two CAs. */
#include "net/tls_hint.h"

#include <string.h>

const char *hs__tls_hint(hs_net_security mode, int server, const char *err, const char *alert,
                         int verify_failed) {
    int received = strstr(alert, "received") != NULL;
    if (strstr(err, "wrong version number") || strstr(err, "http request") ||
        strstr(err, "packet length too long") || strstr(err, "record layer failure"))
        return " (the other side does not speak TLS: started with --insecure?)";
    if (mode == HS_NET_SECRET) {
        /* A server that finds no pre-shared key in the ClientHello looks for a certificate of
         * its own to use instead, and has none. */
        if (server &&
            (strstr(err, "no suitable signature algorithm") || strstr(err, "no shared cipher")))
            return " (no secret offered: the other side uses certificates (--ca --cert --key) "
                   "or no credentials; this peer a secret (--secret-file))";
        if (!server && (strcasestr(err, "certificate required") ||
                        strcasestr(alert, "certificate required")))
            return " (the other side uses certificates (--ca --cert --key); this peer a secret "
                   "(--secret-file))";
        return HS__TLS_HINT_WRONG_SECRET;
    }
    if (strstr(err, "peer did not return a certificate") ||
        strcasestr(alert, "certificate required"))
        return " (no client certificate?)";
    if (verify_failed)
        return " (certificate from another CA?)";
    if (received && (strcasestr(alert, "unknown ca") || strcasestr(alert, "certificate")))
        return " (the peer rejected this peer's certificate: from another CA?)";
    /* A server with a secret and no certificate cannot answer a ClientHello without a key. */
    if (!server && received && strcasestr(alert, "handshake failure"))
        return " (the other side uses a secret (--secret-file)? this peer uses certificates)";
    return "";
}
