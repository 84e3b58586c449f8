/* The part hand-up's decisions (net/pieces.h). The frame reader already holds one connection's
 * parts to their order (each where the last ended); what can still come here is a copy sent
 * again over a new connection after the first was cut midway, which starts over at 0 and
 * repeats what arrived. Loop thread, under the runtime's mutex. */
#include "net/pieces.h"

#include "core/error_internal.h"

int hs__pstream_accept(hs__pstream *s, uint64_t round, uint64_t off, uint64_t n, uint64_t total,
                       int resent, uint64_t *from) {
    if (n == 0 || total == 0 || off > total || n > total - off)
        return hs__err(HS_EPROTO, "PART: %llu bytes at %llu of a DATA message of %llu",
                       (unsigned long long)n, (unsigned long long)off, (unsigned long long)total);
    if (s->active && round == s->round) {
        if (total != s->total)
            return hs__err(HS_EPROTO, "PART: round %llu's message of %llu bytes, its first part "
                                      "said %llu",
                           (unsigned long long)round, (unsigned long long)total,
                           (unsigned long long)s->total);
        /* Only a copy sent again repeats bytes that arrived (from its start, at 0). */
        if (off > s->end || (off < s->end && !resent))
            return hs__err(HS_EPROTO, "PART: round %llu's bytes at %llu, %llu of them arrived",
                           (unsigned long long)round, (unsigned long long)off,
                           (unsigned long long)s->end);
        int dup = s->dropping || off + n <= s->end;
        *from = s->end;
        if (off + n > s->end) s->end = off + n;
        s->active = s->end < s->total;
        return dup ? HS__PIECE_DUP : HS__PIECE_MORE;
    }
    if (off != 0)
        return hs__err(HS_EPROTO, "PART: bytes at %llu of round %llu's message, which was not "
                                  "begun",
                       (unsigned long long)off, (unsigned long long)round);
    /* A new message (one cut midway and never sent again is left behind: its reader waits for
     * the rest until its timeout, as for a message that does not come). */
    s->round = round;
    s->total = total;
    s->end = n;
    s->active = n < total;
    s->dropping = 0;
    *from = 0;
    return HS__PIECE_NEW;
}

void hs__pstream_drop(hs__pstream *s) {
    s->dropping = 1;
    if (!s->active) s->end = s->total;
}

int hs__piece_fits(uint64_t off, uint64_t len, uint64_t at, uint64_t *skip) {
    if (off + len <= at) return -1;
    if (off > at) return 0;
    *skip = at - off;
    return 1;
}
