/* Link profiles (JSON, docs/WAN.md): per-peer uplink/downlink rates and compute slowdown,
 * per-pair one-way delay, jitter and loss, and per-link rate buckets (one per pair, or one
 * shared by every pair between two clusters). The WAN emulator (tools/wan) reads them;
 * everything is resolved here so a reader only indexes arrays. Not thread-safe; read-only
 * once loaded. */
#ifndef HS_WAN_PROFILE_H
#define HS_WAN_PROFILE_H

#include <stdint.h>

/* Peers get 10.77.0.1 .. 10.77.0.n inside their namespaces; .255 is broadcast. */
#define HS_WAN_MAX_PEERS 250

typedef struct hs__wan_pair {
    double delay_s;  /* one-way propagation delay */
    double jitter_s; /* each packet's delay is uniform in delay +- jitter (never reordered) */
    double loss;     /* probability a packet is dropped, in [0, 1) */
    int bucket;      /* index into bucket_bps of this pair's own rate limit; -1: none */
} hs__wan_pair;

typedef struct hs__wan_profile {
    char name[64];
    int n;              /* peers */
    int mtu;            /* of every peer's interface */
    uint64_t seed;      /* of the loss and jitter draws */
    double queue_s;     /* a rate queue drops what would wait longer than this */
    double *up_bps;     /* [n] uplink rate in bit/s; 0: unlimited */
    double *down_bps;   /* [n] downlink rate in bit/s; 0: unlimited */
    double *compute;    /* [n] compute slowdown factor (1: normal), for the programs run */
    hs__wan_pair *pair; /* [n*n], pair[i*n+j] is the direction i -> j */
    int nbuckets;
    double *bucket_bps; /* [nbuckets] rate of each link bucket in bit/s */
} hs__wan_profile;

/* Reads a profile file; on error returns a negative HS_E* with a message naming the field. */
int hs__wan_profile_load(hs__wan_profile **out, const char *path);
/* The same from text; name prefixes error messages. */
int hs__wan_profile_parse(hs__wan_profile **out, const char *text, const char *name);
void hs__wan_profile_free(hs__wan_profile *p);

#endif
