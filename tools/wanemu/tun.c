/* TUN interfaces inside peer namespaces: setns() into the namespace, create the interface
 * there (it stays in that namespace while this process reads and writes its descriptor), and
 * configure it with ioctls from a socket of that namespace, so no `ip` runs in between. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <net/route.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tun.h"

static int set_up(int s, const char *name) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) return -1;
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    return ioctl(s, SIOCSIFFLAGS, &ifr);
}

static int set_addr(int s, const char *name, unsigned long req, uint32_t a) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", name);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(a)};
    memcpy(&ifr.ifr_addr, &sin, sizeof(sin));
    return ioctl(s, req, &ifr);
}

/* Everything done inside the namespace; returns the TUN descriptor or -1 (err set). */
static int open_inside(const char *ifname, uint32_t addr, int mtu, char *err, size_t errlen) {
    const char *step = "open /dev/net/tun";
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC), s = -1;
    struct ifreq ifr;
    if (fd < 0) goto fail;
    memset(&ifr, 0, sizeof(ifr));
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
    step = "TUNSETIFF";
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) goto fail;
    step = "socket";
    if ((s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0) goto fail;
    step = "bring lo up";
    if (set_up(s, "lo") < 0) goto fail;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
    ifr.ifr_mtu = mtu;
    step = "set the MTU";
    if (ioctl(s, SIOCSIFMTU, &ifr) < 0) goto fail;
    /* A longer queue than TUN's 500 packets: the kernel drops what the emulator has not read
     * yet, and bursts of a fast sender must not be lost before the emulated link sees them. */
    ifr.ifr_qlen = 2000;
    step = "set the queue length";
    if (ioctl(s, SIOCSIFTXQLEN, &ifr) < 0) goto fail;
    step = "set the address";
    if (set_addr(s, ifname, SIOCSIFADDR, addr) < 0) goto fail;
    step = "set the netmask";
    if (set_addr(s, ifname, SIOCSIFNETMASK, 0xffffff00u) < 0) goto fail;
    step = "bring the interface up";
    if (set_up(s, ifname) < 0) goto fail;
    close(s);
    return fd;
fail:
    snprintf(err, errlen, "%s: %s", step, strerror(errno));
    if (s >= 0) close(s);
    if (fd >= 0) close(fd);
    return -1;
}

int hs__wan_tun_open(const char *ns, const char *ifname, uint32_t addr, int mtu, char *err,
                     size_t errlen) {
    char path[256];
    int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC), nsfd = -1, fd = -1;
    if (self < 0) {
        snprintf(err, errlen, "/proc/self/ns/net: %s", strerror(errno));
        return -1;
    }
    snprintf(path, sizeof(path), "/run/netns/%s", ns);
    if ((nsfd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (setns(nsfd, CLONE_NEWNET) < 0) {
        snprintf(err, errlen, "setns %s: %s", path, strerror(errno));
        goto out;
    }
    fd = open_inside(ifname, addr, mtu, err, errlen);
    if (setns(self, CLONE_NEWNET) < 0) {
        snprintf(err, errlen, "setns back to our own namespace: %s", strerror(errno));
        if (fd >= 0) close(fd);
        fd = -1;
    }
out:
    if (nsfd >= 0) close(nsfd);
    close(self);
    return fd;
}
