/* Link emulation state of one outgoing link: when a frame may leave, how fast its bytes go,
 * whether a DATA frame is lost. Pure (no I/O, no clock: the caller passes times), so its
 * arithmetic is unit-tested. Single-threaded (the loop thread). */
#ifndef HS_NET_EMULATE_H
#define HS_NET_EMULATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "hearsay/net.h"

typedef struct hs__link {
    hs_net_emulation e;
    hs_rng rng;
    uint64_t last_release_us; /* frames never overtake each other */
    uint64_t paced_until_us;  /* the link is busy sending until then */
} hs__link;

void hs__link_init(hs__link *l, const hs_net_emulation *e, uint64_t seed, uint32_t self,
                   uint32_t peer);

/* 1 if the DATA frame entering the link now is lost. */
int hs__link_lose(hs__link *l);

/* The time at which a frame entering at now_us may start to leave: now + delay + jitter,
 * never before the previous frame's. */
uint64_t hs__link_release(hs__link *l, uint64_t now_us);

/* Rate limit: bytes may go at now_us if the link is free; returns the time they may go and
 * books the link for their serialization time. Unlimited links return now_us. */
uint64_t hs__link_pace(hs__link *l, uint64_t now_us, size_t bytes);

#endif
