/* Sharding a dataset among peers: IID (a seeded permutation cut into near-equal parts) and
 * label-skewed non-IID (per class, Dirichlet(alpha) proportions over the peers; Hsu, Qi and
 * Brown 2019). Every rank computes the same global split from the seed, so shards are disjoint
 * and cover the set without any communication. */
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/rng.h"
#include "hearsay/data.h"

/* Each peer is guaranteed at least this many examples under Dirichlet sharding; draws that
 * leave a peer with fewer are repeated (as the reference implementations do). */
#define DIRICHLET_MIN_SHARD 10
#define DIRICHLET_MAX_DRAWS 1000

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int check_rank(int rank, int world) {
    if (world < 1) return hs__err(HS_EINVAL, "sharding: world size %d must be >= 1", world);
    if (rank < 0 || rank >= world)
        return hs__err(HS_EINVAL, "sharding: rank %d is not in [0, %d)", rank, world);
    return 0;
}

int hs_shard_iid(size_t n, int rank, int world, uint64_t seed, uint32_t **idx, size_t *count) {
    int err = check_rank(rank, world);
    if (err < 0) return err;
    if (n > UINT32_MAX) return hs__err(HS_ERANGE, "sharding: %zu examples is too many", n);
    uint32_t *perm = malloc(sizeof(uint32_t) * (n ? n : 1));
    if (!perm) return hs__err(HS_ENOMEM, "sharding: out of memory");
    for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    hs_rng r;
    hs__rng_init(&r, seed, HS_RNG_SHUFFLE, 0xFFFFFFFFu, 0);
    hs__rng_shuffle_u32(&r, perm, n);
    size_t lo = n * (size_t)rank / (size_t)world, hi = n * (size_t)(rank + 1) / (size_t)world;
    memmove(perm, perm + lo, sizeof(uint32_t) * (hi - lo));
    qsort(perm, hi - lo, sizeof(uint32_t), cmp_u32);
    *idx = perm;
    *count = hi - lo;
    return 0;
}

int hs_shard_dirichlet(const uint8_t *labels, size_t n, int classes, int rank, int world,
                       double alpha, uint64_t seed, uint32_t **idx, size_t *count) {
    int err = check_rank(rank, world);
    if (err < 0) return err;
    if (!(alpha > 0.0)) return hs__err(HS_EINVAL, "dirichlet: alpha %g must be > 0", alpha);
    if (classes < 1 || classes > 256) return hs__err(HS_EINVAL, "dirichlet: %d classes", classes);
    if (n > UINT32_MAX) return hs__err(HS_ERANGE, "sharding: %zu examples is too many", n);
    if ((size_t)world * DIRICHLET_MIN_SHARD > n)
        return hs__err(HS_EINVAL, "dirichlet: %zu examples cannot give %d peers %d each", n,
                       world, DIRICHLET_MIN_SHARD);
    /* Examples grouped by class, each group in a seeded order. */
    size_t *cnt = calloc((size_t)classes + 1, sizeof(size_t));
    uint32_t *byclass = malloc(sizeof(uint32_t) * (n ? n : 1));
    double *p = malloc(sizeof(double) * (size_t)world);
    size_t *got = malloc(sizeof(size_t) * (size_t)world);
    size_t *cut = malloc(sizeof(size_t) * ((size_t)world + 1) * (size_t)classes);
    uint32_t *mine = NULL;
    if (!cnt || !byclass || !p || !got || !cut) {
        err = hs__err(HS_ENOMEM, "sharding: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (labels[i] >= classes) {
            err = hs__err(HS_EINVAL, "dirichlet: label %u of example %zu is not in [0, %d)",
                          labels[i], i, classes);
            goto done;
        }
        cnt[labels[i] + 1]++;
    }
    for (int c = 0; c < classes; c++) cnt[c + 1] += cnt[c];
    {
        size_t *pos = malloc(sizeof(size_t) * (size_t)classes);
        if (!pos) {
            err = hs__err(HS_ENOMEM, "sharding: out of memory");
            goto done;
        }
        memcpy(pos, cnt, sizeof(size_t) * (size_t)classes);
        for (size_t i = 0; i < n; i++) byclass[pos[labels[i]]++] = (uint32_t)i;
        free(pos);
    }
    for (int c = 0; c < classes; c++) {
        hs_rng r;
        hs__rng_init(&r, seed, HS_RNG_SHUFFLE, 0xFFFFFFFEu, (uint32_t)c);
        hs__rng_shuffle_u32(&r, byclass + cnt[c], cnt[c + 1] - cnt[c]);
    }
    int draw;
    for (draw = 0; draw < DIRICHLET_MAX_DRAWS; draw++) {
        memset(got, 0, sizeof(size_t) * (size_t)world);
        for (int c = 0; c < classes; c++) {
            hs_rng r;
            hs__rng_init(&r, seed, HS_RNG_DIRICHLET, (uint32_t)c, (uint32_t)draw);
            double sum = 0;
            for (int k = 0; k < world; k++) sum += p[k] = hs__rng_gamma(&r, alpha);
            size_t nc = cnt[c + 1] - cnt[c];
            size_t *cc = cut + (size_t)c * ((size_t)world + 1);
            double acc = 0;
            cc[0] = 0;
            for (int k = 0; k < world; k++) {
                acc += sum > 0 ? p[k] / sum : 1.0 / world;
                size_t b = k + 1 == world ? nc : (size_t)(acc * (double)nc + 0.5);
                if (b > nc) b = nc;
                if (b < cc[k]) b = cc[k];
                cc[k + 1] = b;
                got[k] += b - cc[k];
            }
        }
        int ok = 1;
        for (int k = 0; k < world; k++) ok &= got[k] >= DIRICHLET_MIN_SHARD;
        if (ok) break;
    }
    if (draw == DIRICHLET_MAX_DRAWS) {
        err = hs__err(HS_EINVAL,
                      "dirichlet:%g: no draw in %d gave every one of %d peers %d examples; "
                      "raise alpha or use fewer peers",
                      alpha, DIRICHLET_MAX_DRAWS, world, DIRICHLET_MIN_SHARD);
        goto done;
    }
    if (!(mine = malloc(sizeof(uint32_t) * (got[rank] ? got[rank] : 1)))) {
        err = hs__err(HS_ENOMEM, "sharding: out of memory");
        goto done;
    }
    size_t m = 0;
    for (int c = 0; c < classes; c++) {
        size_t *cc = cut + (size_t)c * ((size_t)world + 1);
        for (size_t j = cc[rank]; j < cc[rank + 1]; j++) mine[m++] = byclass[cnt[c] + j];
    }
    qsort(mine, m, sizeof(uint32_t), cmp_u32);
    *idx = mine;
    *count = m;
    mine = NULL;
done:
    free(mine);
    free(cnt);
    free(byclass);
    free(p);
    free(got);
    free(cut);
    return err;
}

int hs_partition_parse(const char *s, hs_partition *out) {
    memset(out, 0, sizeof(*out));
    if (!strcmp(s, "iid")) return 0;
    if (!strncmp(s, "dirichlet:", 10)) {
        char *end;
        double a = strtod(s + 10, &end);
        if (end == s + 10 || *end || !(a > 0.0) || a > 1e6)
            return hs__err(HS_EINVAL, "--partition '%s': alpha must be a number > 0", s);
        out->kind = 1;
        out->alpha = a;
        return 0;
    }
    return hs__err(HS_EINVAL, "--partition '%s': expected iid or dirichlet:ALPHA", s);
}

int hs_shard(const hs_dataset *ds, const hs_partition *p, int rank, int world, uint64_t seed,
             uint32_t **idx, size_t *count) {
    if (p->kind == 1)
        return hs_shard_dirichlet(ds->y, ds->n, ds->classes, rank, world, p->alpha, seed, idx,
                                  count);
    return hs_shard_iid(ds->n, rank, world, seed, idx, count);
}
