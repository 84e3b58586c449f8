/* Refusals before any data is loaded: the README promises them there, and loading a data set
 * takes seconds to minutes (14 s under load for Fashion-MNIST), so that a typo found after it
 * costs that much every time, and an output path found unusable at the end costs the run. */
#include "cli/precheck.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "hearsay/topo.h"

int hs__cli_check_out_path(const char *opt, const char *path) {
    if (!strcmp(path, "-")) return 0;
    char dir[4096];
    const char *at = strstr(path, "{id}");
    int n = at ? snprintf(dir, sizeof(dir), "%.*s0%s", (int)(at - path), path, at + 4)
               : snprintf(dir, sizeof(dir), "%s", path);
    if (n < 0 || (size_t)n >= sizeof(dir))
        return hs__cli_usage_error("%s %s: path too long", opt, path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof(dir), ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    struct stat sb;
    /* An existing file is appended to or moved aside, never written through a directory. */
    if (!at && stat(path, &sb) == 0 && (S_ISDIR(sb.st_mode) || access(path, W_OK) != 0))
        return hs__cli_usage_error("%s %s: %s", opt, path,
                                  S_ISDIR(sb.st_mode) ? "is a directory" : strerror(errno));
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return hs__cli_usage_error("%s %s: directory %s does not exist", opt, path, dir);
    if (access(dir, W_OK) != 0)
        return hs__cli_usage_error("%s %s: directory %s is not writable: %s", opt, path, dir,
                                  strerror(errno));
    return 0;
}

/* A model file is read for its shape only with the data's shape; here it must be readable.
 * A name is resolved against a nominal image shape: names and layer widths do not depend on
 * it (the data's own shape is checked again once it is known). */
static int check_model(const char *model) {
    if (!model) return 0;
    size_t len = strlen(model);
    if ((len > 5 && !strcmp(model + len - 5, ".json")) || strchr(model, '/')) {
        if (access(model, R_OK) != 0)
            return hs__cli_usage_error("model file %s: cannot open: %s", model, strerror(errno));
        return 0;
    }
    /* mlp:W-...-W names its own ends, which only the data can confirm: it is resolved against
     * them, so that its syntax is checked here and its shape once the data is known. */
    int c = 3, h = 32, w = 32, classes = 10;
    if (!strncmp(model, "mlp:", 4)) {
        const char *last = strrchr(model, '-');
        c = h = 1;
        w = atoi(model + 4);
        classes = last ? atoi(last + 1) : 0;
        if (w <= 0 || w > 1 << 20 || classes <= 0) w = classes = 1; /* the parser says why */
    }
    hs_model_spec s;
    if (hs_model_spec_parse(&s, model, NULL, c, h, w, classes) < 0)
        return hs__cli_usage_error("%s", hs_error_message());
    return 0;
}

int hs__cli_precheck(const char *model, const char *metrics, const char *topology, int n,
                    uint64_t seed) {
    int rc;
    if ((rc = check_model(model)) < 0) return rc;
    if (metrics && (rc = hs__cli_check_out_path("--metrics", metrics)) < 0) return rc;
    if (!topology || n <= 1) return 0;
    hs_topo *t = NULL;
    if (hs_topo_new(&t, topology, n, seed) < 0)
        return hs__cli_usage_error("--topology %s on %d peers: %s", topology, n,
                                  hs_error_message());
    hs_topo_free(t);
    return 0;
}
