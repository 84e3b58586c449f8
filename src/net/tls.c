/* TLS 1.3 sessions over memory BIOs (see tls.h). The only file of the runtime that calls
 * OpenSSL. Threading: a context is built once and then only read (OpenSSL locks SSL_CTX
 * internally); a session belongs to the loop thread. */
#include "net/tls.h"
#include "net/tls_hint.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error_internal.h"
#include "core/log.h"

#define PSK_IDENTITY "hearsay-psk-v1"
#define PSK_LEN 32
#define SECRET_MIN 16
#define SECRET_MAX 65536
#define PAIR_BUF (512 * 1024) /* each direction; holds at least one chunk of writes */
/* Both SHA-256 suites, so one external PSK (whose hash is SHA-256) fits either. AES-128-GCM is
 * first: it is what the CPUs here accelerate and what the benchmark compares against. */
#define CIPHERS "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256"

struct hs__tls_ctx {
    SSL_CTX *ctx;
    hs_net_security mode;
    uint8_t psk[PSK_LEN];
};

struct hs__tls {
    SSL *ssl;
    BIO *ssl_end; /* the pair's end the SSL uses (owned by ssl) */
    BIO *net_end; /* the end the connection reads ciphertext from and writes it to (owned) */
    hs__tls_ctx *ctx;
    int server;
    char alert[128]; /* the last alert sent or received, for messages */
};

static int ex_index = -1;

/* The first queued OpenSSL error as text, and the queue cleared. */
static const char *ssl_errstr(char *buf, size_t cap) {
    unsigned long e = ERR_get_error();
    if (!e) {
        snprintf(buf, cap, "no OpenSSL error detail");
    } else {
        ERR_error_string_n(e, buf, cap);
    }
    ERR_clear_error();
    return buf;
}

/* ------------------------------------------------------------------ PSK */

static SSL_SESSION *psk_session(SSL *ssl, const hs__tls_ctx *c) {
    static const unsigned char aes128gcm_sha256[] = {0x13, 0x01};
    const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, aes128gcm_sha256);
    SSL_SESSION *s = cipher ? SSL_SESSION_new() : NULL;
    if (!s)
        return NULL;
    if (!SSL_SESSION_set1_master_key(s, c->psk, PSK_LEN) || !SSL_SESSION_set_cipher(s, cipher) ||
        !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
        SSL_SESSION_free(s);
        return NULL;
    }
    return s;
}

static int psk_use_cb(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                      SSL_SESSION **sess) {
    hs__tls *t = SSL_get_ex_data(ssl, ex_index);
    SSL_SESSION *s = psk_session(ssl, t->ctx);
    if (!s)
        return 0;
    /* After a HelloRetryRequest md is the negotiated hash: offer the PSK only if it fits. */
    if (md && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) {
        SSL_SESSION_free(s);
        *sess = NULL;
        return 1;
    }
    *id = (const unsigned char *)PSK_IDENTITY;
    *idlen = strlen(PSK_IDENTITY);
    *sess = s;
    return 1;
}

static int psk_find_cb(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess) {
    hs__tls *t = SSL_get_ex_data(ssl, ex_index);
    *sess = NULL;
    if (idlen != strlen(PSK_IDENTITY) || memcmp(id, PSK_IDENTITY, idlen))
        return 1;
    if (!(*sess = psk_session(ssl, t->ctx)))
        return 0;
    return 1;
}

/* PSK = HKDF-SHA256(secret file bytes, salt, info): the file may be any bytes (a password, a
 * random key); HKDF turns it into a uniform key, and the label keeps this key apart from any
 * other use of the same file. */
static int derive_psk(const char *path, uint8_t psk[PSK_LEN]) {
    static const char salt[] = "hearsay secret-file v1";
    static const char info[] = "hearsay tls13 external psk";
    struct stat st;
    FILE *f = fopen(path, "rb");
    if (!f)
        return hs__err(HS_EINVAL, "secret file %s: cannot open", path);
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        HS_LOGW("secret file %s is readable by other users (chmod 600 it)", path);
    uint8_t *buf = malloc(SECRET_MAX + 1);
    size_t n = buf ? fread(buf, 1, SECRET_MAX + 1, f) : 0;
    fclose(f);
    int err = 0;
    if (!buf)
        return hs__err(HS_ENOMEM, "secret file %s: out of memory", path);
    if (n < SECRET_MIN || n > SECRET_MAX) {
        err = hs__err(HS_EINVAL, "secret file %s: %zu bytes, want %d to %d", path, n, SECRET_MIN,
                      SECRET_MAX);
        goto out;
    }
    EVP_PKEY_CTX *k = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    size_t outlen = PSK_LEN;
    if (!k || EVP_PKEY_derive_init(k) <= 0 || EVP_PKEY_CTX_set_hkdf_md(k, EVP_sha256()) <= 0 ||
        EVP_PKEY_CTX_set1_hkdf_salt(k, (const unsigned char *)salt, (int)strlen(salt)) <= 0 ||
        EVP_PKEY_CTX_set1_hkdf_key(k, buf, (int)n) <= 0 ||
        EVP_PKEY_CTX_add1_hkdf_info(k, (const unsigned char *)info, (int)strlen(info)) <= 0 ||
        EVP_PKEY_derive(k, psk, &outlen) <= 0 || outlen != PSK_LEN) {
        char e[256];
        err = hs__err(HS_ETLS, "secret file %s: key derivation failed: %s", path,
                      ssl_errstr(e, sizeof(e)));
    }
    EVP_PKEY_CTX_free(k);
out:
    OPENSSL_cleanse(buf, SECRET_MAX + 1);
    free(buf);
    return err;
}

/* ------------------------------------------------------------------ context */

static void info_cb(const SSL *ssl, int where, int ret) {
    if (!(where & SSL_CB_ALERT))
        return;
    hs__tls *t = SSL_get_ex_data(ssl, ex_index);
    if (!t)
        return;
    snprintf(t->alert, sizeof(t->alert), "%s alert '%s'",
             (where & SSL_CB_READ) ? "received" : "sent", SSL_alert_desc_string_long(ret));
}

int hs__tls_ctx_new(hs__tls_ctx **out, const hs_net_config *cfg) {
    char e[256];
    int err;
    hs__tls_ctx *c = calloc(1, sizeof(*c));
    if (!c)
        return hs__err(HS_ENOMEM, "TLS context: out of memory");
    c->mode = cfg->security;
    if (ex_index < 0)
        ex_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
    if (!(c->ctx = SSL_CTX_new(TLS_method()))) {
        err = hs__err(HS_ETLS, "TLS context: %s", ssl_errstr(e, sizeof(e)));
        goto fail;
    }
    SSL_CTX_set_min_proto_version(c->ctx, TLS1_3_VERSION);
    SSL_CTX_set_max_proto_version(c->ctx, TLS1_3_VERSION);
    SSL_CTX_set_num_tickets(c->ctx, 0); /* no resumption: every connection authenticates */
    SSL_CTX_set_session_cache_mode(c->ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_info_callback(c->ctx, info_cb);
    if (!SSL_CTX_set_ciphersuites(c->ctx, CIPHERS)) {
        err = hs__err(HS_ETLS, "TLS ciphersuites: %s", ssl_errstr(e, sizeof(e)));
        goto fail;
    }
    if (cfg->security == HS_NET_SECRET) {
        if (!cfg->secret_file) {
            err = hs__err(HS_EINVAL, "TLS with a shared secret needs --secret-file");
            goto fail;
        }
        if ((err = derive_psk(cfg->secret_file, c->psk)) < 0)
            goto fail;
        SSL_CTX_set_psk_use_session_callback(c->ctx, psk_use_cb);
        SSL_CTX_set_psk_find_session_callback(c->ctx, psk_find_cb);
        /* The PSK authenticates both sides; there is no certificate to check. */
        SSL_CTX_set_verify(c->ctx, SSL_VERIFY_NONE, NULL);
    } else if (cfg->security == HS_NET_CERT) {
        if (!cfg->ca_file || !cfg->cert_file || !cfg->key_file) {
            err = hs__err(HS_EINVAL, "TLS with certificates needs --ca, --cert and --key");
            goto fail;
        }
        if (SSL_CTX_use_certificate_chain_file(c->ctx, cfg->cert_file) != 1) {
            err = hs__err(HS_ETLS, "certificate %s: %s", cfg->cert_file, ssl_errstr(e, sizeof(e)));
            goto fail;
        }
        if (SSL_CTX_use_PrivateKey_file(c->ctx, cfg->key_file, SSL_FILETYPE_PEM) != 1) {
            err = hs__err(HS_ETLS, "key %s: %s", cfg->key_file, ssl_errstr(e, sizeof(e)));
            goto fail;
        }
        if (SSL_CTX_check_private_key(c->ctx) != 1) {
            err = hs__err(HS_ETLS, "key %s does not match certificate %s", cfg->key_file,
                          cfg->cert_file);
            goto fail;
        }
        if (SSL_CTX_load_verify_locations(c->ctx, cfg->ca_file, NULL) != 1) {
            err = hs__err(HS_ETLS, "CA %s: %s", cfg->ca_file, ssl_errstr(e, sizeof(e)));
            goto fail;
        }
        /* Mutual: the server requires and checks a client certificate. Any certificate the
         * run's CA signed is a member's: the CA defines the run (no host names: peers are
         * dialed by address). */
        SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    } else {
        err = hs__err(HS_EINVAL, "TLS context requested for security mode %d", cfg->security);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    hs__tls_ctx_free(c);
    return err;
}

void hs__tls_ctx_free(hs__tls_ctx *c) {
    if (!c)
        return;
    SSL_CTX_free(c->ctx);
    OPENSSL_cleanse(c->psk, sizeof(c->psk));
    free(c);
}

/* ------------------------------------------------------------------ sessions */

int hs__tls_new(hs__tls **out, hs__tls_ctx *ctx, int server) {
    char e[256];
    hs__tls *t = calloc(1, sizeof(*t));
    if (!t)
        return hs__err(HS_ENOMEM, "TLS session: out of memory");
    t->ctx = ctx;
    t->server = server;
    /* A BIO pair, not memory BIOs: two fixed ring buffers, so the socket reads straight into
     * the incoming ring and writes straight from the outgoing one (memory BIOs zero-fill and
     * copy on every write). */
    if (!(t->ssl = SSL_new(ctx->ctx)) ||
        BIO_new_bio_pair(&t->ssl_end, PAIR_BUF, &t->net_end, PAIR_BUF) != 1) {
        SSL_free(t->ssl);
        free(t);
        return hs__err(HS_ETLS, "TLS session: %s", ssl_errstr(e, sizeof(e)));
    }
    SSL_set_bio(t->ssl, t->ssl_end, t->ssl_end);
    SSL_set_ex_data(t->ssl, ex_index, t);
    if (server)
        SSL_set_accept_state(t->ssl);
    else
        SSL_set_connect_state(t->ssl);
    *out = t;
    return 0;
}

void hs__tls_free(hs__tls *t) {
    if (!t)
        return;
    SSL_free(t->ssl);
    BIO_free(t->net_end);
    free(t);
}

int hs__tls_feed(hs__tls *t, const void *p, size_t n) {
    while (n) {
        int chunk = n > (1u << 30) ? (1 << 30) : (int)n;
        int w = BIO_write(t->net_end, p, chunk);
        if (w <= 0)
            return hs__err(HS_ETLS, "TLS: %zu bytes of input do not fit the session's buffer", n);
        p = (const uint8_t *)p + w;
        n -= (size_t)w;
    }
    return 0;
}

size_t hs__tls_in_space(hs__tls *t, uint8_t **p) {
    char *b = NULL;
    ossl_ssize_t n = BIO_nwrite0(t->net_end, &b);
    if (n <= 0)
        return 0;
    *p = (uint8_t *)b;
    return (size_t)n;
}

void hs__tls_in_commit(hs__tls *t, size_t n) {
    char *b;
    BIO_nwrite(t->net_end, &b, (int)n);
}

size_t hs__tls_out_peek(hs__tls *t, const uint8_t **p) {
    char *b = NULL;
    ossl_ssize_t n = BIO_nread0(t->net_end, &b);
    if (n <= 0)
        return 0;
    *p = (const uint8_t *)b;
    return (size_t)n;
}

void hs__tls_out_consume(hs__tls *t, size_t n) {
    char *b;
    BIO_nread(t->net_end, &b, (int)n);
}

/* Why a handshake failed, in words a user can act on. */
static int handshake_error(hs__tls *t, int code) {
    char e[256];
    ssl_errstr(e, sizeof(e));
    long v = SSL_get_verify_result(t->ssl);
    const char *hint = hs__tls_hint(t->ctx->mode, t->server, e, t->alert, v != X509_V_OK);
    if (v != X509_V_OK && t->ctx->mode != HS_NET_SECRET)
        snprintf(e + strlen(e), sizeof(e) - strlen(e), ": %s", X509_verify_cert_error_string(v));
    return hs__err(code, "TLS handshake failed: %s%s%s%s", e, t->alert[0] ? "; " : "", t->alert,
                   hint);
}

int hs__tls_handshake(hs__tls *t) {
    ERR_clear_error();
    int r = SSL_do_handshake(t->ssl);
    if (r == 1)
        return 1;
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    return handshake_error(t, HS_EAUTH);
}

int hs__tls_read(hs__tls *t, void *p, size_t n) {
    size_t got = 0;
    ERR_clear_error();
    if (n > (1u << 30))
        n = 1u << 30;
    int r = SSL_read_ex(t->ssl, p, n, &got);
    if (r == 1)
        return (int)got;
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    if (e == SSL_ERROR_ZERO_RETURN)
        return hs__err(HS_ECONNRESET, "TLS: peer closed the session");
    /* In TLS 1.3 the client's handshake ends before the server has checked its certificate:
     * a refusal arrives here, as an alert on the first read. */
    if (!t->server && t->alert[0])
        return handshake_error(t, HS_EAUTH);
    char es[256];
    return hs__err(HS_ETLS, "TLS: %s%s%s", ssl_errstr(es, sizeof(es)), t->alert[0] ? "; " : "",
                   t->alert);
}

int hs__tls_write(hs__tls *t, const void *p, size_t n) {
    size_t done = 0;
    if (n > HS__TLS_WRITE_MAX)
        return hs__err(HS_EINVAL, "TLS write of %zu bytes: over %u per call", n, HS__TLS_WRITE_MAX);
    ERR_clear_error();
    if (n && (SSL_write_ex(t->ssl, p, n, &done) != 1 || done != n)) {
        char es[256];
        return hs__err(HS_ETLS, "TLS write: %s", ssl_errstr(es, sizeof(es)));
    }
    return 0;
}

const char *hs__tls_describe(hs__tls *t, char *buf, size_t cap) {
    snprintf(buf, cap, "%s %s", SSL_get_version(t->ssl), SSL_get_cipher_name(t->ssl));
    return buf;
}
