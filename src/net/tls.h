/* TLS 1.3 over memory BIOs: the only OpenSSL code of the runtime. The connection layer feeds
 * ciphertext it read from the socket, drives the handshake, takes plaintext out, puts
 * plaintext in and takes ciphertext to write; no socket is ever touched here, so nothing
 * blocks. Two credential modes: an external PSK derived from the run's secret file by HKDF, or
 * certificates with mutual authentication. Single-threaded per object (the loop thread); a
 * context is read-only after creation. */
#ifndef HS_NET_TLS_H
#define HS_NET_TLS_H

#include <stddef.h>

#include "hearsay/net.h"

/* Plaintext per hs__tls_write call: its ciphertext fits the outgoing ring with room to spare. */
#define HS__TLS_WRITE_MAX (128u * 1024)

typedef struct hs__tls_ctx hs__tls_ctx;
typedef struct hs__tls hs__tls;

/* Loads the credentials of cfg->security (secret file, or CA + certificate + key). HS_ETLS or
 * HS_EINVAL with a message naming the file and what is wrong with it. */
int hs__tls_ctx_new(hs__tls_ctx **out, const hs_net_config *cfg);
void hs__tls_ctx_free(hs__tls_ctx *c);

/* A session for one connection; server = 1 on the accepting side. */
int hs__tls_new(hs__tls **out, hs__tls_ctx *ctx, int server);
void hs__tls_free(hs__tls *t);

/* Hands n bytes of ciphertext read from the socket to the session (copied). HS_ETLS when they do
 * not fit (the caller decrypts everything after each read, so they always do). */
int hs__tls_feed(hs__tls *t, const void *p, size_t n);

/* Zero-copy input: where the socket may write ciphertext (contiguous space, possibly 0), and
 * how much it wrote there. */
size_t hs__tls_in_space(hs__tls *t, uint8_t **p);
void hs__tls_in_commit(hs__tls *t, size_t n);

/* Advances the handshake: 1 done, 0 needs more input, or HS_ETLS/HS_EAUTH with a message that
 * says what failed and the likely cause ("wrong secret?"). */
int hs__tls_handshake(hs__tls *t);

/* Decrypts up to n bytes: > 0 bytes, 0 when more input is needed, HS_ECONNRESET when the peer
 * closed the session, HS_ETLS on error (message set; alerts from a refusing server land here
 * in TLS 1.3, whose client finishes its handshake first). */
int hs__tls_read(hs__tls *t, void *p, size_t n);

/* Encrypts n bytes into the outgoing ciphertext; n must fit the outgoing buffer (at most
 * HS__TLS_WRITE_MAX per call, drained in between). HS_ETLS. */
int hs__tls_write(hs__tls *t, const void *p, size_t n);

/* Outgoing ciphertext: the first contiguous piece waiting (0: none), and releasing n bytes of
 * it once written or copied elsewhere. Pieces come in stream order. */
size_t hs__tls_out_peek(hs__tls *t, const uint8_t **p);
void hs__tls_out_consume(hs__tls *t, size_t n);

/* Protocol and cipher after the handshake, e.g. "TLSv1.3 TLS_AES_128_GCM_SHA256". */
const char *hs__tls_describe(hs__tls *t, char *buf, size_t cap);

#endif
