/* The bootstrap layer: joining a running job, on both sides (bootstrap.c), on top of
 * membership (the sequencer assigns ids through hs__mb_request_join; WELCOME carries the
 * version that adds the joiner) and the transport (the joiner's connection becomes an ordinary
 * one). Its state lives in struct hs_net (join_*, pjoins), where hs_net_start waits for it.
 *
 * Threading: loop thread; the joiner's outcome goes to hs_net_start under net->mu. */
#ifndef HS_NET_BOOTSTRAP_H
#define HS_NET_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "core/log.h"
#include "hearsay/net.h"
#include "net/transport.h"
#include "net/wire.h"

/* A joiner this member talks to. */
typedef struct hs__pending_join {
    hs__conn *conn; /* NULL once gone */
    uint64_t nonce;
    char addr[HS__ADDR_MAX + 1];
    uint32_t id; /* HS__ID_NONE until JOIN_ACK */
    uint64_t mver;
    uint64_t t_request_us, t_forward_us;
    uint64_t round_at_request;
    uint64_t resume_round; /* the joiner's (its JOIN's frame round) */
    int done;
} hs__pending_join;

enum { HS__JOIN_IDLE, HS__JOIN_DIALING, HS__JOIN_WAITING, HS__JOIN_DONE, HS__JOIN_FAILED };

/* Frames: JOIN (from a joiner, on its connection; resume_round: its frame's round, the
 * joiner's hs_net_config.resume_round), JOIN_FWD (to the sequencer), JOIN_ACK (the sequencer's
 * answer), WELCOME (the joiner's, < 0 closes as malformed). */
void hs__bs_on_join(hs_net *net, hs__conn *c, const hs__join *j, uint64_t resume_round);
void hs__bs_on_join_fwd(hs_net *net, hs__conn *c, const hs__join *j);
void hs__bs_on_join_ack(hs_net *net, const hs__join *j);
int hs__bs_on_welcome(hs_net *net, hs__conn *c, hs_buf *pay);
/* The joiner: dial again, give up at the deadline; the member: forward again, answer. */
void hs__bs_join_tick(hs_net *net, uint64_t now_us);
/* The joiner: dial the bootstrap address, or (connection open) send JOIN. */
void hs__bs_join_start(hs_net *net);
void hs__bs_join_conn_failed(hs_net *net, hs__conn *c, int err, const char *why);
void hs__bs_on_refused(hs_net *net, hs__conn *c, uint32_t code, const char *text);
void hs__bs_conn_gone(hs_net *net, hs__conn *c);
/* WELCOMEs that waited for a version or a snapshot go now if they can. */
void hs__bs_try_welcomes(hs_net *net);
/* The joiner's join failed: hs_net_start returns err with this message. */
void hs__bs_fail(hs_net *net, int err, const char *fmt, ...) HS__PRINTF(3, 4);

#endif
