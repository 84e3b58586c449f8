/* A launch's run directory (rundir.h): the claim by mkdir and the generated run secret, shared
 * by the launches of `hearsay run` peers and of a user's script. */
#include "cli/rundir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"

static int mkdirs(const char *path) {
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

int hs__cli_claim_run_dir(const char *runs_dir, const char *base, int chosen, char *name,
                          size_t ncap, char *dir, size_t dcap) {
    if (strlen(runs_dir) > 2500) return hs__cli_usage_error("--runs-dir %s: path too long", runs_dir);
    if (mkdirs(runs_dir) != 0)
        return hs__cli_usage_error("cannot create %s: %s", runs_dir, strerror(errno));
    for (int k = 1;; k++) {
        if (k == 1) snprintf(name, ncap, "%s", base);
        else snprintf(name, ncap, "%s-%d", base, k);
        snprintf(dir, dcap, "%s/%s", runs_dir, name);
        if (mkdir(dir, 0755) == 0) return 0;
        if (errno != EEXIST || k >= 1000)
            return hs__cli_usage_error("cannot create %s: %s", dir, strerror(errno));
        if (chosen)
            return hs__cli_usage_error("run directory %s exists already (choose another --name)", dir);
    }
}

int hs__cli_check_run_name(const char *v) {
    if (!*v || strchr(v, '/')) return hs__cli_usage_error("--name '%s': a plain directory name", v);
    return 0;
}

int hs__cli_write_secret(const char *path) {
    unsigned char b[32];
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd < 0 || read(fd, b, sizeof(b)) != (ssize_t)sizeof(b)) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", b[i]);
    hex[64] = '\n';
    int ok = write(fd, hex, 65) == 65;
    close(fd);
    return ok ? 0 : -1;
}
