/* libFuzzer target: the --emulate option parser. Whatever parses is within its documented
 * bounds, and formats to a string that parses to the same values. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hearsay/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    hs_net_emulation e, f;
    if (hs_net_emulation_parse(s, &e) == 0) {
        if (!(e.loss >= 0 && e.loss <= 1) || !(e.delay_ms >= 0) || !(e.jitter_ms >= 0) ||
            !(e.rate_bps == 0 || e.rate_bps >= 1000) || !isfinite(e.rate_bps))
            __builtin_trap();
        char buf[512];
        if (hs_net_emulation_format(&e, buf, sizeof(buf)) < 0)
            __builtin_trap();
        if (hs_net_emulation_parse(buf, &f) != 0 || memcmp(&e, &f, sizeof(e)))
            __builtin_trap();
    }
    free(s);
    return 0;
}
