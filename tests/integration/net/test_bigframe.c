/* Two peers exchange 64 MiB frames in both directions at once, every round, with 16 KiB socket
 * buffers (SO_SNDBUF/SO_RCVBUF), over TLS and over plain TCP, and over TLS through an emulated
 * 4 Gbit/s link (paced: a 64 MiB message travels in PART frames, and its first part may wait
 * for the link's schedule): no stall (both finish all rounds within the deadline, no round
 * missed) and the averages come out exact (0.5: the mean of 0 and 1 with weights 1/2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define ROUNDS 6

static void run(int k, const char *secret, const char *emulate) {
    const char *ip = h_ip(k);
    char boot[64], listen[2][64], logp[2][600], errp[2][600];
    snprintf(boot, sizeof(boot), "%s:7070", ip);
    hproc p[2];
    double t0 = h_now();
    for (int i = 0; i < 2; i++) {
        snprintf(listen[i], sizeof(listen[i]), "%s:%d", ip, 7070 + i);
        snprintf(logp[i], sizeof(logp[i]), "%s/b%d-p%d.log", h_dir(), k, i);
        snprintf(errp[i], sizeof(errp[i]), "%s/b%d-p%d.err", h_dir(), k, i);
        char *argv[48];
        int a = h_netpeer_argv(argv, listen[i], i ? boot : NULL);
        if (secret) {
            argv[a++] = "--secret-file";
            argv[a++] = (char *)secret;
        } else {
            argv[a++] = "--insecure";
        }
        if (emulate) {
            argv[a++] = "--emulate";
            argv[a++] = (char *)emulate;
        }
        char rounds[16];
        snprintf(rounds, sizeof(rounds), "%d", ROUNDS);
        char *rest[] = {"--topo",
                        "ring",
                        "--rounds",
                        rounds,
                        "--dim",
                        "16777216",
                        "--sock-buf",
                        "16384",
                        "--wait-members",
                        "2",
                        "--wait-timeout-ms",
                        "60000",
                        "--peer-timeout-ms",
                        "10000",
                        "--recv-timeout-ms",
                        "60000",
                        "--join-timeout-ms",
                        "60000",
                        "--log",
                        logp[i],
                        NULL};
        for (int r = 0; rest[r]; r++)
            argv[a++] = rest[r];
        argv[a] = NULL;
        H_CHECK(h_spawn(&p[i], argv, NULL, errp[i]) == 0, "spawn");
    }
    for (int i = 0; i < 2; i++) {
        int rc = h_wait(&p[i], 150);
        H_CHECK(rc == 0, "peer %d exited with %d (see %s)", i, rc, errp[i]);
    }
    double med = 0;
    for (int i = 0; i < 2; i++) {
        cJSON **ev;
        int n = h_events(logp[i], "done", &ev);
        H_CHECK(n == 1, "peer %d: no done event", i);
        H_CHECK(h_num(ev[0], "rounds") == ROUNDS && h_num(ev[0], "misses") == 0,
                "peer %d: %g rounds, %g misses", i, h_num(ev[0], "rounds"), h_num(ev[0], "misses"));
        H_CHECK(h_num(ev[0], "x0") == 0.5, "peer %d: average %.9g", i, h_num(ev[0], "x0"));
        H_CHECK(h_num(ev[0], "msgs_recv") == ROUNDS, "peer %d received %g frames", i,
                h_num(ev[0], "msgs_recv"));
        med += h_num(ev[0], "round_ms_median") / 2;
        h_free_events(ev, n);
    }
    h_note("%s%s%s: %d rounds of 64 MiB each way with 16 KiB socket buffers in %.1f s (median "
           "round %.0f ms)",
           secret ? "TLS" : "plain", emulate ? ", " : "", emulate ? emulate : "", ROUNDS,
           h_now() - t0, med);
}

int main(void) {
    h_init("net_bigframe", 230);
    const char *secret = h_file("secret", "big frame test secret, long enough\n");
    run(1, secret, NULL);
    run(2, NULL, NULL);
    run(3, secret, "rate=4gbit");
    h_done();
    return 0;
}
