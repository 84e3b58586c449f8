/* hearsay/net.h compiles on its own (no other include first) and its inline contract holds. */
#include "hearsay/net.h"

int main(void) {
    hs_net_config c;
    hs_net_config_init(&c);
    hs_net_emulation e;
    return hs_net_emulation_parse("delay=1ms", &e) == 0 && e.delay_ms == 1 &&
                   c.security == HS_NET_SECRET && c.max_frame > 0
               ? 0
               : 1;
}
