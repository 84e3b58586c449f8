/* One TUN interface per peer namespace, opened by the emulator and configured from inside the
 * namespace, so the emulator's process owns every packet that leaves or enters a peer. */
#ifndef HS_WAN_TUN_H
#define HS_WAN_TUN_H

#include <stdint.h>

/* Opens a TUN interface ifname inside the network namespace named ns (/run/netns/NS), gives
 * it addr/24 and mtu, brings it and the namespace's loopback up, and returns its non-blocking
 * descriptor (or -1 with a message in err). The calling thread is back in its own namespace
 * on return. The interface lives as long as the descriptor. */
int hs__wan_tun_open(const char *ns, const char *ifname, uint32_t addr, int mtu, char *err,
                     size_t errlen);

#endif
