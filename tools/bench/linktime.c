/* What the simulator's link model (src/sim/linktime.c) predicts for a tools/wan profile, for
 * tools/bench/wan --calibrate to compare with the emulator: the seconds of a ring all-reduce of
 * BYTES among all peers, and of one message of BYTES from peer 0 to peer 1 on idle links, with
 * HEADERS bytes of IP and TCP headers per packet (default 52, as hearsay sim --link-headers).
 *   linktime_bench PROFILE BYTES [HEADERS] */
#include <stdio.h>
#include <stdlib.h>

#include "hearsay/error.h"
#include "sim/linktime.h"
#include "wan/profile.h"

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: linktime_bench PROFILE BYTES [HEADERS]\n");
        return 2;
    }
    char *end;
    unsigned long long bytes = strtoull(argv[2], &end, 10);
    if (*end || !bytes) {
        fprintf(stderr, "linktime_bench: BYTES %s: not a positive whole number\n", argv[2]);
        return 2;
    }
    long headers = HS__LINKTIME_TCP_HEADERS;
    if (argc == 4 && ((headers = strtol(argv[3], &end, 10)) < 0 || *end || headers > 1000)) {
        fprintf(stderr, "linktime_bench: HEADERS %s: not a whole number in 0..1000\n", argv[3]);
        return 2;
    }
    hs__wan_profile *p = NULL;
    hs__linktime *lt = NULL;
    if (hs__wan_profile_load(&p, argv[1]) < 0 || hs__linktime_new(&lt, p) < 0) {
        fprintf(stderr, "linktime_bench: %s\n", hs_error_message());
        hs__wan_profile_free(p);
        return 2;
    }
    hs__linktime_set_headers(lt, (int)headers);
    printf("allreduce_s %.9f\n", hs__linktime_allreduce(lt, (size_t)bytes));
    if (p->n > 1) printf("exchange_s %.9f\n", hs__linktime_arrival(lt, 0, 1, (size_t)bytes, 0));
    hs__linktime_free(lt);
    hs__wan_profile_free(p);
    return 0;
}
