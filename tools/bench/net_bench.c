/* net_bench: throughput and round-trip time of the peer runtime next to references, on
 * loopback, each measured in this one process with a sender and a receiver thread.
 *
 *   net_bench stream raw|tls|framed|framed-tls SIZE COUNT   one-way frames of SIZE bytes
 *   net_bench ping raw|framed|framed-tls COUNT               small-message round trips
 *
 * raw: blocking TCP sockets, write/read loops. tls: OpenSSL TLS 1.3 on blocking sockets,
 * SSL_write/SSL_read, TLS_AES_128_GCM_SHA256 with an external PSK (the runtime's cipher and
 * key exchange). framed: two hs_net peers (plain or TLS) exchanging DATA frames through
 * hs_exchange send/recv; ping: the raw reference bounces a 53-byte message (a HEARTBEAT
 * frame's size), the runtime measures HEARTBEAT ping/pong between the loop threads.
 * Prints one JSON line. Not a test: tools/bench/net runs it and records the numbers. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hearsay/error.h"
#include "hearsay/exchange.h"
#include "hearsay/net.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds used by the whole process (both threads, and the runtime's loop threads). */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static double g_cpu; /* CPU seconds of the last measured section */

static void die(const char *what) {
    fprintf(stderr, "net_bench: %s\n", what);
    exit(1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------ sockets */

static int listen_any(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 4) < 0)
        die("listen");
    socklen_t len = sizeof(a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
        die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0)
            die("write");
        p += w;
        n -= (size_t)w;
    }
}

static void read_all(int fd, uint8_t *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r <= 0)
            die("read");
        p += r;
        n -= (size_t)r;
    }
}

/* ------------------------------------------------------------------ TLS reference */

static const unsigned char psk_key[32] = "hearsay benchmark psk, 32 bytes";
static const char psk_id[] = "bench";

static SSL_SESSION *psk_session(SSL *ssl) {
    static const unsigned char aes128[] = {0x13, 0x01};
    SSL_SESSION *s = SSL_SESSION_new();
    SSL_SESSION_set1_master_key(s, psk_key, sizeof(psk_key));
    SSL_SESSION_set_cipher(s, SSL_CIPHER_find(ssl, aes128));
    SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION);
    return s;
}

static int use_cb(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                  SSL_SESSION **sess) {
    (void)md;
    *id = (const unsigned char *)psk_id;
    *idlen = strlen(psk_id);
    *sess = psk_session(ssl);
    return 1;
}

static int find_cb(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess) {
    *sess = idlen == strlen(psk_id) && !memcmp(id, psk_id, idlen) ? psk_session(ssl) : NULL;
    return 1;
}

static SSL *tls_wrap(int fd, int server) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_ciphersuites(ctx, "TLS_AES_128_GCM_SHA256");
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_psk_use_session_callback(ctx, use_cb);
    SSL_CTX_set_psk_find_session_callback(ctx, find_cb);
    SSL *ssl = SSL_new(ctx);
    SSL_CTX_free(ctx); /* the SSL keeps its reference */
    SSL_set_fd(ssl, fd);
    if ((server ? SSL_accept(ssl) : SSL_connect(ssl)) != 1)
        die("TLS handshake");
    return ssl;
}

/* ------------------------------------------------------------------ raw / tls streams */

typedef struct stream_arg {
    int port, tls;
    size_t size, count;
    double t_end;
    int ready;
} stream_arg;

static void *stream_receiver(void *arg) {
    stream_arg *a = arg;
    int lfd = listen_any(&a->port);
    __atomic_store_n(&a->ready, 1, __ATOMIC_RELEASE); /* the port is set */
    int fd = accept(lfd, NULL, NULL);
    SSL *ssl = a->tls ? tls_wrap(fd, 1) : NULL;
    uint8_t *buf = malloc(a->size);
    for (size_t i = 0; i < a->count; i++) {
        if (ssl) {
            size_t got = 0;
            while (got < a->size) {
                size_t r = 0;
                if (SSL_read_ex(ssl, buf + got, a->size - got, &r) != 1)
                    die("SSL_read");
                got += r;
            }
        } else {
            read_all(fd, buf, a->size);
        }
    }
    a->t_end = now_s();
    uint8_t ack = 1;
    write_all(fd, &ack, 1);
    free(buf);
    if (ssl)
        SSL_free(ssl);
    close(fd);
    close(lfd);
    return NULL;
}

static double stream_ref(int tls, size_t size, size_t count) {
    stream_arg a = {0, tls, size, count, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, stream_receiver, &a);
    while (!__atomic_load_n(&a.ready, __ATOMIC_ACQUIRE))
        usleep(100);
    int fd = dial(a.port);
    SSL *ssl = tls ? tls_wrap(fd, 0) : NULL;
    uint8_t *buf = malloc(size);
    memset(buf, 7, size);
    double t0 = now_s(), c0 = cpu_s();
    for (size_t i = 0; i < count; i++) {
        if (ssl) {
            size_t w = 0;
            if (SSL_write_ex(ssl, buf, size, &w) != 1 || w != size)
                die("SSL_write");
        } else {
            write_all(fd, buf, size);
        }
    }
    uint8_t ack;
    read_all(fd, &ack, 1);
    pthread_join(th, NULL);
    double dt = a.t_end - t0;
    g_cpu = cpu_s() - c0;
    free(buf);
    if (ssl)
        SSL_free(ssl);
    close(fd);
    return (double)size * (double)count / dt;
}

/* ------------------------------------------------------------------ the runtime */

static char secret_path[64];

static void pair(hs_net **a, hs_net **b, int tls, size_t max_frame) {
    hs_net_config c;
    hs_net_config_init(&c);
    c.security = tls ? HS_NET_SECRET : HS_NET_INSECURE;
    c.secret_file = secret_path;
    c.max_frame = max_frame;
    c.max_buffered = 8 * max_frame + (1u << 20);
    c.peer_timeout_ms = 10000;
    c.topo_spec = "ring";
    if (hs_net_start(a, &c, NULL) < 0)
        die(hs_error_message());
    char boot[64];
    snprintf(boot, sizeof(boot), "127.0.0.1:%d", hs_net_listen_port(*a));
    c.bootstrap = boot;
    hs_net_welcome w;
    if (hs_net_start(b, &c, &w) < 0)
        die(hs_error_message());
    hs_net_welcome_clear(&w);
    if (hs_net_wait_members(*a, 2, 5000) < 0 || hs_net_wait_members(*b, 2, 5000) < 0)
        die("members");
}

typedef struct framed_arg {
    hs_net *net;
    size_t size, count;
    double t_end;
} framed_arg;

static void *framed_receiver(void *arg) {
    framed_arg *a = arg;
    hs_exchange *ex = hs_net_exchange(a->net);
    for (size_t i = 1; i <= a->count; i++) {
        hs_buf *in;
        if (ex->ops->recv(ex, 0, i, 30000, &in) < 0)
            die(hs_error_message());
        if (in->len != a->size)
            die("size");
        hs_buf_unref(in);
    }
    a->t_end = now_s();
    return NULL;
}

static double stream_framed(int tls, size_t size, size_t count) {
    hs_net *a, *b;
    pair(&a, &b, tls, size);
    framed_arg fa = {b, size, count, 0};
    pthread_t th;
    pthread_create(&th, NULL, framed_receiver, &fa);
    hs_exchange *ex = hs_net_exchange(a);
    hs_buf *buf;
    hs_buf_new(&buf, size);
    buf->len = size;
    memset(buf->data, 7, size);
    double t0 = now_s(), c0 = cpu_s();
    for (size_t i = 1; i <= count; i++) {
        int err;
        while ((err = ex->ops->send(ex, 1, i, buf)) == HS_EAGAIN)
            usleep(1000); /* the queue holds 8 frames: no need to spin */
        if (err < 0)
            die(hs_error_message());
    }
    pthread_join(th, NULL);
    double dt = fa.t_end - t0;
    g_cpu = cpu_s() - c0;
    hs_buf_unref(buf);
    hs_net_free(b);
    hs_net_free(a);
    return (double)size * (double)count / dt;
}

/* ------------------------------------------------------------------ ping-pong */

#define PING_BYTES 53 /* a HEARTBEAT frame: 24-byte header + 29-byte body */

typedef struct ping_arg {
    int port;
    size_t count;
    volatile int ready;
} ping_arg;

static void *ping_echo(void *arg) {
    ping_arg *a = arg;
    int lfd = listen_any(&a->port);
    a->ready = 1;
    int fd = accept(lfd, NULL, NULL), one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint8_t m[PING_BYTES];
    for (size_t i = 0; i < a->count; i++) {
        read_all(fd, m, sizeof(m));
        write_all(fd, m, sizeof(m));
    }
    close(fd);
    close(lfd);
    return NULL;
}

static double ping_raw(size_t count, double *min) {
    ping_arg a = {0, count, 0};
    pthread_t th;
    pthread_create(&th, NULL, ping_echo, &a);
    while (!a.ready)
        usleep(100);
    int fd = dial(a.port);
    uint8_t m[PING_BYTES] = {0};
    double *rtt = malloc(count * sizeof(double));
    for (size_t i = 0; i < count; i++) {
        double t = now_s();
        write_all(fd, m, sizeof(m));
        read_all(fd, m, sizeof(m));
        rtt[i] = (now_s() - t) * 1e6;
    }
    pthread_join(th, NULL);
    close(fd);
    qsort(rtt, count, sizeof(double), cmp_double);
    double med = rtt[count / 2];
    *min = rtt[0];
    free(rtt);
    return med;
}

static double ping_framed(int tls, size_t count, double *min) {
    hs_net *a, *b;
    pair(&a, &b, tls, 1 << 20);
    double *rtt = malloc(count * sizeof(double));
    for (size_t i = 0; i < count; i++)
        if (hs_net_ping(a, 1, 5000, &rtt[i]) < 0)
            die(hs_error_message());
    hs_net_free(b);
    hs_net_free(a);
    qsort(rtt, count, sizeof(double), cmp_double);
    double med = rtt[count / 2];
    *min = rtt[0];
    free(rtt);
    return med;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: net_bench stream raw|tls|framed|framed-tls SIZE COUNT\n"
                        "       net_bench ping raw|framed|framed-tls COUNT\n");
        return 2;
    }
    strcpy(secret_path, "/tmp/hs-bench-secret-XXXXXX");
    int fd = mkstemp(secret_path);
    if (fd < 0 || write(fd, psk_key, sizeof(psk_key)) != (ssize_t)sizeof(psk_key))
        die("secret");
    close(fd);
    const char *kind = argv[2];
    int rc = 0;
    if (!strcmp(argv[1], "stream") && argc >= 5) {
        size_t size = strtoull(argv[3], NULL, 10), count = strtoull(argv[4], NULL, 10);
        double bps;
        if (!strcmp(kind, "raw"))
            bps = stream_ref(0, size, count);
        else if (!strcmp(kind, "tls"))
            bps = stream_ref(1, size, count);
        else if (!strcmp(kind, "framed"))
            bps = stream_framed(0, size, count);
        else if (!strcmp(kind, "framed-tls"))
            bps = stream_framed(1, size, count);
        else
            die("unknown stream kind");
        printf("{\"bench\":\"stream\",\"kind\":\"%s\",\"size\":%zu,\"count\":%zu,\"GBps\":%.4f,"
               "\"cpu_ns_per_byte\":%.4f}\n",
               kind, size, count, bps / 1e9, g_cpu * 1e9 / ((double)size * (double)count));
    } else if (!strcmp(argv[1], "ping")) {
        size_t count = strtoull(argv[3], NULL, 10);
        double min, med;
        if (!strcmp(kind, "raw"))
            med = ping_raw(count, &min);
        else if (!strcmp(kind, "framed"))
            med = ping_framed(0, count, &min);
        else if (!strcmp(kind, "framed-tls"))
            med = ping_framed(1, count, &min);
        else
            die("unknown ping kind");
        printf("{\"bench\":\"ping\",\"kind\":\"%s\",\"count\":%zu,\"rtt_us_median\":%.2f,"
               "\"rtt_us_min\":%.2f}\n",
               kind, count, med, min);
    } else {
        rc = 2;
    }
    unlink(secret_path);
    return rc;
}
