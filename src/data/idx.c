/* IDX reader (gzip or raw through zlib) and datasets' subsets. Every length in a file is checked
 * against what the header declares before it is used. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/error_internal.h"
#include "core/rng.h"
#include "hearsay/data.h"

/* Decompressed size above which a file is refused: Fashion-MNIST's largest is 47 MB. */
#define IDX_MAX_BYTES ((size_t)1 << 30)

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

int hs_idx_read(const char *path, hs_idx *out) {
    memset(out, 0, sizeof(*out));
    struct stat sb;
    if (stat(path, &sb) != 0)
        return hs__err(errno == ENOENT ? HS_ENOENT : HS_EIO, "%s: %s", path, strerror(errno));
    gzFile f = gzopen(path, "rb");
    if (!f) return hs__err(HS_EIO, "%s: cannot open: %s", path, strerror(errno));
    gzbuffer(f, 1 << 17);
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    int err = 0;
    if (!buf) {
        err = hs__err(HS_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (;;) {
        if (len == cap) {
            if (cap >= IDX_MAX_BYTES) {
                err = hs__err(HS_EFORMAT, "%s: larger than %zu bytes uncompressed", path,
                              IDX_MAX_BYTES);
                goto done;
            }
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                err = hs__err(HS_ENOMEM, "%s: out of memory", path);
                goto done;
            }
            buf = nb;
            cap *= 2;
        }
        int n = gzread(f, buf + len, (unsigned)(cap - len));
        if (n < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            err = hs__err(HS_EFORMAT, "%s: corrupt or truncated gzip data (%s)", path, msg);
            goto done;
        }
        if (n == 0) break;
        len += (size_t)n;
    }
    /* zlib reports a gzip stream cut short only through gzerror after EOF. */
    {
        int zerr = Z_OK;
        const char *msg = gzerror(f, &zerr);
        if (zerr != Z_OK && zerr != Z_STREAM_END) {
            err = hs__err(HS_EFORMAT, "%s: corrupt or truncated gzip data (%s)", path, msg);
            goto done;
        }
    }
    if (len < 4) {
        err = hs__err(HS_EFORMAT, "%s: truncated: %zu bytes, an IDX header needs at least 4",
                      path, len);
        goto done;
    }
    if (buf[0] != 0 || buf[1] != 0) {
        err = hs__err(HS_EFORMAT, "%s: bad magic 0x%02x%02x%02x%02x (not an IDX file)", path,
                      buf[0], buf[1], buf[2], buf[3]);
        goto done;
    }
    if (buf[2] != 0x08) {
        err = hs__err(HS_EFORMAT, "%s: element type 0x%02x is not unsigned byte (0x08)", path,
                      buf[2]);
        goto done;
    }
    int ndim = buf[3];
    if (ndim < 1 || ndim > 4) {
        err = hs__err(HS_EFORMAT, "%s: %d dimensions (expected 1 to 4)", path, ndim);
        goto done;
    }
    size_t hdr = 4 + 4 * (size_t)ndim;
    if (len < hdr) {
        err = hs__err(HS_EFORMAT, "%s: truncated header: %zu of %zu bytes", path, len, hdr);
        goto done;
    }
    size_t total = 1;
    for (int i = 0; i < ndim; i++) {
        uint32_t d = be32(buf + 4 + 4 * i);
        if (d == 0) {
            err = hs__err(HS_EFORMAT, "%s: dimension %d is 0", path, i);
            goto done;
        }
        if (total > IDX_MAX_BYTES / d) {
            err = hs__err(HS_EFORMAT, "%s: declared size too large (dimension %d = %u)", path, i, d);
            goto done;
        }
        total *= d;
        out->dims[i] = d;
    }
    if (len - hdr != total) {
        err = hs__err(HS_EFORMAT, "%s: %s: header declares %zu data bytes, file has %zu", path,
                      len - hdr < total ? "truncated" : "trailing data", total, len - hdr);
        goto done;
    }
    out->ndim = ndim;
    out->size = total;
    out->data = malloc(total ? total : 1);
    if (!out->data) {
        err = hs__err(HS_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    memcpy(out->data, buf + hdr, total);
done:
    free(buf);
    gzclose(f);
    return err;
}

void hs_dataset_free(hs_dataset *ds) {
    if (!ds) return;
    free(ds->x);
    free(ds->y);
    free(ds);
}

int hs_dataset_subset(hs_dataset **out, const hs_dataset *src, const uint32_t *idx, size_t count) {
    hs_dataset *ds = calloc(1, sizeof(*ds));
    if (!ds) return hs__err(HS_ENOMEM, "dataset: out of memory");
    ds->n = count;
    ds->dim = src->dim;
    ds->channels = src->channels;
    ds->height = src->height;
    ds->width = src->width;
    ds->classes = src->classes;
    memcpy(ds->mean, src->mean, sizeof(ds->mean));
    memcpy(ds->std, src->std, sizeof(ds->std));
    snprintf(ds->name, sizeof(ds->name), "%s", src->name);
    ds->x = malloc(sizeof(float) * (count ? count : 1) * (size_t)src->dim);
    ds->y = malloc(count ? count : 1);
    if (!ds->x || !ds->y) {
        hs_dataset_free(ds);
        return hs__err(HS_ENOMEM, "dataset subset of %zu examples: out of memory", count);
    }
    for (size_t i = 0; i < count; i++) {
        if (idx[i] >= src->n) {
            hs_dataset_free(ds);
            return hs__err(HS_ERANGE, "dataset subset: index %u of %s is out of range (n = %zu)",
                           idx[i], src->name, src->n);
        }
        memcpy(ds->x + i * (size_t)src->dim, src->x + (size_t)idx[i] * src->dim,
               sizeof(float) * (size_t)src->dim);
        ds->y[i] = src->y[idx[i]];
    }
    *out = ds;
    return 0;
}

int hs_dataset_keep(hs_dataset **ds, size_t n, uint64_t seed, int random) {
    if (n == 0 || n >= (*ds)->n) return 0;
    uint32_t *idx = malloc(sizeof(uint32_t) * (*ds)->n);
    if (!idx) return hs__err(HS_ENOMEM, "dataset %s: out of memory", (*ds)->name);
    for (size_t i = 0; i < (*ds)->n; i++) idx[i] = (uint32_t)i;
    if (random) {
        hs_rng r;
        hs__rng_init(&r, seed, HS_RNG_SHUFFLE, 0xFFFFFFFDu, 0);
        hs__rng_shuffle_u32(&r, idx, (*ds)->n);
    }
    hs_dataset *sub;
    int err = hs_dataset_subset(&sub, *ds, idx, n);
    free(idx);
    if (err < 0) return err;
    hs_dataset_free(*ds);
    *ds = sub;
    return 0;
}
